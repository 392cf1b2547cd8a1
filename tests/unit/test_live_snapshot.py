"""A table read in place by another process as of a moment (server.live_snapshot): whatever
the server changes before, during or after the read, the reader gets the table as taken, bit
for bit; a table that must grow waits for the read, within its bound; a reader that dies or
freezes leaves the server serving and logging nothing more. Real processes: a forked reader
reads this one's memory with process_vm_readv; the steps meet at events (pipes), not times."""
import contextlib
import logging
import os
import signal

import numpy as np
import pytest

from mpips.base import process_memory
from mpips.job.snapshot_write import Resident, SnapshotWrite
from mpips.server import live_snapshot
from mpips.server.live_snapshot import READ, LiveSnapshot, read_table
from unit.test_forked import BOUND_S, gone, wait_for
from unit.test_resident_writer import same_as
from unit.test_table_snapshot import sorted_items, trained_store

WHEN = ("before the read", "between the read and the flag", "between the flag and its sight",
        "once seen")


def change(store, keys, rng, clock: int) -> None:
    """Pushes to stored keys and new ones, new keys stored by a pull, the EMPTY-valued key."""
    old = rng.choice(keys, 50)
    new = rng.integers(0, 2**64 - 1, 20, dtype=np.uint64, endpoint=True)
    some = np.unique(np.concatenate([old, new]))
    store.push(some, rng.normal(size=(some.shape[0], 2)).astype(np.float32), clock)
    fresh = np.unique(rng.integers(0, 2**64 - 1, 20, dtype=np.uint64, endpoint=True))
    store.pull(fresh, np.empty((fresh.shape[0], 2), np.float32))
    if clock % 2:
        store.push(np.array([2**64 - 1], np.uint64), np.ones((1, 2), np.float32), clock)


def unlimited_room(store, keys: int) -> None:
    """No growth while the reader may read (a growth waits for it: another test)."""
    store.reserve(len(store) + keys)


def reader(store, taken: LiveSnapshot, out: str, steps: tuple | None = None,
           first: int | None = None) -> int:
    """A child that reads `taken` (read_table) and saves what it read, sorted, to `out`;
    with `steps` (a pipe to say, one to wait on), it says when it has read the table and
    waits before it raises its flag; with `first` (a pipe), it waits on it before it reads."""
    task, fd = taken.task(), taken.shared.fd
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        if first is not None:
            assert os.read(first, 1) == b"g"
        if steps is not None:
            said, go = steps
            read_into = process_memory.read_into
            calls = []

            def paused(*args):
                read_into(*args)
                calls.append(1)
                if len(calls) == 1:   # the table: the flag is raised after this returns
                    os.write(said, b"r")
                    assert os.read(go, 1) == b"g"
            process_memory.read_into = paused
        rows = read_table(task, fd, None)
        keys, state = sorted_items(store.reading(rows, np.array(task["meta"], np.int64)))
        np.save(out + ".keys.npy", keys)
        np.save(out + ".state.npy", state)
        code = 0
    finally:
        os._exit(code)


def read_back(out: str) -> tuple:
    return (np.load(out + ".keys.npy", allow_pickle=False),
            np.load(out + ".state.npy", allow_pickle=False))


def exited(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@contextlib.contextmanager
def reaped(pid: int):
    """The reader killed and reaped if a test ends before it has (a failed assertion)."""
    try:
        yield pid
    finally:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


@pytest.mark.parametrize("when", [*WHEN, "throughout"])
def test_the_reader_gets_the_table_as_taken_whenever_it_changes(tmp_path, when):
    rng = np.random.default_rng(len(when))
    store, keys = trained_store(rng)
    unlimited_room(store, 1000)
    want = sorted_items(store)
    taken = store.take_live(lambda live: pytest.fail("no growth here"))
    said_r, said_w = os.pipe()
    go_r, go_w = os.pipe()
    clock = 1

    def changes(phase):
        nonlocal clock
        if when in (phase, "throughout"):
            for _ in range(5):
                change(store, keys, rng, clock)
                clock += 1

    changes("before the read")
    with reaped(reader(store, taken, str(tmp_path / "read"), (said_w, go_r))) as pid:
        assert os.read(said_r, 1) == b"r", "the reader read the table"
        changes("between the read and the flag")
        os.write(go_w, b"g")
        wait_for(lambda: taken._block[READ], "the reader's flag")
        changes("between the flag and its sight")
        assert not taken.read, "logging until the server has seen the flag"
        assert taken.acknowledge() and taken.read
        assert exited(pid) == 0
    logged = taken._logged
    changes("once seen")
    assert taken._logged == logged, "nothing logged once the flag was seen"
    got = read_back(str(tmp_path / "read"))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    if when != "once seen":
        assert logged > 0, "rows changed before the flag was seen were logged"
    live = sorted_items(store)
    assert live[0].shape != want[0].shape or not np.array_equal(live[1], want[1]), \
        "the live table moved on meanwhile"
    store.end_snapshot()
    assert not store._live_log[2].any(), "the flags cleared for the next"


@pytest.mark.parametrize("round_", range(2))
def test_reads_racing_the_servers_changes_still_get_the_table_as_taken(tmp_path, round_):
    """No pause: the reader reads a 27 MB table while this process changes it as fast as
    it can, until the flag is up and a little after; each interleaving must give the same."""
    rng = np.random.default_rng(100 + round_)
    store, keys = trained_store(rng, n=1_000_000)
    unlimited_room(store, 200_000)
    want = sorted_items(store)
    taken = store.take_live(lambda live: pytest.fail("no growth here"))
    clock, after = 1, 0
    with reaped(reader(store, taken, str(tmp_path / "read"))) as pid:
        while after < 3:
            some = np.unique(rng.choice(keys, 2000))
            store.push(some, rng.normal(size=(some.shape[0], 2)).astype(np.float32), clock)
            fresh = np.unique(rng.integers(0, 2**64 - 1, 50, dtype=np.uint64, endpoint=True))
            store.pull(fresh, np.empty((fresh.shape[0], 2), np.float32))
            clock += 1
            after += taken.acknowledge()   # (between two "requests")
            assert clock < 10_000, "the reader never raised its flag"
        assert exited(pid) == 0
    got = read_back(str(tmp_path / "read"))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_keys_stored_as_the_writer_reads_are_logged_before_it_reads_the_log(tmp_path):
    """A lookup stores new keys (the table's kernel), then logs their rows as empty: the
    writer reads the table, keys and all, and raises its flag in between. It reads the log
    only once the server has seen the flag, after the lookup: the new keys are not in what
    it writes (taking the flag itself as the end of logging, it wrote them)."""
    rng = np.random.default_rng(11)
    store, keys = trained_store(rng)
    unlimited_room(store, 100)
    want = sorted_items(store)
    taken = store.take_live(lambda live: pytest.fail("no growth here"))
    go_r, go_w = os.pipe()
    stored_in = taken.stored_in

    def in_the_window(rows, fresh):
        os.write(go_w, b"g")   # the keys are stored: the writer reads now
        wait_for(lambda: taken._block[READ], "the reader's flag")
        stored_in(rows, fresh)
    taken.stored_in = in_the_window
    with reaped(reader(store, taken, str(tmp_path / "read"), first=go_r)) as pid:
        new = np.unique(rng.integers(0, 2**64 - 1, 30, dtype=np.uint64, endpoint=True))
        store.pull(new, np.empty((new.shape[0], 2), np.float32))
        assert taken._logged >= new.shape[0], "the new keys' rows logged, as empty"
        wait_for(taken.acknowledge, "the reader's flag to be seen")
        assert exited(pid) == 0
    got = read_back(str(tmp_path / "read"))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def start_write(store, resident, **bounds) -> SnapshotWrite:
    """A checkpoint's write by `resident` (its work: the resident's own), as a server starts
    one."""
    return SnapshotWrite(store, lambda table: {}, "server-0000.h5", lambda pid: None,
                         forked=lambda: None, resident=resident, task={}, **bounds)


def stopped_resident(store, want, live_ok=True):
    resident = Resident(store, same_as(want))
    resident.ready()
    assert resident.live is live_ok, resident.why_not_live
    os.kill(resident._process.pid, signal.SIGSTOP)
    return resident


def grow(store, rng) -> None:
    many = np.unique(rng.integers(0, 2**64 - 1, 4 * store.capacity, dtype=np.uint64))
    store.push(many, np.ones((many.shape[0], 2), np.float32), 1)


def test_a_table_that_must_grow_waits_for_the_read(monkeypatch):
    """The writer frozen before it reads; the table must grow: the server waits (and the
    writer goes on then, at that event), and the file is the table as taken."""
    rng = np.random.default_rng(7)
    store, _ = trained_store(rng)
    want = sorted_items(store)
    resident = stopped_resident(store, want)
    waited = []
    await_read = SnapshotWrite._await_read

    def resumed(self, live):
        waited.append(live.read)
        os.kill(self.pid, signal.SIGCONT)
        await_read(self, live)
    monkeypatch.setattr(SnapshotWrite, "_await_read", resumed)
    try:
        file = start_write(store, resident)
        generation = store.generation
        grow(store, rng)
        assert store.generation > generation and waited == [False], "waited for the read"
        entry = file.wait(BOUND_S)
        assert entry["same"] and entry["table"] == "read in place"
        assert store.snapshot is None
    finally:
        resident.close()


@pytest.mark.parametrize("grows", [True, False], ids=["the table grows", "it serves on"])
def test_a_writer_that_never_reads_is_stopped_at_its_bound(grows):
    """Frozen before it reads: the server stops it within the bound, whether it waits for
    the read (a growth) or polls the write between requests (logging rows meanwhile)."""
    rng = np.random.default_rng(8)
    store, keys = trained_store(rng)
    want = sorted_items(store)
    resident = stopped_resident(store, want)
    try:
        file = start_write(store, resident, read_within=0.3)
        writer, taken = file.pid, store.snapshot
        if grows:
            grow(store, rng)
            entry = file.poll()
        else:
            change(store, keys, rng, 1)
            wait_for(lambda: file.poll() is not None, "the bound")
            entry = file.poll()
        assert gone(writer), "the frozen writer was stopped"
        assert taken.read and store.snapshot is None, "nothing is logged any more"
        waited = ("the server had to rebuild it" if grows
                  else "the server logged the rows it changed")
        assert f"had not read the table within 0.3 s while {waited}" in entry["error"]
        again = start_write(store, resident)
        entry = again.wait(BOUND_S)
        assert again.pid != writer and entry["table"] == "read in place"
        assert not entry["same"], "the table as it is now"
    finally:
        resident.close()


def test_a_writer_killed_before_it_reads_leaves_the_server_logging_nothing():
    rng = np.random.default_rng(9)
    store, keys = trained_store(rng)
    want = sorted_items(store)
    resident = stopped_resident(store, want)
    try:
        file = start_write(store, resident)
        taken = store.snapshot
        os.kill(file.pid, signal.SIGKILL)
        wait_for(lambda: file.poll() is not None, "the writer's end to be seen")
        assert "was killed by signal 9 (SIGKILL)" in file.poll()["error"]
        assert store.snapshot is None and taken.read, "given up: nothing logged"
        change(store, keys, rng, 1)
        assert taken._logged == 0
        assert write_now(store, resident)["table"] == "read in place", "a new writer reads it"
    finally:
        resident.close()


def write_now(store, resident) -> dict:
    return start_write(store, resident).wait(BOUND_S)


@pytest.mark.parametrize("refused", ["EPERM", "aarch64"])
def test_where_the_writer_may_not_read_in_place_the_table_is_copied(monkeypatch, caplog,
                                                                     refused):
    """As where Yama's ptrace_scope forbids the read (EPERM), or on a CPU whose store order
    the read cannot rely on (ARM, POWER): the writer says why as it starts, and every
    checkpoint is written from a copy."""
    if refused == "EPERM":
        def read_into(pid, address, out):
            raise OSError(1, "Operation not permitted")
        monkeypatch.setattr(process_memory, "read_into", read_into)   # (the writer forked after)
        why = "not permitted"
    else:
        monkeypatch.setattr(live_snapshot.platform, "machine", lambda: "aarch64")
        why = "aarch64 CPU does not keep the order of its stores"
    store, _ = trained_store(np.random.default_rng(10))
    resident = Resident(store, same_as(sorted_items(store)))
    try:
        with caplog.at_level(logging.WARNING, logger="mpips"):
            resident.ready()
        assert resident.live is False and why in resident.why_not_live
        assert "writer may not read the server's memory in place" in caplog.text
        assert why in caplog.text
        entry = write_now(store, resident)
        assert entry["same"] and entry["table"] == "copied"
    finally:
        resident.close()


def test_a_prepared_writer_reads_into_the_array_it_made_ahead(tmp_path):
    """prepare: the writer makes and touches its array for the table as it is (once the
    table is filled), and the first checkpoint's read goes into it; none is forked for it."""
    store, _ = trained_store(np.random.default_rng(12))
    resident = Resident(store, lambda task, table: {"keys": len(table)})
    try:
        resident.prepare()
        assert resident._process is None, "no writer forked to prepare"
        resident.ready()
        resident.prepare()
        assert resident.idle() is None or not resident._preparing
        wait_for(lambda: resident.idle() is not None, "the array to be made")
        entry = write_now(store, resident)
        assert entry == {"keys": len(store), "table": "read in place"}
    finally:
        resident.close()
