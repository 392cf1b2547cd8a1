"""The processes a launcher started beside this one, as a rank leaving after a failure finds
them in /proc (base.processes.siblings_before): real child processes of one parent."""
import os
import subprocess
import sys

import pytest

from mpips.base.processes import siblings_before

# A child that says its pid, then waits until its stdin closes (the test releases it).
WAITING = "import os, sys; print(os.getpid(), flush=True); sys.stdin.read()"
# A child that says which of its siblings come before it by RANK_HERE.
ASKING = ("import os; from mpips.base.processes import siblings_before; "
          "print(sorted(siblings_before('RANK_HERE', int(os.environ['RANK_HERE']))))")


def child(code: str, rank, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    if rank is not None:
        env["RANK_HERE"] = str(rank)
    return subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                            stdout=subprocess.PIPE, **kw)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_process_finds_its_running_siblings_before_it_and_no_others():
    waiting = [child(WAITING, rank, stdin=subprocess.PIPE) for rank in (0, 1, 3, None)]
    try:
        pids = [int(p.stdout.readline()) for p in waiting]
        asked = child(ASKING, 2)
        found = asked.communicate(timeout=60)[0]
        assert found.strip() == str(sorted(pids[:2])), \
            "ranks 0 and 1: not 3 (after it), nor a sibling without the variable"
        waiting[0].stdin.close()
        waiting[0].wait(timeout=60)   # gone (reaped): no longer before it
        found = child(ASKING, 2).communicate(timeout=60)[0]
        assert found.strip() == str([pids[1]])
    finally:
        for p in waiting:
            if p.stdin and not p.stdin.closed:
                p.stdin.close()
            p.wait(timeout=60)


def test_a_process_of_no_launcher_has_no_siblings_before_it():
    assert siblings_before("RANK_NOWHERE_SET", 5) == []
