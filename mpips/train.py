"""A training job: servers serve, workers train on their shard, rank 0 writes the summary.

One minibatch on a worker: rows from its byte range of the file -> sorted unique
keys -> pull -> logistic-regression gradient (numba) -> push, which also
completes the worker's clock. After the last epoch every worker scores its share
of the test file with the final model, and rank 0 gathers the scores.
"""
import json
import logging
import os
import time
import traceback
from dataclasses import asdict, dataclass, field

import numpy as np
from mpi4py import MPI

from . import __version__, logreg
from .bounded import wait_all
from .client import KVWorker
from .clocks import ClockTable
from .data import SvmlightShard, check_file
from .errors import ConfigError, MpipsError
from .kernels.logistic import mean_logloss, roc_auc
from .log import say, setup
from .model_io import save_shard
from .optimizer import Optimizer
from .progress import Progress
from .roles import Roles, check_servers, split
from .server import Server
from .store import KVStore
from .warmup import CompileWatch, compile_kernels

log = logging.getLogger("mpips")

EVAL_BATCH = 10000


@dataclass(frozen=True)
class TrainConfig:
    train: str
    out: str
    test: str | None = None
    servers: int = 1
    epochs: int = 1
    batch_size: int = 1000
    optimizer: Optimizer = field(default_factory=Optimizer)
    bias: bool = True
    consistency: str = "bsp"
    skip_bad_lines: bool = False
    timeout: float = 600.0
    log_every: float = 5.0

    def check(self, n_ranks: int) -> None:
        """Raise ConfigError for anything wrong that every rank can see the same way."""
        check_servers(self.servers, n_ranks)
        for flag, value in (("--epochs", self.epochs), ("--batch-size", self.batch_size)):
            if value < 1:
                raise ConfigError(f"{flag} must be at least 1, got {value}")
        if not self.timeout > 0:
            raise ConfigError(f"--timeout must be positive, got {self.timeout}")
        check_file(self.train, "--train")
        if self.test is not None:
            check_file(self.test, "--test")
        try:
            os.makedirs(self.out, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--out {self.out}: cannot create the run directory ({e.strerror})")

    @property
    def model_dir(self) -> str:
        return os.path.join(self.out, "model")


# What each rank reports at the end; gathered to rank 0 as raw bytes.
_RESULT = np.dtype([
    ("examples", "<i8"), ("train_loss", "<f8"), ("train_s", "<f8"), ("wait_s", "<f8"),
    ("bytes_sent", "<i8"), ("keys", "<i8"), ("table_bytes", "<i8"), ("bad_lines", "<i8"),
    ("pulls_held", "<i8"), ("max_gap", "<i8"), ("test_rows", "<i8"),
    ("compile_s", "<f8"), ("late_compiles", "<i8"),
])


def agree(comm: MPI.Intracomm, check, timeout: float = 120.0) -> None:
    """Run `check()` on every rank; if it raises ConfigError anywhere, raise it everywhere.

    The lowest failing rank keeps the original message; the others raise a
    ConfigError with `reported = False` so only one copy is printed.
    """
    error = None
    try:
        check()
    except ConfigError as e:
        error = e
    first = np.array([comm.rank if error else comm.size], np.int64)
    result = np.empty(1, np.int64)
    req = comm.Iallreduce(first, result, op=MPI.MIN)
    wait_all([req], timeout, lambda: "every rank to check the configuration")
    if result[0] < comm.size:
        if error is None:
            error = ConfigError(f"rank {result[0]} rejected the configuration")
        error.reported = comm.rank == result[0]
        raise error


def train(cfg: TrainConfig, comm: MPI.Intracomm = MPI.COMM_WORLD) -> dict | None:
    """Collective over `comm`. Returns the summary on rank 0, None elsewhere."""
    started = time.monotonic()
    agree(comm, lambda: cfg.check(comm.size))
    roles = split(cfg.servers, comm)
    setup(f"rank {comm.rank} ({roles.name})")
    if comm.rank == 0:
        log.info("%d server(s), %d worker(s)", len(roles.servers), len(roles.workers))
    try:
        compile_s = _compile_kernels(roles, cfg.timeout)
        watch = CompileWatch()
        with watch.watching():
            record, margins, labels = _serve(cfg, roles) if roles.is_server else _work(cfg, roles)
        if watch.compiled:
            log.warning("numba compiled during the job, after warm-up: %s", "; ".join(watch.compiled))
        record["compile_s"] = compile_s
        record["late_compiles"] = len(watch.compiled)
        return _summarize(cfg, roles, (record, margins, labels), started)
    finally:
        roles.free()


def _compile_kernels(roles: Roles, timeout: float) -> float:
    """Compile the kernels on one rank per node first; the others then load numba's cache
    instead of compiling the same code at the same time on the same cores."""
    start = time.monotonic()
    if roles.comm.rank == 0:
        log.info("loading the numba kernels (compiled on the first run on a machine, ~20 s)")
    node = roles.comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        if node.rank == 0:
            compile_kernels()
        wait_all([node.Ibarrier()], timeout, lambda: "the first rank on this node to compile "
                                                      "the numba kernels")
        if node.rank != 0:
            compile_kernels()
    finally:
        node.Free()
    if roles.comm.rank == 0:
        log.info("kernels ready in %.1f s", time.monotonic() - start)
    return time.monotonic() - start


def _ready(roles: Roles, timeout: float) -> float:
    wait_all([roles.comm.Ibarrier()], timeout, lambda: "every rank to start")
    return time.monotonic()


def _serve(cfg: TrainConfig, roles: Roles):
    store = KVStore(width=1, optimizer=cfg.optimizer)
    clocks = ClockTable(len(roles.workers), staleness=0)
    progress = (Progress(len(roles.workers), cfg.epochs, cfg.log_every)
                if roles.index == 0 else None)
    config = _config_dict(cfg)

    def save_partial(reason: str) -> None:
        path = save_shard(cfg.model_dir, roles.index, len(roles.servers), store,
                          {"complete": False, "note": reason, "config": config})
        log.error("saved the %d keys trained so far to %s", len(store), path)

    def worker_failed(reason: str) -> None:
        log.error("a worker failed (%s)", reason)
        save_partial(reason)

    server = Server(roles, store, clocks, cfg.timeout, on_error=worker_failed, progress=progress)
    t0 = _ready(roles, cfg.timeout)
    if progress:
        progress.start()
    try:
        stats = server.run()
    except Exception as e:
        save_partial(f"server {roles.index}: {_log_failure(e)}")
        raise
    train_s = time.monotonic() - t0
    save_shard(cfg.model_dir, roles.index, len(roles.servers), store,
               {"complete": True, "config": config})
    r = np.zeros((), _RESULT)
    r["train_s"] = train_s
    r["bytes_sent"] = stats.bytes_sent
    r["keys"] = len(store)
    r["table_bytes"] = store.nbytes
    r["pulls_held"] = stats.pulls_held
    r["max_gap"] = clocks.max_gap
    return r, np.empty(0), np.empty(0, np.float32)


def _log_failure(e: Exception) -> str:
    """Log why this rank fails (with a traceback if it is a bug); return a one-line reason."""
    text = str(e) if isinstance(e, MpipsError) else f"{type(e).__name__}: {e}"
    log.error("%s", text if isinstance(e, MpipsError) else traceback.format_exc())
    e.reported = True   # the command line does not log it again
    return text


def _work(cfg: TrainConfig, roles: Roles):
    kv = KVWorker(roles, width=1, timeout=cfg.timeout)
    try:
        return _train_and_score(cfg, roles, kv)
    except Exception as e:
        text = _log_failure(e)
        try:
            kv.fail(text)
        except MpipsError as again:
            log.error("could not reach the servers to save the model: %s", again)
        raise


def _train_and_score(cfg: TrainConfig, roles: Roles, kv: KVWorker):
    n_workers = len(roles.workers)
    shard = SvmlightShard(cfg.train, roles.index, n_workers, skip_bad=cfg.skip_bad_lines)
    t0 = _ready(roles, cfg.timeout)
    examples, loss, push = 0, 0.0, None
    for epoch in range(cfg.epochs):
        for batch in shard.minibatches(cfg.batch_size):
            keys, cols, bias_col = batch.unique_keys(cfg.bias)
            grad, batch_loss = logreg.gradient(batch, cols, bias_col, kv.wait(kv.pull(keys)))
            loss += batch_loss
            examples += len(batch)
            kv.report(examples, loss, epoch + shard.fraction_done)
            if push is not None:
                kv.wait(push)
            push = kv.push(keys, grad, clock=True)
    kv.finish()
    train_s = time.monotonic() - t0
    wait_all([roles.group.Ibarrier()], cfg.timeout,
             lambda: "the other workers to finish training")
    margins, labels, bad_test_lines = np.empty(0), np.empty(0, np.float32), 0
    if cfg.test:
        margins, labels, bad_test_lines = _score(cfg, roles, kv)
    kv.close()
    r = np.zeros((), _RESULT)
    r["examples"] = examples
    r["train_loss"] = loss
    r["train_s"] = train_s
    r["wait_s"] = kv.wait_s
    r["bytes_sent"] = kv.bytes_sent
    r["bad_lines"] = shard.bad_lines + bad_test_lines
    r["test_rows"] = margins.shape[0]
    return r, margins, labels


def _score(cfg: TrainConfig, roles: Roles, kv: KVWorker):
    """(margins, labels, bad lines skipped) of this worker's share of the test file under
    the final model."""
    shard = SvmlightShard(cfg.test, roles.index, len(roles.workers), skip_bad=cfg.skip_bad_lines)
    margins, labels = [], []
    for batch in shard.minibatches(EVAL_BATCH):
        keys, cols, bias_col = batch.unique_keys(cfg.bias)
        weights = kv.wait(kv.pull(keys, read_only=True))
        margins.append(logreg.margins(batch, cols, bias_col, weights))
        labels.append(batch.labels)
    if not margins:
        return np.empty(0), np.empty(0, np.float32), shard.bad_lines
    return np.concatenate(margins), np.concatenate(labels), shard.bad_lines


def _gatherv(comm, local: np.ndarray, counts: np.ndarray, timeout: float, what: str):
    recv = None
    if comm.rank == 0:
        recv = np.empty(int(counts.sum()), local.dtype)
        req = comm.Igatherv(local, [recv, counts], root=0)
    else:
        req = comm.Igatherv(local, None, root=0)
    wait_all([req], timeout, lambda: what)
    return recv


def _summarize(cfg: TrainConfig, roles: Roles, result, started: float) -> dict | None:
    record, margins, labels = result
    comm = roles.comm
    size = comm.size
    records = np.empty(size, _RESULT) if comm.rank == 0 else None
    req = comm.Igather([record.reshape(1).view(np.uint8), MPI.BYTE],
                       [records.view(np.uint8), MPI.BYTE] if records is not None else None, root=0)
    wait_all([req], cfg.timeout, lambda: "every rank's results")
    counts = np.zeros(size, np.int64)
    if comm.rank == 0:
        counts[:] = records["test_rows"]
    margins = _gatherv(comm, margins, counts, cfg.timeout, "the test scores")
    labels = _gatherv(comm, labels, counts, cfg.timeout, "the test labels")
    if comm.rank != 0:
        return None
    servers, workers = records[:len(roles.servers)], records[len(roles.servers):]
    examples = int(workers["examples"].sum())
    train_s = float(workers["train_s"].max())
    keys = int(servers["keys"].sum())
    bytes_sent = int(records["bytes_sent"].sum())
    summary = {
        "mpips_version": __version__,
        "servers": len(roles.servers),
        "workers": len(roles.workers),
        "config": _config_dict(cfg),
        "consistency": cfg.consistency,
        "staleness": 0,
        "train_examples": examples,
        "train_logloss": float(workers["train_loss"].sum()) / max(examples, 1),
        "test_examples": int(counts.sum()),
        "test_logloss": float(mean_logloss(margins, labels)) if counts.sum() else None,
        "test_auc": float(roc_auc(margins, labels)) if counts.sum() else None,
        "examples_per_s": examples / train_s if train_s > 0 else None,
        "train_s": train_s,
        "wall_s": time.monotonic() - started,
        "compile_s": float(records["compile_s"].max()),
        "late_compiles": int(records["late_compiles"].sum()),
        "keys_stored": keys,
        "server_bytes": int(servers["table_bytes"].sum()),
        "server_bytes_per_key": float(servers["table_bytes"].sum()) / max(keys, 1),
        "bytes_sent": bytes_sent,
        "bytes_per_example": bytes_sent / max(examples, 1),
        "wait_s": [float(x) for x in workers["wait_s"]],
        "max_clock_gap": int(servers["max_gap"].max()),
        "pulls_held": int(servers["pulls_held"].sum()),
        "bad_lines": int(workers["bad_lines"].sum()),
        "model_dir": os.path.abspath(cfg.model_dir),
    }
    if summary["test_auc"] is not None and np.isnan(summary["test_auc"]):
        summary["test_auc"] = None
    os.makedirs(cfg.out, exist_ok=True)
    path = os.path.join(cfg.out, "summary.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    _print_summary(summary, path)
    return summary


def _config_dict(cfg: TrainConfig) -> dict:
    d = asdict(cfg)
    d["optimizer"] = asdict(cfg.optimizer)
    return d


def _print_summary(s: dict, path: str) -> None:
    test = (f"test logloss {s['test_logloss']:.4f}  AUC {s['test_auc']:.4f} "
            f"on {s['test_examples']:,} examples" if s["test_logloss"] is not None
            else "no --test file given")
    say(f"done: {s['train_examples']:,} training examples in {s['train_s']:.1f} s "
        f"({s['examples_per_s'] / 1e3:,.1f}k examples/s, {s['workers']} worker(s), "
        f"{s['servers']} server(s)); {test}")
    say(f"model: {s['keys_stored']:,} keys, {s['server_bytes_per_key']:.1f} bytes/key on the "
        f"servers, in {s['model_dir']}; {s['bytes_per_example']:,.0f} bytes sent per example")
    if s["bad_lines"]:
        say(f"skipped {s['bad_lines']:,} bad input line(s) (--skip-bad-lines)")
    say(f"summary: {path}")
