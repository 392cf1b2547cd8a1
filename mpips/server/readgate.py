"""When a server answers a read: the clocks' rule applied to each pull as it arrives, the
pulls it holds until the rule lets them through, and the record of what was served.

No MPI here: the gate says which pulls to serve or refuse, and the server sends.
"""
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..wire.clocks import FINISHED, ClockTable
from ..wire.placement import Switch

SERVE, REFUSE, HOLD = "serve", "refuse", "hold"

# One pull served to a worker still training, recorded with --record-pulls: who read, at which
# clock, how far the slowest worker had got (-1 once all others have finished), how long the
# pull was held for the clocks, and when (seconds since the server started serving).
PULL_RECORD = np.dtype([("worker", "<i4"), ("clock", "<i8"), ("slowest", "<i8"),
                        ("held_s", "<f8"), ("t", "<f8")])


@dataclass(slots=True)
class Pull:
    worker: int
    source: int            # its rank
    ts: int                # its request number: the reply's tag
    keys: np.ndarray
    insert: bool           # store unknown keys (a training read), or read them as zero
    clock: int = 0         # the clock it reads for
    since: float | None = None   # when it started waiting for other workers' clocks
    owned: bool = False    # `keys` is a copy, not a view of the receive buffer
    version: int = 0       # the placement its keys were split by
    held_under: tuple | None = None   # BSP: what its last HOLD was decided under (see release)


class ReadGate:
    def __init__(self, clocks: ClockTable, record: bool = False):
        self.clocks = clocks
        self.held: deque[Pull] = deque()
        self.stopped = False      # the job stopped after a checkpoint: training reads refused
        self.highest = -1         # the highest clock a training read was served for
        # A move is being agreed: reads past this clock wait.
        self.ceiling: int | None = None
        # The latest range move's switch of placements (see membership/rangemoves), kept once
        # made: a read split by an older placement, for its clock or later, stays refused.
        self.moving: Switch | None = None
        self.pulls_held = 0       # pulls that had to wait for other workers' clocks
        self.held_s = np.zeros(len(clocks.done))   # per worker: time its pulls were held
        self.records: list[tuple] | None = [] if record else None
        self.start = time.monotonic()

    def verdict(self, worker: int, clock: int, version: int) -> str:
        """SERVE, REFUSE or HOLD for a read by `worker` for `clock`, of keys split by
        placement `version`."""
        finished = self.clocks.done[worker] == FINISHED
        if self.stopped and not finished:
            return REFUSE
        if (self.moving and not finished and clock >= self.moving.clock
                and version < self.moving.version):
            return REFUSE
        if self.ceiling is not None and clock > self.ceiling and not finished:
            return HOLD
        # Once stopped, the clocks will not move again: a finished worker (scoring) reads the
        # model as it stands.
        if self.clocks.may_read(worker, clock) or (self.stopped and finished):
            return SERVE
        return HOLD

    def _start_waiting(self, pull: Pull) -> None:
        """A pull starts waiting for other workers once its own worker has completed the
        clocks before it; until then (a pull sent ahead, with NEXT_CLOCK) it waits for that
        worker's own push: pipelining, not a consistency wait."""
        if pull.since is None and self.clocks.done[pull.worker] >= pull.clock:
            self.pulls_held += 1
            pull.since = time.monotonic()

    def arrive(self, pull: Pull, next_clock: bool) -> str:
        """SERVE, REFUSE, or HOLD (the gate keeps it) for a pull just received."""
        pull.clock = self.clocks.read_clock(pull.worker, next_clock)
        verdict = self.verdict(pull.worker, pull.clock, pull.version)
        if verdict == HOLD:
            self.hold(pull)
        return verdict

    def hold(self, pull: Pull) -> None:
        """Keep `pull` (its clock set, the clocks' verdict HOLD) until they let it through."""
        if not pull.owned:   # the receive buffer is reused
            pull.keys, pull.owned = pull.keys.copy(), True
        self._start_waiting(pull)
        self.held.append(pull)

    def release(self) -> tuple[list, list]:
        """(pulls to serve, pulls to refuse) now, oldest first; the others stay held.

        Asked after every clock push, while each of n workers' pulls waits for the slowest:
        under BSP a pull held under the same `_hold_reasons` as now is held still, and only
        its own worker's clock is looked at, so that a clock costs O(n), not O(n^2)."""
        serve: list[Pull] = []
        refuse: list[Pull] = []
        still: deque[Pull] = deque()
        reasons = self._hold_reasons() if self.clocks.staleness == 0 else None
        for pull in self.held:
            if reasons is not None and pull.held_under == reasons:
                verdict = HOLD
            else:
                verdict = self.verdict(pull.worker, pull.clock, pull.version)
            if verdict == SERVE:
                serve.append(pull)
            elif verdict == REFUSE:
                refuse.append(pull)
            else:
                pull.held_under = reasons
                if pull.since is None:   # (asked of every held pull at every release)
                    self._start_waiting(pull)
                still.append(pull)
        self.held = still
        return serve, refuse

    def _hold_reasons(self) -> tuple:
        """Under BSP, all a held pull's verdict may change with: the slowest clock, the stop, a
        move's switch, the ceiling. Not its own worker's clock: that is never behind the
        slowest, so may_read is the slowest's alone; nor its worker finishing: a finished
        worker's read waits for the final clock or a stop, both counted here."""
        return self.clocks.slowest(), self.stopped, self.moving, self.ceiling

    def served(self, pull: Pull) -> None:
        """Account for a pull being served: time held, the largest clock gap, the record."""
        now = time.monotonic()
        self.served_at(pull.worker, pull.clock, 0.0 if pull.since is None else now - pull.since)

    def served_at(self, worker: int, clock: int, held: float = 0.0) -> None:
        """Account for a read by `worker` for `clock` served after `held` seconds held."""
        slowest = self.clocks.record_read(worker)
        if held:
            self.held_s[worker] += held
        done = self.clocks.done[worker]
        if done == FINISHED:
            return
        if clock > self.highest:
            self.highest = clock
        if self.records is not None:
            self.records.append((worker, done,
                                 -1 if slowest == FINISHED else slowest, held,
                                 time.monotonic() - self.start))

    def held_ranks(self) -> set:
        return {pull.source for pull in self.held}

    def pull_records(self) -> np.ndarray:
        return np.array(self.records or [], PULL_RECORD)
