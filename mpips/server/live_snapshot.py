"""A server's table as of a checkpoint's clock, read in place by its resident writer while
the server goes on serving: nothing is copied on the server's side.

Taken at the clock in no time: the writer reads the live table from this process
(base.process_memory), then says so in a flag of a small block of shared memory. Until the
server has seen the flag, between two requests (`acknowledge`), the store logs a row's value
as it first changes it (as a TableSnapshot's does, `kernels.snapshot`), into a log whose
place in memory never moves and whose length is in the shared block; then it says it has
seen the flag, and logs nothing more. The writer waits for that, reads the log and writes
each logged value over the row it read: the table as it was when taken.

Why that holds on x86 (whose stores are seen in order, and loads not passed by later
stores): every change the writer's read of the table may have seen was made before the
writer raised its flag, so in a request the server finished before it saw the flag, and
that request logged the row (a push before it changes it, a new key just after the table's
kernel stored it) and stored the log's length before the server said it had seen the flag;
the writer reads the length after. A row logged after the writer's read holds what the read
saw (the flags log a row once, at its first change). Before the table is rebuilt (it grows,
or keys are removed in place), the server waits until the writer has read it (`finish`).
"""
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from ..base import process_memory
from ..base.forked import POLL_S
from ..base.shared_memory import SharedArray, mapped
from ..kernels import snapshot

# CPUs whose stores other cores see in order and whose loads are not passed by later stores
# (total store order), which the argument above needs: elsewhere (ARM, POWER) the table is
# copied.
ORDERED = ("x86_64", "amd64", "i386", "i686")

# The shared block: the writer's flag, the log's length, and the server's word that it has
# seen the flag (it logs nothing more).
READ, LOGGED, SEEN = 0, 1, 2
SEEN_WAIT_S = 600.0   # the writer's bound on waiting for SEEN (the server answers between
                      # two requests, or its --timeout ends the job)


def why_not_here() -> str | None:
    """Why this machine's tables are not read in place (None: they are)."""
    machine = platform.machine()
    if machine.lower() not in ORDERED:
        return (f"this {machine} CPU does not keep the order of its stores that reading the "
                f"table in place relies on")
    return None


class LiveSnapshot:
    def __init__(self, rows: np.ndarray, meta: np.ndarray, log_rows: np.ndarray,
                 log_values: np.ndarray, logged: np.ndarray,
                 wait_read: Callable[["LiveSnapshot"], None]):
        """`log_rows`, `log_values`: room for a row of `rows` each, their memory never moved
        nor freed while the writer may read them; `logged`: a zero flag per row, set as it is
        logged (cleared again once the writer has read the table); `wait_read(self)` returns
        once the writer has read the table, or has ended (see `finish`). OSError if the
        shared block cannot be made."""
        self.rows, self.meta = rows, meta.copy()
        self.shared = SharedArray((3,), np.int64)
        self._block = self.shared.array
        self._log_rows, self._log_values = log_rows, log_values
        self._copied = logged
        self._wait_read = wait_read
        self._logged = 0
        self.given_up = False

    @property
    def read(self) -> bool:
        """Whether the writer has read the table and the server has seen it (or the snapshot
        was given up): nothing more is logged."""
        return self.given_up or bool(self._block[SEEN])

    def acknowledge(self) -> bool:
        """If the writer has read the table, tell it the server has seen that (nothing more
        is logged); whether it has. Anywhere but inside a lookup that stores keys, between
        the table's kernel and `stored_in` (the loop's turns, the end of a request, a
        growth)."""
        if not self.given_up and not self._block[SEEN] and self._block[READ]:
            self._block[SEEN] = 1
        return self.read

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

    def finish(self) -> None:
        """The table is about to be rebuilt (what the request has stored so far is logged),
        or another snapshot taken: not before the writer has read it (`wait_read`
        acknowledges it)."""
        if not self.acknowledge():
            self._wait_read(self)
        self.give_up()

    def end(self, complete: bool) -> None:
        """No longer kept up to date: once the writer has read the table if `complete` (it
        will write it; another snapshot is taken), else now (it has ended)."""
        if complete:
            self.finish()
        else:
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
    block = mapped(block_fd, (3,), np.int64, shared=True)
    block[READ] = 1
    deadline = time.monotonic() + SEEN_WAIT_S
    while not block[SEEN]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server (process {pid}) did not say it had seen this "
                               f"writer's read of its table within {SEEN_WAIT_S:g} s")
        time.sleep(POLL_S)
    logged = int(block[LOGGED])
    log_rows = np.empty(logged, np.int64)
    log_values = np.empty((logged, shape[1]), dtype)
    if logged:
        process_memory.read_into(pid, task["log_rows"], log_rows)
        process_memory.read_into(pid, task["log_values"], log_values)
        snapshot.apply_log(into, log_rows, log_values, 0, logged)
    return into
