"""The worker side of a training job: minibatches of this worker's part of the data, pulled
weights, gradients pushed (a clock each), a stop or a divergence said in time, then its part
of the test file scored with the final model.
"""
import contextlib
import logging
import math
import time
from collections.abc import Iterator

import numpy as np
from mpi4py import MPI

from ..base.errors import Diverged, InputError, MpipsError, Stopped
from ..base.timeline import Timeline
from ..data.shards import open_shard, spans
from ..data.textfile import TextShard
from ..data.workplan import WorkPlan
from ..ranks.roles import Roles
from ..run import signals, summary, testevents
from ..run.config import TrainConfig
from ..run.startup import process_age, ready
from ..storage import checkpoint
from ..wire.placement import Placement
from ..wire.position import Position
from ..worker.kvworker import KVWorker
from ..worker.pushfilter import Plain, PushFilter
from .failing import saving_on_failure
from .other_workers import wait_for_other_workers
from .part_result import PartResult, epoch_rows
from .shared_rows import SharedWork, Speed, open_shared
from .stage_part import FAILED, FINISHED, SCORED, STOPPED, Front, follow, pipe_of
from .worker_rows import Minibatch, Work
from .worker_scoring import Share, worker_share

log = logging.getLogger("mpips")

STRAGGLER_LEAST_BUSY_S = 1e-3


def work(cfg: TrainConfig, roles: Roles, resume, placement: Placement, failover: bool,
         hot: bool = False) -> PartResult:
    """`failover`: a dead server's requests go to its keys' living copies; `hot` (under
    ULFM): workers may die, so none waits for the others in a barrier."""
    kv = KVWorker(roles, width=cfg.model.spec().width, timeout=cfg.faults.timeout,
                  placement=placement, failover=failover, push_filter=_push_filter(cfg))
    position = checkpoint.positions(resume).get(roles.index)
    with saving_on_failure(roles, kv.placement, cfg.faults.timeout):
        if cfg.pipeline.stages == 1:
            return WorkerLoop(cfg, roles, kv, position, checkpoint.deaths(resume), hot).run()
        return _work_in_pipeline(cfg, roles, kv, position, resume)


def _work_in_pipeline(cfg: TrainConfig, roles: Roles, kv: KVWorker, position,
                      resume) -> PartResult:
    """--stages S: this worker is one stage of a pipeline (see stage_part); stage 0 runs the
    worker loop over its copy's part of the data, the others follow it."""
    model = cfg.model.spec()
    pipe = pipe_of(cfg, roles, model)
    if pipe.stage > 0:
        return follow(cfg, roles, kv, pipe, model, position,
                      lambda: wait_for_other_workers(roles, kv, cfg.faults.timeout))
    front = Front(model, pipe, kv, roles.index)
    try:
        out = WorkerLoop(cfg, roles, kv, position, checkpoint.deaths(resume),
                         part=(pipe.copy, pipe.copies), front=front).run()
    except BaseException:
        with contextlib.suppress(MpipsError, MPI.Exception):
            front.end(FAILED)   # the other stages stop at once, not after --timeout
        raise
    pipe.comm.Free()
    out.tasks = front.tasks.rows()
    return out


def _push_filter(cfg: TrainConfig) -> Plain | PushFilter:
    """The push filter a TrainConfig asks for."""
    if not cfg.push.filtered:
        return Plain()
    return PushFilter(cfg.model.spec().width, cfg.push.values, cfg.push.threshold,
                      cfg.optimizer.l1 if cfg.push.skip_zeros else 0.0)


class WorkerLoop:
    """One worker's training and scoring: for each minibatch of its rows, its weights waited
    for (the next one's keys found meanwhile), the gradient computed and pushed (a clock)
    with the next one's pull, one message per server; a stop or a divergence said in time;
    rows handed over as the lead says (taken, left, split, joined again); then its share of
    the test file scored."""

    def __init__(self, cfg: TrainConfig, roles: Roles, kv: KVWorker, position: Position | None,
                 deaths: tuple = (), hot: bool = False, part: tuple | None = None,
                 front: Front | None = None):
        """`part`: (this worker's part of the data, parts) if not (its index, the workers);
        `front`: this worker is stage 0 of a pipeline, which computes the gradients and scores
        (told when training and scoring are over). Otherwise the worker takes shares of the
        rows of workers that died or left when the lead hands them on, and leaves when
        asked."""
        self.cfg, self.roles, self.kv, self.lead = cfg, roles, kv, kv.lead
        self.deaths, self.hot, self.part, self.front = deaths, hot, part, front
        self.model = front or cfg.model.spec()
        self.shared = cfg.consistency.dynamic and front is None   # --balance dynamic
        self.speed = Speed()
        self.epoch_rows: dict[int, int] = {}   # rows trained in this launch, by epoch
        self.handing_on = front is None
        self.examples, self.loss = 0, 0.0
        self.push_ts: int | None = None   # the latest push, not yet waited for
        self.stopped = False          # the job stopped (a checkpoint holds the model)
        self.left: Minibatch | None = None   # the minibatch from which it left its rows
        self.finished = False         # FINISH said
        self.timeline = Timeline()
        # This worker's rows and its stream of minibatches: set by _start, which run() calls
        # first.
        self.work: Work | SharedWork
        self.stream: Iterator[Minibatch]
        self.t0 = self.mark = self.startup_s = 0.0
        self.position = position      # where a checkpoint says this worker stood
        if position:
            kv.clock = position.clock
            self.examples, self.loss = position.examples, position.loss
        self.examples_before, self.clock_before = self.examples, kv.clock

    def run(self) -> PartResult:
        self._start()
        self._train()
        train_s = time.monotonic() - self.t0
        self._sample(train_s, force=True)
        if self.front is not None:
            self.front.end(STOPPED if self.stopped else FINISHED)
        train_bytes, share, score_s = self._score_or_stop()
        self.kv.close()
        return self._result(train_s, train_bytes, share, score_s)

    def _start(self) -> None:
        """Open this worker's rows (once every rank is ready) and its first minibatches."""
        opened: list[tuple[Work | SharedWork, tuple]] = []

        def open_data() -> None:
            cfg, (index, parts) = self.cfg, self.part or (self.roles.index,
                                                          len(self.roles.workers))
            epoch, segment, offset, taken = 0, 0, -1, []
            if self.position:
                p = self.position
                epoch, segment, offset = p.epoch, p.segment, p.offset
                taken = list(p.taken)
            if self.shared:
                opened.append((open_shared(cfg, self.lead, self.model.reserved_keys(),
                                           self.speed), (epoch, 0, -1)))
                return
            try:
                shard = open_shard(cfg.data.train, index, parts, skip_bad=cfg.data.skip_bad_lines)
                plan = WorkPlan(spans(cfg.data.train, parts), cfg.solver.epochs, self.deaths)
            except OSError as e:
                raise InputError(f"--train {cfg.data.train}: {e.strerror or e}") from None
            work = Work(cfg, shard, plan, index, taken, self.model.reserved_keys())
            work.take_shares_untold(epoch)
            opened.append((work, work.resume_point(epoch, segment, offset) if offset >= 0
                           else (epoch, segment, offset)))

        self.t0 = self.mark = ready(self.roles.comm, self.cfg.faults.startup_timeout, open_data)
        self.startup_s = process_age()
        (self.work, first), = opened
        self.stream = self.work.minibatches(*first)

    def _sample(self, t: float, force: bool = False) -> None:
        if force or self.timeline.due(t):
            kv = self.kv
            self.timeline.add(t, force, examples=self.examples, train_loss=self.loss,
                              wait_s=kv.wait_s, bytes_sent=kv.bytes_sent, clock=kv.clock)

    # Training: joins, segments of the work plan, minibatches.

    def _train(self) -> None:
        """Train on this worker's rows and those handed to it; once done (or having left),
        say FINISH and wait for the others, unless the lead asks it to join again."""
        while True:
            self._train_rows()
            if self.stopped or not self.handing_on:
                return
            self._say_finish(self.left)
            self.finished = True
            if not wait_for_other_workers(self.roles, self.kv, self.cfg.faults.timeout, self.work,
                                           self.hot):
                return
            log.warning("joining again at clock %d (mpips ctl add-worker)", self.lead.join_clock)
            self.stream = self.work.minibatches(*self.work.rejoin(self.lead))
            self.left, self.push_ts = None, None

    def _train_rows(self) -> None:
        """Train the stream of minibatches, then those of the segments the lead handed over
        meanwhile, until none is left, the job stops or this worker leaves."""
        while True:
            current = next(self.stream, None)
            if current is not None:
                pull = self.kv.pull(current.keys)
                while current is not None:
                    current, pull = self._step(current, pull)
            if self.stopped or self.left or not self.handing_on or not self._more_to_train():
                return
            self.stream = self.work.minibatches(self.work.epoch, self.work.segment + 1)

    def _step(self, current: Minibatch, pull: int) -> tuple:
        """Train minibatch `current` (its pull sent); (the next minibatch, its pull), or
        (None, None) once there is none, the job stopped or this worker leaves."""
        kv = self.kv
        self.lead.pass_on_stop(signals.stop_requested())
        if self.handing_on:
            self.work.apply_notices(self.lead.notices())
        waited = kv.wait_s
        upcoming, next_pull = self._next_minibatch()
        testevents.reached("epoch", current.epoch)
        try:
            weights = kv.wait(pull)
        except Stopped:
            self.stopped = True
            return None, None
        assert weights is not None, "waiting for a pull returns its values"
        grad = self._gradient(current, weights)
        # Where the next minibatch starts, for checkpoints: the servers note it with the push.
        epoch, start, segment = ((upcoming.epoch, upcoming.start, upcoming.segment) if upcoming
                                 else (self.cfg.solver.epochs, -1, self._end_segment()))
        kv.report(self.examples, self.loss, current.progress, epoch, start, segment,
                  taken=self.work.taken)
        self._sample(time.monotonic() - self.t0)
        leaving = self.lead.asked_to_leave
        self._push(current, grad, last=upcoming is None or leaving)
        self._pace(waited, len(current.rows))
        if upcoming and leaving:
            self.left = upcoming
            return None, None
        return upcoming, next_pull

    def _next_minibatch(self) -> tuple:
        """(the next minibatch, its pull): its keys are found, and its pull made, while the
        servers answer this one's; the pull travels with this one's push (KVWorker.pull's
        with_push: one message per server per clock). Asked to leave, the worker ends with
        this minibatch: the next is where its rows left start (not pulled); asked to give a
        worker that joins a share of them, it splits them there."""
        lead = self.lead
        upcoming = next(self.stream, None)
        if (upcoming and lead.asked_to_give and not lead.asked_to_leave
                and isinstance(self.work, Work)):
            self.stream = self.work.share_with_joiner(lead, self.kv.clock, lead.asked_to_give,
                                                      upcoming, self.cfg.faults.timeout)
            upcoming = next(self.stream, None)
        next_pull = (self.kv.pull(upcoming.keys, with_push=True)
                     if upcoming and not lead.asked_to_leave else None)
        return upcoming, next_pull

    def _gradient(self, current: Minibatch, weights: np.ndarray) -> np.ndarray:
        """The gradient of `current`'s loss at `weights`; a loss that is not finite stops the
        job (Diverged) before anything of it is pushed."""
        grad, batch_loss = self.model.gradient(current.rows, current.cols, current.bias_col,
                                               weights)
        if not math.isfinite(batch_loss):
            raise Diverged(_diverged(self.cfg, self.kv.clock, current, self.work.shard,
                                     batch_loss))
        self.loss += batch_loss
        self.examples += len(current.rows)
        self.epoch_rows[current.epoch] = self.epoch_rows.get(current.epoch, 0) + len(current.rows)
        if isinstance(self.work, SharedWork):
            grad *= np.float32(self.work.weight(len(current.rows)))
        return grad

    def _push(self, current: Minibatch, grad: np.ndarray, last: bool) -> None:
        """Push the gradient of `current`, a clock (with the next minibatch's pull, if made),
        once the previous push is through. The last push of the worker's stream of
        minibatches delivers what the push filter still holds back (pushfilter)."""
        if self.push_ts is not None:
            self.kv.wait(self.push_ts)
            testevents.reached("clock", self.kv.clock)
        self.push_ts = self.kv.push(current.keys, grad, clock=True, flush=last)

    def _pace(self, waited: float, rows: int) -> None:
        """The worker's speed, from the time its minibatch of `rows` rows kept it busy (not
        waiting on pulls: `waited` before it); --straggler, a testing aid: that time
        `slowdown` times over (as if a minibatch took at least 1 ms: a slowed test job lasts
        about as long however fast the machine)."""
        busy = time.monotonic() - self.mark - (self.kv.wait_s - waited)
        slowdown = self.cfg.diagnostics.slowdown(self.roles.index, self.kv.clock)
        if slowdown > 1:
            # Minibatches of any size (--balance dynamic): as if --batch-size rows took 1 ms.
            least = STRAGGLER_LEAST_BUSY_S * (self.work.weight(rows)
                                              if isinstance(self.work, SharedWork) else 1)
            time.sleep((slowdown - 1) * max(busy, least))
            busy = time.monotonic() - self.mark - (self.kv.wait_s - waited)
        self.speed.add(rows, busy)
        self.mark = time.monotonic()

    # Hand-overs: rows handed to this worker, or left by it.

    def _more_to_train(self) -> bool:
        """Before this worker says FINISH: whether the lead has handed it rows of a dead worker
        that it has not trained (told of, or on their way); none under --balance dynamic."""
        if isinstance(self.work, SharedWork):
            return False
        self.work.catch_up(self.lead, self.lead.status()["deaths"], self.cfg.faults.timeout)
        return self.work.segment + 1 < len(self.work.segments(self.work.epoch))

    def _say_finish(self, left: Minibatch | None = None) -> None:
        """FINISH to every server (completing this worker's requests first), with where the
        rows it leaves to the others start (`left`: the next minibatch), or its end."""
        kv, work, epochs = self.kv, self.work, self.cfg.solver.epochs
        if left:   # the lead hands the rows from the next minibatch on to the others
            log.warning("leaving at clock %d (mpips ctl remove-worker): the rows left from "
                        "epoch %d go to the other workers", kv.clock, left.epoch)
            work.leave(left)
            kv.report(self.examples, self.loss, left.progress, left.epoch, left.start,
                      left.segment, taken=work.taken)
        else:
            work.end()
            kv.report(self.examples, self.loss, epochs, epochs, -1, self._end_segment(),
                      taken=work.taken)
        kv.finish()

    def _end_segment(self) -> int:
        """The segment of a place after all this worker's rows: under --balance dynamic, after
        the chunks it was handed (all done, should it join again or the job resume: see
        data.balance), else 0."""
        return len(self.work.chunks) if isinstance(self.work, SharedWork) else 0

    # After training: the test file, or the stop.

    def _score_or_stop(self) -> tuple:
        """(bytes sent training, this worker's Share of the test file, seconds scoring it):
        scored once every worker has finished, or none if the job stops."""
        cfg, kv = self.cfg, self.kv
        share = Share(np.empty(0), np.empty(0, np.float32), 0, 0)
        score_s = 0.0
        if self.stopped:
            train_bytes = kv.bytes_sent
            log.info("the job is stopping: a checkpoint holds the model at clock %d", kv.clock)
            # Every worker stops (none finishes): a barrier, unless one may have died.
            wait_for_other_workers(self.roles, kv, cfg.faults.timeout,
                                    self.work if self.hot else None, self.hot)
            return train_bytes, share, score_s
        if not self.finished:
            self._say_finish(None)
            wait_for_other_workers(self.roles, kv, cfg.faults.timeout)
        train_bytes = kv.bytes_sent
        if cfg.data.test:
            began = time.monotonic()
            testevents.reached("scoring")
            # Those that died in this launch (a resume's dead workers live again).
            deaths = (self.work.plan.deaths[len(self.deaths):] if isinstance(self.work, Work)
                      else ())
            share = worker_share(cfg, self.roles, kv, deaths,
                                 self.part, self.front, self.hot)
            score_s = time.monotonic() - began
        if self.front is not None:
            self.front.end(SCORED)
        return train_bytes, share, score_s

    def _result(self, train_s: float, train_bytes: int, share: Share,
                score_s: float) -> PartResult:
        kv = self.kv
        r = summary.new_record()
        r["examples"] = self.examples
        r["examples_before"] = self.examples_before
        r["pushes"] = kv.clock - self.clock_before   # each acknowledged (waited for) before BYE
        r["train_loss"] = self.loss
        r["train_s"] = train_s
        r["startup_s"] = self.startup_s
        r["score_s"] = score_s
        r["wait_s"] = kv.wait_s
        r["bytes_sent"] = kv.bytes_sent
        r["train_bytes"] = train_bytes
        r["bad_lines"] = self.work.shard.bad_lines + share.bad_lines
        r["test_rows"] = share.margins.shape[0]
        r["test_units"] = share.units
        r["stopped_at"] = kv.clock if self.stopped else -1   # a worker: where it was stopped
        for name, value in kv.filter.figures().items():
            r[name] = value
        return PartResult(r, share.margins, share.labels, np.zeros(len(self.roles.workers)),
                          samples=self.timeline.samples(),
                          epoch_rows=epoch_rows(self.roles.index, self.epoch_rows))


def _diverged(cfg: TrainConfig, clock: int, current: Minibatch, shard, loss: float) -> str:
    where = "byte" if isinstance(shard, TextShard) else "row"
    kept = (f"; the checkpoints in {cfg.checkpoints} are kept" if cfg.checkpointing.on else "")
    return (f"the training loss became {loss} at clock {clock} (epoch {current.epoch}, the "
            f"minibatch at {where} {current.start} of {shard.path}); nothing of it was pushed. "
            f"The learning rate ({cfg.optimizer.name} --lr {cfg.optimizer.lr:.4g}) may be too "
            f"large, or the data holds values that are not finite{kept}")
