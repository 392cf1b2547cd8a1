"""A server's resident writer (base.writer_process, job.snapshot_write.Resident): forked once,
it writes each checkpoint from the live table it reads in place or from the table's copy in
shared memory (each test both ways where both apply); one killed mid-write, or frozen, is
reported and the next checkpoint gets a new one; without shared memory the checkpoint is
written by a forked child as before."""
import os
import signal

import numpy as np
import pytest

from mpips.base import shared_memory
from mpips.base.budget import Budget
from mpips.base.writer_process import WriterProcess
from mpips.job.snapshot_write import Resident, SnapshotWrite
from mpips.server.live_snapshot import LiveSnapshot
from unit.test_forked import BOUND_S, gone, wait_for
from unit.test_table_snapshot import sorted_items, trained_store


def same_as(want):
    """A resident's work: whether the table it reads is `want` (keys, state); a task may ask
    it to die or hang there, as a test event would."""
    def work(task, table) -> dict:
        if task.get("die"):
            os.kill(os.getpid(), signal.SIGKILL)
        if task.get("hang"):
            wait_for(lambda: False, "nothing")
        got = sorted_items(table)
        return {"same": bool(np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])),
                "pid": os.getpid()}
    return work


def write(store, resident, task=None, forks=None):
    return SnapshotWrite(store, lambda table: resident.work(task or {}, table), "server-0000.h5",
                         lambda pid: None, forked=lambda: forks.append(1) if forks is not None
                         else None, resident=resident, task=task or {})


WAYS = pytest.mark.parametrize("live", [True, False], ids=["read-in-place", "copied"])


@WAYS
def test_the_resident_writes_each_table_and_is_forked_once(live):
    rng = np.random.default_rng(5)
    store, keys = trained_store(rng)
    want = sorted_items(store)
    resident = Resident(store, same_as(want), live=live)
    try:
        first = write(store, resident)
        if live:
            assert not first.copying and isinstance(first._taken, LiveSnapshot)
        else:
            assert first.copying and first._taken.shared is not None, "the copy in shared memory"
        store.push(keys[:50], np.ones((50, 2), np.float32), 1)   # after the take: not in it
        one = first.wait(BOUND_S)
        assert one["same"] and one["pid"] == first.pid != os.getpid()
        want = sorted_items(store)
        resident.work = same_as(want)   # (the child has the work it was forked with)
        second = write(store, resident)
        two = second.wait(BOUND_S)
        assert two["pid"] == one["pid"], "the same process, no fork"
        assert not two["same"], "its work is the one it was forked with (the earlier table)"
    finally:
        resident.close()
    assert gone(one["pid"])


@WAYS
def test_a_resident_killed_mid_write_is_reported_and_replaced(live):
    store, _ = trained_store(np.random.default_rng(6))
    resident = Resident(store, same_as(sorted_items(store)), live=live)
    try:
        file = write(store, resident, {"die": True})
        entry = file.wait(BOUND_S)
        assert "was killed by signal 9 (SIGKILL) before it finished" in entry["error"]
        assert store.snapshot is None, "nothing logged or copied any more"
        assert (store._spare is None) == live, "a copy given back"
        again = write(store, resident)
        entry = again.wait(BOUND_S)
        assert entry["same"] and again.pid != file.pid, "a new resident"
    finally:
        resident.close()


@WAYS
def test_a_frozen_resident_is_stopped_at_the_bound_and_replaced(live):
    store, _ = trained_store(np.random.default_rng(7))
    resident = Resident(store, same_as(sorted_items(store)), live=live)
    removed: list = []
    try:
        file = SnapshotWrite(store, lambda table: {}, "server-0000.h5", removed.append,
                             forked=lambda: None, resident=resident, task={"hang": True})
        entry = file.wait(0.3)
        assert "did not finish within 0.3 s and was stopped" in entry["error"]
        assert gone(file.pid) and removed == [file.pid], "killed, what it left removed"
        assert write(store, resident).wait(BOUND_S)["same"]
    finally:
        resident.close()


def test_a_failed_write_ends_the_resident():
    """After a failure (HDF5 may be left unsound) it answers, then ends: a new one follows."""
    process = WriterProcess(lambda task, fds: {"error": "disk full"}, "f")
    process.start({}, [])
    wait_for(lambda: process.poll() is not None or not process.busy, "the answer")
    assert process.ended is not None and gone(process.pid)


@WAYS
def test_without_shared_memory_a_forked_child_writes_it(monkeypatch, live):
    """(Reading in place needs a shared block for the writer's flag: a copy is made.)"""
    def refused(*args):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(shared_memory.os, "memfd_create", refused)
    store, _ = trained_store(np.random.default_rng(8))
    store.budget = Budget(limit=None)
    resident = Resident(store, same_as(sorted_items(store)), live=live)
    forks: list = []
    try:
        file = write(store, resident, forks=forks)
        assert file._taken.shared is None and store.budget.held == store.nbytes
        entry = file.wait(BOUND_S)
        assert entry["same"] and entry["table"] == "copied" and forks == [1]
        assert (resident._process is None) != live, "a resident made only to ask"
    finally:
        resident.close()


@WAYS
def test_a_resident_dead_between_writes_is_replaced_at_the_next(live):
    """Killed while idle (the out-of-memory killer): the next write forks another."""
    store, _ = trained_store(np.random.default_rng(9))
    resident = Resident(store, same_as(sorted_items(store)), live=live)
    try:
        resident.ready()
        first = resident._process.pid
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: gone(first), "the resident to die")
        file = write(store, resident)
        entry = file.wait(BOUND_S)
        assert entry["same"] and file.pid != first
        assert entry["table"] == ("read in place" if live else "copied")
    finally:
        resident.close()


def test_snapshots_are_written_by_the_resident_as_the_last_one_is_in_the_loop(tmp_path):
    """--snapshot-every: each numbered snapshot's file by the one resident writer (no fork
    per file), the same file as the final one written in the server's own process."""
    from types import SimpleNamespace

    import h5py

    from mpips.job.server_files import resident_writer, snapshot_writer
    from mpips.server.replicas import PrimaryKeys
    from mpips.wire.clocks import ClockTable
    from mpips.wire.placement import Placement

    store, _ = trained_store(np.random.default_rng(9))
    own = PrimaryKeys(store, Placement(1), 0)
    roles = SimpleNamespace(index=0, servers=[0])
    cfg = SimpleNamespace(run_dir=str(tmp_path), checkpoints=str(tmp_path / "checkpoints"),
                          checkpointing=SimpleNamespace(on=False, inline=False))
    resident = resident_writer(cfg, roles, "run", own)
    snapshot = snapshot_writer(cfg, roles, own, {"run_id": "run"}, ClockTable(1, 0),
                               lambda: 7, 0.0, resident)
    try:
        writes = [snapshot(False) for _ in range(2)]
        entries = [w.wait(BOUND_S) for w in writes]
        assert snapshot(True) is None
    finally:
        resident.close()
    assert [e["file"] for e in entries] == [
        str(tmp_path / "snapshots" / label / "server-0000.h5") for label in ("0000", "0001")]
    assert writes[0].pid == writes[1].pid != os.getpid(), "one resident writer"
    files = [h5py.File(tmp_path / "snapshots" / label / "server-0000.h5")
             for label in ("0000", "0001", "final")]
    for f in files:
        assert f.attrs["examples"] == 7 and f.attrs["n_servers"] == 1 and f.attrs["complete"]
        assert sorted(f) == ["keys", "weights"]
        for name in ("keys", "weights"):
            assert np.array_equal(f[name][()], files[-1][name][()])


def test_the_resident_holds_none_of_its_parents_pipes():
    """A pipe the server opened before the resident was forked (the snapshot scorer's stdin,
    which it reads to its end): once the server closes its end, the reader sees the end,
    though the resident lives on. Held open, the lead's wait for the scorer took its bound."""
    import select

    store, _ = trained_store(np.random.default_rng(8))
    read, write_end = os.pipe()
    resident = Resident(store, lambda task, table: {})
    try:
        assert resident.idle() is not None   # forked now, with the pipe open here
        os.close(write_end)
        readable, _, _ = select.select([read], [], [], BOUND_S)
        assert readable and os.read(read, 1) == b"", "the pipe's end, seen"
        assert resident.idle() is not None, "the resident still lives"
    finally:
        resident.close()
        os.close(read)
