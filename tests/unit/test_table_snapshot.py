"""A table's snapshot, copied a span at a time while the store goes on changing: once
complete it holds the table as it was when taken, bit for bit."""
import os
import time

import numpy as np
import pytest

from mpips.base.budget import Budget
from mpips.base.forked import APART_BYTES, keep_from_children
from mpips.job.snapshot_write import SnapshotWrite
from mpips.models.optimizer import Optimizer
from mpips.server.store import KVStore


def sorted_items(store):
    keys, state = store.items()
    order = np.argsort(keys)
    return keys[order], state[order]


def mapped_in_a_child(address: int) -> bool:
    """Whether a child forked now has the page at `address` (its /proc/self/maps)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        with open("/proc/self/maps") as maps:
            mapped = any(int(lo, 16) <= address < int(hi, 16) for lo, hi in
                         (line.split()[0].split("-") for line in maps))
        os.write(write, b"1" if mapped else b"0")
        os._exit(0)
    os.close(write)
    seen = os.read(read, 1)
    os.waitpid(pid, 0)
    return seen == b"1"


def trained_store(rng, n=3000):
    store = KVStore(2, Optimizer("adagrad", lr=0.1), capacity=64)
    keys = np.unique(rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True))
    store.push(keys, rng.normal(size=(keys.shape[0], 2)).astype(np.float32), 0)
    return store, keys


@pytest.mark.parametrize("seed", range(6))
def test_a_snapshot_holds_the_table_as_taken_whatever_changes_meanwhile(seed):
    """Pushes to stored keys, new keys stored by pulls and pushes, the EMPTY-valued key, a
    growth of the table and removed keys, between spans of the copy."""
    rng = np.random.default_rng(seed)
    store, keys = trained_store(rng)
    if seed % 2:
        store.push(np.array([2**64 - 1], np.uint64), np.ones((1, 2), np.float32), 0)
    want = sorted_items(store)
    taken = store.take_snapshot()
    clock = 1
    while not taken.step(int(rng.integers(1, 400))):
        what = int(rng.integers(6))
        old = rng.choice(keys, 50)
        new = rng.integers(0, 2**64 - 1, 20, dtype=np.uint64, endpoint=True)
        if what <= 2:
            some = np.unique(np.concatenate([old, new]))
            store.push(some, rng.normal(size=(some.shape[0], 2)).astype(np.float32), clock)
        elif what == 3:
            store.pull(np.unique(new), np.empty((np.unique(new).shape[0], 2), np.float32))
        elif what == 4 and rng.random() < 0.2:
            many = rng.integers(0, 2**64 - 1, 4000, dtype=np.uint64, endpoint=True)
            store.push(np.unique(many), np.ones((np.unique(many).shape[0], 2), np.float32),
                       clock)   # the table grows: the rest is copied first
        elif what == 5 and rng.random() < 0.2:
            store.remove(np.unique(old[:5]))
        clock += 1
    got = sorted_items(store.snapshot_of(taken))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    live = sorted_items(store)
    assert live[0].shape != want[0].shape or not np.array_equal(live[1], want[1]), \
        "the live table moved on meanwhile"


def test_a_snapshot_given_up_leaves_the_store_as_it_was():
    store, keys = trained_store(np.random.default_rng(1))
    store.take_snapshot()
    store.end_snapshot()
    assert store.snapshot is None
    store.push(keys[:10], np.ones((10, 2), np.float32), 1)   # no copy is kept up


def test_a_large_table_is_left_out_of_forked_children():
    """A child would copy every page the server writes after the fork: it never sees them."""
    small = np.ones(1 << 10, np.uint8)
    assert not keep_from_children(small), "small arrays may share heap pages with others"
    big = np.ones(APART_BYTES, np.uint8)
    assert keep_from_children(big)
    assert not mapped_in_a_child(big.ctypes.data + big.nbytes // 2), \
        "the child has the array's pages"


def test_a_snapshot_write_forks_once_copied_and_its_array_serves_the_next():
    """The writer (a real fork) reads the table as it was at the clock, though keys were
    pushed before the copy was complete; the copy's array, counted against the budget, is
    kept for the next copy (its pages in memory), not made again."""
    rng = np.random.default_rng(3)
    store, keys = trained_store(rng)
    store.budget = Budget(limit=None)
    held = store.budget.held
    want = sorted_items(store)

    def write(table):
        got = sorted_items(table)
        return {"same": bool(np.array_equal(got[0], want[0])
                             and np.array_equal(got[1], want[1]))}

    forks = []
    file = SnapshotWrite(store, write, "server-0000.h5", lambda pid: None,
                         forked=lambda: forks.append(1))
    assert file.copying and store.budget.held == held + store.nbytes
    store.push(keys[:100], np.ones((100, 2), np.float32), 1)   # before any span is copied
    deadline = time.monotonic() + 60
    while (entry := file.poll()) is None:
        assert time.monotonic() < deadline, "the writer did not end within 60 s"
    assert entry == {"same": True, "table": "copied"} and forks == [1] and not file.copying
    assert store.snapshot is None and store.budget.held == held + store.nbytes
    want = sorted_items(store)
    again = SnapshotWrite(store, write, "server-0000.h5", lambda pid: None,
                          forked=lambda: forks.append(2))
    assert store.budget.held == held + store.nbytes, "the same array again"
    assert again.wait(60) == {"same": True, "table": "copied"} and forks == [1, 2]


def test_no_memory_for_the_copy_fails_the_file_not_the_server():
    store, _ = trained_store(np.random.default_rng(4))
    store.budget = Budget(limit=store.nbytes + store.nbytes // 2)
    store.budget.take(store.nbytes, "the table")
    file = SnapshotWrite(store, lambda table: {}, "server-0000.h5", lambda pid: None,
                         forked=lambda: None)
    entry = file.poll()
    assert "no memory for a copy of this server's table" in entry["error"]
    assert "--max-rank-memory" in entry["error"] and not file.copying
    assert store.snapshot is None and store.budget.held == store.nbytes


def test_a_large_copy_goes_to_its_own_writer_only():
    """A copy being made is left out of other forked children (its writes would copy the
    pages they share); its own writer, forked once it is complete, reads it."""
    store = KVStore(1, Optimizer("sgd", lr=0.1), capacity=APART_BYTES // 12 + 1)
    keys = np.arange(1, 5001, dtype=np.uint64)
    store.push(keys, np.ones((keys.shape[0], 1), np.float32), 0)
    want = sorted_items(store)
    file = SnapshotWrite(store, lambda table: {"same": bool(
        np.array_equal(sorted_items(table)[1], want[1]))}, "server-0000.h5", lambda pid: None,
        forked=lambda: None)
    copy = store.snapshot.rows
    assert copy.nbytes >= APART_BYTES
    assert not mapped_in_a_child(copy.ctypes.data + copy.nbytes // 2), "another child has the copy"
    assert file.wait(60) == {"same": True, "table": "copied"}, "its own writer read it"
