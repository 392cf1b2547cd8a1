"""Checkpoint coordination on a server: at which clocks a checkpoint is written, where each
worker stood at them, and, on server 0, when a checkpoint is complete (every server's file
in) or failed. No MPI, no files: the server carries the messages, its hooks write.

Under BSP a checkpoint is the state after its clock, and a worker may already have pushed
beyond it: its position is kept by clock. Under SSP and ASP each server writes what it holds
when its slowest worker reaches the clock, with every worker's latest position.
"""
import logging

from ..base.errors import CheckpointsFailing

log = logging.getLogger("mpips")

# Checkpoints that fail one after another (a full or read-only disk) stop the job after this
# many: training on without a way back is a risk the user did not choose.
FAILURES_IN_A_ROW = 3


class Checkpoints:
    def __init__(self, every: int, seconds: float, lead: bool, n_servers: int, bsp: bool,
                 positions: dict | None = None):
        self.every, self.seconds = every, seconds
        self.lead, self.n_servers, self.bsp = lead, n_servers, bsp
        self.living = set(range(n_servers))   # the servers whose files a checkpoint needs
        # Where each worker's next minibatch starts, from its latest clock push; under BSP
        # also by the clock it had reached, for checkpoints of earlier clocks.
        self.positions = dict(positions or {})
        self._history = {w: {p["clock"]: p} for w, p in self.positions.items()}
        self.stop_at = None       # the clock to checkpoint and stop at, once named
        self.planned = set()      # clocks named for timed checkpoints
        self.written = set()      # clocks this server has written (or tried to write) at
        self._entries = {}        # server 0: clock -> the servers' files and the positions
        self.completed = set()    # server 0: clocks whose manifest it wrote
        self.failed_in_a_row = 0  # server 0: checkpoints failed since the last success

    @property
    def periodic(self) -> bool:
        return bool(self.every or self.seconds)

    def note(self, worker: int, clock: int, report, finished: bool) -> None:
        """Where `worker` stands after `clock` clocks (its latest report)."""
        taken = list(self.positions.get(worker, {}).get("taken", []))
        taken += [report.taken_epoch] * max(report.taken - len(taken), 0)
        position = {"clock": clock, "epoch": report.epoch, "segment": report.segment,
                    "offset": report.offset, "examples": report.examples, "loss": report.loss,
                    "finished": finished, "taken": taken}
        self.positions[worker] = position
        if not finished:
            self._history.setdefault(worker, {})[clock] = position

    def positions_at(self, clock: int) -> dict:
        """Where each worker stood at `clock` (see the module's docstring)."""
        if not self.bsp:
            return {w: dict(p) for w, p in self.positions.items()}
        return {w: dict(self._history.get(w, {}).get(clock, latest))
                for w, latest in self.positions.items()}

    def position_after(self, worker: int, clock: int) -> dict:
        """Where `worker` stood once it had completed `clock` clocks (a dead worker's place,
        at the clocks every server holds): from its push of that clock (kept under BSP until
        every worker has passed it; under SSP and ASP the nearest this server still knows),
        else the place it started from."""
        seen = self._history.get(worker, {})
        earlier = [c for c in seen if c <= clock]
        if earlier:
            return dict(seen[max(earlier)])
        if worker in self.positions:
            return dict(self.positions[worker])
        return {"clock": clock, "epoch": 0, "segment": 0, "offset": -1, "examples": 0,
                "loss": 0.0, "finished": False, "taken": []}

    def note_lost(self, worker: int, place: dict) -> None:
        """`worker` died where `place` says (its clocks after it were dropped): checkpoints
        from now on record it there."""
        self.positions[worker] = dict(place, lost=True)
        seen = self._history.get(worker, {})
        for c in [c for c in seen if c > place["clock"]]:
            del seen[c]

    def forget_before(self, clock: int) -> None:
        for seen in self._history.values():
            for c in [c for c in seen if c < clock]:
                del seen[c]

    def last_clock(self, slowest_before: int) -> int:
        """The last clock any worker completed, once all have finished."""
        return max([p["clock"] for p in self.positions.values()] + [slowest_before])

    def first_clock(self) -> int:
        """The clock training starts from: 0, or the checkpoint's when resuming. Workers that
        had finished, or left, stand at the clock they stopped at, before it: not counted."""
        going = [p["clock"] for p in self.positions.values() if not p.get("finished")]
        return min(going or [p["clock"] for p in self.positions.values()] or [0])

    def due(self, clock: int) -> bool:
        return bool((self.every and clock % self.every == 0) or clock == self.stop_at
                    or clock in self.planned)

    def reached(self, slowest: int) -> list:
        """Clocks named for timed checkpoints that the slowest worker has reached: the name
        may arrive after this server passed the clock."""
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

    def shard_in(self, clock: int, entry: dict, positions: dict | None = None):
        """Server 0: a server's entry for checkpoint `clock` (its own with the positions).
        Returns (entries, positions) once all servers' entries are in, else None."""
        state = self._entries.setdefault(clock, {"shards": [], "positions": None})
        state["shards"].append(entry)
        if positions is not None:
            state["positions"] = positions
        return self._ready(clock)

    def _ready(self, clock: int):
        state = self._entries[clock]
        if (not self.living <= {e["server"] for e in state["shards"]}
                or state["positions"] is None):
            return None
        del self._entries[clock]
        return state["shards"], state["positions"]

    def servers_lost(self, servers) -> list:
        """Server 0: `servers` died; checkpoints no longer wait for their files. Returns
        (clock, entries, positions) of those that are now complete."""
        self.living -= set(servers)
        ready = [(clock, self._ready(clock)) for clock in sorted(self._entries)]
        return [(clock, *r) for clock, r in ready if r is not None]

    def outcome(self, clock: int, failures: list) -> None:
        """Server 0: checkpoint `clock` was written (no failures) or not; several failed in a
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
        """Server 0, at the end: (clock, servers missing) of checkpoints never completed."""
        return [(clock, sorted(self.living
                               - {e["server"] for e in self._entries[clock]["shards"]}))
                for clock in sorted(self._entries)]
