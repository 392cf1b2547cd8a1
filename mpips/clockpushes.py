"""BSP's push buffer: the pushes that complete each clock are kept until every worker has
completed that clock, then given out in clock and worker order. The model at each clock is
then a consistent cut, and does not depend on the order in which the pushes arrived, so a
run with a fixed seed is reproducible bit for bit."""


class ClockPushes:
    def __init__(self, applied: int = 0):
        self._pending = {}        # clock -> worker -> push
        self.applied = applied    # every push of the clocks before this one has been given out

    def add(self, clock: int, worker: int, push) -> None:
        self._pending.setdefault(clock, {})[worker] = push

    def until(self, clock: int) -> list:
        """The pushes of every clock before `clock` not given out yet, in clock then worker
        order."""
        ready = []
        for c in sorted(c for c in self._pending if c < clock):
            pending = self._pending.pop(c)
            ready += [pending[w] for w in sorted(pending)]
        self.applied = max(self.applied, clock)
        return ready
