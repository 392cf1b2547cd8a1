"""What the servers do, under ULFM, when a worker dies: agree on the clocks of it that every
server holds, drop its pushes after them, stop waiting for it, and (the lead) hand the rows
it had not trained to the living workers (see `workplan`).

A worker pushes each clock to every server in turn, so it may die having reached some and
not others. Each server that learns of the death tells the others how many of the dead
worker's clocks it holds (GONE); once every living server has said, all take the smallest
number, K, and drop its pushes of clock K and later. Under BSP no server has applied them:
with hot failover a clock is applied only once every server holds every worker's pushes of
it (`ClockTable.commit`, HAVE messages), so the model has each of the dead worker's clocks
applied everywhere or nowhere, and its place after clock K (which every server got with its
push) is where the survivors take over. Under SSP and ASP pushes are applied on arrival:
the pushes after K that reached some servers stay applied there, and their rows are trained
again by the survivors.
"""
import logging
import time

from ..base.errors import ProtocolError
from ..data.workplan import Handover, WorkPlan
from ..wire import messages, notices, tags
from ..wire.clocks import FINISHED
from ..wire.position import Position
from ..wire.protocol import Op
from .context import RecoveryContext

log = logging.getLogger("mpips")


class WorkerLosses:
    def __init__(self, ctx: RecoveryContext, epochs: int, parts: list, deaths: tuple = (),
                 hot: bool = True):
        """`ctx`: the server's context (what a handler may read and do). `parts`: each
        worker's own part of the training data (see `workplan`). Not `hot` (no ULFM): no
        worker dies here, but one may leave (`mpips ctl remove-worker`), and its rows are
        handed over the same way."""
        self.ctx = ctx
        self.hot = hot
        self.epochs = epochs
        self.parts = parts
        self.deaths = list(deaths)   # in order, as the lead numbered them (a resume's first)
        self.held: dict[int, dict[int, int]] = {}   # dead worker -> {server index: its clocks
                                                    # held there}
        self.settled: set[int] = set()   # dead workers no longer waited for
        self.examples = 0            # examples the dead workers trained (the lead counts them)
        self.failures: list[dict] = []   # what this server saw of workers' deaths
        self.abandoned: list[str] = []   # the lead: rows left that no living worker could take
        clocks = ctx.clocks
        if hot and clocks.staleness == 0:
            clocks.commit([i for i in range(len(ctx.roles.servers))
                           if i != ctx.roles.index])
        self._here = clocks.here()   # what this server last told the others it holds
        ctx.register(self.handlers())

    def handlers(self) -> dict:
        """The operations worker failover brings to the server's loop."""
        return {Op.GONE: self._on_gone, Op.HAVE: self._on_have, Op.DEATH: self._on_death}

    def _on_gone(self, source: int, r, buf) -> None:
        s, gone = self.ctx, messages.Gone.of(r.header)
        if not 0 <= gone.worker < len(s.roles.workers):
            raise ProtocolError(f"{s.sender(source)} sent a bad request: GONE of worker "
                                f"{gone.worker}, which this server cannot take")
        self.on_gone(s.roles.servers.index(source), gone.worker, gone.clock)

    def _on_have(self, source: int, r, buf) -> None:
        s = self.ctx
        s.clocks.have(s.roles.servers.index(source), messages.Have.of(r.header).clock)
        s.pushes.advance()

    def _on_death(self, source: int, r, buf) -> None:
        try:
            death = messages.Death.of(r.header, buf)
        except ValueError as e:
            raise ProtocolError(f"{self.ctx.sender(source)} sent a bad request: DEATH: "
                                f"{e}") from None
        self.on_death(death.number, death.handover)

    def tell_what_is_here(self) -> None:
        """BSP: the other servers apply a clock once every server holds all its pushes (see
        `ClockTable.commit`); this server tells them when it holds more."""
        s = self.ctx
        here = s.clocks.here()
        if not s.clocks.elsewhere or here <= self._here:
            return
        self._here = here
        for i in s.clocks.elsewhere:
            s.send(messages.Have(here).pack(), s.roles.servers[i])

    def workers_died(self, workers: set) -> bool:
        """Workers MPI (or another server) said died: tell the other servers how many of
        their clocks this one holds. Whether any was news."""
        s = self.ctx
        me = s.roles.index
        new = [w for w in sorted(workers) if me not in self.held.get(w, {})]
        for w in new:
            clocks = self._held_here(w)
            self.held.setdefault(w, {})[me] = clocks
            self.failures.append({"worker": w, "role": f"worker {w}",
                                  "rank": s.roles.workers[w], "learned_at": time.time(),
                                  "clocks_held": clocks})
            log.warning("worker %d (rank %d) died; this server holds its first %d clock(s)",
                        w, s.roles.workers[w], clocks)
            for i in s.others():
                s.send(messages.Gone(w, clocks).pack(), s.roles.servers[i])
        dead = {s.roles.workers[w] for w in new}
        s.forget_ranks(dead)
        for w in new:
            self._settle(w)
        return bool(new)

    def _held_here(self, worker: int) -> int:
        done = self.ctx.clocks.done[worker]
        if done == FINISHED:   # it had finished: its last clock
            place = self.ctx.ckpt.positions.get(worker)
            return place.clock if place else 0
        return done

    def known(self) -> set:
        """Dead workers this server knows of."""
        me = self.ctx.roles.index
        return {w for w, said in self.held.items() if me in said}

    def on_gone(self, sender: int, worker: int, clocks: int) -> None:
        """Server `sender` holds `clocks` of dead `worker`'s clocks. Its count is trusted: this
        server's own MPI may tell of the death later."""
        if worker in self.settled:
            return
        self.held.setdefault(worker, {})[sender] = clocks
        if self.ctx.roles.index not in self.held[worker]:
            self.workers_died({worker})
        else:
            self._settle(worker)

    def servers_died(self) -> None:
        """Dead servers are no longer waited for."""
        for w in list(self.held):
            self._settle(w)

    def _settle(self, worker: int) -> None:
        """Once every living server has said how many of `worker`'s clocks it holds: drop its
        later pushes, stop waiting for it, and (the lead) hand over its rows."""
        s = self.ctx
        said = self.held[worker]
        living = s.placement.living
        if worker in self.settled or not set(living) <= set(said):
            return
        self.settled.add(worker)
        k = min(said[i] for i in living)
        dropped = s.pushes.buffer.drop(worker, k)
        place = s.ckpt.position_after(worker, k)
        s.clocks.worker_gone(worker)
        s.ckpt.note_lost(worker, place)
        for f in self.failures:
            if f["worker"] == worker:
                f.update({"clocks_kept": k, "pushes_dropped": dropped})
        if s.lead:
            self._hand_on(worker, k, place)
            s.members.worker_gone(worker)
            if s.scoring:
                s.scoring.worker_gone(worker)
        s.pushes.advance()

    def _hand_on(self, worker: int, clock: int, place: Position) -> None:
        """The lead: the dead worker's rows left go to the living workers still training."""
        self.examples += place.examples
        if self.ctx.handout and self.ctx.handout.dynamic:   # the next that ask take them
            self.ctx.handout.worker_gone(worker, place)
            return
        if place.finished or place.epoch >= self.epochs:
            log.warning("worker %d had finished its rows: nothing to hand over", worker)
            return
        survivors = self.training(but=worker)
        if not survivors:
            self._abandon(f"worker {worker} died with rows left to train (epoch "
                          f"{place.epoch}) and every other worker had finished")
            return
        self.announce(Handover(worker, clock, place.epoch, place.segment, place.offset,
                               place.taken, survivors))
        log.warning("worker %d's rows left (from epoch %d, clock %d) go to worker(s) %s",
                    worker, place.epoch, clock, list(survivors))

    def _abandon(self, why: str) -> None:
        """Rows nobody can train: the job ends as usual (the other servers do not know), and
        then stops everywhere for a resume (job.ending.finish, from this server's record)."""
        self.abandoned.append(why)
        log.error("%s: nobody can train its rows left; the job stops for a resume from its "
                  "last checkpoint once the others are done", why)

    def training(self, but: int) -> tuple:
        """The workers still training, but `but`."""
        s = self.ctx
        return tuple(w for w in range(len(s.roles.workers))
                     if w != but and w not in s.clocks.gone and s.clocks.done[w] != FINISHED)

    def announce(self, death: Handover) -> None:
        """Number the death, and tell the other servers and every living worker of it (all
        workers share the test file among the living ones)."""
        s = self.ctx
        index = len(self.deaths)
        self.deaths.append(death)
        told = messages.Death(index, death).pack()
        for i in s.others():
            s.send(told, s.roles.servers[i])
        notice = notices.HandoverNotice(index, death.fields()).fields()
        for w in range(len(s.roles.workers)):
            if w not in s.clocks.gone:
                s.send(notice, s.roles.workers[w], tags.NOTICE_TAG)

    def finished(self, worker: int, clock: int, place: Position) -> Handover | None:
        """The lead: `worker` said FINISH, its next minibatch at `place` (a checkpoint's
        position). The rows it has not trained go on to the workers still training, as a
        dead worker's would: those from `place` if it left before its end (`mpips ctl
        remove-worker`), and shares handed to it after it asked whether there were any (they
        crossed on the wire), from the end of its plan. Returns the hand-over, if any."""
        taken = place.taken
        given = [d for d in self.deaths if worker in d.survivors]
        # (a full-batch solver's worker says no epoch: it left only if it was asked to)
        leaving = worker in self.ctx.members.leaving and place.epoch < self.epochs
        if self.ctx.handout and self.ctx.handout.dynamic:
            if self.ctx.lead and leaving:   # its chunks left go to the next that ask
                self.ctx.handout.worker_gone(worker, place)
            return None
        if not self.ctx.lead or (len(taken) >= len(given) and not leaving):
            return None
        if leaving:   # shares it had not taken yet join the epoch it left in
            epoch, segment, offset = place.epoch, place.segment, place.offset
        else:
            epoch, offset = self.epochs - 1, -1
            segment = len(WorkPlan(self.parts, self.epochs, tuple(self.deaths))
                          .segments(worker, epoch, taken))
        survivors = self.training(but=worker)
        if not survivors:
            self._abandon(f"worker {worker} ended with rows left to train (epoch {epoch}) and "
                          f"every other worker had finished")
            return None
        full = taken + (epoch,) * (len(given) - len(taken))
        death = Handover(worker, clock, epoch, segment, offset, full, survivors, dead=False)
        self.announce(death)
        log.warning("worker %d %s: its rows left go to worker(s) %s", worker,
                    "left" if leaving else "finished before its share of a dead worker's rows "
                    "reached it", list(survivors))
        return death

    def on_death(self, index: int, death: Handover) -> None:
        """The lead numbered a death: kept, for checkpoints (and should this server lead)."""
        if index == len(self.deaths):
            self.deaths.append(death)

    def deaths_before(self, clock: int) -> list:
        """The deaths a checkpoint of `clock` records: those whose worker's clocks ended
        before it (at `clock` itself the dead worker still stands where it was), and the
        splits made at it (the worker cut its rows where its next minibatch starts, which is
        where its push of `clock` says it stands, and the joiner's first push counts them)."""
        return [d.as_dict() for d in self.deaths
                if d.clock < clock or (d.split and d.clock == clock)]
