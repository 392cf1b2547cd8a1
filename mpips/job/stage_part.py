"""Wide & Deep with its network split across worker ranks (`train --stages S`).

The job's W workers form W / S copies of an S-stage pipeline (workers c*S .. c*S+S-1 are
copy c, in stage order). Stage 0 of a copy is a worker as in any job: it reads the copy's
part of the data and pulls its minibatch's rows (the keys' weights and embeddings, the bias)
and the rows of its own layers; every other stage pulls only its layers' rows. A minibatch
is cut into micro-batches that run through the schedule (`pipeline.StageRank`); the last
stage adds the wide margins stage 0 sent it and returns the loss's gradient by logit, from
which stage 0 makes the wide weights' and the embeddings' gradients. Then every stage pushes
its rows' gradients as a clock of its own. So the servers keep the whole network, its
optimizer state and its checkpoints, the copies meet there under the job's consistency
model. Scoring the test file runs the network's forward the same way, stage by stage: no
rank ever holds the whole network.
"""
import logging
import time
from collections import deque
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from mpi4py import MPI

from ..base.errors import MpipsError, Stopped
from ..base.timeline import Timeline
from ..models.network import Stage, forward, measured_costs, partition
from ..pipeline.schedule import POLICIES, describe
from ..pipeline.stage_rank import StageRank, receive
from ..ranks.bounded import wait_all
from ..run import signals, summary, testevents
from ..run.config_checks import check_stages
from ..run.startup import process_age, ready
from ..wire.position import Position
from ..wire.tags import (
    STAGE_HEADER,
    STAGE_LABELS,
    STAGE_RESULT,
    STAGE_SCORE,
    STAGE_SCORE_LOGITS,
    STAGE_SCORE_WIDE,
    STAGE_SCORE_X,
)
from .part_result import TASK_LOG, PartResult

log = logging.getLogger("mpips")

# What a header's first number says besides a minibatch's row count.
FINISHED, STOPPED, FAILED, SCORED = -1.0, -2.0, -3.0, -4.0


class TaskLog:
    """The tasks of a bounded number of minibatches: the first `first` and the latest
    `last`."""

    def __init__(self, worker: int, first: int = 4, last: int = 8):
        self.worker, self.first = worker, first
        self._first: list[np.ndarray] = []
        self._last: deque[np.ndarray] = deque(maxlen=last)

    def add(self, clock: int, began: float, records: np.ndarray) -> None:
        """`records` (pipeline.TASK_RECORD) of the step at `clock` that began at `began`."""
        rows = np.zeros(records.shape[0], TASK_LOG)
        rows["worker"], rows["clock"] = self.worker, clock
        for name in ("stage", "kind", "micro"):
            rows[name] = records[name]
        rows["start"], rows["end"] = began + records["start"], began + records["end"]
        (self._first if len(self._first) < self.first else self._last).append(rows)

    def rows(self) -> np.ndarray:
        kept = [*self._first, *self._last]
        return np.concatenate(kept) if kept else np.zeros(0, TASK_LOG)


class StageFailed(MpipsError):
    """Another stage of this pipeline failed; it said why in its own log."""


@dataclass
class Pipe:
    """Where this worker sits: copy `copy` of `copies`, stage `stage` of `stages`; `comm`
    holds its copy's stages in order; `cuts` are each stage's layers."""
    comm: MPI.Intracomm
    copy: int
    copies: int
    stage: int
    stages: int
    cuts: list
    policy: str
    micros: int
    timeout: float
    ranks: tuple = ()   # the world ranks of this copy's stages, in order

    def name(self, stage: int) -> str:
        """Stage `stage` of this pipeline, as a user finds it in the logs."""
        worker = self.copy * self.stages + stage
        rank = f", rank {self.ranks[stage]}" if self.ranks else ""
        return f"stage {stage} of pipeline {self.copy} (worker {worker}{rank})"

    @property
    def layers(self) -> range:
        return self.cuts[self.stage]

    def stage_layers(self, model) -> list:
        """The model's layers this stage runs."""
        return model.layers[self.layers.start:self.layers.stop]

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    def tasks(self, rows: int) -> list:
        """This stage's tasks for a minibatch of `rows` (fewer micro-batches than rows)."""
        return _schedule(self.policy, self.stages, min(self.micros, rows))[self.stage]

    def send(self, values: np.ndarray, to: int, tag: int) -> MPI.Request:
        return self.comm.Isend(np.ascontiguousarray(values, np.float64), to, tag)

    def receive(self, shape, source: int, tag: int, what: str, progress=None) -> np.ndarray:
        return receive(self.comm, shape, np.float64, source, tag, self.timeout, what, progress)


@lru_cache(maxsize=64)
def _schedule(policy: str, stages: int, micros: int) -> list:
    return POLICIES[policy](stages, micros)


def _micro_rows_of(cfg) -> int:
    """A micro-batch's rows, to measure the layers' costs on."""
    return max(1, (cfg.solver.batch_size or 1000) // cfg.pipeline.micro_batches)


def micro_rows(rows: int, micros: int) -> list:
    """Rows of each micro-batch of a minibatch: as equal as can be, the first ones larger."""
    return [p.shape[0] for p in np.array_split(np.arange(rows), min(micros, rows))]


def pipe_of(cfg, roles, model) -> Pipe:
    """Collective over the workers: this worker's pipeline, its stages' layers cut where the
    costs measured on its copy's stage 0 balance them."""
    copy, stage = divmod(roles.index, cfg.pipeline.stages)
    comm = roles.group.Split(copy, stage)
    costs = np.zeros(len(model.layers))
    if roles.index == 0:   # one measure for every copy: all cut the network alike
        costs[:] = measured_costs(model.layers, None, _micro_rows_of(cfg))
    wait_all([roles.group.Ibcast(costs, root=0)], cfg.faults.timeout,
             lambda: "the layers' costs measured by worker 0")
    cuts = partition(list(costs), cfg.pipeline.stages)
    if roles.index == 0:
        log.info("%d pipeline(s) of %d stages, layers per stage %s, %s schedule of %d "
                 "micro-batches", len(roles.workers) // cfg.pipeline.stages, cfg.pipeline.stages,
                 " | ".join(f"{c.start}-{c.stop - 1}" for c in cuts), cfg.pipeline.schedule,
                 cfg.pipeline.micro_batches)
    first = copy * cfg.pipeline.stages
    return Pipe(comm, copy, len(roles.workers) // cfg.pipeline.stages, stage, cfg.pipeline.stages,
                cuts,
                cfg.pipeline.schedule, cfg.pipeline.micro_batches, cfg.faults.timeout,
                tuple(roles.workers[first:first + cfg.pipeline.stages]))


def _score(pipe: Pipe, kv, model, keys: np.ndarray) -> None:
    """A later stage while stage 0 scores the test file: each minibatch's forward through
    this stage's layers, with the final model's rows (pulled once)."""
    layers, weights = pipe.stage_layers(model), None
    while True:
        header = pipe.receive(3, 0, STAGE_SCORE, f"{pipe.name(0)} to send the "
                                            f"next rows to score")
        if header[0] == FAILED:
            raise StageFailed(f"{pipe.name(0)} failed while scoring (its "
                              f"log says why)")
        if header[0] < 0:
            return
        n = int(header[0])
        if weights is None:
            weights = model.unpack(kv.wait(kv.pull(keys, read_only=True)), pipe.layers)
        x = pipe.receive((n, layers[0].inputs), pipe.stage - 1,
                         STAGE_SCORE_X, f"the activations to score from stage {pipe.stage - 1}")
        y = forward(layers, weights, x)
        if pipe.last:
            wide = pipe.receive(n, 0, STAGE_SCORE_WIDE, "the wide margins to score from stage 0")
            out = pipe.send(wide + y[:, 0], 0, STAGE_SCORE_LOGITS)
        else:
            out = pipe.send(y, pipe.stage + 1, STAGE_SCORE_X)
        wait_all([out], pipe.timeout, lambda: "the next stage to take the rows to score")


def describe_pipeline(cfg) -> str:
    """What --print-schedule prints: the network, each stage's layers and measured cost, and
    each stage's tasks in order."""
    from ..base.errors import ConfigError
    if cfg.model.name != "widedeep":
        raise ConfigError(f"--print-schedule shows Wide & Deep's pipeline: it needs --model "
                          f"widedeep (got --model {cfg.model.name})")
    check_stages(cfg, cfg.pipeline.stages)
    model = cfg.with_data_fields().model.spec()   # as the job will train it
    rows = _micro_rows_of(cfg)
    costs = measured_costs(model.layers, None, rows)
    cuts = partition(costs, cfg.pipeline.stages)
    pooled = (f"concatenate {model.fields} fields ({model.deep_inputs})" if model.fields else
              f"sum ({model.deep_inputs})")
    lines = [f"network: embeddings of {model.embedding_dim} from the servers -> {pooled} -> " +
             " -> ".join(f"dense {a.inputs}x{a.outputs} {a.activation}" for a in model.layers) +
             " -> plus the wide margin -> logistic loss"]
    for s, cut in enumerate(cuts):
        share = sum(costs[cut.start:cut.stop])
        lines.append(f"stage {s}: layers {cut.start}-{cut.stop - 1}, {share * 1e3:.3f} ms "
                     f"forward+backward per micro-batch of {rows} rows "
                     f"({share / sum(costs):.0%})" + (", and the embeddings" if s == 0 else ""))
    lines += [f"{cfg.pipeline.schedule} schedule of {cfg.pipeline.micro_batches} micro-batches:",
              describe(POLICIES[cfg.pipeline.schedule](cfg.pipeline.stages,
                                                       cfg.pipeline.micro_batches))]
    return "\n".join(lines)


class Front:
    """Stage 0 as the worker loop sees a model: the rows it pulls besides the data's keys
    (its layers'), and a minibatch's gradient, which the whole pipeline computes."""

    def __init__(self, model, pipe: Pipe, kv, worker: int):
        self.model, self.pipe, self.kv = model, pipe, kv
        self.width = model.width
        self._rows = model.reserved_keys(pipe.layers)
        self.layers = pipe.stage_layers(model)
        self.tasks = TaskLog(worker)

    def reserved_keys(self) -> np.ndarray:
        return self._rows

    def gradient(self, batch, cols, bias_col: int, weights: np.ndarray):
        pipe, n, k = self.pipe, len(batch), self.model.deep_inputs
        report = self.kv.reported   # its progress and epoch: what the other stages report
        sends = [pipe.send(np.array([n, report.progress if report else 0.0,
                                     report.epoch if report else 0]), s, STAGE_HEADER)
                 for s in range(1, pipe.stages)]
        model = self.model
        wide, pooled = model.sparse_forward(batch, cols, bias_col, weights)
        sends.append(pipe.send(np.stack([batch.labels.astype(np.float64), wide], axis=1),
                               pipe.stages - 1, STAGE_LABELS))
        own = model.own_rows(bias_col, weights.shape[0], self._rows.shape[0])
        stage = Stage(self.layers, model.unpack(weights[own], pipe.layers),
                      len(micro_rows(n, pipe.micros)), last=False)
        rank = StageRank(pipe.comm, stage, k, pipe.timeout)
        grads, began = [], time.time()
        _, records = rank.step(pipe.tasks(n), micro_rows(n, pipe.micros), pooled, None,
                               apply=lambda s: grads.append(s.summed()))
        self.tasks.add(self.kv.clock, began, records)
        dpooled = np.concatenate([rank.input_grads[m] for m in range(len(rank.input_grads))])
        result = pipe.receive(n + 1, pipe.stages - 1, STAGE_RESULT,
                              f"the loss's gradient from the last stage, "
                              f"{pipe.name(pipe.stages - 1)}")
        grad = model.sparse_gradient(batch, cols, bias_col, result[:n], dpooled, weights.shape)
        grad[own] = model.pack(grads[0], pipe.layers)
        wait_all(sends, pipe.timeout, lambda: "the other stages to take stage 0's messages")
        return grad, float(result[n])

    def margins(self, batch, cols, bias_col: int, weights: np.ndarray) -> np.ndarray:
        """Scoring after training: the rows' margins, the network's forward run stage by
        stage (no rank pulls the whole network)."""
        pipe, n = self.pipe, len(batch)
        sends = [pipe.send(np.array([n, 0.0, 0.0]), s, STAGE_SCORE) for s in range(1, pipe.stages)]
        model = self.model
        wide, pooled = model.sparse_forward(batch, cols, bias_col, weights)
        sends.append(pipe.send(wide, pipe.stages - 1, STAGE_SCORE_WIDE))
        own = model.own_rows(bias_col, weights.shape[0], self._rows.shape[0])
        sends.append(pipe.send(forward(self.layers, model.unpack(weights[own], pipe.layers),
                                       pooled), 1, STAGE_SCORE_X))
        margins = pipe.receive(n, pipe.stages - 1, STAGE_SCORE_LOGITS,
                               f"the margins from the last stage, {pipe.name(pipe.stages - 1)}")
        wait_all(sends, pipe.timeout, lambda: "the other stages to take stage 0's messages")
        return margins

    def end(self, how: float) -> None:
        """Tell the other stages training is over (finished, stopped), scoring is
        (SCORED), or this stage failed (FAILED: said where they wait between minibatches,
        training or scoring; within one they find out from their bounded waits)."""
        tags = {SCORED: (STAGE_SCORE,),
                FAILED: (STAGE_HEADER, STAGE_SCORE)}.get(how, (STAGE_HEADER,))
        sends = [self.pipe.send(np.array([how, 0.0, 0.0]), s, tag)
                 for s in range(1, self.pipe.stages) for tag in tags]
        wait_all(sends, self.pipe.timeout, lambda: "the other stages to hear that training "
                                                   "is over")


def follow(cfg, roles, kv, pipe: Pipe, model, position: Position | None,
           wait_for_others) -> PartResult:
    """A stage after the first: for each minibatch stage 0 announces, pull this stage's rows,
    run its tasks, push their gradients; then finish with the other workers. Returns what
    worker_part.work returns."""
    return Follower(cfg, roles, kv, pipe, model, position).run(wait_for_others)


class Follower:
    """A stage after the first of a pipeline, minibatch by minibatch as stage 0 sends them."""

    def __init__(self, cfg, roles, kv, pipe: Pipe, model, position: Position | None):
        self.cfg, self.roles, self.kv, self.pipe, self.model = cfg, roles, kv, pipe, model
        if position:
            kv.clock = position.clock
        self.clock_before = kv.clock
        self.keys = model.reserved_keys(pipe.layers)
        self.layers = pipe.stage_layers(model)
        self.push: int | None = None   # the latest push, not yet waited for
        self.tasks = TaskLog(roles.index)
        self.weights: np.ndarray | None = None   # this stage's rows, as last read
        self.status: dict[str, int] = {}   # what the lead last said of the workers

    def run(self, wait_for_others) -> PartResult:
        cfg, kv, pipe = self.cfg, self.kv, self.pipe
        t0 = ready(self.roles.comm, cfg.faults.startup_timeout, lambda: None)
        startup_s = process_age()
        how = None
        while how is None:
            how = self._step()
        if how == FAILED:
            raise StageFailed(f"{pipe.name(0)} failed (its log says why)")
        if how == FINISHED:
            kv.report(0, 0.0, cfg.solver.epochs, cfg.solver.epochs, -1)
            kv.finish()
        train_s, train_bytes = time.monotonic() - t0, kv.bytes_sent
        wait_for_others()
        if how == FINISHED:
            _score(pipe, kv, self.model, self.keys)
        kv.close()
        pipe.comm.Free()
        r = summary.new_record()
        r["pushes"] = kv.clock - self.clock_before
        r["train_s"] = train_s
        r["startup_s"] = startup_s
        r["wait_s"] = kv.wait_s
        r["bytes_sent"], r["train_bytes"] = kv.bytes_sent, train_bytes
        r["stopped_at"] = kv.clock if how == STOPPED else -1
        return PartResult(r, np.empty(0), np.empty(0, np.float32),
                          np.zeros(len(self.roles.workers)), samples=Timeline().samples(),
                          tasks=self.tasks.rows())

    def _progress(self):
        self.status.update(self.kv.lead.status())
        return self.status["slowest_clock"], self.status["finished"]

    def _step(self) -> float | None:
        """One minibatch of stage 0's, announced: this stage's tasks, and its push. None, or
        how training ended (FINISHED, STOPPED, FAILED) if stage 0 said so instead."""
        kv, pipe, model = self.kv, self.pipe, self.model
        kv.lead.pass_on_stop(signals.stop_requested())   # server 0 stops the job
        header = pipe.receive(3, 0, STAGE_HEADER,
                              f"{pipe.name(0)} to announce its minibatch of "
                              f"clock {kv.clock} (the slowest worker is at clock "
                              f"{self.status.get('slowest_clock')})", progress=self._progress)
        if header[0] < 0:
            return header[0]
        n = int(header[0])
        weights, stopped = self._pull()
        stage = Stage(self.layers, model.unpack(weights, pipe.layers),
                      len(micro_rows(n, pipe.micros)), last=pipe.last, mean_over=n)
        labels = offsets = None
        if pipe.last:
            given = pipe.receive((n, 2), 0, STAGE_LABELS, f"the labels of clock {kv.clock} from "
                                                     f"{pipe.name(0)}")
            labels, offsets = given[:, 0].copy(), given[:, 1].copy()
        grads, began = [], time.time()
        loss, records = StageRank(pipe.comm, stage, self.layers[0].inputs, pipe.timeout).step(
            pipe.tasks(n), micro_rows(n, pipe.micros), None, labels,
            apply=lambda s: grads.append(s.summed()), offsets=offsets)
        self.tasks.add(kv.clock, began, records)
        if pipe.last:
            dlogits = np.concatenate([stage.dlogits[m] for m in range(len(stage.dlogits))])
            wait_all([pipe.send(np.append(dlogits, loss), 0, STAGE_RESULT)], pipe.timeout,
                     lambda: f"{pipe.name(0)} to take the loss's gradient")
        rows = model.pack(grads[0], pipe.layers)
        if stopped or not np.isfinite(rows).all():
            return None   # stopping, or diverged: stage 0 says which, and nothing is pushed
        kv.report(0, 0.0, float(header[1]), int(header[2]), -1)
        if self.push is not None:
            kv.wait(self.push)
            testevents.reached("clock", kv.clock)
        self.push = kv.push(self.keys, rows, clock=True)
        return None

    def _pull(self) -> tuple:
        """(this stage's rows, whether the job stopped). Under SSP or ASP the job may stop
        between stage 0's read and this one: the step runs on the rows at hand (stage 0 is in
        it) and pushes nothing."""
        try:
            self.weights = self.kv.wait(self.kv.pull(self.keys))
            return self.weights, False
        except Stopped:
            if self.weights is None:
                self.weights = np.zeros((self.keys.shape[0], self.model.width), np.float32)
            return self.weights, True
