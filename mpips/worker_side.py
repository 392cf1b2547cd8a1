"""The worker side of a training job: minibatches of this worker's part of the data, pulled
weights, gradients pushed (a clock each), a stop or a divergence said in time, then its part
of the test file scored with the final model.
"""
import logging
import math
import time

import numpy as np
from mpi4py import MPI

from . import checkpoint, logreg, signals, summary
from .bounded import wait_all
from .client import KVWorker, tell_servers_to_save
from .config import TrainConfig
from .data import KeyIndexer, SvmlightShard
from .errors import ConfigError, Diverged, InputError, Interrupted, MpipsError, Stopped
from .failover import CannotFailOver
from .log import log_failure
from .placement import Placement
from .roles import Roles
from .shards import open_shard
from .startup import ready

log = logging.getLogger("mpips")

EVAL_BATCH = 10000


def work(cfg: TrainConfig, roles: Roles, resume, placement: Placement, failover: bool):
    kv = KVWorker(roles, width=1, timeout=cfg.timeout, placement=placement, failover=failover)
    try:
        return _train_and_score(cfg, roles, kv, checkpoint.positions(resume).get(roles.index))
    except Exception as e:
        if isinstance(e, ConfigError):
            raise   # every rank stops with it, before training
        reason = f"worker {roles.index}: {log_failure(e)}"
        if not isinstance(e, (Interrupted, CannotFailOver)):
            living = [r for i, r in enumerate(roles.servers) if i not in kv.placement.dead]
            try:
                tell_servers_to_save(roles.comm, living, reason, cfg.timeout)
            except (MpipsError, MPI.Exception) as again:
                log.error("could not reach the servers to save the model: %s", again)
        raise


def _train_and_score(cfg: TrainConfig, roles: Roles, kv: KVWorker, position: dict | None):
    n_workers = len(roles.workers)
    slowdown = cfg.slowdown(roles.index)
    examples, loss, push, stopped = 0, 0.0, None, False
    epoch, offset = 0, -1
    if position:
        kv.clock, epoch, offset = position["clock"], position["epoch"], position["offset"]
        examples, loss = position["examples"], position["loss"]
    before = examples
    opened = []

    def open_data() -> None:
        try:
            shard = open_shard(cfg.train, roles.index, n_workers, skip_bad=cfg.skip_bad_lines)
        except OSError as e:
            raise InputError(f"--train {cfg.train}: {e.strerror or e}") from None
        opened.append((shard, *(_resume_point(shard, epoch, offset) if offset >= 0
                                else (epoch, offset))))

    t0 = mark = ready(roles.comm, cfg.timeout, open_data)
    shard, epoch, offset = opened[0]
    stream = _minibatches(cfg, shard, epoch, offset)
    current = next(stream, None)
    pull = kv.pull(current[1]) if current else None
    while current is not None:
        _pass_on_stop(kv)
        waited = kv.wait_s
        # Pipelining: the next minibatch's keys are found and its pull sent now, so the
        # servers work on it while this one computes (they answer once this push arrives).
        upcoming = next(stream, None)
        next_pull = kv.pull(upcoming[1], next_clock=True) if upcoming else None
        batch, keys, cols, bias_col, progress, _ = current
        try:
            weights = kv.wait(pull)
        except Stopped:
            stopped = True
            break
        grad, batch_loss = logreg.gradient(batch, cols, bias_col, weights)
        if not math.isfinite(batch_loss):
            raise Diverged(_diverged(cfg, kv.clock, current, shard, batch_loss))
        loss += batch_loss
        examples += len(batch)
        # Where the next minibatch starts, for checkpoints: the servers note it with the push.
        kv.report(examples, loss, progress, *((upcoming[5], upcoming[0].start) if upcoming
                                              else (cfg.epochs, -1)))
        if push is not None:
            kv.wait(push)
        push = kv.push(keys, grad, clock=True)
        if slowdown > 1:   # --straggler, a testing aid: take `slowdown` times as long
            busy = time.monotonic() - mark - (kv.wait_s - waited)
            time.sleep((slowdown - 1) * max(busy, 0.0))
            mark = time.monotonic()
        current, pull = upcoming, next_pull
    train_s = time.monotonic() - t0
    margins, labels, bad_test_lines = np.empty(0), np.empty(0, np.float32), 0
    if not stopped:
        kv.report(examples, loss, cfg.epochs, cfg.epochs, -1)
        kv.finish()
        train_bytes = kv.bytes_sent
        _wait_for_other_workers(roles, kv, cfg.timeout)
        if cfg.test:
            margins, labels, bad_test_lines = _score(cfg, roles, kv)
    else:
        train_bytes = kv.bytes_sent
        log.info("the job is stopping: a checkpoint holds the model at clock %d", kv.clock)
        _wait_for_other_workers(roles, kv, cfg.timeout)   # workers that finished wait here
    kv.close()
    r = summary.new_record()
    r["examples"] = examples
    r["examples_before"] = before
    r["train_loss"] = loss
    r["train_s"] = train_s
    r["wait_s"] = kv.wait_s
    r["bytes_sent"] = kv.bytes_sent
    r["train_bytes"] = train_bytes
    r["bad_lines"] = shard.bad_lines + bad_test_lines
    r["test_rows"] = margins.shape[0]
    r["stopped_at"] = kv.clock if stopped else -1   # a worker: where it was stopped
    return r, margins, labels, np.zeros(n_workers)


def _pass_on_stop(kv: KVWorker) -> None:
    """A stop asked of this worker (a signal to this rank alone) goes to server 0, once."""
    if signals.stop_requested() and not kv.stop_sent:
        kv.ask_to_stop()


def _resume_point(shard, epoch: int, offset: int) -> tuple[int, int]:
    """(epoch, offset) to go on from, given where a checkpoint says this worker stood: the
    same, unless the data changed since (--allow-changed-data) and the place is no longer the
    start of a row of this worker's part."""
    point = shard.next_row_at(offset)
    if point == offset:
        return epoch, offset
    if point is None:
        log.warning("%s: byte or row %d of the checkpoint is past this worker's part of the "
                    "changed data: going on with epoch %d", shard.path, offset, epoch + 1)
        return epoch + 1, -1
    log.warning("%s: the checkpoint's place %d is not a row start of this worker's part of "
                "the changed data: going on at %d", shard.path, offset, point)
    return epoch, point


def _diverged(cfg: TrainConfig, clock: int, current, shard, loss: float) -> str:
    batch, epoch = current[0], current[5]
    where = "byte" if isinstance(shard, SvmlightShard) else "row"
    kept = (f"; the checkpoints in {cfg.checkpoints} are kept" if cfg.checkpoints_on else "")
    return (f"the training loss became {loss} at clock {clock} (epoch {epoch}, the minibatch "
            f"at {where} {batch.start} of {shard.path}); nothing of it was pushed. The "
            f"learning rate ({cfg.optimizer.name} --lr {cfg.optimizer.lr:.4g}) may be too "
            f"large, or the data holds values that are not finite{kept}")


def _minibatches(cfg: TrainConfig, shard, first_epoch: int = 0, offset: int = -1):
    """(rows, keys, cols, bias_col, epochs done, epoch) for each minibatch from `first_epoch`
    on, the first epoch starting at `offset` (a byte or row; -1: its beginning)."""
    index = KeyIndexer()
    for epoch in range(first_epoch, cfg.epochs):
        start = offset if epoch == first_epoch and offset >= 0 else None
        for batch in shard.minibatches(cfg.batch_size, start):
            keys, cols, bias_col = index(batch, cfg.bias, shard.path)
            yield batch, keys, cols, bias_col, epoch + shard.fraction_done, epoch


def _wait_for_other_workers(roles: Roles, kv: KVWorker, timeout: float) -> None:
    """Wait until every worker has finished training, however long that takes, as long as
    the slowest keeps advancing: the bound is --timeout without progress."""
    latest = {}

    def progress():
        _pass_on_stop(kv)
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
