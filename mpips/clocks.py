"""Vector clocks on a server: how far each worker has got, and which reads may proceed.

A worker's clock counts the clocks it has completed. A read by a worker at
clock c may proceed once every worker has completed c - staleness clocks:
staleness 0 is bulk-synchronous (BSP), s > 0 is stale-synchronous (SSP), and
None never waits (ASP). A finished worker counts as infinitely far ahead.
"""
import numpy as np

FINISHED = np.iinfo(np.int64).max


class ClockTable:
    def __init__(self, n_workers: int, staleness: int | None = 0):
        self.done = np.zeros(n_workers, np.int64)
        self.staleness = staleness
        self.max_gap = 0

    def tick(self, worker: int) -> None:
        self.done[worker] += 1

    def finish(self, worker: int) -> None:
        self.done[worker] = FINISHED

    def slowest(self) -> int:
        return int(self.done.min())

    def may_read(self, clock: int) -> bool:
        return self.staleness is None or self.slowest() >= clock - self.staleness

    def record_read(self, clock: int) -> None:
        """Note a served read, to report the largest gap to the slowest worker."""
        slowest = self.slowest()
        if slowest != FINISHED:
            self.max_gap = max(self.max_gap, clock - slowest)

    @property
    def all_finished(self) -> bool:
        return bool((self.done == FINISHED).all())
