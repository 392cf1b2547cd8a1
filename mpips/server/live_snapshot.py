"""A server's table as of a checkpoint's clock, read in place by its resident writer while
the server goes on serving: nothing is copied on the server's side.

Taken at the clock in no time: the writer reads the live table from this process
(base.process_memory), then says so in a flag of a small block of shared memory. Until
the flag is up, the store logs a row's value just before it first changes it (as a
TableSnapshot's does, `kernels.snapshot`), into a log whose place in memory never moves and
whose length is in the shared block; once up, it logs nothing more. The writer then reads
the log and writes each logged value over the row it read: the table as it was when taken.

Why that holds on x86 (whose stores are seen in order, and loads not passed by later
stores): the server logs a row before it changes it and stores the log's length in
between, so a writer that read any part of a change reads, afterwards, a length that covers
its entry. A change the writer's length does not cover came after that load, hence after
every read of the table before it. A change made once the flag was seen came after the
flag, which the writer raised after its reads. Before the table is rebuilt (it grows, or
keys are removed in place), the server waits until the writer has read it (`finish`).
"""
import os
from collections.abc import Callable

import numpy as np

from ..base import process_memory
from ..base.shared_memory import SharedArray, mapped
from ..kernels import snapshot

READ, LOGGED = 0, 1   # the shared block: the writer's flag, the log's length


class LiveSnapshot:
    complete = False   # (as TableSnapshot's: the writer reads the table, not this process)

    def __init__(self, rows: np.ndarray, meta: np.ndarray, log_rows: np.ndarray,
                 log_values: np.ndarray, logged: np.ndarray,
                 wait_read: Callable[["LiveSnapshot"], None]):
        """`log_rows`, `log_values`: room for a row of `rows` each, their memory never moved
        nor freed while the writer may read them; `logged`: a zero flag per row, set as it is
        logged (cleared again once the writer has read the table); `wait_read(self)` returns
        once the writer has read the table, or has ended (see `finish`). OSError if the
        shared block cannot be made."""
        self.rows, self.meta = rows, meta.copy()
        self.shared = SharedArray((2,), np.int64)
        self._block = self.shared.array
        self._log_rows, self._log_values = log_rows, log_values
        self._copied = logged
        self._wait_read = wait_read
        self._logged = 0
        self.given_up = False

    @property
    def read(self) -> bool:
        """Whether the writer has read the table (or the snapshot was given up)."""
        return self.given_up or bool(self._block[READ])

    def task(self) -> dict:
        """What the writer needs to read the table and the log (JSON; `read_table`)."""
        return {"pid": os.getpid(), "rows": self.rows.ctypes.data,
                "shape": list(self.rows.shape), "dtype": self.rows.dtype.str,
                "log_rows": self._log_rows.ctypes.data,
                "log_values": self._log_values.ctypes.data, "meta": self.meta.tolist()}

    def before_write(self, rows: np.ndarray) -> None:
        """The table's rows `rows` are about to change (-1: none)."""
        if not self.read:
            self._logged = snapshot.log_before_write(
                self.rows, self._copied, 0, rows, self._log_rows, self._log_values,
                self._logged)
            self._block[LOGGED] = self._logged

    def stored_in(self, rows: np.ndarray, fresh: np.ndarray) -> None:
        """Keys were just stored in rows rows[i] where fresh[i] is set: empty when taken."""
        if not self.read:
            self._logged = snapshot.log_empty(self._copied, 0, rows, fresh, self._log_rows,
                                              self._log_values, self._logged)
            self._block[LOGGED] = self._logged

    def step(self, rows: int | None = None) -> bool:
        return self.read

    def finish(self) -> None:
        """The table is about to be rebuilt: not before the writer has read it."""
        if not self.read:
            self._wait_read(self)
        self.give_up()

    def end(self, complete: bool) -> None:
        """No longer kept up to date: the writer has read the table, or is given up."""
        self.give_up()

    def give_up(self) -> None:
        """Nothing more is logged (the writer has read the table, or ended); the flags are
        cleared for the next."""
        if not self.given_up:
            self.given_up = True
            self._copied[self._log_rows[:self._logged]] = 0
            self.shared.close()


def read_table(task: dict, block_fd: int, into: np.ndarray | None) -> np.ndarray:
    """In the writer: the table a LiveSnapshot's `task` describes, read from its server as
    it was when taken, into `into` if it has the table's shape (an array kept from the last
    read: its pages are in memory) or a new array."""
    shape, dtype = tuple(task["shape"]), np.dtype(task["dtype"])
    if into is None or into.shape != shape or into.dtype != dtype:
        into = np.empty(shape, dtype)
    pid = task["pid"]
    process_memory.read_into(pid, task["rows"], into)
    block = mapped(block_fd, (2,), np.int64, shared=True)
    block[READ] = 1
    logged = int(block[LOGGED])
    log_rows = np.empty(logged, np.int64)
    log_values = np.empty((logged, shape[1]), dtype)
    if logged:
        process_memory.read_into(pid, task["log_rows"], log_rows)
        process_memory.read_into(pid, task["log_values"], log_values)
        snapshot.apply_log(into, log_rows, log_values, 0, logged)
    return into
