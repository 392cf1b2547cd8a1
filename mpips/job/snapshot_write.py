"""A checkpoint's shard, or a snapshot's, written from the table as it was at its clock or
moment, by the server's resident writer (base.writer_process: forked as the server starts,
or at its first file, and kept); the server only sends it a line of JSON.

The writer reads the live table in place (server.live_snapshot), where this system lets a
child read its parent's memory: the writer finds out with a small read as it starts. Else
the table is copied a span of rows at a time between the server's requests
(server.table_snapshot) into shared memory, which the writer maps. Without shared memory,
or while the resident writer is busy, a child forked for the write (base.forked) writes it
from the copy: the live table is kept out of it (base.forked.keep_from_children), so the
server's writes after the fork copy no pages.
"""
import logging
import os
import time
from collections.abc import Callable

import numpy as np

from ..base import process_memory
from ..base.budget import OverBudget
from ..base.forked import POLL_S, ForkedWrite, keep_from_children, waited
from ..base.shared_memory import mapped
from ..base.writer_process import WriterProcess
from ..server.live_snapshot import LiveSnapshot, read_table, why_not_here
from ..server.store import KVStore
from ..server.table_snapshot import TableSnapshot

log = logging.getLogger("mpips")

# How long a writer may take to read the live table (the server logs the rows it changes
# meanwhile, and a table to be rebuilt waits for it): 10^7 keys take 0.05-0.2 s.
READ_WAIT_S = 60.0
PROBE_WAIT_S = 10.0   # ... and for a writer just forked to say whether it can read the table


class Resident:
    """A server's resident writer: `work(task, table)` run in a process forked at the start
    (`ready`) or the first write, and kept (another one forked if it ended), over a store
    reading the table as the task's moment left it: read in place from this process (`live`)
    or mapped from a copy in shared memory."""

    def __init__(self, store: KVStore, work: Callable[[dict, KVStore], dict],
                 live: bool = True, before_read: Callable[[dict], None] = lambda task: None):
        """`live`: read the live table where this system allows it (else always a copy);
        `before_read(task)`: called in the process before it reads the live table."""
        self._store, self.work, self._before_read = store, work, before_read
        self._process: WriterProcess | None = None
        # Whether the process reads this one's memory (asked as it is forked), and why not.
        self.live, self.why_not_live = False, "" if live else "not asked to"
        self._ask = live
        self._said = False   # why it does not read in place, said once
        self._probe = np.arange(64, dtype=np.uint64)   # what it reads to find out
        self._preparing = False   # its array for the table being made (see prepare)
        self._rows: np.ndarray | None = None   # in the process: the table it read last

    def ready(self) -> None:
        """The process forked now (at the start, while the server is small: a cheap fork,
        and none at the first checkpoint)."""
        self.idle()

    def prepare(self) -> None:
        """If the process reads the live table: it makes its array for the table as it is
        now, every page touched, while it has nothing else to do (once the table is filled
        or loaded), so that the first checkpoint does not touch them as it reads. A table
        grown since takes a new array at its next checkpoint. Nothing if none was forked
        (`ready`): jobs without checkpoints fork none."""
        process = self.reads_live() if self._process is not None else None
        if process is not None:
            shape, dtype = self._store.layout
            process.start({"prepare": {"shape": list(shape), "dtype": dtype.str}}, [])
            self._preparing = True

    def idle(self) -> WriterProcess | None:
        """The process, ready for a task (forked now if none lives); None if it is busy."""
        process = self._process
        if process is not None and self._preparing and process.busy:
            self._preparing = process.poll() is None
        if process is not None and not process.idle and process.ended is not None:
            process = None   # it failed, was stopped, or died between writes
        if process is None:
            process = self._process = WriterProcess(self._in_child,
                                                    "a checkpoint's or snapshot's file")
            if self._ask:
                self.live, self.why_not_live = self._reads_here(process)
                if not self.live and not self._said:
                    self._said = True
                    log.warning("checkpoints copy this server's table: its writer may not read "
                                "the server's memory in place (%s)", self.why_not_live)
        return process if process.idle else None

    def reads_live(self) -> WriterProcess | None:
        """The process, ready for a task, if it reads the live table; else None."""
        if not self._ask:
            return None
        process = self.idle()
        return process if process is not None and self.live else None

    def _reads_here(self, process: WriterProcess) -> tuple[bool, str]:
        """Whether a process just forked reads this one's memory (its first task, a small
        read, waited for: a few ms), and why not."""
        if not process_memory.available():
            return False, "this system has no process_vm_readv"
        why = why_not_here()
        if why:
            return False, why
        process_memory.allow_reader(process.pid)
        process.start({"probe": self._probe.ctypes.data}, [])
        answer = process.wait(PROBE_WAIT_S)
        return bool(answer.get("live")), answer.get("why", answer.get("error", ""))

    def close(self) -> None:
        """The process ends (between writes)."""
        if self._process is not None:
            self._process.close()
            self._process = None

    def _in_child(self, task: dict, fds: list) -> dict:
        if "probe" in task:
            return self._read_probe(task["probe"])
        if "prepare" in task:
            layout = task["prepare"]
            self._rows = np.empty(tuple(layout["shape"]), np.dtype(layout["dtype"]))
            self._rows.fill(0)   # (np.zeros would leave the pages untouched)
            return {"prepared": layout["shape"]}
        if "live" in task:
            live = task["live"]
            self._before_read(task)
            rows = self._rows = read_table(live, fds[0], self._rows)
            meta = live["meta"]
        else:
            rows, meta = mapped(fds[0], tuple(task["shape"]), task["dtype"]), task["meta"]
        return self.work(task, self._store.reading(rows, np.array(meta, np.int64)))

    def _read_probe(self, address: int) -> dict:
        """In the process: whether it reads its parent's copy of `_probe` (the same as its
        own, forked from it)."""
        seen = np.zeros_like(self._probe)
        try:
            process_memory.read_into(os.getppid(), address, seen)
        except OSError as e:
            return {"live": False, "why": str(e)}
        if not np.array_equal(seen, self._probe):
            return {"live": False, "why": "it read other values than its parent holds"}
        return {"live": True}


class SnapshotWrite:
    """A ShardWrite (server.context): the file written from a store that reads the table as
    it was when this was made, by the resident writer or else `write(store)` in a forked
    child; `forked()` is called in this process once the writer has it."""

    def __init__(self, store: KVStore, write: Callable[[KVStore], dict], what: str,
                 cleanup: Callable[[int], None], forked: Callable[[], None],
                 resident: Resident | None = None, task: dict | None = None,
                 read_within: float = READ_WAIT_S):
        """`resident`: the process that writes it if idle (reading the live table, or the
        copy in shared memory), `task` what it is told (JSON; `write` is then resident.work
        over the task); `read_within`: how long a writer may take to read the live table
        (the server logs the rows it changes meanwhile), else it is stopped."""
        self.started = time.monotonic()   # the state is the table's now
        self.pid = os.getpid()            # the writer's, once forked
        self._store, self._write, self.what = store, write, what
        self._cleanup, self._forked = cleanup, forked
        self._resident, self._task, self._read_within = resident, task, read_within
        self._file: ForkedWrite | WriterProcess | None = None
        self._entry: dict | None = None   # before a writer, or none: why
        self._done: dict | None = None    # the write's entry, once it has ended
        self._answer: dict | None = None  # the writer's, if it came while the read was awaited
        self.how = "copied"   # how the writer took the table: "read in place" or "copied"
        # the copy, given back once not read; or the live table's log
        self._taken: TableSnapshot | LiveSnapshot | None = None
        process = resident.reads_live() if resident is not None and task is not None else None
        if process is not None and self._read_live(process):
            return
        try:
            self._taken = store.take_snapshot()
        except (OverBudget, MemoryError) as e:
            self._entry = {"error": f"no memory for a copy of this server's table to write "
                                    f"{what} from ({e or 'the machine refused it'}); "
                                    f"training goes on, the checkpoint is not complete"}

    def _read_live(self, process: WriterProcess) -> bool:
        """The resident writer told to read the live table; False if it cannot be (no shared
        block for its flag, no room for the log): a copy is made instead."""
        assert self._task is not None, "a task for the resident writer"
        try:
            live = self._taken = self._store.take_live(self._await_read)
        except (OSError, MemoryError):
            self._store.end_snapshot(complete=False)
            return False
        process.start({**self._task, "live": live.task()}, [live.shared.fd], self._cleanup,
                      self.what)
        self._file, self.pid = process, process.pid
        self.how = "read in place"
        self._forked()
        return True

    def _await_read(self, live: LiveSnapshot) -> None:
        """Until the writer has read the live table (the table is about to be rebuilt), or
        has ended; within `read_within` of the take, else it is stopped."""
        assert isinstance(self._file, WriterProcess), "the resident writer reads it"
        while not live.acknowledge():
            answer = self._file.poll() or self._read_overdue("the server had to rebuild it "
                                                             "(it grows, or keys go)")
            if answer is not None:
                self._answer = answer
                return
            time.sleep(POLL_S)

    def _read_overdue(self, waiting: str) -> dict | None:
        """The writer stopped if it has not read the live table within its bound (the entry
        then says so, and what waited for it), else None."""
        if time.monotonic() - self.started <= self._read_within:
            return None
        assert self._file is not None, "a writer was started"
        return self._file.stop(f"the writer of {self.what} (process {self.pid}) had not read "
                               f"the table within {self._read_within:g} s while {waiting}, and "
                               f"was stopped; training goes on, the checkpoint is not complete")

    def _writer_answer(self) -> dict | None:
        """The writer's answer: as it came while the read was awaited, or polled (the writer
        stopped if overdue with its read)."""
        if self._answer is not None:
            return self._answer
        assert self._file is not None, "a writer was started"
        live = self._taken if isinstance(self._taken, LiveSnapshot) else None
        if live is not None:
            live.acknowledge()   # (a turn of the server's loop: between two requests)
        answer = self._file.poll()
        if answer is None and live is not None and not live.read:
            answer = self._read_overdue("the server logged the rows it changed")
        return answer

    @property
    def copying(self) -> bool:
        """Whether the table is still being copied (the loop then polls every turn)."""
        return self._file is None and self._entry is None

    def poll(self) -> dict | None:
        if self._done is not None:
            return self._done
        if self._file is None:
            if self._entry is not None:
                return self._entry
            assert isinstance(self._taken, TableSnapshot), "a copy is being made"
            if not self._taken.step():
                return None
            self._fork()
        return self._ended(self._writer_answer())

    def wait(self, timeout: float) -> dict:
        if self._done is not None:
            return self._done
        if self.copying:
            assert self._taken is not None, "a copy is being made"
            self._taken.finish()
            self._fork()
        if self._file is None:
            assert self._entry is not None, "stopped before it was forked"
            return self._entry
        return waited(self, timeout)

    def stop(self, why: str) -> dict:
        if self._done is not None:
            return self._done
        if self._answer is not None:
            return self._ended(self._answer)
        if self._file is not None:
            return self._ended(self._file.stop(why))
        if self._entry is None:
            self._release(complete=False)   # given up: what is left need not be copied
            self._entry = {"error": why}
        return self._ended(self._entry)

    def _ended(self, entry):
        """`entry`, and if the write has ended, the copy given back to the store."""
        if entry is not None:
            self._done = entry if "error" in entry else {**entry, "table": self.how}
            if self._taken is not None:
                self._release(complete=False)   # (a copy's was complete when handed over)
                if isinstance(self._taken, TableSnapshot):
                    self._store.give_back(self._taken)
                self._taken = None
        return self._done

    def _fork(self) -> None:
        """The copy complete: the resident writer told to write it, or a child forked."""
        assert isinstance(self._taken, TableSnapshot), "a copy was made"
        self._release()
        shared = self._taken.shared
        process = (self._resident.idle() if self._resident is not None and shared is not None
                   else None)
        if process is not None:
            assert shared is not None and self._task is not None, "a task in shared memory"
            rows = self._taken.rows
            process.start({**self._task, "shape": list(rows.shape), "dtype": rows.dtype.str,
                           "meta": self._taken.meta.tolist()}, [shared.fd], self._cleanup,
                          self.what)
            self._file = process
        else:
            self._file = self._fork_child()
        self.pid = self._file.pid
        self._forked()

    def _fork_child(self) -> ForkedWrite:
        assert isinstance(self._taken, TableSnapshot), "a copy was made"
        view = self._store.snapshot_of(self._taken)
        # (the copy's pages are the child's and this process's alike until one writes them:
        # neither does, and this one reuses them once the child has ended; no other child
        # gets them: see KVStore.take_snapshot)
        keep_from_children(self._taken.rows, keep=False)
        child = ForkedWrite(lambda: self._write(view), self.what, self._cleanup)
        keep_from_children(self._taken.rows)
        return child

    def _release(self, complete: bool = True) -> None:
        """The store no longer keeps the copy up to date (see KVStore.end_snapshot)."""
        if self._taken is not None and self._store.snapshot is self._taken:
            self._store.end_snapshot(complete)
