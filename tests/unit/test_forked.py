"""A checkpoint file written by a forked child (base/forked): the same bytes as a write in
the process, of the state at the fork whatever the process does after it; and a child that
fails, is killed mid-write, hangs, or loses its parent, is reported and leaves nothing."""
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from mpips.base.forked import ForkedWrite
from mpips.base.processes import process_state
from mpips.job.server_files import SPREAD_MOST_S, spread_of
from mpips.models.optimizer import Optimizer
from mpips.server.replicas import PrimaryKeys
from mpips.server.store import KVStore
from mpips.storage import checkpoint
from mpips.wire.placement import Placement

BOUND_S = 30.0   # every wait here is for something that takes well under a second


def store_of(n: int, seed: int = 0) -> KVStore:
    store = KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.1))
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 2**64 - 1, n, dtype=np.uint64))
    store.push(keys, rng.normal(size=(keys.shape[0], 1)).astype(np.float32), 0)
    return store


def wait_for(done, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not done():
        assert time.monotonic() < deadline, f"waited {BOUND_S:g} s for {what}"
        time.sleep(0.005)


def gone(pid: int) -> bool:
    found = process_state(pid)
    return found is None or found.state in ("Z", "X")


def test_a_forked_file_is_the_inline_one_bit_for_bit_at_the_fork(tmp_path):
    store = store_of(20_000)
    inline = checkpoint.write_shard(str(tmp_path / "inline"), 7, 0, store, {"run_id": "r"})
    forked = ForkedWrite(lambda: checkpoint.write_shard(str(tmp_path / "forked"), 7, 0, store,
                                                        {"run_id": "r"}), "server-0000.h5")
    # The process goes on at once: pushes and new keys after the fork are not in the file.
    store.push(np.arange(1, 5000, dtype=np.uint64), np.ones((4999, 1), np.float32), 1)
    entry = forked.wait(BOUND_S)
    assert entry == inline
    ours = (tmp_path / "forked" / "clock-000000000007" / "server-0000.h5").read_bytes()
    theirs = (tmp_path / "inline" / "clock-000000000007" / "server-0000.h5").read_bytes()
    assert ours == theirs
    assert forked.poll() == entry, "asked again, the same entry"


@pytest.mark.parametrize("replicas", [1, 2], ids=["own keys", "primary keys of copies"])
def test_a_streamed_shard_holds_what_write_shard_writes(tmp_path, replicas):
    """Block by block (a forked writer's way): the same datasets, attributes and entry;
    with copies of other servers' ranges, only the keys it is primary for; the key equal to
    the table's empty marker too."""
    store = store_of(30_000, seed=4)
    store.push(np.array([2**64 - 1], np.uint64), np.ones((1, 1), np.float32), 0)
    own = PrimaryKeys(store, Placement(2, replicas), 0)
    whole = checkpoint.write_shard(str(tmp_path / "whole"), 3, 0, own, {"run_id": "r"},
                                   ranges=own.ranges())
    halves = []
    streamed = checkpoint.stream_shard(str(tmp_path / "streamed"), 3, 0, own, {"run_id": "r"},
                                       ranges=own.ranges(), midway=lambda: halves.append(1),
                                       rows=1000)
    assert streamed == whole and halves == [1]
    assert whole["keys"] < len(store) if replicas > 1 else whole["keys"] == len(store)
    name = os.path.join("clock-000000000003", "server-0000.h5")
    with h5py.File(tmp_path / "whole" / name) as a, h5py.File(tmp_path / "streamed" / name) as b:
        for dataset in ("keys", "state"):
            assert a[dataset][()].tobytes() == b[dataset][()].tobytes()
        assert dict(a.attrs) == dict(b.attrs)
    assert 2**64 - 1 in checkpoint_keys(tmp_path / "streamed" / name) or replicas > 1


def test_a_spread_out_shard_takes_its_time_and_is_the_same_file(tmp_path):
    """A periodic checkpoint's file paced over `spread` seconds (job.server_files.spread_of):
    no sooner, block by block, and byte for byte the file written at once."""
    store = store_of(20_000, seed=5)
    own = PrimaryKeys(store, Placement(1), 0)
    at_once = checkpoint.stream_shard(str(tmp_path / "once"), 4, 0, own, {"run_id": "r"},
                                      rows=1000)
    began = time.monotonic()
    spread = checkpoint.stream_shard(str(tmp_path / "spread"), 4, 0, own, {"run_id": "r"},
                                     rows=1000, spread=0.5)
    assert time.monotonic() - began >= 0.5
    assert spread == at_once
    name = os.path.join("clock-000000000004", "server-0000.h5")
    assert (tmp_path / "once" / name).read_bytes() == (tmp_path / "spread" / name).read_bytes()
    assert spread_of(3.0) == 1.5 and spread_of(600.0) == SPREAD_MOST_S
    assert spread_of(0.0) == spread_of(None) == 0.0, "checkpoints by clocks: at once"


def test_a_paced_writer_told_to_hurry_goes_at_full_speed(tmp_path):
    """A stop, or the job's end, waits for the paced file being written: the server says
    `hurry`, and its writer (a forked child here, sharing the flag's page) stops pacing."""
    store = store_of(20_000, seed=6)
    own = PrimaryKeys(store, Placement(1), 0)
    checkpoint.hurry(False)
    began = time.monotonic()
    child = ForkedWrite(lambda: checkpoint.stream_shard(str(tmp_path), 5, 0, own, {},
                                                         rows=1000, spread=BOUND_S),
                        "server-0000.h5")
    try:
        assert child.poll() is None, "pacing: 30 s for its blocks"
        checkpoint.hurry()
        entry = child.wait(BOUND_S)
    finally:
        checkpoint.hurry(False)
    assert entry["keys"] == len(store) and time.monotonic() - began < BOUND_S / 2


def checkpoint_keys(path) -> set:
    with h5py.File(path) as f:
        return set(f["keys"][()].tolist())


def test_a_writer_that_fails_says_why(tmp_path):
    def failing() -> dict:
        raise OSError(28, "No space left on device")

    entry = ForkedWrite(failing, "server-0001.h5").wait(BOUND_S)
    assert entry["error"].startswith("the writer of server-0001.h5 (process ")
    assert "failed (exit status 1): OSError: [Errno 28] No space left on device" in entry["error"]


def test_a_writer_killed_mid_write_leaves_no_file(tmp_path):
    """Its temporary file is written, then it waits (as a slow disk makes it): SIGKILL."""
    tmp = tmp_path / "server-0000.h5.tmp"
    go_on = tmp_path / "go-on"

    def slow() -> dict:
        tmp.write_bytes(b"half a file")
        wait_for(go_on.exists, "the test")   # never comes: the writer is killed first
        return {}

    removed = []
    writer = ForkedWrite(slow, "server-0000.h5",
                         cleanup=lambda pid: (removed.append(pid), os.remove(tmp)))
    wait_for(tmp.exists, "the writer's temporary file")
    assert writer.poll() is None, "still writing"
    os.kill(writer.pid, signal.SIGKILL)
    wait_for(lambda: writer.poll() is not None, "the killed writer to be reaped")
    assert "was killed by signal 9 (SIGKILL) before it finished" in writer.poll()["error"]
    assert removed == [writer.pid] and not tmp.exists()


def test_the_jobs_stop_signals_do_not_cut_a_write(tmp_path):
    """Ctrl-C or Slurm's SIGTERM reach the writer too: the stopping job waits for its file."""
    started, go_on = tmp_path / "started", tmp_path / "go-on"

    def write() -> dict:
        started.write_text("")
        wait_for(go_on.exists, "the test")
        return {"file": "f"}

    writer = ForkedWrite(write, "f")
    wait_for(started.exists, "the writer to start")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        os.kill(writer.pid, sig)
    go_on.write_text("")
    assert writer.wait(BOUND_S) == {"file": "f"}


def test_a_writer_that_hangs_is_stopped_at_the_bound(tmp_path):
    writer = ForkedWrite(lambda: wait_for(lambda: False, "nothing") or {}, "server-0000.h5")
    entry = writer.wait(0.2)
    assert "did not finish within 0.2 s and was stopped" in entry["error"]
    assert gone(writer.pid)


def test_a_writer_dies_with_its_parent(tmp_path):
    """The rank is killed outright mid-write: its writer must not outlive it."""
    pid_file = tmp_path / "writer.pid"
    script = (f"import time\n"
              f"from mpips.base.forked import ForkedWrite\n"
              f"w = ForkedWrite(lambda: time.sleep({BOUND_S}) or {{}}, 'f')\n"
              f"open({str(pid_file)!r}, 'w').write(str(w.pid))\n"
              f"time.sleep({BOUND_S})\n")
    rank = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), "the writer's pid")
        writer = int(pid_file.read_text())
        assert not gone(writer)
        rank.kill()
        rank.wait(BOUND_S)
        wait_for(lambda: gone(writer), f"the writer (process {writer}) to die with its parent")
    finally:
        rank.kill()


@pytest.mark.parametrize("text", ["kill rank 0 at writing 2", "busy rank 1 for 2 s at writing 17"])
def test_writing_is_a_servers_point(text, monkeypatch):
    from mpips.run import testevents
    assert testevents.parse(text).point == "writing"
    monkeypatch.setenv(testevents.ENABLE, "1")
    testevents.check([text], n_ranks=4, n_servers=2, full_batch=False)
    with pytest.raises(testevents.EventError, match="only servers write checkpoints"):
        testevents.check([text], n_ranks=4, n_servers=0, full_batch=False)
