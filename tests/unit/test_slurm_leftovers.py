"""The test Slurm cluster's guard against daemons an earlier session left running
(slurm_cluster._test_daemons, _stop): real processes named as the daemons are, found by
their command line in /proc and stopped; others left alone."""
import os
import subprocess
import sys

import pytest
from slurm_cluster import _stop, _test_daemons

# A process that stays until killed (its stdin is never closed), ignoring SIGTERM as a hung
# daemon might.
STUBBORN = "import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
           "print('up', flush=True); sys.stdin.read()"


def named(tmp_path, name: str, conf: str) -> subprocess.Popen:
    """A Python process whose argv[0] is `name` and whose arguments end in -f conf."""
    link = tmp_path / name
    if not link.exists():
        link.symlink_to(sys.executable)
    proc = subprocess.Popen([str(link), "-c", STUBBORN, "-f", conf], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    return proc


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_test_clusters_leftover_daemons_are_found_and_stopped_and_nothing_else(
        tmp_path, monkeypatch):
    monkeypatch.setattr("slurm_cluster.STOP_S", 1)   # (until SIGKILL: its SIGTERM is ignored)
    stale = named(tmp_path, "slurmd", "/tmp/pytest-of-root/pytest-1/slurm0/slurm.conf")
    mine = named(tmp_path, "slurmctld", str(tmp_path / "slurm.conf"))
    other = named(tmp_path, "slurmd", "/etc/slurm/slurm.conf")   # not a test cluster's
    try:
        assert stale.pid in _test_daemons() and other.pid not in _test_daemons()
        assert _test_daemons(str(tmp_path / "slurm.conf")) == [mine.pid]
        _stop([stale.pid, mine.pid], "left by a test")   # SIGTERM ignored: SIGKILL ends them
        assert stale.wait(5) == -9 and mine.wait(5) == -9
        assert other.poll() is None
    finally:
        for proc in (stale, mine, other):
            proc.kill()
            proc.wait()
