"""Run directories without MPI: which files are mpips's, what removal leaves, locks, and
input fingerprints."""
import json
import os
import re
import socket
import subprocess
import time

import pytest

from mpips.data import fingerprint
from mpips.storage import rundir
from mpips.base.errors import ConfigError
from mpips.base.processes import start_time

MPIPS_FILES = ["summary.json", "model/server-0000.h5", "model/server-0001.h5.tmp-123",
               "pulls/server-0000.h5", "snapshots/0003/server-0000.h5",
               "snapshots/final/server-0001.h5"]
USER_FILES = ["notes.md", "model/notes.txt", "snapshots/photo.jpg", "model/mine/server-0000.h5",
              "snapshots/0003/plot.png"]


def make(root, paths):
    for p in paths:
        os.makedirs(os.path.dirname(os.path.join(root, p)) or root, exist_ok=True)
        with open(os.path.join(root, p), "w") as f:
            f.write("x")


def test_only_the_files_mpips_writes_are_its_own(tmp_path):
    make(tmp_path, MPIPS_FILES + USER_FILES)
    assert sorted(rundir.run_outputs(str(tmp_path))) == sorted(MPIPS_FILES)


def test_removal_keeps_everything_else_and_names_it(tmp_path):
    make(tmp_path, MPIPS_FILES + USER_FILES)
    left = rundir.remove_run_outputs(str(tmp_path))
    assert sorted(left) == sorted(p for p in USER_FILES if "/" in p)
    for p in USER_FILES:
        assert (tmp_path / p).exists(), p
    for p in MPIPS_FILES:
        assert not (tmp_path / p).exists(), p
    assert not (tmp_path / "pulls").exists() and not (tmp_path / "snapshots" / "final").exists()


def test_checkpoint_files_and_removal(tmp_path):
    make(tmp_path, ["clock-000000000015/server-0000.h5", "clock-000000000015/manifest.json",
                    "clock-000000000030/manifest.json.tmp", "clock-000000000030/README",
                    "clock-7/server-0000.h5", "mpips.lock"])
    assert len(rundir.checkpoint_files(str(tmp_path))) == 3
    assert rundir.remove_checkpoints(str(tmp_path)) == ["clock-000000000030/README"]
    assert sorted(os.listdir(tmp_path)) == ["clock-000000000030", "clock-7", "mpips.lock"]


def run_with(root, run_id):
    root.mkdir(parents=True)
    (root / "summary.json").write_text(json.dumps({"run_id": run_id}))


def test_outputs_of_another_run_are_refused_and_of_the_same_run_replaced(tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "out" / "checkpoints"
    rundir.check_outputs(str(out), str(ckpt), False, None)   # nothing there
    run_with(out, "A")
    with pytest.raises(ConfigError, match="already holds a run"):
        rundir.check_outputs(str(out), str(ckpt), False, None)
    rundir.check_outputs(str(out), str(ckpt), False, "A")
    with pytest.raises(ConfigError, match="the checkpoint is of run B, but --out .* holds A"):
        rundir.check_outputs(str(out), str(ckpt), False, "B")
    rundir.check_outputs(str(out), str(ckpt), True, "B")


def test_a_lock_names_its_holder_and_stale_ones_are_taken_over(tmp_path, monkeypatch):
    # The holder is this process, which does not end: the lock waits out LINGER_S for it
    # before it refuses (0.2 s here, not 5).
    monkeypatch.setattr(rundir, "LINGER_S", 0.2)
    first = rundir.DirectoryLock(str(tmp_path), "run-1", "--out")
    first.acquire()
    with pytest.raises(ConfigError, match=f"in use by run run-1 on host {socket.gethostname()}"):
        rundir.DirectoryLock(str(tmp_path), "run-2", "--out").acquire()
    first.release()
    assert not (tmp_path / rundir.LOCK).exists()
    (tmp_path / rundir.LOCK).write_text(json.dumps(
        {"run_id": "old", "host": socket.gethostname(), "pid": os.getpid(), "started": "0"}))
    rundir.DirectoryLock(str(tmp_path), "run-3", "--out").acquire()   # pid reused: not its


def test_the_lock_of_a_job_still_ending_is_taken_once_its_process_is_gone(tmp_path,
                                                                          monkeypatch):
    """A resume right after a failed launch: the lock's holder is a process of this host
    that is still ending. It ends at a known point, as the lock starts waiting for it (the
    lock's first pause), not after a time: the lock is taken then, not refused."""
    ending = subprocess.Popen(["sleep", "600"])
    (tmp_path / rundir.LOCK).write_text(json.dumps(
        {"run_id": "killed", "host": socket.gethostname(), "pid": ending.pid,
         "started": start_time(ending.pid)}))

    class EndsAsTheLockWaits:
        """rundir's clock, whose first pause ends the holder (and reaps it, as its launcher
        would)."""
        pauses = 0

        def __getattr__(self, name):
            return getattr(time, name)

        def sleep(self, seconds):
            if not self.pauses:
                ending.kill()
                ending.wait()
            self.pauses += 1
            time.sleep(seconds)

    clock = EndsAsTheLockWaits()
    monkeypatch.setattr(rundir, "time", clock)
    rundir.DirectoryLock(str(tmp_path), "resumed", "--out").acquire()
    assert clock.pauses >= 1, "the lock waited for the holder to go"
    assert json.loads((tmp_path / rundir.LOCK).read_text())["run_id"] == "resumed"


def test_a_lock_is_kept_while_a_process_of_its_job_runs_here(tmp_path, monkeypatch, caplog):
    """Under hot failover a job outlives its lead, and its lock names every server. The lead
    (the lock's holder) is gone, another server runs: the job runs (`ctl` finds it) and a
    second job is refused, naming the run and that server; once no process of the job runs
    on this host, the lock is taken over at once."""
    monkeypatch.setattr(rundir, "LINGER_S", 0.5)   # (the wait for a job still ending)
    lead, server = subprocess.Popen(["sleep", "600"]), subprocess.Popen(["sleep", "600"])
    host = socket.gethostname()
    job = [{"host": host, "pid": p.pid, "started": start_time(p.pid)}
           for p in (lead, server)]
    (tmp_path / rundir.LOCK).write_text(json.dumps(
        {"run_id": "failing-over", "taken": "then", "what": "--out", **job[0], "job": job}))
    try:
        lead.kill()
        lead.wait()
        holder, gone = rundir.running_job(str(tmp_path))
        assert gone is None and holder["run_id"] == "failing-over"
        said = (f"in use by run failing-over on host {host} (pid {lead.pid}, since then; its "
                f"other servers: pids {server.pid} on {host})")
        with pytest.raises(ConfigError, match=re.escape(said)):
            rundir.DirectoryLock(str(tmp_path), "second", "--out").acquire()
    finally:
        server.kill()
        server.wait()
    with caplog.at_level("WARNING", logger="mpips"):
        rundir.DirectoryLock(str(tmp_path), "third", "--out").acquire()
    assert (f"its processes on this host ({lead.pid}, {server.pid}) are no longer running"
            in caplog.text)
    assert json.loads((tmp_path / rundir.LOCK).read_text())["run_id"] == "third"


def test_a_fingerprint_tells_what_changed(tmp_path):
    path = tmp_path / "d.svm"
    path.write_bytes(b"1 1:1\n" * 1000)
    then = fingerprint.of_input(str(path))
    assert fingerprint.changes(str(path), then, fingerprint.of_input(str(path))) == []
    path.write_bytes(b"0 1:1\n" + b"1 1:1\n" * 999)
    os.utime(path, ns=(then["mtime_ns"], then["mtime_ns"]))
    assert fingerprint.changes(str(path), then, fingerprint.of_input(str(path))) == [
        f"{path}: its first or last MiB differ"]
    path.write_bytes(b"1 1:1\n" * 10)
    found = fingerprint.changes(str(path), then, fingerprint.of_input(str(path)))
    assert any("size 6,000 -> 60 bytes" in c for c in found)
