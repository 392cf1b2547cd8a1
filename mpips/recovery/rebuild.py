"""Rebuilding lost copies: after a server dies, each key range it held gets a new holder (the
placement adds the next living server on the ring), so that R copies exist again. No MPI
here: the server carries the messages.

Workers send a range's pushes to its new holder from the moment they learn of the death
(they split keys by the new placement). The range's primary sends the new holder a copy of
the range (keys and optimizer state) once that copy holds every push a worker sent before it
learned, and says, for each worker, the last push it had applied. The new holder keeps the
range's pushes aside until the copy arrives, then applies those the copy lacks, in the order
the primary applied them. Under BSP that order is clock, worker, arrival: the new copy holds
the primary's bits.
"""
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Outgoing:
    """A range this server sends a copy of, and to whom."""
    range: int
    to: int                  # server index


@dataclass
class Incoming:
    """A range this server holds anew and waits for a copy of; the pushes kept meanwhile."""
    range: int
    since: float             # when the wait began (monotonic), for the rebuild's duration
    kept: list = field(default_factory=list)   # (clock, worker, ts, keys, values)


class Rebuilds:
    def __init__(self, server: int, n_workers: int):
        self.server = server
        self.outgoing: list[Outgoing] = []
        self.incoming: dict[int, Incoming] = {}
        self.version = 0                  # the placement version the plan is for
        self.switched: dict[int, int] = {}   # worker -> first clock it pushed under `version`
        # The last push applied, per worker (a list: set on every push applied, where a numpy
        # array's element compares and stores 3x slower).
        self.last_ts: list[int] = [0] * n_workers
        self.done: list[tuple] = []       # (range, keys, seconds) of copies received
        self.this_round: list[tuple] = []   # those of the latest plan

    def plan(self, before, after, now: float) -> None:
        """The placement changed from `before` to `after` (a server died): what to send, what
        to wait for. A copy in flight to a server that died since is sent again elsewhere."""
        self.version = after.version
        self.switched = {}
        self.outgoing = []
        self.this_round = []
        for r, holders in enumerate(after.holders):
            new = [s for s in holders if s not in before.holders[r]]
            if holders and holders[0] == self.server:
                self.outgoing += [Outgoing(r, s) for s in new if s != self.server]
            if self.server in new:
                self.incoming[r] = Incoming(r, now)
        for r in [r for r in self.incoming if self.server not in after.holders[r]]:
            del self.incoming[r]

    def pushed(self, worker: int, clock: int, version: int) -> None:
        """A push from `worker` at `clock`, split by placement `version`."""
        if version >= self.version and worker not in self.switched:
            self.switched[worker] = clock

    def due(self, workers_left: list, applied_clock: int | None) -> list:
        """The copies to send now: once every worker still training has pushed under the new
        placement and (BSP) every clock before those pushes is applied. `applied_clock`:
        BSP's applied boundary, or None (SSP, ASP: pushes apply on arrival)."""
        if not self.outgoing or any(w not in self.switched for w in workers_left):
            return []
        first = max((self.switched[w] for w in workers_left), default=0)
        if applied_clock is not None and applied_clock < first:
            return []
        ready, self.outgoing = self.outgoing, []
        return ready

    def keep(self, ranges: np.ndarray, clock: int, worker: int, ts: int, keys: np.ndarray,
             values: np.ndarray):
        """Set aside the part of a push in ranges still waiting for their copy; returns the
        keys and values of the rest."""
        if not self.incoming:
            return keys, values
        waiting = np.isin(ranges, list(self.incoming))
        if not waiting.any():
            return keys, values
        for r in np.unique(ranges[waiting]).tolist():
            mine = ranges == r
            self.incoming[r].kept.append((clock, worker, ts, keys[mine].copy(),
                                          values[mine].copy()))
        return keys[~waiting], values[~waiting]

    def arrived(self, r: int, last_ts: np.ndarray, now: float, n_keys: int) -> list:
        """The copy of range `r` arrived (it holds each worker's pushes up to last_ts): the
        kept pushes it lacks, in clock, worker, arrival order, as (clock, worker, ts, keys,
        values)."""
        waiting = self.incoming.pop(r, None)
        if waiting is None:
            return []
        self.done.append((r, n_keys, now - waiting.since))
        self.this_round.append(self.done[-1])
        kept = [p for p in waiting.kept if p[2] > last_ts[p[1]]]
        order = sorted(range(len(kept)), key=lambda i: (kept[i][0], kept[i][1], i))
        return [kept[i] for i in order]

    def complete(self, r: int) -> bool:
        """Whether this server's copy of range `r` is whole (not waiting for a copy)."""
        return r not in self.incoming
