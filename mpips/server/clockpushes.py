"""BSP's push buffer: the pushes of each clock are kept until every worker has completed that
clock, then given out in clock, worker and arrival order. The model at each clock is then a
consistent cut, and does not depend on the order in which workers' pushes arrived, so a run
with a fixed seed is reproducible bit for bit, and every replica of a key range, given the
same pushes, holds the same bits."""


class ClockPushes:
    def __init__(self, applied: int = 0):
        self._pending = {}        # clock -> worker -> [push, ...] in arrival order
        self.applied = applied    # every push of the clocks before this one has been given out

    def add(self, clock: int, worker: int, push) -> None:
        self._pending.setdefault(clock, {}).setdefault(worker, []).append(push)

    def until(self, clock: int) -> list:
        """The pushes of every clock before `clock` not given out yet, in clock, worker, then
        arrival order."""
        ready = []
        for c in sorted(c for c in self._pending if c < clock):
            pending = self._pending.pop(c)
            for w in sorted(pending):
                ready += pending[w]
        self.applied = max(self.applied, clock)
        return ready

    def drop(self, worker: int, from_clock: int) -> int:
        """Forget `worker`'s pushes of `from_clock` and later (a dead worker's, which not every
        server holds); returns how many."""
        dropped = 0
        for clock, pending in self._pending.items():
            if clock >= from_clock:
                dropped += len(pending.pop(worker, []))
        return dropped
