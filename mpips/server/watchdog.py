"""Which workers a server still hears from: when each last sent something, the silence check
(no worker still talking has sent anything for --timeout seconds: the job fails, naming the
slowest), and the STATUS a worker asks for.
"""
import time

import numpy as np

from ..base.errors import WaitTimeout
from ..wire import protocol
from ..wire.clocks import FINISHED
from ..wire.protocol import Op


class Watchdog:
    def __init__(self, ctx):
        self.ctx = ctx
        self.talking = set(ctx.roles.workers)   # workers (ranks) that have not said BYE
        # When each worker last sent something (a list: set on every request, where a numpy
        # array's element is slower to set).
        self._last_message_at = [0.0] * len(ctx.roles.workers)
        ctx.register({Op.STATUS: self.on_status})

    def start(self, now: float) -> None:
        self._last_message_at = [now] * len(self._last_message_at)

    def message_from(self, worker: int) -> None:
        """`worker` sent something (or trains again: it joins): its silence counts from now."""
        self._last_message_at[worker] = time.monotonic()

    def forget(self, ranks: set) -> None:
        """Ranks that said BYE, or died: no longer expected to send."""
        self.talking -= ranks

    def on_status(self, source: int, r, buf) -> None:
        self.ctx.reply(self.status(), source, r.header.ts)

    def status(self) -> np.ndarray:
        ctx = self.ctx
        done = ctx.clocks.done
        slowest = int(np.argmin(done))
        if done[slowest] == FINISHED:
            slowest = -1
        silent = 0 if slowest < 0 else time.monotonic() - self._last_message_at[slowest]
        values = {"slowest_clock": -1 if slowest < 0 else int(done[slowest]),
                  "slowest_worker": slowest,
                  # A worker joining counts as training before it does.
                  "finished": done.count(FINISHED) - ctx.members.idle_joining(),
                  "slowest_silent_ms": int(silent * 1000),
                  "deaths": len(ctx.losses.deaths) if ctx.losses else 0,
                  "stopping": int(ctx.gate.stopped)}
        return np.array([values[f] for f in protocol.STATUS_FIELDS], np.int64)

    def check(self) -> None:
        """Fail if no worker that is still talking has sent anything for `timeout` seconds."""
        ctx = self.ctx
        now = time.monotonic()
        ranks = sorted(self.talking)
        last = [self._last_message_at[ctx.roles.worker_index(r)] for r in ranks]
        if now - max(last) <= ctx.timeout:
            return
        held = ctx.gate.held_ranks()
        lines = []
        for rank, at in zip(ranks, last):
            w = ctx.roles.worker_index(rank)
            clock = ctx.clocks.done[w]
            state = ("finished training" if clock == FINISHED else f"at clock {clock}")
            waiting = ", waiting for a pull held for the clocks" if rank in held else ""
            lines.append(f"worker {w} (rank {rank}) {state}, silent {now - at:.0f} s{waiting}")
        status = dict(zip(protocol.STATUS_FIELDS, self.status().tolist()))
        slowest = status["slowest_worker"]
        culprit = ("" if slowest < 0 else
                   f"the slowest is worker {slowest} (rank {ctx.roles.workers[slowest]}), at "
                   f"clock {status['slowest_clock']}, silent for "
                   f"{status['slowest_silent_ms'] / 1000:.0f} s; ")
        raise WaitTimeout(f"no worker has sent anything for {now - max(last):.0f} s "
                          f"(--timeout {ctx.timeout:g}): {culprit}" + "; ".join(lines))
