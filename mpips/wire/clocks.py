"""Vector clocks on a server: how far each worker has got, and which reads may proceed.

A worker's clock counts the clocks it has completed, as this server has seen
them (its CLOCK pushes), never as the worker claims. A read by a worker at
clock c may proceed once every worker has completed c - staleness clocks:
staleness 0 is bulk-synchronous (BSP), s > 0 is stale-synchronous (SSP, Ho et
al. 2013), and None never waits (ASP). A finished worker counts as infinitely
far ahead. What it reads after FINISH (scoring the test file) is the final model:
its reads wait until every worker has finished, so that the last pushes of all,
which may still be on their way to this server, are in.
"""
import numpy as np

from ..base.errors import ProtocolError

FINISHED = np.iinfo(np.int64).max


class ClockTable:
    def __init__(self, n_workers: int, staleness: int | None = 0):
        # (a list: read on every request, where a numpy array's element would be a numpy
        # scalar, slower to make and to compare)
        self.done: list[int] = [0] * n_workers
        self.staleness = staleness
        self.max_gap = 0
        self.longest = 0   # the most clocks any worker has completed, FINISH or not
        self.gone: set[int] = set()  # dead workers: counted as finished
        # Under BSP with hot failover, each other server's `here()` (see `commit`); a clock is
        # complete once complete on every living server.
        self.elsewhere: dict[int, int] = {}
        # here() and slowest(), asked of every read and push, kept until they change: here()
        # with how many workers stand at it, so that one moving on from it changes it only
        # if it was the last.
        self._here: int | None = None
        self._at_here = 0
        self._slowest: int | None = None

    def commit(self, servers) -> None:
        """Complete a clock only once every one of `servers` (indices) says it holds every
        worker's pushes of it (BSP under ULFM: a worker that dies between its pushes to two
        servers then never has a clock applied on one and not on the other)."""
        self.elsewhere = {s: self.here() for s in servers}   # all start where this one does
        self._slowest = None

    def have(self, server: int, clock: int) -> None:
        """`server` holds every living worker's pushes of its first `clock` clocks."""
        if server in self.elsewhere:
            self.elsewhere[server] = max(self.elsewhere[server], clock)
            self._slowest = None

    def server_gone(self, server: int) -> None:
        self.elsewhere.pop(server, None)
        self._slowest = None

    def worker_gone(self, worker: int) -> None:
        """A dead worker: no longer waited for."""
        self.gone.add(worker)
        self.finish(worker)

    def resume(self, worker: int, clock: int) -> None:
        """`worker` has completed `clock` clocks (a checkpoint's record)."""
        clock = int(clock)
        self.done[worker] = clock
        self.longest = max(self.longest, clock)
        self._here = self._slowest = None

    def tick(self, worker: int) -> None:
        before = self.done[worker]
        if before == FINISHED:
            raise ProtocolError(f"worker {worker} completed a clock after it said FINISH")
        self.done[worker] = before + 1
        if before >= self.longest:
            self.longest = before + 1
        self._moved_from(before)

    def finish(self, worker: int) -> None:
        before = self.done[worker]
        self.done[worker] = FINISHED
        self._moved_from(before)

    def _moved_from(self, clock: int) -> None:
        """A worker moved on from `clock`."""
        if self._here is not None and clock == self._here:
            self._at_here -= 1
            if not self._at_here:
                self._here = self._slowest = None

    def here(self) -> int:
        """The smallest clock among workers still training on this server (FINISHED if none
        is)."""
        if self._here is None:
            done = self.done
            here = min(done)
            self._here, self._at_here = here, done.count(here)
        return self._here

    def gap(self) -> int:
        """How many clocks the fastest worker still training is ahead of the slowest."""
        training = [c for c in self.done if c != FINISHED]
        return max(training) - min(training) if training else 0

    def slowest(self) -> int:
        """The smallest clock among workers still training, on every server (FINISHED if none
        is)."""
        slowest = self._slowest
        if slowest is None:
            slowest = self.here()
            if self.elsewhere:
                slowest = min(slowest, *self.elsewhere.values())
            self._slowest = slowest
        return slowest

    def read_clock(self, worker: int, next_clock: bool = False) -> int:
        """The clock a read by `worker` is for: its own, or the next one (a read sent ahead of
        the push that completes its current clock)."""
        clock = self.done[worker]
        return clock if clock == FINISHED or not next_clock else clock + 1

    def may_read(self, worker: int, clock: int) -> bool:
        """Whether `worker` may now read for `clock`: once it has itself completed the clocks
        before, and every worker has completed clock - staleness of them; after FINISH, once
        every worker has finished, here and on every server this one waits for (`commit`):
        only then are their last clocks applied here (the final model)."""
        done = self.done[worker]
        if done == FINISHED:
            return self.final
        return done >= clock and (self.staleness is None
                                  or self.slowest() >= clock - self.staleness)

    def record_read(self, worker: int) -> int:
        """Note a read served to `worker`; returns the slowest clock at that moment, and keeps
        the largest gap between a reader's clock and the slowest for the summary."""
        slowest = self.slowest()
        clock = self.done[worker]
        if clock != FINISHED and clock - slowest > self.max_gap:
            self.max_gap = clock - slowest
        return slowest

    @property
    def all_finished(self) -> bool:
        return all(c == FINISHED for c in self.done)

    @property
    def final(self) -> bool:
        """Every worker has finished, here and on every server this one waits for (`commit`):
        their last clocks are applied here, the model is the final one."""
        return self.slowest() == FINISHED
