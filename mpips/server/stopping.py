"""Stopping a job for a resume: a stop asked of any rank (a signal) reaches the lead (STOP),
which names the clock to checkpoint and stop at, two past its slowest worker (no server has
passed it yet), and tells the other servers (STOP_AT). Reads past that clock are refused
(see readgate); the checkpoint is taken on the way (see pushes.advance).
"""
import logging

from ..wire import messages
from ..wire.clocks import FINISHED
from ..wire.protocol import Op

log = logging.getLogger("mpips")


class Stopping:
    def __init__(self, ctx):
        self.ctx = ctx
        self.asked = False   # the lead: a rank was asked to stop; others: told the lead
        ctx.register({Op.STOP: self.on_stop, Op.STOP_AT: self.on_stop_at})

    def poll(self) -> None:
        """A stop asked of any rank reaches the lead, which names the clock to stop at."""
        ctx = self.ctx
        if not self.asked and ctx.hooks.stop_requested():
            self.asked = True
            log.info("asked to stop (a signal): the job checkpoints and stops")
            if not ctx.lead:
                ctx.send(messages.Stop().pack(), ctx.lead_rank)
        if (self.asked and ctx.lead and ctx.ckpt.stop_at is None
                and not ctx.members.busy):   # a stop waits for a move to end
            slowest = ctx.clocks.slowest()
            if slowest != FINISHED:   # else training is over: nothing to stop
                # Two clocks past the slowest worker: no server can be further than one
                # clock ahead of this one. Reads past it are refused.
                ctx.ckpt.stop_at = slowest + 2
                ctx.tell_servers(messages.StopAt(slowest + 2))
                log.info("stopping at clock %d, two past the slowest worker, after a "
                         "checkpoint there", slowest + 2)

    def on_stop(self, source: int, r, buf) -> None:
        self.asked = True   # only the lead receives it
        self.poll()

    def on_stop_at(self, source: int, r, buf) -> None:
        self.ctx.ckpt.stop_at = messages.StopAt.of(r.header).clock
        self.ctx.pushes.advance()
