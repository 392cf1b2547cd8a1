"""Checkpoint coordination on a server: at which clocks a checkpoint is written, where each
worker stood at them (`Checkpoints`, no MPI, no files), and the rounds of messages that take
one (`CheckpointRounds`): each server writes its file through its hooks and tells the lead
(SHARD_SAVED); the lead writes the manifest once every living server's file is in, and names
the clock of a timed checkpoint (CHECKPOINT_AT): two past its slowest worker, which no server
has passed yet.

Under BSP a checkpoint is the state after its clock, and a worker may already have pushed
beyond it: its position is kept by clock. Under SSP and ASP each server writes what it holds
when its slowest worker reaches the clock, with every worker's latest position.
"""
import json
import logging
import time
from typing import NamedTuple

from ..base.errors import CheckpointsFailing, ProtocolError
from ..wire import messages
from ..wire.clocks import FINISHED
from ..wire.placement import describe_ranges
from ..wire.protocol import Op
from .context import ShardWrite

log = logging.getLogger("mpips")

# Checkpoints that fail one after another (a full or read-only disk) stop the job after this
# many: training on without a way back is a risk the user did not choose.
FAILURES_IN_A_ROW = 3
CHECK_WRITER_S = 2e-3   # how often the loop asks whether the file being written is in


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
        self.positions: dict[int, dict] = dict(positions or {})
        self._history: dict[int, dict[int, dict]] = {
            w: {p["clock"]: p} for w, p in self.positions.items()}
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
        """Where `worker` stands after `clock` clocks (its latest report)."""
        before = self.positions.get(worker)
        taken = before.get("taken", []) if before else []   # never changed in place: shared
        if report.taken > len(taken):
            taken = taken + [report.taken_epoch] * (report.taken - len(taken))
        position = {"clock": clock, "epoch": report.epoch, "segment": report.segment,
                    "offset": report.offset, "examples": report.examples, "loss": report.loss,
                    "finished": finished, "taken": taken}
        self.positions[worker] = position
        if not finished:
            self._history.setdefault(worker, {})[clock] = position

    def place(self, worker: int, position: dict) -> None:
        """Where `worker` stands after position["clock"] clocks, said by the lead, not by the
        worker (it joins again): as its report would be."""
        self.positions[worker] = position
        self._history.setdefault(worker, {})[position["clock"]] = position

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

    def shard_in(self, clock: int, entry: dict, positions: dict | None = None):
        """The lead: a server's entry for checkpoint `clock` (its own with the positions).
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

    def servers_lost(self, living) -> list:
        """The lead: servers died, `living` are left; checkpoints no longer wait for the dead
        ones' files. Returns (clock, entries, positions) of those that are now complete."""
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


class Writing(NamedTuple):
    """This server's file of checkpoint `clock` being written, and where each worker stood
    at the clock (for the manifest, if this server leads when the file is in)."""
    clock: int
    file: ShardWrite
    positions: dict


class CheckpointRounds:
    """Taking checkpoints on a server: its file at each clock due (its state taken at the
    clock, written while the server goes on; one at a time), and on the lead, the manifest
    once every file is in, and the timed checkpoints named."""
    def __init__(self, ctx):
        self.ctx = ctx
        self.next_timed = float("inf")
        self.next_check = float("inf")   # when the loop next calls poll
        self.writing: Writing | None = None
        self.written = 0   # files written in this launch (test events count them)
        self._said_ending = self._said_waiting = False
        ctx.register({Op.CHECKPOINT_AT: self.on_checkpoint_at,
                      Op.SHARD_SAVED: self.on_shard_saved})

    def start(self, start: float) -> None:
        seconds = self.ctx.ckpt.seconds
        self.next_check = self.next_timed = start + seconds if seconds else float("inf")

    def poll(self, now: float) -> None:
        """The file being written, if it is done; the lead: a timed checkpoint named, if due."""
        if self.writing is not None:
            self._check(now)
        if now >= self.next_timed and self.ctx.lead:
            self._name_timed()
            self.next_timed = time.monotonic() + self.ctx.ckpt.seconds
        self._schedule(now)

    def _schedule(self, now: float) -> None:
        if self.writing is None:
            later = float("inf")
        else:   # a table being copied: a span every turn (see job.snapshot_write)
            later = now if self.copying else now + CHECK_WRITER_S
        self.next_check = min(self.next_timed, later)

    def take(self, clock: int) -> None:
        """Take this server's state for checkpoint `clock` (once): its file is written while
        the server goes on, and the lead told once it is in."""
        ctx = self.ctx
        ctx.pushes.apply_backups()   # a checkpoint is of the whole store at its clock
        if ctx.hooks.write_shard is None or not ctx.ckpt.begin(clock):
            return
        if ctx.clocks.staleness == 0 and ctx.pushes.buffer.applied > clock:
            # Only if a worker's minibatches missed server 0 for clocks on end, so that
            # server 0 named a clock this server had passed: better no checkpoint than one
            # whose state is not its clock's. Without this server's file it is passed over.
            log.warning("not writing checkpoint clock %d: this server has applied clock %d "
                        "already", clock, ctx.pushes.buffer.applied - 1)
            return
        if self.writing is not None:
            self._wait_for_file(f"checkpoint clock {clock} is due")
        positions = ctx.ckpt.positions_at(clock)   # before forget_before drops them
        self.writing = Writing(clock, ctx.hooks.write_shard(clock), positions)
        now = time.monotonic()
        self._check(now)   # written in the loop (--checkpoint-inline): done now
        self._schedule(now)

    @property
    def copying(self) -> bool:
        """Whether this server's state for the file being written is still being copied."""
        return self.writing is not None and self.writing.file.copying

    def ending(self) -> bool:
        """At the end, nothing else to serve: whether the loop goes on until the file being
        written is in (within --timeout of its start, see _check)."""
        if self.writing is None:
            return False
        if not self._said_ending:
            self._said_ending = True
            log.info("waiting for this server's file of checkpoint clock %d (process %d, up "
                     "to --timeout %g s) before ending", self.writing.clock,
                     self.writing.file.pid, self.ctx.timeout)
        return True

    def abandon(self, why: str) -> None:
        """The server stops on an error: the file being written is given up (its writer
        ended, what it left removed); the checkpoint is not complete."""
        if self.writing is not None:
            clock, file, _ = self.writing
            self.writing = None
            entry = file.stop(f"its writer was stopped with the server ({why})")
            if "error" in entry:
                log.error("checkpoint at clock %d is not complete: %s", clock, entry["error"])

    def _wait_for_file(self, because: str) -> None:
        """Hold the loop until the file being written is in, within --timeout."""
        assert self.writing is not None, "called while a file is being written"
        clock, file, _ = self.writing
        # Said once as a warning (it is the interval that is too short), then quietly.
        (log.info if self._said_waiting else log.warning)(
            "%s: waiting for the file of checkpoint clock %d, still being written after "
            "%.1f s (process %d; up to --timeout %g s): checkpoints come faster than they are "
            "written, and workers wait; a longer --checkpoint-every avoids it", because, clock,
            time.monotonic() - file.started, file.pid, self.ctx.timeout)
        self._said_waiting = True
        file.wait(self.ctx.timeout)
        self._check(time.monotonic())

    def _check(self, now: float) -> None:
        """The file being written: if it is done (or over --timeout, then stopped), the lead
        told."""
        assert self.writing is not None, "called while a file is being written"
        clock, file, positions = self.writing
        entry = file.poll()
        if entry is None:
            if now - file.started <= self.ctx.timeout:
                return
            entry = file.stop(f"this server's file was not written within --timeout "
                              f"{self.ctx.timeout:g} s (its writer, process {file.pid}, was "
                              f"stopped): is the checkpoint directory's file system slow or "
                              f"hung?")
        self.writing = None
        self._written(clock, entry, positions, now - file.started)

    def _written(self, clock: int, entry: dict, positions: dict, seconds: float) -> None:
        """This server's file of checkpoint `clock` is in (or failed): the lead told."""
        ctx = self.ctx
        if "error" in entry:
            entry = {**entry, "server": ctx.roles.index}
            log.error("checkpoint at clock %d: %s", clock, entry["error"])
        else:
            ctx.stats.checkpoints += 1
            self.written += 1
            log.info("wrote %d keys of checkpoint clock %d in %.2f s", entry.get("keys", 0),
                     clock, seconds)
            ctx.hooks.reached("checkpoint", self.written, ctx.lead)
        if ctx.lead:
            self._shard_in(clock, entry, positions)
        else:
            ctx.send(messages.ShardSaved(clock, json.dumps(entry)).pack(), ctx.lead_rank)

    def _shard_in(self, clock: int, entry: dict, positions: dict | None = None) -> None:
        """The lead: a server's file of checkpoint `clock`; once all are in (and its own
        positions), the manifest: the checkpoint now exists."""
        ready = self.ctx.ckpt.shard_in(clock, entry, positions)
        if ready is not None:
            self._complete(clock, *ready)

    def _complete(self, clock: int, shards: list, positions: dict) -> None:
        """The lead, every living server's file of checkpoint `clock` in: its manifest, if
        they hold every key range (a server that died may have taken some with it)."""
        ctx = self.ctx
        failed = [f"server {e['server']}: {e['error']}" for e in shards if "error" in e]
        covered = {r for e in shards for r in e.get("ranges", [e["server"]])}
        missing = sorted(set(range(ctx.placement.n_ranges)) - covered)
        if missing and not failed:   # a death, not a failing disk: not one of those counted
            log.warning("checkpoint at clock %d is passed over: key range(s) %s are in no "
                        "file (their server died before writing it)", clock,
                        describe_ranges(missing))
            return
        if not failed:
            deaths = ctx.losses.deaths_before(clock) if ctx.losses else []
            problem = ctx.hooks.write_manifest(clock, shards, positions, deaths)
            failed = [problem] if problem else []
        ctx.ckpt.outcome(clock, failed)

    def servers_lost(self) -> None:
        """Servers died: the checkpoints that waited only for their files are done."""
        for clock, shards, positions in self.ctx.ckpt.servers_lost(self.ctx.placement.living):
            self._complete(clock, shards, positions)

    def _name_timed(self) -> None:
        """The lead, a timed checkpoint being due: as for stopping, two clocks past the
        slowest worker, without stopping."""
        ctx = self.ctx
        slowest = ctx.clocks.slowest()
        if slowest == FINISHED or ctx.ckpt.stop_at is not None:
            return   # the final or the stopping checkpoint comes anyway
        ctx.ckpt.planned.add(slowest + 2)
        ctx.tell_servers(messages.CheckpointAt(slowest + 2))

    def on_checkpoint_at(self, source: int, r, buf) -> None:
        self.ctx.ckpt.planned.add(messages.CheckpointAt.of(r.header).clock)
        self.ctx.pushes.advance()

    def on_shard_saved(self, source: int, r, buf) -> None:
        saved = messages.ShardSaved.of(r.header, buf)
        try:
            entry = json.loads(saved.text)
        except ValueError:
            raise ProtocolError(f"{self.ctx.sender(source)} sent a bad request: SHARD_SAVED "
                                f"whose text is not JSON") from None
        self._shard_in(saved.clock, entry)
