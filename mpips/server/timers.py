"""A server's timed work between messages: the job's snapshots (every snapshot_every
seconds, and once at the end of training) and the samples of its timeline.
"""
import time

from ..base.timeline import Timeline
from ..wire.clocks import FINISHED


class Timers:
    def __init__(self, ctx):
        self.ctx = ctx
        self.timeline = Timeline()
        self._final_taken = False
        self._start = 0.0
        self._next_snapshot = float("inf")
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
        self.next_at = min(snapshot, self._start + self.timeline.next_due)

    def final_snapshot(self) -> None:
        """Every worker has finished: the last snapshot (once)."""
        if self.ctx.hooks.snapshot and not self._final_taken:
            self._snapshot(final=True)
            self._final_taken = True

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
        self.ctx.hooks.snapshot(final)
        self.ctx.stats.busy_s += time.monotonic() - began
