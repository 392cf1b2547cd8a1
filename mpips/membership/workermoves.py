"""Workers joining and leaving a running job (`mpips ctl add-worker / remove-worker`): rows
move, not keys, and the placement stays.

Leaving: the lead tells the worker (LEAVE); it ends with the minibatch it is at and says
FINISH with where its rows left start, and the lead hands them on as a dead worker's
(`workerloss`). The worker stays, idle, and may join again.
Joining (an idle worker): each of the n workers training cuts its rows left, keeps n shares
and gives one (GIVE), and tells the lead (SPLIT, numbered as a death). Every worker asked
split, the servers agree a clock C as for a move of key ranges (`rangemoves`); the joiner's
clock becomes C - 1 on every server (JOIN_AT) and it trains from there (JOIN). Until then
the lead counts it as training, so that no worker ends (and scores) before it.
Under --balance dynamic nobody splits: the epoch's rows left are a pool the lead hands out to
whoever asks (`rowhandout`), so the servers agree on C at once and the joiner asks for chunks
again from there.
"""
import logging
import time
from dataclasses import dataclass, field

from ..base.errors import ProtocolError
from ..wire import messages, notices, tags
from ..wire.clocks import FINISHED
from ..wire.position import Position
from ..wire.protocol import Op
from .context import Losses, MembershipContext

log = logging.getLogger("mpips")


@dataclass
class Join:
    """A worker joining, on the lead: the `ctl` request, the workers yet to split their rows
    with it and those that did, when it was asked."""
    request: dict
    worker: int
    waiting: set[int]
    began: float
    given: list[int] = field(default_factory=list)


class WorkerMoves:
    """The lead's part in a worker leaving or joining, and every server's in a join."""
    def __init__(self, members):
        self.members = members   # the front: its answers to `ctl`, the clock agreed
        self.ctx: MembershipContext = members.ctx
        self.leaving = {}       # worker -> (the request it leaves for, when asked)
        self.left = []          # workers that left, in order (the first joins again first)
        self.joining: Join | None = None   # a worker joining

    def handlers(self) -> dict:
        return {Op.SPLIT: self.on_split, Op.JOIN_AT: self.on_join_at}

    @property
    def _losses(self) -> Losses:
        """Where a leaving or joining worker's rows are handed over."""
        losses = self.ctx.losses
        assert losses is not None, "without them any worker change is refused (_worker_refusal)"
        return losses

    def _worker_refusal(self, verb: str, worker) -> str | None:
        """What refuses any worker change: a job whose rows are not handed over, a worker
        (if named) that does not exist or died."""
        s = self.ctx
        n = len(s.roles.workers)
        if not s.losses or s.dense.tables:
            return (f"a worker {verb} only a job of minibatch training without --stages: a "
                    f"pipeline's stages and a full-batch solver's rows are not handed over")
        if worker is not None and not 0 <= worker < n:
            return f"there is no worker {worker}: the job has {n} (0-{n - 1})"
        if worker is not None and worker in s.clocks.gone:
            return f"worker {worker} died"
        return None

    def leave_refusal(self, worker) -> str | None:
        s = self.ctx
        problem = self._worker_refusal("leaves", worker)
        if problem:
            return problem
        if worker is None:
            return "remove-worker needs the number of the worker to remove"
        if s.clocks.done[worker] == FINISHED:
            return f"worker {worker} has finished training"
        if worker in self.leaving:
            return f"worker {worker} is leaving already"
        if not set(self._losses.training(but=worker)) - set(self.leaving):
            return "no other worker is still training to take its rows"
        return None

    def _idle_workers(self) -> list:
        """Living workers not training (they left, or finished their rows): those that left
        first, in order."""
        s = self.ctx
        idle = [w for w in range(len(s.roles.workers))
                if s.clocks.done[w] == FINISHED and w not in s.clocks.gone]
        return sorted(idle, key=lambda w: self.left.index(w) if w in self.left else len(idle))

    def _donors(self) -> list:
        return [w for w in self._losses.training(but=-1) if w not in self.leaving]

    def join_refusal(self, worker) -> str | None:
        problem = self._worker_refusal("joins", worker)
        if problem:
            return problem
        if worker is not None and worker not in self._idle_workers():
            return f"worker {worker} is training"
        if not self._idle_workers():
            return ("no worker is idle to join: one that left (ctl remove-worker) or finished "
                    "its rows can")
        handout = self.ctx.handout
        if handout is not None and handout.dynamic:
            if not handout.rows_left():
                return ("every row of every epoch is handed out already (--balance dynamic): "
                        "a worker that joins would get none")
        elif not self._donors():
            return "no worker is training to share its rows"
        return None

    @property
    def _dynamic(self) -> bool:
        """Whether the lead hands out the rows (--balance dynamic): a join splits none."""
        return self.ctx.handout is not None and self.ctx.handout.dynamic

    def ask_to_give(self, request: dict) -> None:
        """A worker joins: every worker training splits its rows left, keeping n shares for
        the one it gives (n: the workers training), and tells the lead (SPLIT); then the
        servers agree on the clock it joins at (see `_join`). Under --balance dynamic, at
        once."""
        s = self.ctx
        worker = request.get("target")
        worker = self._idle_workers()[0] if worker is None else worker
        if self._dynamic:
            self.joining = Join(request, worker, set(), time.monotonic())
            self.members.move_lead.agree(request, self._join)
            return
        donors = self._donors()
        self.joining = Join(request, worker, set(donors), time.monotonic())
        for w in donors:
            s.send(notices.GiveNotice(worker, len(donors)).fields(),
                   s.roles.workers[w], tags.NOTICE_TAG)

    def on_split(self, source: int, r, buf) -> None:
        """The lead: a worker split its rows with the one joining; number it, as a death."""
        s, j = self.ctx, self.joining
        sender = s.roles.worker_index(source)
        try:
            death = messages.Split.of(buf).handover
        except ValueError as e:
            raise ProtocolError(f"{s.sender(source)} sent a bad request: SPLIT: {e}") from None
        if (j is None or sender not in j.waiting or death.worker != sender or death.dead
                or death.survivors != (sender, j.worker) or len(death.shares) != 2):
            raise ProtocolError(f"{s.sender(source)} sent a bad request: SPLIT of its rows "
                                f"with worker(s) {list(death.survivors)}, which no join asked "
                                f"of it")
        j.waiting.discard(sender)
        j.given.append(sender)
        self._losses.announce(death)
        self._split_done()

    def _split_done(self) -> None:
        """Once every worker asked has split its rows (or finished instead), the clock."""
        j = self.joining
        assert j is not None, "called while a worker joins (on_split, worker_gone, worker_finished)"
        if j.waiting:
            return
        if not j.given:
            error = "every worker finished its rows before sharing them"
            self.members.answer(j.request, {"ok": False, "error": error})
            self.joining = None
            return
        self.members.move_lead.agree(j.request, self._join)

    def _join(self, clock: int) -> None:
        """The lead, the clock agreed: the worker trains again from it, on every server."""
        s, j = self.ctx, self.joining
        assert j is not None, "the clock agreed for the join under way"
        worker = j.worker
        for server in s.others():
            s.send(messages.JoinAt(worker, clock).pack(), s.roles.servers[server])
        self._joined(worker, clock)
        if worker in s.clocks.gone:
            error = f"worker {worker} died before it joined"
            self.members.answer(j.request, {"ok": False, "error": error})
            self.joining = None
            return
        if self._dynamic:
            assert s.handout is not None, "_dynamic: the lead hands out the rows"
            s.ckpt.place(worker, s.handout.worker_joins(worker, s.ckpt.positions[worker]))
        s.send(notices.JoinNotice(clock - 1).fields(), s.roles.workers[worker],
               tags.NOTICE_TAG)
        result = {"ok": True, "command": "add-worker", "target": worker, "clock": clock,
                  "seconds": round(time.monotonic() - j.began, 4), "from": j.given}
        self.members.done.append(result)
        log.warning("ctl add-worker %d done: it trains again from clock %d, %s", worker, clock,
                    "asking for chunks of the rows left" if self._dynamic else
                    f"with a share of the rows left of worker(s) {j.given}")
        if worker in self.left:
            self.left.remove(worker)
        self.members.answer(j.request, result)
        self.joining = None

    def on_join_at(self, source: int, r, buf) -> None:
        s = self.ctx
        worker = messages.JoinAt.of(r.header).worker
        if not 0 <= worker < len(s.roles.workers):
            raise ProtocolError(f"{s.sender(source)} sent JOIN_AT of worker {worker}; the job "
                                f"has {len(s.roles.workers)}")
        self._joined(worker, r.header.clock)

    def _joined(self, worker: int, clock: int) -> None:
        """`worker` trains again from `clock` (unless it died meanwhile); reads held for the
        agreement go on."""
        s = self.ctx
        if worker not in s.clocks.gone:
            s.clocks.resume(worker, clock - 1)
            s.watchdog.message_from(worker)
            # Checkpoints from now on have it training, from where it left (its shares of the
            # splits follow its own rows: see workplan), not finished at the clock it left at.
            place = s.ckpt.positions.get(worker)
            if place is not None:
                s.ckpt.positions[worker] = place.but(clock=clock - 1, finished=False)
        self.members.ranges.agreed()
        s.reads.release()

    def idle_joining(self) -> int:
        """1 if a worker is joining but not training yet (the lead counts it as training:
        the others must not end before it has trained its share), else 0."""
        j = self.joining
        return int(j is not None and self.ctx.clocks.done[j.worker] == FINISHED)

    def ask_to_leave(self, request: dict) -> None:
        """Tell the worker to leave after the minibatch it is at; its FINISH says where its
        rows left start, and the lead hands them on (see workerloss)."""
        s = self.ctx
        worker = request["target"]
        self.leaving[worker] = (request, time.monotonic())
        s.send(notices.LeaveNotice().fields(), s.roles.workers[worker],
               tags.NOTICE_TAG)

    def worker_gone(self, worker: int) -> None:
        """The lead: `worker` died (its rows handed over); a change waiting for it goes on."""
        if worker in self.leaving:
            request, _ = self.leaving.pop(worker)
            error = f"worker {worker} died before it left; its rows were handed over"
            self.members.answer(request, {"ok": False, "error": error})
        j = self.joining
        if j is not None and worker == j.worker and j.given:
            # The shares given to it go on as a finished worker's would (see workerloss).
            losses, place = self._losses, self.ctx.ckpt.positions.get(worker)
            losses.finished(worker, 0, Position(0, epoch=losses.epochs,
                                                taken=place.taken if place else ()))
        if j is not None and worker in j.waiting:
            j.waiting.discard(worker)
            self._split_done()

    def worker_finished(self, worker: int, clock: int, handed) -> None:
        """The lead: `worker` said FINISH (`handed`: the workplan.Handover its rows left went on
        by, if any); if it was asked to leave, the answer."""
        if self.joining is not None and worker in self.joining.waiting:
            self.joining.waiting.discard(worker)
            self._split_done()
        if worker not in self.leaving:
            return
        self.left.append(worker)
        request, began = self.leaving.pop(worker)
        result = {"ok": True, "command": "remove-worker", "target": worker, "clock": clock,
                  "seconds": round(time.monotonic() - began, 4),
                  "from_epoch": handed.epoch if handed else None,
                  "handed_to": list(handed.survivors) if handed else [],
                  "chunks_back": self._dynamic}
        self.members.done.append(result)
        log.warning("ctl remove-worker %d done: it left at clock %d%s", worker, clock,
                    f"; its rows left from epoch {handed.epoch} go to worker(s) "
                    f"{list(handed.survivors)}" if handed else
                    "; its chunks left go to the next workers that ask" if self._dynamic else
                    ", having trained all its rows")
        self.members.answer(request, result)
