"""The lead's side of --balance dynamic: it answers each worker's WORK with its next chunk of
training rows and minibatch size (data.balance), takes back the chunks of a worker that dies
or leaves, hands chunks again to one that joins (`mpips ctl add-worker`), and keeps the
hand-out for checkpoints. A server that does not lead refuses WORK (admission); under
--balance static every server does. The hand-out is not copied: should the lead die, the
server that leads next stops the job at the next WORK (a resume from a checkpoint goes on
from the hand-out it kept).
"""
import logging

from ..base.errors import ProtocolError
from ..data.balance import Balance, Refused
from ..ranks.ulfm import CannotFailOver
from ..wire import messages
from ..wire.protocol import Op

log = logging.getLogger("mpips")


class RowHandOut:
    """`balance`: the lead's hand-out (None under --balance static: WORK is refused)."""

    def __init__(self, ctx, balance: Balance | None):
        self.ctx = ctx
        self.balance = balance
        self.led = ctx.lead   # the hand-out is the first lead's alone (not replicated)
        ctx.register({Op.WORK: self.on_work})

    @property
    def dynamic(self) -> bool:
        """Whether the lead hands out the rows (--balance dynamic)."""
        return self.balance is not None

    def on_work(self, source: int, request, buf) -> None:
        ctx = self.ctx
        if self.balance is None:
            raise ProtocolError(f"{ctx.sender(source)} asked for a chunk of training rows "
                                f"(WORK), but this job hands out none (--balance static)")
        if not self.led:
            raise CannotFailOver("the lead server that handed out the training rows "
                                 "(--balance dynamic) died, and its hand-out with it: the job "
                                 "stops, to resume from its last checkpoint")
        worker = ctx.roles.worker_index(source)
        try:
            ask = messages.WorkAsk.of(buf)
            chunk = self.balance.ask(worker, ask.epoch, ask.speed, ask.units)
        except (ValueError, Refused) as e:
            raise ProtocolError(f"{ctx.sender(source)} asked for {e}: refused, and the job "
                                f"stops") from None
        ctx.reply(messages.work_answer(chunk), source, request.header.ts)

    def worker_gone(self, worker: int, place: dict) -> None:
        """`worker` died or left where `place` (a checkpoint's position) says: the chunks it
        had not trained go back to the pool, to the next workers that ask."""
        if self.balance is None:
            return
        done, offset = int(place.get("segment", 0)), int(place.get("offset", -1))
        if place.get("epoch", 0) >= self.balance.epochs:   # it had trained all it was handed
            done, offset = len(self.balance.handed[worker]), -1
        before = len(self.balance.abandoned)
        back = self.balance.give_back(worker, done, offset)
        if back:
            log.warning("worker %d's chunks of training rows not trained go to the next "
                        "workers that ask: %s", worker,
                        ", ".join(f"[{a}, {b}) of epoch {e}" for e, a, b in back))
        for e, a, b in self.balance.abandoned[before:]:
            why = (f"worker {worker} gave back rows [{a}, {b}) of epoch {e} once no other "
                   f"worker was training")
            log.error("%s: nobody can train them; the job stops for a resume from its last "
                      "checkpoint once the others are done", why)
            if self.ctx.losses:   # the model is incomplete, as when a plan's rows are
                self.ctx.losses.abandoned.append(why)

    def state(self) -> dict | None:
        """What a checkpoint's manifest keeps of the hand-out now: {"balance": ...} under
        --balance dynamic, {} under static; None on a server that leads since the first lead
        died (the hand-out died with it)."""
        if self.balance is None:
            return {}
        return {"balance": self.balance.state()} if self.led else None

    def rows_left(self) -> int:
        """Rows of every epoch not yet handed out, or given back (0 under --balance static)."""
        return self.balance.left() if self.balance else 0

    def worker_joins(self, worker: int, place: dict) -> dict:
        """`worker`, which had left or had none left, trains again (`mpips ctl add-worker`):
        it asks for chunks again from the epoch it was in. Returns its place (`place`, a
        checkpoint's position, updated): after the chunks it was handed, none started."""
        assert self.balance is not None, "a join under --balance dynamic"
        epoch = self.balance.join(worker)
        log.warning("worker %d asks for chunks of training rows again, from epoch %d",
                    worker, epoch)
        return dict(place, epoch=epoch, segment=len(self.balance.handed[worker]), offset=-1)
