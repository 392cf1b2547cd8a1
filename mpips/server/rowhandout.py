"""The lead's side of --balance dynamic: it answers each worker's WORK with its next chunk of
training rows and minibatch size (data.balance), takes back the chunks of a worker that dies
or leaves, hands chunks again to one that joins (`mpips ctl add-worker`), and keeps the
hand-out for checkpoints. A server that does not lead refuses WORK (admission); under
--balance static every server does.

Under failover (ULFM, --replicas R of 2 or more) the hand-out has copies on the servers that
would lead next (the standbys: the first R - 1 living servers after the lead, as many as may
die with it and leave every key a living copy): after each change the lead sends each a
numbered copy (HANDOUT, JSON: the whole hand-out to a new standby, then the chunks handed or
changed since the last copy, with the few numbers per worker and epoch) and holds its answer
to the worker until every standby says it holds that copy (HANDOUT_HELD). So every chunk a
worker was told of is in every standby's copy, and should the lead die, with up to R - 2 of
its standbys, the first living standby goes on handing out from its copy. A worker whose
question died with the lead asks the new lead again, saying how many chunks it holds: the
same count as its last question's gets that question's answer again, from the copy. A worker
that died or left while the lead died (its chunks given back in no copy) has them given back
then. Should the lead and all its standbys die, the next server holds no current copy and
stops the job at the next WORK (a resume from a checkpoint goes on from the hand-out it
kept).
"""
import json
import logging

import numpy as np

from ..base.errors import ProtocolError
from ..data.balance import Balance, Refused
from ..ranks.ulfm import CannotFailOver
from ..wire import messages
from ..wire.clocks import FINISHED
from ..wire.position import Position
from ..wire.protocol import Op

log = logging.getLogger("mpips")


class RowHandOut:
    """`balance`: the hand-out (None under --balance static: WORK is refused); on every
    server, the lead's the job's."""

    def __init__(self, ctx, balance: Balance | None):
        self.ctx = ctx
        self.balance = balance
        self.led = ctx.lead   # this server hands out the rows (the first lead, or its heir)
        # Copies kept on the standbys: under failover, with another server alive.
        self.copies = ctx.takeover is not None and balance is not None
        # Whether this server's hand-out is the job's as of the last copy: the lead's; the
        # first standbys' at the start (the lead copies every change before it answers).
        self.current = self.led or (self.copies and ctx.roles.index in self._standbys_of_lead())
        self.number = 0          # the lead: copies sent; a standby: the latest held
        self.standbys: list[int] = []   # the lead: the servers it sends its copies to
        self.held: dict[int, int] = {}  # the lead: the latest copy each standby holds
        self.waiting: list[tuple[int, int, int, np.ndarray]] = []   # (copy, rank, ts, answer)
        # worker -> (chunks it held when it last asked, the answer): to answer a question
        # asked again of the next lead alike
        self.answers: dict[int, tuple[int, list[int]]] = {}
        ctx.register({Op.WORK: self.on_work, Op.HANDOUT: self.on_copy,
                      Op.HANDOUT_HELD: self.on_held})

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
                                 "(--balance dynamic) died, and its hand-out with it (no "
                                 "living server holds a copy): the job stops, to resume "
                                 "from its last checkpoint")
        worker = ctx.roles.worker_index(source)
        try:
            ask = messages.WorkAsk.of(buf)
            last = self.answers.get(worker)
            if last is not None and last[0] == ask.held:   # its answer died with a lead
                answer = np.array(last[1], np.int64)
            else:
                answer = messages.work_answer(
                    self.balance.ask(worker, ask.epoch, ask.speed, ask.units))
                self.answers[worker] = (ask.held, answer.tolist())
                self._copy()
        except (ValueError, Refused) as e:
            raise ProtocolError(f"{ctx.sender(source)} asked for {e}: refused, and the job "
                                f"stops") from None
        if self._held_by_all() < self.number:
            self.waiting.append((self.number, source, request.header.ts, answer))
        else:
            ctx.reply(answer, source, request.header.ts)

    def worker_gone(self, worker: int, place: Position) -> None:
        """`worker` died or left where `place` (a checkpoint's position) says: the chunks it
        had not trained go back to the pool, to the next workers that ask."""
        if self.balance is None:
            return
        done, offset = place.segment, place.offset
        if place.epoch >= self.balance.epochs:   # it had trained all it was handed
            done, offset = len(self.balance.handed[worker]), -1
        before = len(self.balance.abandoned)
        back = self.balance.give_back(worker, done, offset)
        self._copy()
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
        --balance dynamic, {} under static; None on a lead that holds no current hand-out
        (it died with the leads before it)."""
        if self.balance is None:
            return {}
        return {"balance": self.balance.state()} if self.led else None

    def rows_left(self) -> int:
        """Rows of every epoch not yet handed out, or given back (0 under --balance static)."""
        return self.balance.left() if self.balance else 0

    def worker_joins(self, worker: int, place: Position) -> Position:
        """`worker`, which had left or had none left, trains again (`mpips ctl add-worker`):
        it asks for chunks again from the epoch it was in. Returns its place (`place`, a
        checkpoint's position, updated): after the chunks it was handed, none started."""
        assert self.balance is not None, "a join under --balance dynamic"
        epoch = self.balance.join(worker)
        self.answers.pop(worker, None)   # it asks anew, holding as many chunks as it did
        self._copy()
        log.warning("worker %d asks for chunks of training rows again, from epoch %d",
                    worker, epoch)
        return place.but(epoch=epoch, segment=len(self.balance.handed[worker]), offset=-1)

    # The copies on the standbys (under failover).
    def _standbys_of_lead(self) -> list[int]:
        """The servers that would lead next, in turn: the first living ones after the lead,
        as many as may die with it and leave every key a living copy (--replicas - 1)."""
        placement = self.ctx.placement
        return list(placement.living[1:placement.replicas])

    def _held_by_all(self) -> int:
        """The lead: the latest copy every standby holds (all it sent, with none)."""
        return min((self.held.get(s, 0) for s in self.standbys), default=self.number)

    def _copy(self) -> None:
        """The lead: a copy of the hand-out to its standbys, whole to a new set of them, else
        what changed since the last (answers wait until all hold it)."""
        ctx, balance = self.ctx, self.balance
        if not (self.copies and self.led):
            return
        assert balance is not None, "copies under --balance dynamic"
        standbys = self._standbys_of_lead()
        whole = standbys != self.standbys   # new standbys: no copy yet to go on from
        self.standbys = standbys
        if not standbys:   # the last server: nobody to copy to
            self._answer_waiting()
            return
        self.number += 1
        copy = messages.HandOutCopy(self.number, json.dumps({
            "balance": balance.copy(whole),
            "answers": {str(w): [held, answer] for w, (held, answer) in self.answers.items()},
        })).pack()
        balance.copied()
        for standby in standbys:
            ctx.send(copy, ctx.roles.servers[standby])

    def on_copy(self, source: int, request, buf) -> None:
        """A standby: the lead's copy (whole, or the changes since the last), taken if it
        fits; it says it holds it."""
        ctx = self.ctx
        copy = messages.HandOutCopy.of(request.header, buf)
        if self.balance is None or self.led:
            raise ProtocolError(f"{ctx.sender(source)} sent a copy of the hand-out of "
                                f"training rows (HANDOUT) to a server that "
                                f"{'leads' if self.led else 'hands out none'}")
        try:
            record = json.loads(copy.text)
            answers = {int(w): (int(held), [int(x) for x in answer])
                       for w, (held, answer) in record["answers"].items()}
            if not all(0 <= w < self.balance.workers and len(a) == 4
                       for w, (_, a) in answers.items()):
                raise ValueError("answers: to no such worker, or not four numbers")
            self.balance.take_copy(record["balance"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ProtocolError(f"{ctx.sender(source)} sent a copy of the hand-out of "
                                f"training rows that does not fit this job: {e}") from None
        self.answers, self.number, self.current = answers, copy.number, True
        ctx.send(messages.HandOutHeld(copy.number).pack(), source)

    def on_held(self, source: int, request, buf) -> None:
        """The lead: a standby holds copy `number`: the answers that waited for every standby
        to hold it go."""
        ctx = self.ctx
        held = messages.HandOutHeld.of(request.header).number
        standby = next((s for s in self.standbys if ctx.roles.servers[s] == source), None)
        if standby is None:
            return   # a former standby's (it died, or another stands by now)
        if not 0 < held <= self.number:
            raise ProtocolError(f"{ctx.sender(source)} says it holds copy {held} of the "
                                f"hand-out of training rows; {self.number} were sent")
        self.held[standby] = max(self.held.get(standby, 0), held)
        self._answer_waiting()

    def _answer_waiting(self) -> None:
        held, still = self._held_by_all(), []
        for number, rank, ts, answer in self.waiting:
            if number <= held:
                self.ctx.reply(answer, rank, ts)
            else:
                still.append((number, rank, ts, answer))
        self.waiting = still

    def servers_died(self) -> None:
        """Servers died (the placement already without them): a standby that leads now takes
        the hand-out from its copy; a lead whose standbys changed copies to them all."""
        ctx = self.ctx
        if not (self.copies and ctx.lead):
            return
        if not self.led:
            if not self.current:
                return   # no copy here: the next WORK stops the job (on_work)
            self.led = True
            log.warning("server %d hands out the training rows now, from the copy the lead "
                        "kept here (number %d)", ctx.roles.index, self.number)
            self._given_back_in_no_copy()
        if self.standbys != self._standbys_of_lead():
            self._copy()   # answers waiting go once the new standbys hold this copy

    def _given_back_in_no_copy(self) -> None:
        """The chunks of workers that died or left around the lead's death, which no copy
        gave back: given back now, from their places."""
        ctx, balance = self.ctx, self.balance
        assert balance is not None, "copies under --balance dynamic"
        for worker in range(balance.workers):
            gone = worker in ctx.clocks.gone or ctx.clocks.done[worker] == FINISHED
            if gone and worker not in balance.out and worker in ctx.ckpt.positions:
                self.worker_gone(worker, ctx.ckpt.positions[worker])
