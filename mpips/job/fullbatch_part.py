"""The worker side of a full-batch job (--solver lbfgs): each worker holds its part of the
training data in memory, its features mapped to the coordinates of a dense weight vector
(key mod --dim; the bias is coordinate --dim). Worker 0 drives the solver (lbfgs); every
evaluation of the objective is every worker's gather of the point at its coordinates, its
part of the logistic gradient, and a scatter_add of it into the gradient table, started by
the driver's commands on the workers' communicator. No rank holds the weight vector.
"""
import logging
import math
import time
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ..base import timeline
from ..base.budget import Budget
from ..base.errors import InputError, SaveError
from ..base.log import say
from ..data import fingerprint
from ..data.dense_rows import Part
from ..data.inputs import data_format
from ..data.shards import open_shard
from ..data.textfile import Rows
from ..models import lbfgs
from ..ranks.bounded import wait_all
from ..ranks.roles import Roles
from ..run import signals, summary, testevents
from ..run.config import TrainConfig
from ..run.startup import process_age, ready
from ..storage import checkpoint
from ..wire.tags import LOSS_TAG
from ..worker.dense_client import Dense, DenseClient
from ..worker.kvworker import KVWorker
from .failing import saving_on_failure
from .part_result import PartResult

log = logging.getLogger("mpips")

DONE, EVALUATE = 0, 1
READ_ROWS = 1 << 16


def read_part(path: str, part: int, parts: int, dim: int, bias: bool, skip_bad: bool):
    """(Part, bad lines) of part `part` of `parts` of a dataset."""
    try:
        shard = open_shard(path, part, parts, skip_bad=skip_bad)
        batches = list(shard.minibatches(READ_ROWS))
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None
    rows = Rows.concat(batches) if batches else Rows(
        np.empty(0, np.float32), np.zeros(1, np.int64), np.empty(0, np.uint64),
        np.empty(0, np.float32))
    return Part(rows, dim, bias), shard.bad_lines


def solve(cfg: TrainConfig, roles: Roles, name: str, resume, placement,
          failover: bool) -> PartResult:
    """This worker's part of a full-batch job (run `name`, from checkpoint `resume`: its
    directory and manifest); its steps: float64[k, 6] on the driver."""
    kv = KVWorker(roles, width=1, timeout=cfg.faults.timeout, placement=placement,
                  failover=failover)
    with saving_on_failure(roles, kv.placement, cfg.faults.timeout):
        return FullBatchWorker(cfg, roles, kv, name, resume).run()


class Evaluate(NamedTuple):
    """The driver to the other workers: evaluate your share at table `point` into table
    `gradient` (tables' numbers, in lbfgs.tables' order)."""
    point: int
    gradient: int

    def fields(self) -> tuple:
        return (EVALUATE, self.point, self.gradient)


class Done(NamedTuple):
    """The driver to the other workers: the solver is done; `stopped`: the iteration the job
    stopped at, or -1."""
    stopped: int

    def fields(self) -> tuple:
        return (DONE, 0, self.stopped)


def command_of(fields) -> "Evaluate | Done":
    """The driver's command in three int64 `fields` (see Evaluate.fields, Done.fields)."""
    kind, first, second = (int(x) for x in fields)
    return Evaluate(first, second) if kind == EVALUATE else Done(second)


class FullBatchWorker:
    """A worker of `--solver lbfgs`: its rows in memory; worker 0 drives the solver, the
    others evaluate their share of the loss and gradient at its command."""

    def __init__(self, cfg: TrainConfig, roles: Roles, kv: KVWorker, name: str, resume):
        self.cfg, self.roles, self.kv, self.name, self.resume = cfg, roles, kv, name, resume
        self.ps = DenseClient(kv)
        self.group, self.n_workers = roles.group, len(roles.workers)
        self.driver = roles.index == 0
        self.stop_asked = False   # a stop signal (Slurm's warning, SIGUSR1) reached some worker
        self.budget = Budget(cfg.layout.max_rank_memory)
        self.names = lbfgs.tables(cfg.solver.history, cfg.optimizer.l1)
        # Its rows and the solver's tables: set by _load, which run() calls first.
        self.part: Part
        self.tables: dict[str, Dense]
        self.bad_lines = self.n_total = 0
        self.startup_s = 0.0

    def run(self) -> PartResult:
        cfg, kv = self.cfg, self.kv
        self._load()
        start = MPI.Wtime()
        if self.driver:
            steps, weights, stopped, mean_loss = self._drive()
        else:
            steps, mean_loss = [], math.nan
            weights, stopped = self.tables["w"], self._follow()
        if stopped >= 0 and self.driver:
            log.info("the job is stopping: a checkpoint holds the model at iteration %d", stopped)
        train_s = MPI.Wtime() - start
        kv.finish()
        wait_all([self.group.Ibarrier()], cfg.faults.timeout, lambda: "the other workers to finish")
        margins, labels, bad_test = (np.empty(0), np.empty(0, np.float32), 0)
        if cfg.data.test and stopped < 0:
            test, bad_test = read_part(cfg.data.test, self.roles.index, self.n_workers,
                                       cfg.solver.dim,
                                       cfg.model.bias, cfg.data.skip_bad_lines)
            margins, labels = test.margins(weights.gather(test.coords)), test.labels
        kv.close()
        r = summary.new_record()
        r["examples"] = self.part.n_rows
        r["train_loss"] = mean_loss * self.n_total if self.driver and stopped < 0 else 0.0
        r["train_s"] = train_s
        r["startup_s"] = self.startup_s
        r["wait_s"] = kv.wait_s
        r["bytes_sent"] = r["train_bytes"] = kv.bytes_sent
        r["bad_lines"] = self.bad_lines + bad_test
        r["test_rows"] = margins.shape[0]
        r["stopped_at"] = stopped   # a worker: the iteration it stopped at
        r["solver_steps"] = len(steps)
        r["held_peak"] = self.budget.peak
        trace = np.array([list(s) for s in steps], np.float64).reshape(-1, len(lbfgs.Step._fields))
        return PartResult(r, margins, labels, np.zeros(self.n_workers), trace, timeline.empty())

    def _load(self) -> None:
        """This worker's rows in memory (once every rank is ready), every worker's count of
        rows, and the solver's dense tables."""
        cfg, roles = self.cfg, self.roles
        loaded = []
        ready(roles.comm, cfg.faults.startup_timeout, lambda: loaded.append(read_part(
            cfg.data.train, roles.index, self.n_workers, cfg.solver.dim, cfg.model.bias,
            cfg.data.skip_bad_lines)))
        self.startup_s = process_age()
        (self.part, self.bad_lines), = loaded
        part = self.part
        self.budget.take(part.nbytes(), f"its {part.n_rows:,} rows of {cfg.data.train} in memory")
        counts = np.zeros(self.n_workers, np.int64)
        wait_all([self.group.Iallgather(np.array([part.n_rows], np.int64), counts)],
                 cfg.faults.timeout, lambda: "every worker's count of rows")
        self.n_total = int(counts.sum())
        self.tables = {table: self.ps.dense(table, cfg.solver.dim + 1) for table in self.names}

    def _share(self, point, gradient) -> float:
        """Add this worker's share of the gradient at `point` into `gradient`; the mean loss
        (on the driver: summed over the workers)."""
        part, budget = self.part, self.budget
        budget.take(16 * part.coords.shape[0], "the weights and gradient of its coordinates")
        loss, grad = part.loss_and_gradient(point.gather(part.coords))
        budget.release(16 * part.coords.shape[0])
        gradient.scatter_add(part.coords, grad / self.n_total, workers=self.n_workers)
        total, asked = _sum_at_driver(self.group, loss, self.cfg.faults.timeout)
        self.stop_asked |= asked
        return total / self.n_total

    def _command(self, command: "Evaluate | Done | None" = None) -> "Evaluate | Done":
        """The driver's command to the others (broadcast from it): evaluate a point into a
        gradient, or done."""
        buf = np.array(command.fields() if command else (0, 0, 0), np.int64)
        wait_all([self.group.Ibcast(buf, root=0)], self.cfg.faults.timeout,
                 lambda: "worker 0 (the solver's driver) to say what comes next")
        return command_of(buf)

    def _evaluate(self, point, gradient) -> float:
        """The objective at `point`, its gradient into `gradient` (the driver's, for lbfgs)."""
        gradient.fill(0.0)
        self._command(Evaluate(self.names.index(point.name), self.names.index(gradient.name)))
        f = self._share(point, gradient)
        self.ps.restore_copies()   # (after servers died) no worker writes now
        l2 = self.cfg.optimizer.l2
        if l2:
            f += 0.5 * l2 * point.dot(point)
            gradient.axpy(l2, point)
        return f

    def _drive(self) -> tuple:
        """Worker 0: run the solver; (its steps, the model's table, the iteration it stopped
        at or -1, the mean training loss)."""
        cfg, tables, names = self.cfg, self.tables, self.names
        settings = lbfgs.Settings(memory=cfg.solver.history, l1=cfg.optimizer.l1,
                                  max_iter=cfg.solver.max_iter, tol=cfg.solver.tol)
        roles_now = dict(tables)   # minimize swaps the roles of w and w_trial, g and g_trial
        steps = lbfgs.minimize(
            roles_now, self._evaluate, settings, report=_say,
            resume=_from_json(self.resume.manifest["solver"]) if self.resume else None,
            checkpoint=lambda it, state: _checkpoint(cfg, self.ps, self.name, self.n_workers,
                                                     it, state),
            every=cfg.checkpointing.every or 0, stop=lambda: self.stop_asked)
        weights = roles_now["w"]
        stopped = int(steps[-1].iteration) if self.stop_asked else -1
        mean_loss = math.nan
        if stopped < 0:
            mean_loss = self._evaluate(weights, roles_now["g_trial"])
            if cfg.optimizer.l2:
                mean_loss -= 0.5 * cfg.optimizer.l2 * weights.dot(weights)
        if weights is not tables["w"]:   # the model is table w
            weights = tables["w"].copy(weights)
        for table in names[1:]:
            tables[table].free()
        self._command(Done(stopped))
        return steps, weights, stopped, mean_loss

    def _follow(self) -> int:
        """The other workers: evaluate at the driver's command until it says done; the
        iteration the job stopped at, or -1."""
        while True:
            command = self._command()
            if isinstance(command, Done):
                return command.stopped
            self._share(self.tables[self.names[command.point]],
                        self.tables[self.names[command.gradient]])


def _checkpoint(cfg: TrainConfig, ps: DenseClient, name: str, n_workers: int,
                iteration: int, state: dict) -> None:
    """The driver's part of a checkpoint: every server writes its blocks; then the manifest,
    with the solver's state, makes it complete."""
    servers = ps.checkpoint(iteration)
    if not servers:
        log.warning("checkpoint at iteration %d not written (a server could not: see its "
                    "error); training goes on", iteration)
        return
    n_servers = len(servers)
    try:
        shards = checkpoint.dense_entries(cfg.checkpoints, iteration, servers)
        directory = checkpoint.write_manifest(
            cfg.checkpoints, iteration, shards, run_id=name, config=cfg.to_record(),
            servers=n_servers, workers=n_workers, consistency="bsp",
            inputs={"train": fingerprint.of_input(cfg.data.train)},
            data_format=data_format(cfg.data.train),
            placement=ps.kv.placement.describe(), positions={}, deaths=[],
            solver=_to_json(state), worker_random_state=None,
            written=time.strftime("%Y-%m-%d %H:%M:%S"))
    except (OSError, SaveError) as e:
        log.warning("checkpoint at iteration %d not written: %s", iteration, e)
        return
    assert cfg.checkpointing.keep is not None, "TrainConfig.with_checkpointing() fills it in"
    checkpoint.prune(cfg.checkpoints, cfg.checkpointing.keep, directory)
    say(f"checkpoint at iteration {iteration}: {directory}")


def _to_json(state: dict) -> dict:
    """NaN (a gradient norm not yet measured) as null: manifests are strict JSON."""
    steps = [[None if isinstance(v, float) and math.isnan(v) else v for v in step]
             for step in state["steps"]]
    return {**state, "steps": steps}


def _from_json(state: dict) -> dict:
    steps = [[math.nan if v is None else v for v in step] for step in state["steps"]]
    return {**state, "steps": steps}


def _sum_at_driver(group, value: float, timeout: float) -> tuple:
    """(the sum over workers of `value`, in worker order; whether any worker was asked to
    stop) on worker 0 (nan, False elsewhere); a worker that does not send its part in time
    is named."""
    mine = np.array([value, float(signals.stop_requested())])
    if group.rank != 0:
        wait_all([group.Isend(mine, 0, LOSS_TAG)], timeout,
                 lambda: "worker 0 (the solver's driver) to take this worker's loss")
        return math.nan, False
    parts = np.empty((group.size, 2))
    parts[0] = mine
    requests = [group.Irecv(parts[w], w, LOSS_TAG) for w in range(1, group.size)]
    wait_all(requests, timeout, lambda: f"the losses of worker(s) "
             f"{[w for w, r in enumerate(requests, 1) if not r.Test()]} at this point: "
             f"they said nothing for --timeout {timeout:g} s")
    return float(parts[:, 0].sum()), bool(parts[:, 1].any())


def _say(step: lbfgs.Step) -> None:
    log.info("iteration %d: objective %.10g, gradient norm %.3g, step %.3g, %d evaluations, "
             "%.2f s", step.iteration, step.objective, step.gradient_norm, step.step,
             step.evaluations, step.seconds)
    testevents.reached("iteration", int(step.iteration))
