"""A training job: servers serve, workers train on their shard, rank 0 writes the summary.

One minibatch on a worker: rows from its byte range of the file -> sorted unique
keys -> pull -> logistic-regression gradient (numba) -> push, which also
completes the worker's clock. After the last epoch every worker scores its share
of the test file with the final model, and rank 0 gathers the scores.
"""
import logging
import os
import shutil
import time
import traceback
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from mpi4py import MPI

from . import logreg, summary
from .bounded import wait_all
from .client import KVWorker, tell_servers_to_save
from .clocks import FINISHED, ClockTable
from .data import KeyIndexer
from .shards import check_input, features_per_row, open_shard
from .errors import ConfigError, Interrupted, MpipsError
from .log import say, setup
from .model_io import save_shard, write_atomic_hdf5
from .optimizer import LR_SCALE, Optimizer
from .progress import Progress
from .roles import Roles, check_servers, split
from .server import Server
from .startup import agree, compile_per_node, run_id
from .store import KVStore
from .warmup import CompileWatch

log = logging.getLogger("mpips")

EVAL_BATCH = 10000
CONSISTENCY = ("bsp", "ssp", "asp")
RUN_OUTPUTS = ("summary.json", "model", "pulls", "snapshots")   # what a run writes in --out


@dataclass(frozen=True)
class TrainConfig:
    train: str
    out: str | None = None          # None: runs/<run id>
    test: str | None = None
    servers: int = 1
    epochs: int = 1
    batch_size: int = 1000
    optimizer: Optimizer = field(default_factory=Optimizer)
    bias: bool = True
    consistency: str = "bsp"
    staleness: int | None = None    # SSP only
    stragglers: tuple = ()          # ((worker, slowdown factor), ...): a testing aid
    record_pulls: bool = False
    snapshot_every: float | None = None
    skip_bad_lines: bool = False
    overwrite: bool = False
    timeout: float = 600.0
    log_every: float = 5.0

    def check(self, n_ranks: int) -> None:
        """Raise ConfigError for anything wrong that every rank can see the same way."""
        check_servers(self.servers, n_ranks)
        for flag, value in (("--epochs", self.epochs), ("--batch-size", self.batch_size)):
            if value < 1:
                raise ConfigError(f"{flag} must be at least 1, got {value}")
        if not 0 < self.timeout < float("inf"):
            raise ConfigError(f"--timeout must be a positive number of seconds, got {self.timeout}")
        if self.consistency not in CONSISTENCY:
            raise ConfigError(f"--consistency must be one of {', '.join(CONSISTENCY)}, "
                              f"got {self.consistency!r}")
        if self.consistency == "ssp" and not 0 <= (self.staleness or 0) < 2**31:
            raise ConfigError(f"--staleness must be a number of clocks from 0 to 2^31-1, "
                              f"got {self.staleness}")
        if self.consistency == "ssp" and self.staleness is None:
            raise ConfigError("--consistency ssp needs --staleness S, a number of clocks >= 0")
        if self.consistency != "ssp" and self.staleness is not None:
            raise ConfigError(f"--staleness applies to --consistency ssp, not {self.consistency}")
        slowed = [worker for worker, _ in self.stragglers]
        if len(set(slowed)) < len(slowed):
            raise ConfigError(f"--straggler names a worker more than once: {sorted(slowed)}")
        for worker, factor in self.stragglers:
            if not 0 <= worker < n_ranks - self.servers:
                raise ConfigError(f"--straggler {worker}:{factor}: worker {worker} does not exist "
                                  f"(workers are 0..{n_ranks - self.servers - 1})")
            if not 1 <= factor < float("inf"):
                raise ConfigError(f"--straggler {worker}:{factor}: the factor must be >= 1")
        if self.snapshot_every is not None and not self.snapshot_every > 0:
            raise ConfigError(f"--snapshot-every must be positive, got {self.snapshot_every}")
        check_input(self.train, "--train")
        if self.test is not None:
            check_input(self.test, "--test")
        earlier = [name for name in RUN_OUTPUTS if os.path.exists(os.path.join(self.out, name))]
        if earlier and not self.overwrite:
            raise ConfigError(f"--out {self.out} already holds a run ({', '.join(earlier)}); "
                              f"choose another --out, or pass --overwrite to replace it")
        try:
            os.makedirs(self.out, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--out {self.out}: cannot create the run directory ({e.strerror})")

    @property
    def model_dir(self) -> str:
        return os.path.join(self.out, "model")

    @property
    def max_staleness(self) -> int | None:
        """Clocks a reader may be ahead of the slowest worker: 0 for BSP, None (any) for ASP."""
        return {"bsp": 0, "asp": None}.get(self.consistency, self.staleness)

    def slowdown(self, worker: int) -> float:
        return dict(self.stragglers).get(worker, 1.0)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["optimizer"] = asdict(self.optimizer)
        return d


def train(cfg: TrainConfig, comm: MPI.Intracomm = MPI.COMM_WORLD) -> dict | None:
    """Collective over `comm`. Returns the summary on rank 0, None elsewhere."""
    started = time.monotonic()
    # Every rank waits this long at most, even before the configuration is checked.
    bound = cfg.timeout if 0 < cfg.timeout < float("inf") else TrainConfig.timeout
    name = run_id(comm, bound)
    cfg = replace(cfg, out=cfg.out or os.path.join("runs", name))
    agree(comm, lambda: cfg.check(comm.size), bound)
    chosen_lr = cfg.optimizer.lr is None
    if chosen_lr:   # every rank reads the same bytes, so all choose the same rate
        density = features_per_row(cfg.train) + cfg.bias
        cfg = replace(cfg, optimizer=cfg.optimizer.with_default_lr(density))
    if comm.rank == 0 and cfg.overwrite:
        for output in RUN_OUTPUTS:
            path = os.path.join(cfg.out, output)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
    roles = split(cfg.servers, comm)   # collective: nobody writes before the old run is gone
    setup(f"rank {comm.rank} ({roles.name})")
    if comm.rank == 0:
        log.info("run %s: %d server(s), %d worker(s), writing to %s", name, len(roles.servers),
                 len(roles.workers), cfg.out)
        if chosen_lr:
            log.info("%s learning rate %.4g: %g / %.1f features per row (set --lr to change)",
                     cfg.optimizer.name, cfg.optimizer.lr, LR_SCALE[cfg.optimizer.name], density)
        log.info("loading the numba kernels (compiled on the first run on a machine, ~20 s)")
    try:
        compile_s = compile_per_node(roles.comm, cfg.timeout)
        if comm.rank == 0:
            log.info("kernels ready in %.1f s", compile_s)
        watch = CompileWatch()
        with watch.watching():
            if roles.is_server:
                record, margins, labels, held = _serve(cfg, roles, name)
            else:
                record, margins, labels, held = _work(cfg, roles)
        if watch.compiled:
            log.warning("numba compiled during the job, after warm-up: %s", "; ".join(watch.compiled))
        record["compile_s"] = compile_s
        record["late_compiles"] = len(watch.compiled)
        return _finish(cfg, roles, name, record, margins, labels, held, started)
    finally:
        roles.free()


def _ready(roles: Roles, timeout: float) -> float:
    wait_all([roles.comm.Ibarrier()], timeout, lambda: "every rank to start")
    return time.monotonic()


def _log_failure(e: Exception) -> str:
    """Log why this rank fails (with a traceback if it is a bug); return a one-line reason."""
    text = str(e) if isinstance(e, MpipsError) else f"{type(e).__name__}: {e}"
    log.error("%s", text if isinstance(e, MpipsError) else traceback.format_exc())
    e.reported = True   # the command line does not log it again
    return text


def _serve(cfg: TrainConfig, roles: Roles, name: str):
    store = KVStore(width=1, optimizer=cfg.optimizer)
    clocks = ClockTable(len(roles.workers), staleness=cfg.max_staleness)
    progress = (Progress(len(roles.workers), cfg.epochs, cfg.log_every)
                if roles.index == 0 else None)
    attrs = {"run_id": name, "config": cfg.as_dict()}
    started = [time.monotonic()]
    taken = []

    def snapshot(final: bool) -> None:
        """The model as it is now, for learning curves (--snapshot-every); the last one
        when every worker has finished training."""
        taken.append(time.monotonic() - started[0])
        slowest = clocks.slowest()
        name = "final" if final else f"{len(taken) - 1:04d}"
        save_shard(os.path.join(cfg.out, "snapshots", name), roles.index,
                   len(roles.servers), store,
                   {**attrs, "complete": True, "elapsed_s": taken[-1],
                    "slowest_clock": -1 if slowest == FINISHED else slowest}, weights_only=True)

    reasons = []

    def save_partial(reason: str) -> None:
        reasons.append(reason)   # the first reason stays first: later ones are often echoes
        path = save_shard(cfg.model_dir, roles.index, len(roles.servers), store,
                          {**attrs, "complete": False, "note": "; then ".join(reasons)})
        log.error("saved the %d keys trained so far to %s", len(store), path)

    def another_rank_failed(reason: str) -> None:
        log.error("stopping: %s", reason)
        save_partial(reason)

    server = Server(roles, store, clocks, cfg.timeout, on_error=another_rank_failed,
                    progress=progress, record_pulls=cfg.record_pulls,
                    every=(cfg.snapshot_every, snapshot) if cfg.snapshot_every else None)
    t0 = started[0] = _ready(roles, cfg.timeout)
    if progress:
        progress.start()
    try:
        stats = server.run()
    except Exception as e:
        reason = f"server {roles.index}: {_log_failure(e)}"
        save_partial(reason)
        others = [r for r in roles.servers if r != roles.comm.rank]
        if others and not isinstance(e, Interrupted):
            try:
                tell_servers_to_save(roles.comm, others, reason, cfg.timeout)
            except MpipsError as again:
                log.error("the other servers did not confirm saving their shards: %s", again)
        raise
    train_s = time.monotonic() - t0
    save_shard(cfg.model_dir, roles.index, len(roles.servers), store, {**attrs, "complete": True})
    if cfg.record_pulls:
        pulls = server.pull_records()
        write_atomic_hdf5(os.path.join(cfg.out, "pulls", f"server-{roles.index:04d}.h5"),
                          {field: pulls[field] for field in pulls.dtype.names},
                          {"run_id": name, "consistency": cfg.consistency,
                           "staleness": -1 if cfg.max_staleness is None else cfg.max_staleness})
    r = summary.new_record()
    r["train_s"] = train_s
    r["bytes_sent"] = stats.bytes_sent
    r["keys"] = len(store)
    r["table_bytes"] = store.nbytes
    r["pulls_held"] = stats.pulls_held
    r["max_gap"] = clocks.max_gap
    r["busy_s"] = stats.busy_s
    return r, np.empty(0), np.empty(0, np.float32), server.held_s


def _work(cfg: TrainConfig, roles: Roles):
    kv = KVWorker(roles, width=1, timeout=cfg.timeout)
    try:
        return _train_and_score(cfg, roles, kv)
    except Exception as e:
        reason = f"worker {roles.index}: {_log_failure(e)}"
        if not isinstance(e, Interrupted):
            try:
                tell_servers_to_save(roles.comm, roles.servers, reason, cfg.timeout)
            except MpipsError as again:
                log.error("could not reach the servers to save the model: %s", again)
        raise


def _train_and_score(cfg: TrainConfig, roles: Roles, kv: KVWorker):
    n_workers = len(roles.workers)
    shard = open_shard(cfg.train, roles.index, n_workers, skip_bad=cfg.skip_bad_lines)
    slowdown = cfg.slowdown(roles.index)
    stream = _minibatches(cfg, shard)
    t0 = mark = _ready(roles, cfg.timeout)
    examples, loss, push = 0, 0.0, None
    current = next(stream, None)
    pull = kv.pull(current[1]) if current else None
    while current is not None:
        waited = kv.wait_s
        # Pipelining: the next minibatch's keys are found and its pull sent now, so the
        # servers work on it while this one computes (they answer once this push arrives).
        upcoming = next(stream, None)
        next_pull = kv.pull(upcoming[1], next_clock=True) if upcoming else None
        batch, keys, cols, bias_col, progress = current
        grad, batch_loss = logreg.gradient(batch, cols, bias_col, kv.wait(pull))
        loss += batch_loss
        examples += len(batch)
        kv.report(examples, loss, progress)
        if push is not None:
            kv.wait(push)
        push = kv.push(keys, grad, clock=True)
        if slowdown > 1:   # --straggler, a testing aid: take `slowdown` times as long
            busy = time.monotonic() - mark - (kv.wait_s - waited)
            time.sleep((slowdown - 1) * max(busy, 0.0))
            mark = time.monotonic()
        current, pull = upcoming, next_pull
    kv.report(examples, loss, cfg.epochs)
    kv.finish()
    train_s = time.monotonic() - t0
    _wait_for_other_workers(roles, kv, cfg.timeout)
    margins, labels, bad_test_lines = np.empty(0), np.empty(0, np.float32), 0
    if cfg.test:
        margins, labels, bad_test_lines = _score(cfg, roles, kv)
    kv.close()
    r = summary.new_record()
    r["examples"] = examples
    r["train_loss"] = loss
    r["train_s"] = train_s
    r["wait_s"] = kv.wait_s
    r["bytes_sent"] = kv.bytes_sent
    r["bad_lines"] = shard.bad_lines + bad_test_lines
    r["test_rows"] = margins.shape[0]
    return r, margins, labels, np.zeros(n_workers)


def _minibatches(cfg: TrainConfig, shard):
    """(rows, keys, cols, bias_col, epochs done) for each minibatch of every epoch."""
    index = KeyIndexer()
    for epoch in range(cfg.epochs):
        for batch in shard.minibatches(cfg.batch_size):
            keys, cols, bias_col = index(batch, cfg.bias, shard.path)
            yield batch, keys, cols, bias_col, epoch + shard.fraction_done


def _wait_for_other_workers(roles: Roles, kv: KVWorker, timeout: float) -> None:
    """Wait until every worker has finished training, however long that takes, as long as
    the slowest keeps advancing: the bound is --timeout without progress."""
    latest = {}

    def progress():
        latest.update(kv.status())
        return latest["slowest_clock"], latest["finished"]

    wait_all([roles.group.Ibarrier()], timeout, progress=progress, check_every=2.0,
             what=lambda: (f"the other workers to finish training (worker "
                           f"{latest.get('slowest_worker')} is at clock "
                           f"{latest.get('slowest_clock')})"))


def _score(cfg: TrainConfig, roles: Roles, kv: KVWorker):
    """(margins, labels, bad lines skipped) of this worker's share of the test file under
    the final model."""
    shard = open_shard(cfg.test, roles.index, len(roles.workers), skip_bad=cfg.skip_bad_lines)
    margins, labels, index = [], [], KeyIndexer()
    for batch in shard.minibatches(EVAL_BATCH):
        keys, cols, bias_col = index(batch, cfg.bias, shard.path)
        weights = kv.wait(kv.pull(keys, read_only=True))
        margins.append(logreg.margins(batch, cols, bias_col, weights))
        labels.append(batch.labels)
    if not margins:
        return np.empty(0), np.empty(0, np.float32), shard.bad_lines
    return np.concatenate(margins), np.concatenate(labels), shard.bad_lines


def _finish(cfg, roles, name, record, margins, labels, held, started) -> dict | None:
    """Gather every rank's figures and the test scores; rank 0 writes the summary."""
    comm = roles.comm
    records = summary.allgather(comm, record, cfg.timeout)
    held = summary.max_over_ranks(comm, held, cfg.timeout, "the servers' hold times")
    counts = records["test_rows"]
    margins = summary.gather_to_root(comm, margins, counts, cfg.timeout, "the test scores")
    labels = summary.gather_to_root(comm, labels, counts, cfg.timeout, "the test labels")
    result = None
    if comm.rank == 0:
        result = summary.build(
            records, len(roles.servers), margins, labels, held, run_id=name,
            config=cfg.as_dict(), consistency=cfg.consistency, staleness=cfg.max_staleness,
            wall_s=time.monotonic() - started,
            model_dir=os.path.abspath(cfg.model_dir))
        summary.print_lines(result, summary.write(cfg.out, result))
    examples = int(records["examples"].sum())
    if examples == 0:   # every rank sees the same records, so all fail alike
        error = ConfigError(f"--train {cfg.train}: no training examples "
                            f"({int(records['bad_lines'].sum())} bad line(s) skipped)")
        error.reported = comm.rank == 0
        raise error
    return result
