"""The requests most of a server's time goes to, taken the short way: a worker's pull, its
push of float32 values without a backed-up part, and the two in one message (a push, then
the next clock's pull: protocol.WITH_PUSH). One compiled call checks a pull's keys and looks
them up (kernels.requests), or, if the clocks hold the pull, checks and keeps them; one checks
a push (its header, length, values and figures) and copies its values out of the receive
buffer, then the push goes to `pushes` as any other.

Anything else goes the general way (`loop`: `admission`, then the operation's handler): a
request that breaks a rule (admission names the fault), a pull the clocks refuse, a
push with a backed-up part or encoded values, a request split by another placement than this
server's (a server died, key ranges moved), a dead worker's or a finished one's. The short way
decides nothing the general way would decide otherwise: what it takes, admission would have
admitted, and the handlers do the same with it.
"""
from enum import IntEnum

import numpy as np

from ..kernels.requests import short_push
from ..wire import protocol
from ..wire.clocks import FINISHED
from ..wire.protocol import HEADER_BYTES, REPORT_BYTES, Op
from .readgate import HOLD, SERVE

PULL_FLAGS = protocol.READ_ONLY | protocol.NEXT_CLOCK
_NO_KEYS = np.empty(0, np.uint64)


class Taken(IntEnum):
    """How much of a bundle (a push, then a pull) the short way took."""
    NONE = 0
    PUSH = 1    # the push only: the pull goes the general way
    BOTH = 2


class HotPath:
    def __init__(self, ctx, progress=None):
        """`progress`: where a worker's figures go (the lead's progress lines), if anywhere."""
        self.ctx = ctx
        self.progress = progress
        self._workers = {rank: i for i, rank in enumerate(ctx.roles.workers)}

    def _worker(self, source: int, h: protocol.Header) -> int | None:
        """The index of the worker at rank `source` if its request `h` may go the short way
        (split by this server's placement, the worker training, the numbers not negative)."""
        ctx = self.ctx
        worker = self._workers.get(source)
        if (worker is None or h.placement != ctx.placement.version or h.ts < 0 or h.clock < 0
                or h.nkeys < 0 or h.width < 0 or ctx.clocks.done[worker] == FINISHED
                or worker in ctx.clocks.gone):
            return None
        return worker

    def take(self, source: int, buf: np.ndarray, h: protocol.Header) -> bool:
        """Handle the request `buf` (header `h`) from rank `source` if it is one of those
        taken the short way; whether it was."""
        worker = self._worker(source, h)
        if worker is None:
            return False
        if h.op == Op.PULL:
            taken = self._pull(worker, source, buf, h, h.flags)
        elif h.op == Op.PUSH:
            taken = self._push(worker, buf, 0, h)
        else:
            return False
        if taken:
            self.ctx.watchdog.message_from(worker)
        return taken

    def take_bundle(self, source: int, buf: np.ndarray, h: protocol.Header) -> Taken:
        """`take` for a PULL that carries a PUSH (WITH_PUSH): the push first, then the pull;
        how much of it was taken (what was not goes the general way)."""
        cut = HEADER_BYTES + 8 * h.nkeys
        worker = self._worker(source, h)
        if worker is None or cut + HEADER_BYTES > buf.shape[0]:
            return Taken.NONE
        if not self._push(worker, buf, cut, protocol.header(buf, cut)):
            return Taken.NONE
        ctx = self.ctx
        ctx.watchdog.message_from(worker)
        # `_worker` asked again of what the push may have changed: the clocks may have moved
        # to a new placement.
        clocks = ctx.clocks
        if (h.placement != ctx.placement.version or clocks.done[worker] == FINISHED
                or worker in clocks.gone):
            return Taken.PUSH
        pull = self._pull(worker, source, buf[:cut], h, h.flags & ~protocol.WITH_PUSH)
        return Taken.BOTH if pull else Taken.PUSH

    def _pull(self, worker: int, source: int, buf: np.ndarray, h, flags: int) -> bool:
        """`h`'s flags but `flags` (a bundle's header, WITH_PUSH left out) are not read."""
        ctx = self.ctx
        if flags & ~PULL_FLAGS or buf.shape[0] != HEADER_BYTES + 8 * h.nkeys:
            return False
        clock = ctx.clocks.read_clock(worker, bool(flags & protocol.NEXT_CLOCK))
        verdict = ctx.gate.verdict(worker, clock, h.placement)
        if verdict == SERVE:
            return ctx.reads.serve_checked(worker, source, h, buf, clock)
        return verdict == HOLD and ctx.reads.hold_checked(worker, source, h, buf, clock)

    def _push(self, worker: int, buf: np.ndarray, at: int, h) -> bool:
        """The push at buf[at:] (header `h`, read unchecked), checked and its values copied
        by one compiled call (kernels.requests.short_push), then taken."""
        ctx = self.ctx
        n, width = h.nkeys, ctx.store.width
        if n < 0 or 4 * n * width > buf.shape[0]:   # (checked before its values are made)
            return False
        values = np.empty((n, width), np.float32)
        keys_at = short_push(buf, at, width, ctx.placement.version, values)
        if keys_at < 0:
            return False
        keys = buf[keys_at:keys_at + 8 * n].view(np.uint64) if keys_at else _NO_KEYS
        if n and keys_at and ctx.placement.first_misplaced(keys, ctx.roles.index, False)[0] >= 0:
            return False
        report = None
        if h.flags & protocol.REPORT:
            report = protocol.report_at(buf, buf.shape[0] - REPORT_BYTES)
            if self.progress:
                self.progress.update(worker, report, say=ctx.lead)
        ctx.pushes.take_own(worker, h, keys, values, report, buf.shape[0] - at, owned=True)
        return True
