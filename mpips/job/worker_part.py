"""The worker side of a training job: minibatches of this worker's part of the data, pulled
weights, gradients pushed (a clock each), a stop or a divergence said in time, then its part
of the test file scored with the final model.
"""
import contextlib
import logging
import math
import time

import numpy as np
from mpi4py import MPI

from ..storage import checkpoint
from ..worker.pushfilter import Plain, PushFilter
from ..run import signals
from ..run import summary
from ..run import testevents
from ..ranks.bounded import Backoff, wait_all, wait_until
from ..worker.kvworker import KVWorker
from .failing import saving_on_failure
from ..run.config import TrainConfig
from ..data.textfile import KeyIndexer, TextShard
from ..base.errors import Diverged, InputError, MpipsError, Stopped
from ..models.lbfgs import Step
from ..wire.placement import Placement
from ..ranks.roles import Roles
from .scoring import Share, worker_share
from ..data.shards import open_shard, spans
from .stage_part import FAILED, FINISHED, SCORED, STOPPED, Front, follow, pipe_of
from ..run.startup import process_age, ready
from ..base.timeline import Timeline
from ..data.workplan import Handover, WorkPlan

log = logging.getLogger("mpips")

STRAGGLER_LEAST_BUSY_S = 1e-3


def work(cfg: TrainConfig, roles: Roles, resume, placement: Placement, failover: bool,
         hot: bool = False):
    """`failover`: a dead server's requests go to its keys' living copies; `hot` (under
    ULFM): workers may die, so none waits for the others in a barrier."""
    kv = KVWorker(roles, width=cfg.model.spec().width, timeout=cfg.faults.timeout,
                  placement=placement, failover=failover, push_filter=_push_filter(cfg))
    position = checkpoint.positions(resume).get(roles.index)
    with saving_on_failure(roles, kv.placement, cfg.faults.timeout):
        if cfg.pipeline.stages == 1:
            return _train_and_score(cfg, roles, kv, position, checkpoint.deaths(resume), hot)
        return _work_in_pipeline(cfg, roles, kv, position, resume)


def _work_in_pipeline(cfg: TrainConfig, roles: Roles, kv: KVWorker, position, resume):
    """--stages S: this worker is one stage of a pipeline (see stagework); stage 0 runs the
    worker loop over its copy's part of the data, the others follow it."""
    model = cfg.model.spec()
    pipe = pipe_of(cfg, roles, model)
    if pipe.stage > 0:
        return follow(cfg, roles, kv, pipe, model, position,
                      lambda: _wait_for_other_workers(roles, kv, cfg.faults.timeout))
    front = Front(model, pipe, kv, roles.index)
    try:
        out = _train_and_score(cfg, roles, kv, position, checkpoint.deaths(resume),
                               part=(pipe.copy, pipe.copies), front=front)
    except BaseException:
        with contextlib.suppress(MpipsError, MPI.Exception):
            front.end(FAILED)   # the other stages stop at once, not after --timeout
        raise
    pipe.comm.Free()
    return (*out, front.tasks.rows())


def _push_filter(cfg: TrainConfig) -> Plain | PushFilter:
    """The push filter a TrainConfig asks for."""
    if not cfg.push.filtered:
        return Plain()
    return PushFilter(cfg.model.spec().width, cfg.push.values, cfg.push.threshold,
                      cfg.optimizer.l1 if cfg.push.skip_zeros else 0.0)


def _train_and_score(cfg: TrainConfig, roles: Roles, kv: KVWorker, position: dict | None,
                     deaths: tuple = (), hot: bool = False, part: tuple = None,
                     front: Front | None = None):
    """`part`: (this worker's part of the data, parts) if not (its index, the workers);
    `front`: this worker is stage 0 of a pipeline, which computes the gradients and scores
    (told when training and scoring are over). Otherwise the worker takes shares of the rows
    of workers that died or left when the lead hands them on, and leaves when asked."""
    n_workers = len(roles.workers)
    index, parts = part or (roles.index, n_workers)
    model = front or cfg.model.spec()
    slowdown = cfg.diagnostics.slowdown(roles.index)
    examples, loss, push, stopped, left = 0, 0.0, None, False, None
    handing_on = front is None
    epoch, segment, offset, taken = 0, 0, -1, []
    if position:
        kv.clock, epoch, offset = position["clock"], position["epoch"], position["offset"]
        segment, taken = position.get("segment", 0), list(position.get("taken", []))
        examples, loss = position["examples"], position["loss"]
    before, clock_before = examples, kv.clock
    opened = []

    def open_data() -> None:
        try:
            shard = open_shard(cfg.data.train, index, parts, skip_bad=cfg.data.skip_bad_lines)
            plan = WorkPlan(spans(cfg.data.train, parts), cfg.solver.epochs, deaths)
        except OSError as e:
            raise InputError(f"--train {cfg.data.train}: {e.strerror or e}") from None
        work = Work(cfg, shard, plan, index, taken, model.reserved_keys())
        work.take_shares_untold(epoch)
        opened.append((work, *(work.resume_point(epoch, segment, offset) if offset >= 0
                               else (epoch, segment, offset))))

    timeline = Timeline()

    def sample(t: float, force: bool = False) -> None:
        if force or timeline.due(t):
            timeline.add(t, force, examples=examples, train_loss=loss, wait_s=kv.wait_s,
                         bytes_sent=kv.bytes_sent, clock=kv.clock)

    t0 = mark = ready(roles.comm, cfg.faults.startup_timeout, open_data)
    startup_s = process_age()
    work, epoch, segment, offset = opened[0]
    shard = work.shard
    stream = work.minibatches(epoch, segment, offset)
    finished = False
    while True:   # once, unless this worker leaves and then joins again
        while True:
            current = next(stream, None)
            pull = kv.pull(current[1]) if current else None
            while current is not None:
                _pass_on_stop(kv)
                if handing_on:
                    work.learn(kv.notices())
                waited = kv.wait_s
                # Pipelining: the next minibatch's keys are found and its pull sent now, so
                # the servers work on it while this one computes (they answer once this push
                # arrives). Asked to leave, the worker ends with this minibatch: the next is
                # where its rows left start; asked to give a worker that joins a share of
                # them, it splits them there.
                upcoming = next(stream, None)
                if upcoming and kv.asked_to_give and not kv.asked_to_leave:
                    stream = work.split(kv, *kv.asked_to_give, upcoming, cfg.faults.timeout)
                    upcoming = next(stream, None)
                next_pull = (kv.pull(upcoming[1], next_clock=True)
                             if upcoming and not kv.asked_to_leave else None)
                batch, keys, cols, bias_col, progress = current[:5]
                testevents.reached("epoch", current[5])
                try:
                    weights = kv.wait(pull)
                except Stopped:
                    stopped = True
                    break
                grad, batch_loss = model.gradient(batch, cols, bias_col, weights)
                if not math.isfinite(batch_loss):
                    raise Diverged(_diverged(cfg, kv.clock, current, shard, batch_loss))
                loss += batch_loss
                examples += len(batch)
                # Where the next minibatch starts, for checkpoints: the servers note it with
                # the push.
                kv.report(examples, loss, progress,
                          *((upcoming[5], upcoming[0].start, upcoming[6]) if upcoming
                            else (cfg.solver.epochs, -1, 0)), taken=work.taken)
                sample(time.monotonic() - t0)
                if push is not None:
                    kv.wait(push)
                    testevents.reached("clock", kv.clock)
                # The last push of the worker's stream of minibatches delivers what the push
                # filter still holds back (pushfilter).
                push = kv.push(keys, grad, clock=True,
                               flush=upcoming is None or kv.asked_to_leave)
                if slowdown > 1:   # --straggler, a testing aid: take `slowdown` times as long
                    # (as if a minibatch took at least 1 ms: a test's slowed job then lasts
                    # about as long however fast the machine and the code)
                    busy = time.monotonic() - mark - (kv.wait_s - waited)
                    time.sleep((slowdown - 1) * max(busy, STRAGGLER_LEAST_BUSY_S))
                    mark = time.monotonic()
                if upcoming and kv.asked_to_leave:
                    left = upcoming
                    break
                current, pull = upcoming, next_pull
            if stopped or left or not handing_on or not _more_to_train(kv, work,
                                                                       cfg.faults.timeout):
                break
            stream = work.minibatches(work.epoch, work.segment + 1)
        if stopped or not handing_on:
            break
        _say_finish(kv, examples, loss, cfg.solver.epochs, work, left)
        finished = True
        if not _wait_for_other_workers(roles, kv, cfg.faults.timeout, work, hot):
            break
        log.warning("joining again at clock %d (mpips ctl add-worker)", kv.join_clock)
        stream = work.minibatches(*work.rejoin(kv))
        left, push = None, None
    train_s = time.monotonic() - t0
    sample(train_s, force=True)
    if front is not None:
        front.end(STOPPED if stopped else FINISHED)
    share = Share(np.empty(0), np.empty(0, np.float32), 0, 0)
    score_s = 0.0
    if not stopped:
        if not finished:
            _say_finish(kv, examples, loss, cfg.solver.epochs, work, None)
            _wait_for_other_workers(roles, kv, cfg.faults.timeout)
        train_bytes = kv.bytes_sent
        if cfg.data.test:
            # Those that died in this launch (a resume's dead workers live again).
            began = time.monotonic()
            testevents.reached("scoring")
            share = worker_share(cfg, roles, kv, work.plan.deaths[len(deaths):], part, front,
                                 hot)
            score_s = time.monotonic() - began
        if front is not None:
            front.end(SCORED)
    else:
        train_bytes = kv.bytes_sent
        log.info("the job is stopping: a checkpoint holds the model at clock %d", kv.clock)
        # Every worker stops (none finishes): a barrier, unless one may have died.
        _wait_for_other_workers(roles, kv, cfg.faults.timeout, work if hot else None, hot)
    kv.close()
    r = summary.new_record()
    r["examples"] = examples
    r["examples_before"] = before
    r["pushes"] = kv.clock - clock_before   # each acknowledged (waited for) before BYE
    r["train_loss"] = loss
    r["train_s"] = train_s
    r["startup_s"] = startup_s
    r["score_s"] = score_s
    r["wait_s"] = kv.wait_s
    r["bytes_sent"] = kv.bytes_sent
    r["train_bytes"] = train_bytes
    r["bad_lines"] = shard.bad_lines + share.bad_lines
    r["test_rows"] = share.margins.shape[0]
    r["test_units"] = share.units
    r["stopped_at"] = kv.clock if stopped else -1   # a worker: where it was stopped
    for name, value in kv.filter.figures().items():
        r[name] = value
    return (r, share.margins, share.labels, np.zeros(n_workers), np.empty((0, len(Step._fields))),
            timeline.samples())


def _say_finish(kv: KVWorker, examples: int, loss: float, epochs: int, work: "Work",
                left=None) -> None:
    """FINISH to every server (completing this worker's requests first), with where the rows
    it leaves to the others start (`left`: the next minibatch), or its end."""
    if left:   # the lead hands the rows from the next minibatch on to the others
        log.warning("leaving at clock %d (mpips ctl remove-worker): the rows left from epoch "
                    "%d go to the other workers", kv.clock, left[5])
        work.leave(left)
        kv.report(examples, loss, left[4], left[5], left[0].start, left[6], taken=work.taken)
    else:
        work.end()
        kv.report(examples, loss, epochs, epochs, -1, taken=work.taken)
    kv.finish()


def _more_to_train(kv: KVWorker, work: "Work", timeout: float) -> bool:
    """Before this worker says FINISH: whether the lead has handed it rows of a dead worker
    that it has not trained (told of, or on their way)."""
    work.catch_up(kv, kv.status()["deaths"], timeout)
    return work.segment + 1 < len(work.segments(work.epoch))


def _pass_on_stop(kv: KVWorker) -> None:
    """A stop asked of this worker (a signal to this rank alone) goes to server 0, once."""
    if signals.stop_requested() and not kv.stop_sent:
        kv.ask_to_stop()


def _diverged(cfg: TrainConfig, clock: int, current, shard, loss: float) -> str:
    batch, epoch = current[0], current[5]
    where = "byte" if isinstance(shard, TextShard) else "row"
    kept = (f"; the checkpoints in {cfg.checkpoints} are kept" if cfg.checkpointing.on else "")
    return (f"the training loss became {loss} at clock {clock} (epoch {epoch}, the minibatch "
            f"at {where} {batch.start} of {shard.path}); nothing of it was pushed. The "
            f"learning rate ({cfg.optimizer.name} --lr {cfg.optimizer.lr:.4g}) may be too "
            f"large, or the data holds values that are not finite{kept}")


class Work:
    """This worker's rows, epoch by epoch, as its work plan says: its own part, then the
    shares of dead workers' rows it took (see `workplan`)."""

    def __init__(self, cfg: TrainConfig, shard, plan: WorkPlan, worker: int, taken: list,
                 reserved: np.ndarray):
        """`reserved`: the model's own rows every minibatch pulls."""
        self.cfg, self.shard, self.plan, self.worker = cfg, shard, plan, worker
        self.reserved = reserved
        self.taken = list(taken)   # the epochs at which it took its shares
        self.epoch = 0             # the epoch and segment of the latest minibatch handed out
        self.segment = 0
        self._told = {}            # deaths told of out of order: number -> Handover
        self._rejoin_at = (0, 0)   # where shares given after it left begin (see leave)

    def catch_up(self, kv: KVWorker, deaths: int, timeout: float) -> None:
        """Wait (bounded) until the lead's word of its first `deaths` deaths has reached this
        worker, and learn them."""
        def told() -> bool:
            self.learn(kv.notices())
            return len(self.plan.deaths) >= deaths
        wait_until(told, timeout, lambda: f"the lead server's word of {deaths} dead worker(s)")

    def learn(self, notices: list) -> None:
        """Deaths the lead told of, (number, Handover): each joins the plan in order, and this
        worker takes its share at the epoch it is in."""
        for number, death in notices:
            self._told[number] = death
        while len(self.plan.deaths) in self._told:
            death = self._told.pop(len(self.plan.deaths))
            self.plan = self.plan.with_death(death)
            if self.worker not in death.survivors:
                continue
            self.taken.append(self.epoch)
            if death.worker == self.worker:
                log.info("gave worker %d a share of the rows left", death.survivors[1])
            else:
                log.warning("worker %d %s: this worker takes its share of the rows it had "
                            "left, from epoch %d on", death.worker, "died" if death.dead else
                            "shared its rows" if death.split else "handed its rows on",
                            death.epoch)

    def take_shares_untold(self, epoch: int) -> None:
        """Resuming: the checkpoint records deaths whose word had not reached this worker by
        its clock (the lead's notice comes between minibatches); it takes their shares now, at
        the epoch it goes on from, as it would have on hearing of them. No notice comes again."""
        untold = len(self.plan.shares(self.worker)) - len(self.taken)
        if untold > 0:
            self.taken += [epoch] * untold
            log.warning("taking shares of %d worker(s)' rows that the checkpoint records as "
                        "handed on, from epoch %d on", untold, epoch)

    def segments(self, epoch: int) -> list:
        return self.plan.segments(self.worker, epoch, self.taken)

    def _after(self, epoch: int, segment: int, offset: int) -> tuple[int, int]:
        """(epoch, segment) where ranges added at `epoch` begin once the plan is cut at the
        place given (see workplan.trained)."""
        return epoch, segment + int(offset > self.segments(epoch)[segment][0])

    def split(self, kv: KVWorker, joiner: int, weight: int, upcoming, timeout: float):
        """Asked to give a worker that joins one share of its rows left for every `weight`
        it keeps: cut them where `upcoming` (the next minibatch) starts, have the lead number
        the split (every worker learns it in order), and return the minibatches of the rows
        it keeps, from there."""
        epoch, segment, offset = upcoming[5], upcoming[6], upcoming[0].start
        death = Handover(self.worker, kv.clock, epoch, segment, offset, tuple(self.taken),
                      (self.worker, joiner), dead=False, shares=(weight, 1))
        resume = self._after(epoch, segment, offset)
        kv.split(death.fields())

        def numbered() -> bool:
            self.learn(kv.notices())
            return death in self.plan.deaths
        wait_until(numbered, timeout, lambda: "the lead server to number this worker's split "
                                              "of its rows with the worker joining")
        return self.minibatches(*resume)

    def leave(self, upcoming) -> None:
        """Leaving where `upcoming` (the next minibatch) starts: where shares given to it,
        should it join again, begin."""
        self._rejoin_at = self._after(upcoming[5], upcoming[6], upcoming[0].start)

    def end(self) -> None:
        """Done with its rows: shares given to it, should it join again, come after them."""
        last = self.cfg.solver.epochs - 1
        self._rejoin_at = (last, len(self.segments(last)))

    def rejoin(self, kv: KVWorker) -> tuple[int, int]:
        """Asked to join again: go on from the clock the lead named; (epoch, segment) where
        the shares given to it begin."""
        kv.clock, kv.join_clock, kv.asked_to_leave = kv.join_clock, None, False
        return self._rejoin_at

    def _reader(self, epoch: int, segment: int):
        span = self.segments(epoch)[segment]
        return self.shard if span == self.plan.parts[self.worker] else self.shard.over(*span)

    def resume_point(self, epoch: int, segment: int, offset: int) -> tuple[int, int, int]:
        """(epoch, segment, offset) to go on from, given where a checkpoint says this worker
        stood: the same, unless the data changed since (--allow-changed-data) and the place
        is no longer the start of a row of that part of the data."""
        if epoch >= self.cfg.solver.epochs or segment >= len(self.segments(epoch)):
            return epoch, segment, offset
        reader = self._reader(epoch, segment)
        point = reader.next_row_at(offset)
        if point == offset:
            return epoch, segment, offset
        if offset == self.segments(epoch)[segment][1]:   # at its end: cut there (a leave)
            return epoch, segment + 1, -1
        if point is None:
            log.warning("%s: byte or row %d of the checkpoint is past this part of the changed "
                        "data: going on with the next", reader.path, offset)
            return epoch, segment + 1, -1
        log.warning("%s: the checkpoint's place %d is not a row start of this part of the "
                    "changed data: going on at %d", reader.path, offset, point)
        return epoch, segment, point

    def minibatches(self, first_epoch: int = 0, first_segment: int = 0, offset: int = -1):
        """(rows, keys, cols, bias_col, epochs done, epoch, segment) for each minibatch from
        `first_epoch` on, starting at `offset` of `first_segment` (a byte or row; -1: its
        beginning). Shares taken meanwhile join the epoch being trained."""
        index = KeyIndexer(self.reserved)
        for epoch in range(first_epoch, self.cfg.solver.epochs):
            self.epoch = epoch
            segment = first_segment if epoch == first_epoch else 0
            while segment < len(self.segments(epoch)):
                self.segment = segment
                reader = self._reader(epoch, segment)
                start = offset if (epoch, segment) == (first_epoch, first_segment) else -1
                for batch in reader.minibatches(self.cfg.solver.batch_size,
                                                start if start >= 0 else None):
                    keys, cols, bias_col = index(batch, self.cfg.model.bias, reader.path)
                    yield (batch, keys, cols, bias_col,
                           epoch + self._done(epoch, segment, reader), epoch, segment)
                segment += 1

    def _done(self, epoch: int, segment: int, reader) -> float:
        """The fraction of the epoch's rows handed out (by bytes or rows)."""
        sizes = [b - a for a, b in self.segments(epoch)]
        total = sum(sizes)
        done = sum(sizes[:segment]) + reader.fraction_done * sizes[segment]
        return min(done / total, 1.0) if total > 0 else 1.0


def _wait_for_other_workers(roles: Roles, kv: KVWorker, timeout: float,
                            work: "Work | None" = None, hot: bool = False) -> bool:
    """Wait until every worker has finished training, however long that takes, as long as
    the slowest keeps advancing: the bound is --timeout without progress. With `work` (not a
    pipeline), workers may die or leave meanwhile: the lead server's word, not a barrier,
    says when, and `work` learns of every death the lead numbered, so that all workers share
    the test file alike; and the lead may ask this worker to join again (returns True). If
    the job stops meanwhile, the others (stopped, not finished) meet in a barrier unless
    workers may die (`hot`): this worker joins them there."""
    latest = {}

    def progress():
        _pass_on_stop(kv)
        latest.update(kv.status())
        return latest["slowest_clock"], latest["finished"], latest["deaths"]

    def what() -> str:
        return (f"the other workers to finish training (worker "
                f"{latest.get('slowest_worker')} is at clock {latest.get('slowest_clock')})")

    if work is None:
        wait_all([roles.group.Ibarrier()], timeout, what, progress=progress, check_every=2.0)
        return False

    def all_finished() -> bool:
        work.learn(kv.notices())
        if kv.join_clock is not None:
            return True
        progress()
        return latest["finished"] == len(roles.workers) or (latest["stopping"] and not hot)
    # Each poll asks the lead; progress is judged on its latest answer.
    wait_until(all_finished, timeout, what, check_every=0.0, backoff=Backoff(longest=0.05),
               progress=lambda: (latest["slowest_clock"], latest["finished"], latest["deaths"]))
    if kv.join_clock is not None:
        return True
    if latest["stopping"] and not hot:
        return _wait_for_other_workers(roles, kv, timeout)
    work.catch_up(kv, latest["deaths"], timeout)
    return False
