"""A checkpoint's shard, or a snapshot's, written from a copy of the table taken at its clock
or moment: the copy is made a span of rows at a time between the server's requests
(server.table_snapshot) into shared memory, then the server's resident writer
(base.writer_process: forked as the server starts, or at its first file, and kept) maps it
and writes the file; the server only sends it a line of JSON. Without shared memory,
or while the resident writer is busy, a child forked for the write (base.forked) writes it:
the live table is kept out of it (base.forked.keep_from_children), so the server's writes
after the fork copy no pages.
"""
import os
import time
from collections.abc import Callable

import numpy as np

from ..base.budget import OverBudget
from ..base.forked import ForkedWrite, keep_from_children
from ..base.shared_memory import mapped
from ..base.writer_process import WriterProcess
from ..server.store import KVStore
from ..server.table_snapshot import TableSnapshot


class Resident:
    """A server's resident writer: `work(task, table)` run in a process forked at the start
    (`ready`) or the first write, and kept (another one forked if it ended), over a store
    reading the copy that the task's shared memory holds."""

    def __init__(self, store: KVStore, work: Callable[[dict, KVStore], dict]):
        self._store, self.work = store, work
        self._process: WriterProcess | None = None

    def ready(self) -> None:
        """The process forked now (at the start, while the server is small: a cheap fork,
        and none at the first checkpoint)."""
        self.idle()

    def idle(self) -> WriterProcess | None:
        """The process, ready for a task (forked now if none lives); None if it is busy."""
        process = self._process
        if process is not None and not process.idle and process.ended is not None:
            process = None   # it failed, was stopped, or died between writes
        if process is None:
            process = self._process = WriterProcess(self._in_child,
                                                    "a checkpoint's or snapshot's file")
        return process if process.idle else None

    def close(self) -> None:
        """The process ends (between writes)."""
        if self._process is not None:
            self._process.close()
            self._process = None

    def _in_child(self, task: dict, fds: list) -> dict:
        rows = mapped(fds[0], tuple(task["shape"]), task["dtype"])
        return self.work(task, self._store.reading(rows, np.array(task["meta"], np.int64)))


class SnapshotWrite:
    """A ShardWrite (server.context): the file written from a store that reads the table as
    it was when this was made, by the resident writer or else `write(store)` in a forked
    child; `forked()` is called in this process once the writer has it."""

    def __init__(self, store: KVStore, write: Callable[[KVStore], dict], what: str,
                 cleanup: Callable[[int], None], forked: Callable[[], None],
                 resident: Resident | None = None, task: dict | None = None):
        """`resident`: the process that writes it if idle and the copy is in shared memory,
        `task` what it is told (JSON; `write` is then resident.work over the task)."""
        self.started = time.monotonic()   # the state is the table's now
        self.pid = os.getpid()            # the writer's, once forked
        self._store, self._write, self._what = store, write, what
        self._cleanup, self._forked = cleanup, forked
        self._resident, self._task = resident, task
        self._file: ForkedWrite | WriterProcess | None = None
        self._entry: dict | None = None   # before a writer, or none: why
        self._done: dict | None = None    # the write's entry, once it has ended
        self._taken: TableSnapshot | None = None   # the copy, given back once not read
        try:
            self._taken = store.take_snapshot()
        except (OverBudget, MemoryError) as e:
            self._entry = {"error": f"no memory for a copy of this server's table to write "
                                    f"{what} from ({e or 'the machine refused it'}); "
                                    f"training goes on, the checkpoint is not complete"}

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
            assert self._taken is not None, "a copy is being made"
            if not self._taken.step():
                return None
            self._fork()
        assert self._file is not None, "forked once the copy is complete"
        return self._ended(self._file.poll())

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
        return self._ended(self._file.wait(timeout))

    def stop(self, why: str) -> dict:
        if self._done is not None:
            return self._done
        if self._file is not None:
            return self._ended(self._file.stop(why))
        if self._entry is None:
            self._release(complete=False)   # given up: what is left need not be copied
            self._entry = {"error": why}
        return self._ended(self._entry)

    def _ended(self, entry):
        """`entry`, and if the write has ended, the copy given back to the store."""
        if entry is not None:
            self._done = entry
            if self._taken is not None:
                self._release()
                self._store.give_back(self._taken)
                self._taken = None
        return entry

    def _fork(self) -> None:
        """The copy complete: the resident writer told to write it, or a child forked."""
        assert self._taken is not None, "a copy was made"
        self._release()
        shared = self._taken.shared
        process = (self._resident.idle() if self._resident is not None and shared is not None
                   else None)
        if process is not None:
            assert shared is not None and self._task is not None, "a task in shared memory"
            rows = self._taken.rows
            process.start({**self._task, "shape": list(rows.shape), "dtype": rows.dtype.str,
                           "meta": self._taken.meta.tolist()}, [shared.fd], self._cleanup,
                          self._what)
            self._file = process
        else:
            self._file = self._fork_child()
        self.pid = self._file.pid
        self._forked()

    def _fork_child(self) -> ForkedWrite:
        assert self._taken is not None, "a copy was made"
        view = self._store.snapshot_of(self._taken)
        # (the copy's pages are the child's and this process's alike until one writes them:
        # neither does, and this one reuses them once the child has ended; no other child
        # gets them: see KVStore.take_snapshot)
        keep_from_children(self._taken.rows, keep=False)
        child = ForkedWrite(lambda: self._write(view), self._what, self._cleanup)
        keep_from_children(self._taken.rows)
        return child

    def _release(self, complete: bool = True) -> None:
        """The store no longer keeps the copy up to date (see KVStore.end_snapshot)."""
        if self._taken is not None and self._store.snapshot is self._taken:
            self._store.end_snapshot(complete)
