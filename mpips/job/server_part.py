"""The server side of a training job: a store of the keys this server holds, loaded from a
checkpoint when resuming; the hooks the loop calls (its checkpoint files and manifests, see
server_files; snapshots; live curves); serving until the workers are done; the model it
saves at the end or after an error.
"""
import logging
import os
import time

import numpy as np

from ..base.budget import Budget, OverBudget
from ..base.errors import ConfigError, Interrupted, SaveError, said_by
from ..base.files import keep_trying, write_hdf5
from ..data.balance import Balance
from ..data.inputs import data_format
from ..data.shards import distinct_keys, spans
from ..models.lbfgs import Step
from ..ranks.roles import Roles
from ..run import signals, summary, testevents
from ..run.config import TrainConfig
from ..run.startup import process_age, ready
from ..server.checkpoint_clocks import Checkpoints
from ..server.dense_tables import DenseTables
from ..server.loop import Hooks, Server
from ..server.progress import Progress
from ..server.replicas import PrimaryKeys
from ..server.rowhandout import RowHandOut
from ..server.store import KVStore
from ..storage import checkpoint
from ..storage.model_files import save_shard
from ..storage.rundir import RunLocks
from ..wire.clocks import ClockTable
from ..wire.placement import Placement
from .chunks import shared
from .failing import log_failure, others_save
from .livecurves import LiveCurves
from .part_result import PartResult
from .scoring import Scoring, core_to_spare
from .server_files import (
    checkpoint_writers,
    checkpoints_hint,
    resident_writer,
    snapshot_writer,
    write_for_the_dead,
)
from .snapshot_scorer import SnapshotScorer
from .snapshot_write import Resident

log = logging.getLogger("mpips")

NO_STEPS = np.empty((0, len(Step._fields)))   # a full-batch solver's, which only its driver has


def _reserve(store: KVStore, train: str, share: float) -> None:
    """Room in the table, before training, for this server's share of the keys a converted
    dataset holds (its estimate, with a tenth more): growing a large table as keys arrive
    costs more than finding them. Within --max-rank-memory only; else it grows as before."""
    expected = distinct_keys(train)
    if not expected:
        return
    try:
        store.reserve(int(expected * share * 1.1))
    except (OverBudget, MemoryError) as e:
        log.info("the table is not sized ahead for the data's keys: %s", e)


def serve_job(cfg: TrainConfig, roles: Roles, name: str, resume, placement: Placement,
              failover: bool, failures: list, locks: RunLocks, hot: bool = False,
              moves: list | None = None, ulfm: bool = False) -> PartResult:
    """`failover`: go on when another server dies; `hot` (under ULFM): when a worker dies;
    `ulfm`: servers that die as the model is saved are found (see server_files.write_for_the_dead).
    `locks`: the run's directories' locks, which this server takes over if it comes to
    lead."""
    part = ServerPart(cfg, roles, name, resume, placement, locks)
    server = part.server(failover, hot)
    stats = part.run(server)
    failures += server.failures
    if moves is not None:
        moves += server.members.done
    lost = part.save(server, ulfm)
    return part.result(server, stats, lost)


class ServerPart:
    """One server's part of a job: its store and dense tables (loaded from a checkpoint
    when resuming), the hooks the server's loop calls (checkpoints, snapshots, a save after
    an error), the loop itself, the model saved at the end, and the server's figures."""

    def __init__(self, cfg: TrainConfig, roles: Roles, name: str, resume, placement: Placement,
                 locks: RunLocks):
        self.cfg, self.roles, self.name, self.resume, self.locks = cfg, roles, name, resume, locks
        self.placement = placement
        self.budget = Budget(cfg.layout.max_rank_memory)
        model = cfg.model.spec()
        self.store = KVStore(width=model.width, optimizer=cfg.optimizer, budget=self.budget,
                             init=None if model.starts_at_zero else model.init)
        self.dense = DenseTables(roles.index, placement, len(roles.workers), self.budget)
        self.own = PrimaryKeys(self.store, placement, roles.index)   # what this server writes
        self.clocks = ClockTable(len(roles.workers), staleness=cfg.consistency.max_staleness)
        self.positions = checkpoint.positions(resume)
        for worker, p in self.positions.items():
            self.clocks.resume(worker, p.clock)
        self.handout: RowHandOut | None = None   # made with the server's loop
        self.dense_written: list[int] = []
        self.dense.checkpointer = self.write_dense
        minibatch = not cfg.solver.full_batch
        # Every server keeps the figures; the lead says them (a full-batch driver its own).
        self.progress = (Progress(len(roles.workers), cfg.solver.epochs,
                                  cfg.diagnostics.log_every) if minibatch else None)
        # The training data's format, that of the data the model can score ("": not known).
        self.trained_on = data_format(cfg.data.train)
        self.attrs = {"run_id": name, "config": cfg.to_record(),
                      "data_format": self.trained_on or ""}
        self.started = time.monotonic()
        self.curves: LiveCurves | None = None
        self.scorer: SnapshotScorer | None = None
        self.resident: Resident | None = None   # the checkpoints' writer (made with the hooks)
        if roles.index == 0:   # the lead, at the start
            self._draw_curves()
        self.reasons: list[str] = []
        self.startup_s = self.train_s = self.save_s = 0.0

    def load(self) -> None:
        """Room for the training data's keys, and the checkpoint resumed from, if any."""
        cfg, roles, resume = self.cfg, self.roles, self.resume
        if not cfg.solver.full_batch:   # a full-batch solver's servers hold dense tables
            _reserve(self.store, cfg.data.train, self.placement.held_ranges(roles.index).mean())
            # Here rather than in each forked checkpoint writer (h5py's import takes 0.1-0.3 s)
            import h5py  # noqa: F401
        if not resume:
            return
        directory, manifest = resume
        full_batch = "solver" in manifest
        try:
            loaded = (checkpoint.load_dense(directory, manifest, self.dense) if full_batch else
                      checkpoint.load_shards(directory, manifest, self.store, self.placement,
                                             roles.index))
        except (OSError, KeyError, ValueError) as e:
            raise ConfigError(f"--resume: cannot read the checkpoint {directory}: {e}") from None
        log.info("resumed from checkpoint %s %d (%s): loaded %d %s",
                 "iteration" if full_batch else "clock", manifest["clock"], directory,
                 loaded, "blocks" if full_batch else "keys")

    def write_dense(self, iteration: int) -> bool:
        """A full-batch job's checkpoint: this server's blocks of the dense tables."""
        try:
            checkpoint.write_dense_shard(self.cfg.checkpoints, iteration, self.roles.index,
                                         self.dense.datasets(), {"run_id": self.name})
            self.dense_written.append(iteration)
            # As the lead's: the driver completes the checkpoint once this server answers,
            # so it cannot wait for the earlier ones (see testevents).
            testevents.reached("checkpoint", len(self.dense_written), lead=True)
            return True
        except SaveError as e:
            log.error("checkpoint at iteration %d: %s", iteration, e)
            return False

    def _examples(self) -> int:
        """The examples trained so far, as the workers' reports say (-1: not counted)."""
        return self.progress.examples_sum if self.progress else -1

    def save_partial(self, reason: str, wait_s: float) -> None:
        """After an error: on a full disk, tried again for `wait_s`. A rank that told this one
        to save waits for its acknowledgement within --timeout (a frozen server never gives
        it)."""
        self.reasons.append(reason)   # the first reason stays first: later ones often echo it
        own = self.own
        try:
            path = keep_trying(
                lambda: save_shard(self.cfg.model_dir, self.roles.index, len(self.roles.servers),
                                   own, {**self.attrs, "complete": False,
                                         "note": "; then ".join(self.reasons)},
                                   self.clocks.longest, ranges=own.ranges(),
                                   n_ranges=own.placement.n_ranges, dense=self.dense.datasets()),
                wait_s, "the model trained so far")
        except SaveError as e:
            log.error("could not save the %d keys trained so far: %s%s", len(own), e,
                      checkpoints_hint(self.cfg))
            return
        log.error("saved the %d keys trained so far to %s", len(own), path)

    def _hooks(self) -> Hooks:
        cfg = self.cfg

        def another_rank_failed(reason: str) -> None:
            log.error("stopping: %s", reason)
            self.save_partial(reason, cfg.faults.disk_wait)

        def placement_changed(changed: Placement) -> None:
            self.own.placement = changed

        def now_leads() -> None:
            self.locks.take_over(f"server {self.roles.index} leads the run now")
            self._draw_curves()

        resident = self.resident = resident_writer(cfg, self.roles, self.name, self.own)
        return Hooks(**checkpoint_writers(cfg, self.roles, self.name, self.own, self.trained_on,
                                          resident),
                     placement_changed=placement_changed,
                     snapshot=(snapshot_writer(
                         cfg, self.roles, self.own, self.attrs, self.clocks, self._examples,
                         self.started, resident) if cfg.diagnostics.snapshot_every else None),
                     snapshot_every=cfg.diagnostics.snapshot_every or 0.0,
                     failed=another_rank_failed, stop_requested=signals.stop_requested,
                     reached=testevents.reached if testevents.armed() else None,
                     now_leads=now_leads,
                     sampled=self._sampled if cfg.diagnostics.tensorboard else None)

    def _draw_curves(self) -> None:
        """Live curves for TensorBoard from this server, which leads (--tensorboard)."""
        directory = self.cfg.diagnostics.tensorboard
        if directory and self.curves is None and self.progress:
            self.curves = LiveCurves(directory, self.cfg.to_record())
            self.progress.curves = self.curves.line
            cfg = self.cfg
            if cfg.data.test and cfg.diagnostics.snapshot_every and self.scorer is None:
                self.scorer = SnapshotScorer.start(cfg.run_dir, directory, cfg.data.test,
                                                   self.name)

    def _sampled(self, figures: dict, force: bool) -> None:
        if self.curves and self.progress:
            self.curves.sample(self.progress.examples_sum, figures, force)

    def server(self, failover: bool, hot: bool) -> Server:
        """The server's loop over this part's store and tables."""
        cfg, roles = self.cfg, self.roles
        minibatch = not cfg.solver.full_batch
        # A worker's rows are handed over when it dies (hot) or leaves (not a pipeline's or a
        # full-batch solver's).
        elastic = hot or (cfg.pipeline.stages == 1 and minibatch)
        # A full-batch job's checkpoints are by iterations, asked for by its driver.
        by_clocks = cfg.checkpointing.every if minibatch else 0
        balance = self._balance()   # (before the checkpoints take the positions: it moves them)
        checkpoints = Checkpoints(by_clocks, cfg.checkpointing.seconds, len(roles.servers),
                                  cfg.consistency.max_staleness == 0, self.positions)
        scoring = ((lambda s: Scoring(s, cfg, core_to_spare(roles) and not hot, hot))
                   if shared(cfg) else None)
        server = Server(roles, self.store, self.clocks, cfg.faults.timeout,
                        hooks=self._hooks(), progress=self.progress, dense=self.dense,
                        record_pulls=cfg.diagnostics.record_pulls, checkpoints=checkpoints,
                        placement=self.placement, failover=failover, workers_fail_over=hot,
                        epochs=cfg.solver.epochs,
                        parts=spans(cfg.data.train, len(roles.workers)) if elastic else (),
                        deaths=checkpoint.deaths(self.resume), run_dir=cfg.data.out,
                        run_id=self.name, scoring=scoring)
        server.ctx.handout = self.handout = RowHandOut(server.ctx, balance)
        return server

    def _balance(self) -> Balance | None:
        """The hand-out of the training rows (--balance dynamic), as the checkpoint resumed
        from left it, if any; None under --balance static."""
        cfg = self.cfg
        if not cfg.consistency.dynamic:
            return None
        workers, epochs = len(self.roles.workers), cfg.solver.epochs
        assert cfg.solver.batch_size, "the minibatch size is chosen before the servers start"
        total = spans(cfg.data.train, 1)[0][1]
        state = self.resume.manifest.get("balance") if self.resume else None
        if not state:
            return Balance(total, epochs, workers, cfg.solver.batch_size)
        # Each worker goes on from its place in the checkpoint holding no chunk: the rest of
        # those it held goes back to the pool, and its place starts over in this launch.
        places = {w: (p.epoch, p.segment, p.offset) for w, p in self.positions.items()}
        self.positions = {w: p.but(segment=0, offset=-1) for w, p in self.positions.items()}
        return Balance.of_state(state, epochs, workers, cfg.solver.batch_size, 1, places)

    def run(self, server: Server):
        """Every rank ready, the server's loop until the workers are done; after an error,
        what this server holds saved, and the other servers told to save theirs."""
        cfg, roles = self.cfg, self.roles
        t0 = self.started = ready(roles.comm, cfg.faults.startup_timeout, self.load)
        if self.resident is not None:
            self.resident.prepare()   # the table reserved or loaded: its size known
        self.startup_s = process_age()
        if self.progress:
            self.progress.start(self.positions)
        try:
            stats = server.run()
        except Exception as e:
            if self.scorer:
                self.scorer.training_over()
            reason = said_by(f"server {roles.index}", log_failure(e))
            # A second signal stops at once: no wait for space.
            self.save_partial(reason, 0 if isinstance(e, Interrupted) else cfg.faults.disk_wait)
            # A death no server can take over: every server detects it and saves its shard.
            others = [roles.servers[i] for i in server.placement.others(roles.index)]
            others_save(roles.comm, others, e, reason, cfg.faults.timeout,
                        "the other servers did not confirm saving their shards", answering=True)
            raise
        self.train_s = time.monotonic() - t0
        if self.curves:
            self.curves.close()
        return stats

    def _final_attrs(self, server: Server) -> dict:
        """The model file's attributes: complete, or why not and how to go on."""
        cfg, abandoned = self.cfg, server.losses.abandoned if server.losses else []
        if server.stopped and not self.clocks.all_finished:
            return {**self.attrs, "complete": False,
                    "note": f"stopped at clock {server.stop_at}; continue with --resume "
                            f"{cfg.checkpoints}"}
        if abandoned:
            return {**self.attrs, "complete": False,
                    "note": f"{abandoned[0]}; continue with --resume {cfg.checkpoints}"}
        return {**self.attrs, "complete": True}

    def save(self, server: Server, ulfm: bool) -> int:
        """The model this server holds, then (under ULFM) the ranges of servers that died
        meanwhile; the record of pulls if asked. Returns the key ranges no file holds."""
        cfg, own, dense = self.cfg, self.own, self.dense
        saved = self._final_attrs(server)

        def save_model() -> None:
            keep_trying(lambda: save_shard(cfg.model_dir, self.roles.index,
                                           len(self.roles.servers), own, saved,
                                           self.clocks.longest, ranges=own.ranges(),
                                           n_ranges=own.placement.n_ranges,
                                           dense=dense.datasets()),
                        cfg.faults.disk_wait, "the trained model")

        testevents.reached("saving")
        began = time.monotonic()
        try:
            save_model()
            lost = (write_for_the_dead(self.roles, own, dense, cfg.model_dir, save_model)
                    if ulfm else 0)
        except SaveError as e:
            raise SaveError(f"the model of server {self.roles.index} ({len(own):,} keys) could "
                            f"not be saved: {e}{checkpoints_hint(cfg)}") from None
        self.save_s = time.monotonic() - began
        if cfg.diagnostics.record_pulls:
            self._write_pulls(server)
        return lost

    def _write_pulls(self, server: Server) -> None:
        cfg, pulls = self.cfg, server.pull_records()
        assert pulls.dtype.names is not None, "the record of pulls is a structured array"
        staleness = cfg.consistency.max_staleness
        try:
            write_hdf5(os.path.join(cfg.run_dir, "pulls", f"server-{self.roles.index:04d}.h5"),
                       {field: pulls[field] for field in pulls.dtype.names},
                       {"run_id": self.name, "consistency": cfg.consistency.mode,
                        "staleness": -1 if staleness is None else staleness})
        except SaveError as e:
            log.warning("the record of pulls (--record-pulls) was not written: %s", e)

    def result(self, server: Server, stats, lost: int) -> PartResult:
        """The server's figures for the summary, and its share of the test scores."""
        store, clocks = self.store, self.clocks
        abandoned = server.losses.abandoned if server.losses else []
        r = summary.new_record()
        r["train_s"] = self.train_s
        r["startup_s"] = self.startup_s
        r["save_s"] = self.save_s
        r["bytes_sent"] = stats.bytes_sent
        r["keys"] = len(self.own)
        r["copies"] = len(store)   # with backups' keys
        r["table_bytes"] = store.nbytes + self.dense.nbytes()
        r["pulls_held"] = stats.pulls_held
        r["max_gap"] = clocks.max_gap
        r["busy_s"] = stats.busy_s
        r["train_bytes"] = stats.train_bytes_sent
        r["push_bytes"] = stats.push_bytes
        r["train_requests"] = stats.train_requests or stats.requests
        r["ranges_lost"] = lost
        r["rows_abandoned"] = len(abandoned)
        r["stopped_at"] = server.stop_at if server.stopped else -1   # a server: its checkpoint
        r["stop_saved"] = server.stop_at in server.completed   # known to server 0 only
        r["examples"] = server.losses.examples if server.losses else 0   # dead workers' (lead)
        r["pushes"] = stats.pushes_applied
        r["keys_served"] = stats.keys_served
        r["test_keys"] = stats.test_keys
        r["test_keys_known"] = stats.test_keys_known
        r["held_peak"] = self.budget.peak
        r["snapshots"] = server.timers.numbered
        margins, labels = np.empty(0), np.empty(0, np.float32)
        if server.scoring:
            margins, labels = server.scoring.results()
            r["score_s"] = server.scoring.score_s
            r["bad_lines"] = server.scoring.bad_lines
            r["test_units"] = server.scoring.units
        r["test_rows"] = margins.shape[0]
        return PartResult(r, margins, labels, server.held_s, NO_STEPS,
                          server.timeline.samples(), scorer=self.scorer)
