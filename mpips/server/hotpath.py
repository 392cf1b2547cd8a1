"""The requests most of a server's time goes to, taken the short way: a worker's pull, and its
push of float32 values without a backed-up part. One compiled call checks a pull's keys and
looks them up (kernels.requests), or, if the clocks hold the pull, checks and keeps them; a
push's values and figures are checked, then the push goes to `pushes` as any other.

Anything else goes the general way (`loop`: `admission`, then the operation's handler): a
request that breaks a rule (admission names the fault), a pull the clocks refuse, a
push with a backed-up part or encoded values, a request split by another placement than this
server's (a server died, key ranges moved), a dead worker's or a finished one's. The short way
decides nothing the general way would decide otherwise: what it takes, admission would have
admitted, and the handlers do the same with it.
"""
import numpy as np

from ..base.errors import ProtocolError
from ..kernels.requests import first_not_finite
from ..wire import protocol
from ..wire.clocks import FINISHED
from ..wire.protocol import HEADER_BYTES, REPORT_BYTES, Op
from .admission import Request, check_report
from .readgate import HOLD, SERVE

PULL_FLAGS = protocol.READ_ONLY | protocol.NEXT_CLOCK
PUSH_FLAGS = protocol.CLOCK | protocol.SAME_KEYS | protocol.REPORT
_NO_KEYS = np.empty(0, np.uint64)


class HotPath:
    def __init__(self, ctx, progress=None):
        """`progress`: where a worker's figures go (the lead's progress lines), if anywhere."""
        self.ctx = ctx
        self.progress = progress
        self._workers = {rank: i for i, rank in enumerate(ctx.roles.workers)}

    def take(self, source: int, buf: np.ndarray, h: protocol.Header) -> bool:
        """Handle the request `buf` (header `h`) from rank `source` if it is one of those
        taken the short way; whether it was."""
        ctx = self.ctx
        worker = self._workers.get(source)
        if (worker is None or h.placement != ctx.placement.version or h.ts < 0 or h.clock < 0
                or h.nkeys < 0 or h.width < 0 or ctx.clocks.done[worker] == FINISHED
                or worker in ctx.clocks.gone):
            return False
        if h.op == Op.PULL:
            taken = self._pull(worker, source, buf, h)
        elif h.op == Op.PUSH:
            taken = self._push(worker, source, buf, h)
        else:
            return False
        if taken:
            ctx.watchdog.message_from(worker)
        return taken

    def _pull(self, worker: int, source: int, buf: np.ndarray, h) -> bool:
        ctx = self.ctx
        if h.flags & ~PULL_FLAGS or buf.shape[0] != HEADER_BYTES + 8 * h.nkeys:
            return False
        clock = ctx.clocks.read_clock(worker, bool(h.flags & protocol.NEXT_CLOCK))
        verdict = ctx.gate.verdict(worker, clock, h.placement)
        if verdict == SERVE:
            return ctx.reads.serve_checked(worker, source, h, buf, clock)
        return verdict == HOLD and ctx.reads.hold_checked(worker, source, h, buf, clock)

    def _push(self, worker: int, source: int, buf: np.ndarray, h) -> bool:
        ctx = self.ctx
        n, width, flags = h.nkeys, h.width, h.flags
        if flags & ~PUSH_FLAGS or width != ctx.store.width:
            return False
        keyed = not flags & protocol.SAME_KEYS
        start = HEADER_BYTES + (8 * n if keyed else 0)
        end = HEADER_BYTES + protocol.payload_bytes(h)
        if buf.shape[0] != end + (REPORT_BYTES if flags & protocol.REPORT else 0):
            return False
        values = buf[start:end].view(np.float32).reshape(n, width)
        if first_not_finite(values) >= 0:
            return False
        report = None
        if flags & protocol.REPORT:
            report = protocol.report_at(buf, end)
            try:
                check_report(Op.PUSH, report)
            except ProtocolError:
                return False
        keys = buf[HEADER_BYTES:start].view(np.uint64) if keyed else _NO_KEYS
        if keyed and ctx.placement.first_misplaced(keys, ctx.roles.index, False)[0] >= 0:
            return False
        if report is not None and self.progress:
            self.progress.update(worker, report, say=ctx.lead)
        ctx.pushes.on_push(source, Request(Op.PUSH, h, keys, values, report), buf)
        return True
