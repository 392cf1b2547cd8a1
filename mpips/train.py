"""A training job: servers serve, workers train on their shard, rank 0 writes the summary.

One minibatch on a worker: rows from its share of the data -> sorted unique keys
-> pull -> logistic-regression gradient (numba) -> push, which also completes the
worker's clock. After the last epoch every worker scores its share of the test
file with the final model, and rank 0 gathers the scores. With --resume, servers
first load the checkpoint's keys they own and workers start where it says.
"""
import json
import logging
import math
import os
import time
import traceback
from dataclasses import replace

import numpy as np
from mpi4py import MPI

from . import checkpoint, defaults, fingerprint, logreg, rundir, signals, summary
from .bounded import wait_all
from .client import KVWorker, tell_servers_to_save
from .clocks import FINISHED, ClockTable
from .config import TrainConfig, check_resumable
from .data import KeyIndexer, SvmlightShard
from .errors import (ConfigError, Diverged, InputError, Interrupted, MpipsError, SaveError,
                     Stopped)
from .failover import CannotFailOver, is_failure, what_died
from .faulttolerance import announce
from .log import say, setup
from .files import keep_trying, write_hdf5
from .model_io import save_shard
from .placement import Placement
from .replicas import PrimaryKeys
from .progress import Progress
from .roles import Roles, split
from .checkpointing import Checkpoints
from .server import Hooks, Server
from .shards import open_shard, sample_rows
from .startup import agree, broadcast_text, compile_per_node, run_id
from .store import KVStore
from .warmup import CompileWatch

log = logging.getLogger("mpips")

EVAL_BATCH = 10000


class JobStopped(MpipsError):
    """Raised on every rank after a job stopped early with a checkpoint: exit status 75."""


def train(cfg: TrainConfig, comm: MPI.Intracomm = MPI.COMM_WORLD) -> dict | None:
    """Collective over `comm`. Returns the summary on rank 0, None elsewhere."""
    started = time.monotonic()
    # Every rank waits this long at most, even before the configuration is checked.
    bound = cfg.timeout if 0 < cfg.timeout < float("inf") else TrainConfig.timeout
    name = run_id(comm, bound)
    cfg = replace(cfg, out=cfg.out or os.path.join("runs", name))
    agree(comm, lambda: cfg.check(comm.size), bound)
    resume = _find_checkpoint(cfg, comm, bound) if cfg.resume else None
    if resume:
        agree(comm, lambda: check_resumable(cfg, resume[1], comm.size - cfg.servers,
                                            compare_data=comm.rank == 0), bound)
        name = resume[1]["run_id"]   # a resumed run goes on under its own name
    cfg = cfg.with_checkpointing(resume[1]["config"] if resume else None)
    locks = _claim_directories(cfg, comm, name, resume, bound)
    try:
        return _run(cfg, comm, name, resume, started, bound)
    finally:
        if locks:
            locks.stop()


def _claim_directories(cfg: TrainConfig, comm, name: str, resume, timeout: float):
    """Rank 0 locks --out (and --checkpoint-dir, if checkpoints go elsewhere), makes sure
    nothing of another run is there, and removes what this run replaces: only files mpips
    wrote. Agreed by every rank. Returns the locks' heartbeat on rank 0."""
    held = []

    def claim():
        if comm.rank != 0:
            return
        directories = [(cfg.out, "--out")]
        inside = os.path.realpath(cfg.checkpoints).startswith(os.path.realpath(cfg.out) + os.sep)
        if (cfg.checkpoints_on or resume) and not inside:
            directories.append((cfg.checkpoints, "--checkpoint-dir"))
        for directory, flag in directories:
            lock = rundir.DirectoryLock(directory, name, flag)
            lock.acquire()
            held.append(lock)
        rundir.check_outputs(cfg.out, cfg.checkpoints, cfg.overwrite,
                             resume[1]["run_id"] if resume else None)
        try:
            foreign = [os.path.join(cfg.out, p) for p in rundir.remove_run_outputs(cfg.out)]
            if cfg.overwrite and not resume:   # the checkpoints of the run replaced go too
                foreign += [os.path.join(cfg.checkpoints, p)
                            for p in rundir.remove_checkpoints(cfg.checkpoints)]
        except OSError as e:
            raise ConfigError(f"cannot remove the earlier run's {e.filename}: {e.strerror}")
        if foreign:
            log.warning("left in place, not written by mpips: %s", ", ".join(foreign))

    try:
        agree(comm, claim, timeout)
    except ConfigError:
        for lock in held:
            lock.release()
        raise
    return rundir.Heartbeat(held) if held else None


def _run(cfg: TrainConfig, comm, name: str, resume, started: float, bound: float):
    # Rank 0 samples the data (not every rank) to choose what was not given, and to check
    # what was; all use its choice.
    chosen, workers = None, comm.size - cfg.servers
    if comm.rank == 0:
        sample = sample_rows(cfg.train, workers)
        chosen = json.dumps(defaults.choose(
            sample.rows, sample.per_part, sample.exact, workers=workers, bias=cfg.bias,
            optimizer=cfg.optimizer.name, lr=cfg.optimizer.lr, batch=cfg.batch_size,
            beta=cfg.optimizer.beta,
            resumed_batch=resume[1]["config"]["batch_size"] if resume else None))
    chosen = json.loads(broadcast_text(comm, chosen, bound))
    cfg = replace(cfg, batch_size=chosen["batch_size"],
                  optimizer=replace(cfg.optimizer, lr=chosen["lr"], beta=chosen["beta"],
                                    eps=chosen["eps"]))
    roles = split(cfg.servers, comm)   # collective: nobody writes before the old run is gone
    # The one key placement every part uses.
    placement = Placement(len(roles.servers), cfg.replicas, roles.nodes[:len(roles.servers)])
    setup(f"rank {comm.rank} ({roles.name})")
    # Collective: rank 0 says whether hot failover can work, and why.
    failover = announce(comm, bound).on and cfg.replicas > 1
    if comm.rank == 0:
        log.info("run %s: %d server(s), %d worker(s), writing to %s", name, len(roles.servers),
                 len(roles.workers), cfg.out)
        if resume:
            _say_what_is_left(cfg, resume)
            every = (f"every {cfg.checkpoint_every} clocks" if cfg.checkpoint_every else
                     f"every {cfg.checkpoint_seconds:g} s" if cfg.checkpoint_seconds else
                     "only when asked to stop")
            log.info("checkpoints %s, keeping the newest %d (as the run resumed, unless given "
                     "again)", every, cfg.keep_checkpoints)
        for line in chosen["notes"]:
            log.info("%s", line)
        for line in chosen["warnings"]:
            log.warning("%s", line)
        log.info("loading the numba kernels (compiled on the first run on a machine, ~20 s)")
    try:
        compile_s = compile_per_node(roles.comm, cfg.timeout)
        if comm.rank == 0:
            log.info("kernels ready in %.1f s", compile_s)
        watch = CompileWatch()
        failures = []   # the servers' deaths this rank saw (server 0's go in the summary)
        with watch.watching():
            if roles.is_server:
                record, margins, labels, held = _serve(cfg, roles, name, resume, placement,
                                                       failover, failures)
            else:
                record, margins, labels, held = _work(cfg, roles, resume, placement, failover)
        if watch.compiled:
            log.warning("numba compiled during the job, after warm-up: %s", "; ".join(watch.compiled))
        record["compile_s"] = compile_s
        record["late_compiles"] = len(watch.compiled)
        # Collectives cannot span a dead rank: the survivors finish on their own.
        finishing = roles.survived() if failover else roles
        if finishing is not roles:
            _say_who_died_late(roles, finishing, failures)
        try:
            return _finish(cfg, finishing, name, record, margins, labels, held, started,
                           failures)
        finally:
            if finishing is not roles:
                finishing.comm.Free()
    finally:
        roles.free()


def _say_who_died_late(roles: Roles, survivors: Roles, failures: list) -> None:
    """Ranks found dead only as the job finished (after their part was done): in the
    summary's failures, and said, since the summary lacks their figures."""
    living = set(survivors.comm.Get_group().Translate_ranks(
        list(range(survivors.comm.size)), roles.comm.Get_group()))
    known = {f["rank"] for f in failures}
    for rank in sorted(set(range(roles.comm.size)) - living - known):
        role = (f"server {rank}" if rank < len(roles.servers)
                else f"worker {roles.worker_index(rank)}")
        failures.append({"rank": rank, "role": role, "learned_at": time.time(),
                         "when": "as the job finished"})
        if survivors.comm.rank == 0:
            log.warning("%s (rank %d) died as the job finished: the summary lacks its figures "
                        "(a worker's: its test rows are not scored)", role, rank)


def _say_what_is_left(cfg: TrainConfig, resume) -> None:
    """When a checkpoint has no training left under --epochs, say so (the model is saved and
    scored all the same)."""
    directory, manifest = resume
    epochs = [p["epoch"] for p in manifest["positions"].values()]
    if min(epochs) < cfg.epochs:
        return
    beyond = max(epochs) > cfg.epochs
    log.warning("the checkpoint at clock %d (%s) has %s --epochs %d (its workers are at epoch "
                "%d): nothing is left to train; its model is saved%s. Pass a larger --epochs "
                "to train on", manifest["clock"], directory,
                "gone beyond" if beyond else "finished", cfg.epochs, max(epochs),
                " and scored" if cfg.test else "")


def _find_checkpoint(cfg: TrainConfig, comm, timeout: float):
    """(directory, manifest) of the newest valid checkpoint in --resume, the same on every
    rank: rank 0 verifies the checksums (and says which newer ones it passed over)."""
    found = checkpoint.latest_valid(cfg.resume) if comm.rank == 0 else None
    directory = broadcast_text(comm, found[0] if found else "", timeout)
    if not directory:
        error = ConfigError(f"--resume {cfg.resume}: no complete, undamaged checkpoint in it")
        error.reported = comm.rank == 0
        raise error
    return directory, checkpoint.read_manifest(directory)


def _ready(roles: Roles, timeout: float, prepare) -> float:
    """Every rank prepares (opens its data, loads its part of a checkpoint); if any fails,
    all stop together with its message instead of waiting for it. Returns the start time."""
    agree(roles.comm, prepare, timeout, "every rank to be ready to train")
    return time.monotonic()


def _log_failure(e: Exception) -> str:
    """Log why this rank fails (with a traceback if it is a bug); return a one-line reason."""
    if is_failure(e):   # another rank died (under ULFM): the command line says which
        return what_died(MPI.COMM_WORLD, e)
    text = str(e) if isinstance(e, MpipsError) else f"{type(e).__name__}: {e}"
    log.error("%s", text if isinstance(e, MpipsError) else traceback.format_exc())
    e.reported = True   # the command line does not log it again
    return text


def _positions(resume) -> dict:
    """Worker -> where it stood in the checkpoint (clock, epoch, offset, examples, loss)."""
    return {int(w): p for w, p in resume[1]["positions"].items()} if resume else {}


def _checkpoint_writers(cfg: TrainConfig, roles: Roles, name: str,
                        own: PrimaryKeys) -> dict:
    """The server's hooks that write a checkpoint: its shard, and (server 0) the manifest."""
    root = cfg.checkpoints
    # What the workers read, as it was when this launch started: a resume compares it.
    inputs = {"train": fingerprint.of_input(cfg.train)}   # any server may come to lead

    def write_shard(clock: int) -> dict:
        start = time.monotonic()
        try:
            entry = checkpoint.write_shard(root, clock, roles.index, own, {"run_id": name},
                                           ranges=own.ranges())
        except SaveError as e:
            log.error("checkpoint at clock %d: %s", clock, e)
            return {"server": roles.index, "error": str(e)}
        log.info("wrote %d keys of checkpoint clock %d in %.2f s", entry["keys"], clock,
                 time.monotonic() - start)
        return entry

    def write_manifest(clock: int, shards: list, positions: dict) -> str | None:
        try:
            directory = checkpoint.write_manifest(
                root, clock, shards, run_id=name, config=cfg.as_dict(),
                servers=len(roles.servers), workers=len(roles.workers),
                consistency=cfg.consistency, inputs=inputs,
                placement=own.placement.describe(),
                positions={str(w): p for w, p in sorted(positions.items())},
                worker_random_state=None,   # workers draw no random numbers (file order)
                written=time.strftime("%Y-%m-%d %H:%M:%S"))
        except SaveError as e:
            return str(e)
        checkpoint.prune(root, cfg.keep_checkpoints, directory)
        say(f"checkpoint at clock {clock}: {directory}")
        return None

    return {"write_shard": write_shard, "write_manifest": write_manifest}


def _serve(cfg: TrainConfig, roles: Roles, name: str, resume, placement: Placement,
           failover: bool, failures: list):
    store = KVStore(width=1, optimizer=cfg.optimizer)
    own = PrimaryKeys(store, placement, roles.index)   # what this server writes
    clocks = ClockTable(len(roles.workers), staleness=cfg.max_staleness)
    positions = _positions(resume)
    for worker, p in positions.items():
        clocks.done[worker] = p["clock"]

    def load() -> None:
        if not resume:
            return
        try:
            loaded = checkpoint.load_shards(resume[0], resume[1], store, placement,
                                            roles.index)
        except (OSError, KeyError, ValueError) as e:
            raise ConfigError(f"--resume: cannot read the checkpoint {resume[0]}: {e}") from None
        log.info("resumed from checkpoint clock %d (%s): loaded %d keys",
                 resume[1]["clock"], resume[0], loaded)
    # Every server keeps the figures; the lead says them.
    progress = Progress(len(roles.workers), cfg.epochs, cfg.log_every)
    attrs = {"run_id": name, "config": cfg.as_dict()}
    started = [time.monotonic()]
    taken = []

    def snapshot(final: bool) -> None:
        """The model as it is now, for learning curves (--snapshot-every); the last one
        when every worker has finished training."""
        taken.append(time.monotonic() - started[0])
        slowest = clocks.slowest()
        label = "final" if final else f"{len(taken) - 1:04d}"
        try:
            save_shard(os.path.join(cfg.out, "snapshots", label), roles.index,
                       len(roles.servers), own,
                       {**attrs, "complete": True, "elapsed_s": taken[-1],
                        "slowest_clock": -1 if slowest == FINISHED else slowest},
                       weights_only=True, ranges=own.ranges())
        except SaveError as e:
            log.warning("snapshot %s not written: %s", label, e)

    reasons = []

    def save_partial(reason: str) -> None:
        """After an error: one attempt (other ranks wait for this one's word)."""
        reasons.append(reason)   # the first reason stays first: later ones are often echoes
        try:
            path = save_shard(cfg.model_dir, roles.index, len(roles.servers), own,
                              {**attrs, "complete": False, "note": "; then ".join(reasons)},
                              ranges=own.ranges())
        except SaveError as e:
            log.error("could not save the %d keys trained so far: %s%s", len(own), e,
                      _checkpoints_hint(cfg))
            return
        log.error("saved the %d keys trained so far to %s", len(own), path)

    def another_rank_failed(reason: str) -> None:
        log.error("stopping: %s", reason)
        save_partial(reason)

    def placement_changed(changed: Placement) -> None:
        own.placement = changed

    hooks = Hooks(**_checkpoint_writers(cfg, roles, name, own),
                  placement_changed=placement_changed,
                  snapshot=snapshot if cfg.snapshot_every else None,
                  snapshot_every=cfg.snapshot_every or 0.0, failed=another_rank_failed,
                  stop_requested=signals.stop_requested)
    checkpoints = Checkpoints(cfg.checkpoint_every, cfg.checkpoint_seconds, roles.index == 0,
                              len(roles.servers), cfg.max_staleness == 0, positions)
    server = Server(roles, store, clocks, cfg.timeout, hooks=hooks, progress=progress,
                    record_pulls=cfg.record_pulls, checkpoints=checkpoints, placement=placement,
                    failover=failover)
    t0 = started[0] = _ready(roles, cfg.timeout, load)
    if progress:
        progress.start(positions)
    try:
        stats = server.run()
    except Exception as e:
        reason = f"server {roles.index}: {_log_failure(e)}"
        save_partial(reason)
        others = [r for i, r in enumerate(roles.servers)
                  if r != roles.comm.rank and i not in server.placement.dead]
        # A death nobody takes over: every server learns of it and saves by itself.
        if others and not isinstance(e, (Interrupted, CannotFailOver)):
            try:
                tell_servers_to_save(roles.comm, others, reason, cfg.timeout)
            except (MpipsError, MPI.Exception) as again:
                log.error("the other servers did not confirm saving their shards: %s", again)
        raise
    failures += server.failures
    train_s = time.monotonic() - t0
    if server.stopped and not clocks.all_finished:
        saved = {**attrs, "complete": False,
                 "note": f"stopped at clock {server.stop_at}; continue with --resume "
                         f"{cfg.checkpoints}"}
    else:
        saved = {**attrs, "complete": True}
    try:
        keep_trying(lambda: save_shard(cfg.model_dir, roles.index, len(roles.servers), own,
                                       saved, ranges=own.ranges()),
                    cfg.disk_wait, "the trained model")
    except SaveError as e:
        raise SaveError(f"the model of server {roles.index} ({len(own):,} keys) could not be "
                        f"saved: {e}{_checkpoints_hint(cfg)}") from None
    if cfg.record_pulls:
        pulls = server.pull_records()
        try:
            write_hdf5(os.path.join(cfg.out, "pulls", f"server-{roles.index:04d}.h5"),
                       {field: pulls[field] for field in pulls.dtype.names},
                       {"run_id": name, "consistency": cfg.consistency,
                        "staleness": -1 if cfg.max_staleness is None else cfg.max_staleness})
        except SaveError as e:
            log.warning("the record of pulls (--record-pulls) was not written: %s", e)
    r = summary.new_record()
    r["train_s"] = train_s
    r["bytes_sent"] = stats.bytes_sent
    r["keys"] = len(own)
    r["copies"] = len(store)   # with backups' keys
    r["table_bytes"] = store.nbytes
    r["pulls_held"] = stats.pulls_held
    r["max_gap"] = clocks.max_gap
    r["busy_s"] = stats.busy_s
    r["train_bytes"] = stats.train_bytes_sent
    r["stopped_at"] = server.stop_at if server.stopped else -1   # a server: its checkpoint
    r["stop_saved"] = server.stop_at in server.completed   # known to server 0 only
    return r, np.empty(0), np.empty(0, np.float32), server.held_s


def _checkpoints_hint(cfg: TrainConfig) -> str:
    """Where the model is kept as of an earlier clock, if anywhere."""
    found = [d for d in checkpoint.all_checkpoints(cfg.checkpoints)
             if os.path.exists(os.path.join(d, checkpoint.MANIFEST))]
    return (f"; the newest checkpoint, {found[0]}, holds it as of its clock" if found else
            "; there is no checkpoint of it")


def _work(cfg: TrainConfig, roles: Roles, resume, placement: Placement, failover: bool):
    kv = KVWorker(roles, width=1, timeout=cfg.timeout, placement=placement, failover=failover)
    try:
        return _train_and_score(cfg, roles, kv, _positions(resume).get(roles.index))
    except Exception as e:
        if isinstance(e, ConfigError):
            raise   # every rank stops with it, before training
        reason = f"worker {roles.index}: {_log_failure(e)}"
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

    t0 = mark = _ready(roles, cfg.timeout, open_data)
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


def _finish(cfg, roles, name, record, margins, labels, held, started,
            failures: list) -> dict | None:
    """Gather every rank's figures and the test scores; rank 0 writes the summary."""
    comm = roles.comm
    records = summary.allgather(comm, record, cfg.timeout)
    held = summary.max_over_ranks(comm, held, cfg.timeout, "the servers' hold times")
    counts = records["test_rows"]
    margins = summary.gather_to_root(comm, margins, counts, cfg.timeout, "the test scores")
    labels = summary.gather_to_root(comm, labels, counts, cfg.timeout, "the test labels")
    # The job stopped if any worker was stopped (one that had finished its data was not).
    stopped = bool((records["stopped_at"][len(roles.servers):] >= 0).any())
    stopped_at = int(records["stopped_at"][:len(roles.servers)].max()) if stopped else -1
    result = None
    if comm.rank == 0:
        result = summary.build(
            records, len(roles.servers), margins, labels, held, run_id=name,
            config=cfg.as_dict(), consistency=cfg.consistency, staleness=cfg.max_staleness,
            status="stopped" if stopped else "complete",
            stopped_at_clock=stopped_at if stopped else None,
            checkpoints=os.path.abspath(cfg.checkpoints), wall_s=time.monotonic() - started,
            model_dir=os.path.abspath(cfg.model_dir), failures=failures)
        summary.print_lines(result, summary.write(cfg.out, result))
    if stopped:   # every rank sees the same records, so all end alike
        error = JobStopped(f"stopped at clock {stopped_at} after writing a checkpoint; continue "
                           f"with --resume {cfg.checkpoints}")
        error.reported = comm.rank != 0
        raise error
    examples = int(records["examples"].sum())
    if examples == 0:
        error = ConfigError(f"--train {cfg.train}: no training examples "
                            f"({int(records['bad_lines'].sum())} bad line(s) skipped)")
        error.reported = comm.rank == 0
        raise error
    return result
