"""A server's timed work between messages: the job's snapshots (every snapshot_every
seconds, and once at the end of training) and the samples of its timeline.

A snapshot's file may be written beside the loop (the hook returns the write, a ShardWrite:
its copy of the table is made a span at a time between requests, then a forked child
writes it). None is passed over, so that every server's snapshot N is of the same moment of
the job (a copy not complete when the next is taken is completed then).
"""
import logging
import time

from ..base.timeline import Timeline
from ..wire.clocks import FINISHED
from .context import ShardWrite
from .table_snapshot import next_look

log = logging.getLogger("mpips")
MOST_WRITING = 2   # snapshots written at once at most (each holds a copy of the table)


class Timers:
    def __init__(self, ctx):
        self.ctx = ctx
        self.timeline = Timeline()
        self._final_taken = False
        self._start = 0.0
        self._next_snapshot = float("inf")
        self._writing: list[ShardWrite] = []   # snapshots being written beside the loop
        self._said_waiting = False
        self.numbered = 0   # numbered snapshots taken (the final one not counted)
        self.next_at = 0.0   # when tick has something to do (the loop calls it only then)

    def start(self, start: float) -> None:
        hooks = self.ctx.hooks
        self._start = start
        self._next_snapshot = (start + hooks.snapshot_every
                               if hooks.snapshot and hooks.snapshot_every else float("inf"))
        self._plan()

    def tick(self, now: float) -> None:
        """A snapshot, a sample of the timeline, if due."""
        start = self._start
        if self._writing:
            self._writing = [w for w in self._writing if not self._ended(w.poll())]
        if now >= self._next_snapshot and not self._final_taken:
            every = self.ctx.hooks.snapshot_every
            self._snapshot(final=False)
            missed = (time.monotonic() - start) // every
            self._next_snapshot = start + (missed + 1) * every
        if self.timeline.due(now - start):
            self.sample(now - start)
        self._plan()

    def _plan(self) -> None:
        snapshot = float("inf") if self._final_taken else self._next_snapshot
        if self._writing:
            snapshot = min(snapshot, next_look(time.monotonic(), self.copying))
        self.next_at = min(snapshot, self._start + self.timeline.next_due)

    @property
    def copying(self) -> bool:
        """Whether a snapshot's copy of the table is being made."""
        return bool(self._writing) and any(w.copying for w in self._writing)

    @staticmethod
    def _ended(entry: dict | None) -> bool:
        """Whether a snapshot being written is done (`entry`: its outcome, if in)."""
        if entry is not None and "error" in entry:
            log.warning("a snapshot was not written: %s", entry["error"])
        return entry is not None

    def final_snapshot(self) -> None:
        """Every worker has finished: the last snapshot (once), after those being written."""
        if self.ctx.hooks.snapshot and not self._final_taken:
            self.finish_writing()
            self._snapshot(final=True)
            self._final_taken = True

    def finish_writing(self) -> None:
        """Wait (within --timeout each) for the snapshots being written."""
        for writing in self._writing:
            self._ended(writing.wait(self.ctx.timeout))
        self._writing = []

    def sample(self, t: float, force: bool = False) -> None:
        ctx = self.ctx
        stats, gate = ctx.stats, ctx.gate
        slowest, gap = ctx.clocks.slowest(), ctx.clocks.gap()
        self.timeline.add(t, force, busy_s=stats.busy_s, bytes_sent=stats.bytes_sent,
                          held_s=float(gate.held_s.sum()), pulls_held=gate.pulls_held,
                          pushes=stats.pushes_applied, gap=gap,
                          clock=-1 if slowest == FINISHED else slowest)
        if ctx.lead and ctx.hooks.sampled:
            ctx.hooks.sampled({
                **{f"wait/worker_{w}_s": float(s) for w, s in enumerate(gate.held_s)},
                "server/bytes_sent": float(stats.bytes_sent),
                "server/bytes_received": float(stats.bytes_received),
                "server/busy_share": stats.busy_s / t if t > 0 else 0.0,
                "clocks/slowest": -1.0 if slowest == FINISHED else float(slowest),
                "clocks/gap": float(gap)}, force)

    def _snapshot(self, final: bool) -> None:
        began = time.monotonic()
        if len(self._writing) >= MOST_WRITING:
            if not self._said_waiting:
                log.warning("a snapshot is due while %d are still being written: waiting for "
                            "the oldest (snapshots come faster than they are written, and "
                            "workers wait; a longer --snapshot-every avoids it)",
                            len(self._writing))
                self._said_waiting = True
            self._ended(self._writing.pop(0).wait(self.ctx.timeout))
        writing = self.ctx.hooks.snapshot(final)
        self.numbered += not final
        if writing is not None:
            self._writing.append(writing)
        self.ctx.stats.busy_s += time.monotonic() - began
