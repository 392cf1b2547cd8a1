"""The rounds of messages that take a checkpoint (`CheckpointRounds`), at the clocks
`checkpoint_clocks.Checkpoints` says: each server writes its file through its hooks and tells
the lead (SHARD_SAVED); the lead writes the manifest once every living server's file is in,
and names the clock of a timed checkpoint (CHECKPOINT_AT): two past its slowest worker, which
no server has passed yet.
"""
import json
import logging
import time
from typing import NamedTuple

from ..base.errors import ProtocolError
from ..storage import checkpoint
from ..wire import messages
from ..wire.clocks import FINISHED
from ..wire.placement import describe_ranges
from ..wire.protocol import Op
from .checkpoint_clocks import Standing
from .context import ShardWrite
from .table_snapshot import next_look

log = logging.getLogger("mpips")



class Writing(NamedTuple):
    """This server's file of checkpoint `clock` being written, and where the job stood at the
    clock (for the manifest, if this server leads when the file is in)."""
    clock: int
    file: ShardWrite
    standing: Standing


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
        later = float("inf") if self.writing is None else next_look(now, self.copying)
        self.next_check = min(self.next_timed, later)

    def take(self, clock: int, paced: bool = False) -> None:
        """Take this server's state for checkpoint `clock` (once): its file is written while
        the server goes on (`paced`, a periodic one: spread out, see job.server_files), and
        the lead told once it is in."""
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
            self._wait_for_file(f"checkpoint clock {clock} is due", paced)
        checkpoint.hurry(False)   # the new file keeps its pace, if it has one
        standing = Standing(ctx.ckpt.positions_at(clock),   # before forget_before drops them
                            ctx.handout.state() if ctx.handout else {})
        self.writing = Writing(clock, ctx.hooks.write_shard(clock, paced), standing)
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
            checkpoint.hurry()   # a paced file now holds the end
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

    def _wait_for_file(self, because: str, paced: bool) -> None:
        """Hold the loop until the file being written is in, within --timeout (a paced one
        told to hurry); `paced`: the next is a periodic checkpoint, not a stop's."""
        assert self.writing is not None, "called while a file is being written"
        clock, file, _ = self.writing
        checkpoint.hurry()
        # Said once as a warning (it is the interval that is too short), then quietly; for a
        # stop's checkpoint, not as a warning.
        (log.info if self._said_waiting or not paced else log.warning)(
            "%s: waiting for the file of checkpoint clock %d, still being written after "
            "%.1f s (process %d; up to --timeout %g s): checkpoints come faster than they are "
            "written, and workers wait; a longer --checkpoint-every avoids it", because, clock,
            time.monotonic() - file.started, file.pid, self.ctx.timeout)
        self._said_waiting = self._said_waiting or paced
        file.wait(self.ctx.timeout)
        self._check(time.monotonic())

    def _check(self, now: float) -> None:
        """The file being written: if it is done (or over --timeout, then stopped), the lead
        told."""
        assert self.writing is not None, "called while a file is being written"
        file = self.writing.file
        entry = file.poll()
        if entry is None:
            if now - file.started <= self.ctx.timeout:
                return
            entry = file.stop(f"this server's file was not written within --timeout "
                              f"{self.ctx.timeout:g} s (its writer, process {file.pid}, was "
                              f"stopped): is the checkpoint directory's file system slow or "
                              f"hung?")
        writing, self.writing = self.writing, None
        self._written(writing.clock, entry, writing.standing, now - file.started)

    def _written(self, clock: int, entry: dict, standing: Standing, seconds: float) -> None:
        """This server's file of checkpoint `clock` is in (or failed): the lead told."""
        ctx = self.ctx
        if "error" in entry:
            entry = {**entry, "server": ctx.roles.index}
            log.error("checkpoint at clock %d: %s", clock, entry["error"])
        else:
            ctx.stats.checkpoints += 1
            self.written += 1
            log.info("wrote %d keys of checkpoint clock %d in %.2f s%s", entry.get("keys", 0),
                     clock, seconds, f" (the table {entry['table']})" if "table" in entry else "")
            ctx.reached("checkpoint", self.written)
        if ctx.lead:
            self._shard_in(clock, entry, standing)
        else:
            ctx.send(messages.ShardSaved(clock, json.dumps(entry)).pack(), ctx.lead_rank)

    def _shard_in(self, clock: int, entry: dict, standing: Standing | None = None) -> None:
        """The lead: a server's file of checkpoint `clock`; once all are in (and where the job
        stood, with its own), the manifest: the checkpoint now exists."""
        ready = self.ctx.ckpt.shard_in(clock, entry, standing)
        if ready is not None:
            self._complete(clock, *ready)

    def _complete(self, clock: int, shards: list, standing: Standing) -> None:
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
        if standing.handed_out is None:
            log.warning("checkpoint at clock %d is passed over: the hand-out of the training "
                        "rows (--balance dynamic) died with the lead that kept it", clock)
            return
        if not failed:
            deaths = ctx.losses.deaths_before(clock) if ctx.losses else []
            problem = ctx.hooks.write_manifest(clock, shards, standing, deaths)
            failed = [problem] if problem else []
        ctx.ckpt.outcome(clock, failed)

    def servers_lost(self) -> None:
        """Servers died: the checkpoints that waited only for their files are done."""
        for clock, shards, standing in self.ctx.ckpt.servers_lost(self.ctx.placement.living):
            self._complete(clock, shards, standing)

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
