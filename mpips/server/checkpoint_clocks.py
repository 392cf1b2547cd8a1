"""At which clocks a server writes checkpoints and where each worker stood at them
(`Checkpoints`; no MPI, no files), and what a checkpoint's manifest keeps of that moment
(`Standing`).

Under BSP a checkpoint is the state after its clock, and a worker may already have pushed
beyond it: its position is kept by clock. Under SSP and ASP each server writes what it holds
when its slowest worker reaches the clock, with every worker's latest position.
"""
import logging
from typing import NamedTuple

from ..base.errors import CheckpointsFailing
from ..wire.position import Position

log = logging.getLogger("mpips")
_new = tuple.__new__

# Checkpoints that fail one after another (a full or read-only disk) stop the job after this
# many: training on without a way back is a risk the user did not choose.
FAILURES_IN_A_ROW = 3


class Standing(NamedTuple):
    """Where the job stood at a checkpoint's clock, as its manifest keeps it: each worker's
    position and, under --balance dynamic, the lead's hand-out of the training rows ({} under
    static; None on a server that leads since the first lead died, the hand-out with it).
    Both are taken at the clock: a resume puts each worker back among the chunks the hand-out
    says it held then (a hand-out read later, once a worker had left or died meanwhile, gave
    back its rows from a place past the checkpoint's)."""
    positions: dict
    handed_out: dict | None


class Checkpoints:
    def __init__(self, every: int | None, seconds: float | None, n_servers: int, bsp: bool,
                 positions: dict | None = None):
        """Every `every` clocks and every `seconds` seconds (None or 0: not by them)."""
        self.every: int = every or 0
        self.seconds: float = seconds or 0.0
        self.bsp = bsp
        self.living = set(range(n_servers))   # the servers whose files a checkpoint needs
        # Where each worker's next minibatch starts, from its latest clock push; under BSP
        # also by the clock it had reached, for checkpoints of earlier clocks.
        self.positions: dict[int, Position] = dict(positions or {})
        # clock -> worker -> its position after that clock (by clock: each clock's entries
        # are dropped together once no checkpoint can be taken before it). A new clock is
        # mostly the next one a worker reaches, after those kept: while they stay in ascending
        # order (`_sorted`), forget_before drops from the front.
        self._history: dict[int, dict[int, Position]] = {}
        self._sorted, self._newest = True, -1
        for w, p in self.positions.items():
            self._at(p.clock)[w] = p
        self.stop_at: int | None = None   # the clock to checkpoint and stop at, once named
        self.planned: set[int] = set()    # clocks named for timed checkpoints
        self.written: set[int] = set()    # clocks this server has written (or tried to write) at
        self._entries: dict[int, dict] = {}   # the lead: clock -> the servers' files and the
                                              # positions
        self.completed: set[int] = set()  # the lead: clocks whose manifest it wrote
        self.failed_in_a_row = 0  # the lead: checkpoints failed since the last success

    @property
    def periodic(self) -> bool:
        return bool(self.every or self.seconds)

    def note(self, worker: int, clock: int, report, finished: bool) -> None:
        """Where `worker` stands after `clock` clocks (its latest report). (Made for every
        push of a clock: the record is built as a plain tuple in Position's field order, the
        last, `lost`, False: twice as fast as through the NamedTuple's own constructor.
        tests/unit/test_server_parts.py compares it with a Position made by its fields.)"""
        before = self.positions.get(worker)
        taken = before.taken if before else ()
        if report.taken > len(taken):
            taken = taken + (report.taken_epoch,) * (report.taken - len(taken))
        position = _new(Position, (clock, report.epoch, report.segment, report.offset,
                                   report.examples, report.loss, finished, taken, False))
        self.positions[worker] = position
        if not finished:
            self._at(clock)[worker] = position

    def place(self, worker: int, position: Position) -> None:
        """Where `worker` stands after position.clock clocks, said by the lead, not by the
        worker (it joins again): as its report would be."""
        self.positions[worker] = position
        self._at(position.clock)[worker] = position

    def _at(self, clock: int) -> dict:
        """The positions kept for `clock`, made if new."""
        at = self._history.get(clock)
        if at is None:
            at = self._history[clock] = {}
            if clock < self._newest:
                self._sorted = False
            else:
                self._newest = clock
        return at

    def positions_at(self, clock: int) -> dict:
        """Where each worker stood at `clock` (see the module's docstring)."""
        if not self.bsp:
            return dict(self.positions)
        at = self._history.get(clock, {})
        return {w: at.get(w, latest) for w, latest in self.positions.items()}

    def position_after(self, worker: int, clock: int) -> Position:
        """Where `worker` stood once it had completed `clock` clocks (a dead worker's place,
        at the clocks every server holds): from its push of that clock (kept under BSP until
        every worker has passed it; under SSP and ASP the nearest this server still knows),
        else the place it started from."""
        earlier = [c for c, at in self._history.items() if c <= clock and worker in at]
        if earlier:
            return self._history[max(earlier)][worker]
        return self.positions.get(worker, Position(clock))

    def note_lost(self, worker: int, place: Position) -> None:
        """`worker` died where `place` says (its clocks after it were dropped): checkpoints
        from now on record it there."""
        self.positions[worker] = place.but(lost=True)
        for c, at in self._history.items():
            if c > place.clock:
                at.pop(worker, None)

    def forget_before(self, clock: int) -> None:
        """The positions kept by clock before `clock` are no longer asked for."""
        history = self._history
        if not self._sorted:
            history = self._history = dict(sorted(history.items()))
            self._sorted = True
        while history:
            oldest = next(iter(history))
            if oldest >= clock:
                break
            del history[oldest]

    def last_clock(self, slowest_before: int) -> int:
        """The last clock any worker completed, once all have finished."""
        return max([p.clock for p in self.positions.values()] + [slowest_before])

    def first_clock(self) -> int:
        """The clock training starts from: 0, or the checkpoint's when resuming. Workers that
        had finished, or left, stand at the clock they stopped at, before it: not counted."""
        going = [p.clock for p in self.positions.values() if not p.finished]
        return min(going or [p.clock for p in self.positions.values()] or [0])

    def due(self, clock: int) -> bool:
        return bool((self.every and clock % self.every == 0) or clock == self.stop_at
                    or clock in self.planned)

    @property
    def may_be_due(self) -> bool:
        """Whether `due` can be true of any clock now (else none need be asked)."""
        return bool(self.every or self.stop_at is not None or self.planned)

    def reached(self, slowest: int) -> list:
        """Clocks named for timed checkpoints that the slowest worker has reached: the name
        may arrive after this server passed the clock."""
        if not self.planned:
            return []
        ready = sorted(c for c in self.planned if c <= slowest)
        self.planned.difference_update(ready)
        return ready

    def begin(self, clock: int) -> bool:
        """Whether this server should write checkpoint `clock` now (once per clock)."""
        if clock in self.written:
            return False
        self.written.add(clock)
        self.planned.discard(clock)
        return True

    def shard_in(self, clock: int, entry: dict, standing: Standing | None = None):
        """The lead: a server's entry for checkpoint `clock` (its own with where the job stood
        at the clock). Returns (entries, standing) once all servers' entries are in, else
        None."""
        state = self._entries.setdefault(clock, {"shards": [], "standing": None})
        state["shards"].append(entry)
        if standing is not None:
            state["standing"] = standing
        return self._ready(clock)

    def _ready(self, clock: int):
        state = self._entries[clock]
        if (not self.living <= {e["server"] for e in state["shards"]}
                or state["standing"] is None):
            return None
        del self._entries[clock]
        return state["shards"], state["standing"]

    def servers_lost(self, living) -> list:
        """The lead: servers died, `living` are left; checkpoints no longer wait for the dead
        ones' files. Returns (clock, entries, standing) of those that are now complete."""
        self.living = set(living)
        ready = [(clock, self._ready(clock)) for clock in sorted(self._entries)]
        return [(clock, *r) for clock, r in ready if r is not None]

    def outcome(self, clock: int, failures: list) -> None:
        """The lead: checkpoint `clock` was written (no failures) or not; several failed in a
        row raise CheckpointsFailing."""
        if not failures:
            self.failed_in_a_row = 0
            self.completed.add(clock)
            return
        self.failed_in_a_row += 1
        why = "; ".join(failures)
        if self.failed_in_a_row >= FAILURES_IN_A_ROW:
            raise CheckpointsFailing(
                f"{self.failed_in_a_row} checkpoints in a row could not be written (the last, "
                f"at clock {clock}: {why}); stopping rather than training on without a "
                f"checkpoint to come back to")
        log.error("checkpoint at clock %d was not written (%s); training goes on, and stops if "
                  "%d in a row fail", clock, why, FAILURES_IN_A_ROW)

    def incomplete(self) -> list:
        """The lead, at the end: (clock, servers missing) of checkpoints never completed."""
        return [(clock, sorted(self.living
                               - {e["server"] for e in self._entries[clock]["shards"]}))
                for clock in sorted(self._entries)]
