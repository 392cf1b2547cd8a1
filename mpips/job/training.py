"""A training job on every rank, from the checks all ranks agree on to the summary that
rank 0 writes.

`train`: the run id, the configuration checked (every rank stops with the same message),
the checkpoint to resume from, whether hot failover can work, and the run's directories
locked and cleared. Then (`running`, imported once the checks have passed) numba kernels
are compiled once per node, while the last rank (a worker) samples the data to choose the
minibatch size and learning rate and every other rank imports the module of its own part.
Then the roles and the key placement are made. Each rank plays one part: a server's
(`server_part`), a worker's (`worker_part`, which runs `stage_part` under --stages) or,
under --solver lbfgs, a full-batch worker's (`fullbatch_part`). A worker's minibatch is:
rows of its part of the data -> sorted unique keys -> pull -> the model's gradient
(logistic regression, a factorization machine or Wide & Deep: models/catalog) -> push,
which also completes the worker's clock. After training, the test rows are scored
(`scoring`). `ending.finish` gathers every rank's figures, and rank 0 writes summary.json
and timeline.h5. A job stopped with a checkpoint raises JobStopped (exit 75) on every rank.
"""
import json
import logging
import os
import secrets
import time
from dataclasses import replace

from mpi4py import MPI

from ..base.errors import ConfigError
from ..base.processes import Process
from ..ranks.collectives import agree, broadcast_text, gather_text
from ..ranks.ulfm_launch import hot_failover
from ..run.config import TrainConfig
from ..run.config_checks import check, check_resumable
from ..storage import rundir

# What a launch refused by its checks never uses is imported once they pass (numba's kernels
# above all: a quarter of a second of every rank): the job itself (job.running), reading
# rows, checkpoints.

log = logging.getLogger("mpips")


def run_id(comm: MPI.Intracomm, timeout: float) -> str:
    """A name for this run, the same on every rank: start time and a random suffix."""
    text = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}" if comm.rank == 0 else None
    return broadcast_text(comm, text, timeout)


def train(cfg: TrainConfig, comm: MPI.Intracomm = MPI.COMM_WORLD) -> dict | None:
    """Collective over `comm`. Returns the summary on rank 0, None elsewhere."""
    started = time.monotonic()
    # Every rank waits this long at most before training, even before the configuration is
    # checked.
    bound = cfg.faults.startup_timeout
    name = run_id(comm, bound)
    cfg = replace(cfg, data=replace(cfg.data, out=cfg.data.out or os.path.join("runs", name)))
    agree(comm, lambda: check(cfg, comm.size), bound)
    cfg = cfg.with_data_fields()
    if comm.rank == 0 and cfg.model.name == "widedeep":
        log.info("Wide & Deep's network reads %s",
                 f"the {cfg.model.fields} fields' embeddings concatenated" if cfg.model.fields
                 else "the sum of a row's embeddings (--fields F "
                 "concatenates F fields' instead: a feature's field is given in libffm text, "
                 "known in Criteo's and Avazu's)")
    # One rank reads up to the first example (the sampler, a worker: it parses text anyway).
    def find_an_example() -> None:
        if comm.rank == comm.size - 1:
            from ..data.shards import check_examples
            check_examples(cfg.data.train, "--train", cfg.data.skip_bad_lines)

    agree(comm, find_an_example, bound, "the last rank to find an example in --train")
    resume = _find_checkpoint(cfg, comm, bound) if cfg.checkpointing.resume else None
    if resume:
        agree(comm, lambda: check_resumable(cfg, resume.manifest, comm.size - cfg.server_ranks,
                                            compare_data=comm.rank == 0), bound)
        name = resume.manifest["run_id"]   # a resumed run goes on under its own name
    cfg = cfg.with_checkpointing(resume.manifest["config"] if resume else None)
    # Collective: whether hot failover can work (the lock names every server if it can).
    verdict = hot_failover(comm, bound)
    locks = _claim_directories(cfg, comm, name, resume, bound,
                               verdict.on and cfg.faults.replicas > 1)
    try:
        from .running import run
        return run(cfg, comm, name, resume, started, bound, verdict, locks)
    finally:
        locks.stop()


def _claim_directories(cfg: TrainConfig, comm, name: str, resume, timeout: float,
                       outlives_lead: bool) -> rundir.RunLocks:
    """Rank 0 locks --out (and --checkpoint-dir, if checkpoints go elsewhere), makes sure
    nothing of another run is there, and removes what this run replaces: only files mpips
    wrote. Agreed by every rank. Returns the locks, held on rank 0; when the job
    `outlives_lead` (hot failover), they name every server, and a server that comes to lead
    takes them over."""
    out = cfg.data.out
    assert out is not None, "train() gives --out its default before this"
    job = _servers(comm, cfg.server_ranks, timeout) if outlives_lead else ()
    directories = [(out, "--out")]
    inside = os.path.realpath(cfg.checkpoints).startswith(os.path.realpath(out) + os.sep)
    if (cfg.checkpointing.on or resume) and not inside:
        directories.append((cfg.checkpoints, "--checkpoint-dir"))
    locks = rundir.RunLocks([rundir.DirectoryLock(directory, name, flag, job)
                             for directory, flag in directories])

    def claim():
        if comm.rank != 0:
            return
        locks.acquire()
        rundir.check_outputs(out, cfg.checkpoints, cfg.data.overwrite,
                             resume.manifest["run_id"] if resume else None)
        try:
            foreign = [os.path.join(out, p) for p in rundir.remove_run_outputs(out)]
            if cfg.data.overwrite and not resume:   # the checkpoints of the run replaced go too
                foreign += [os.path.join(cfg.checkpoints, p)
                            for p in rundir.remove_checkpoints(cfg.checkpoints)]
        except OSError as e:
            raise ConfigError(
                f"cannot remove the earlier run's {e.filename}: {e.strerror}") from None
        if foreign:
            log.warning("left in place, not written by mpips: %s", ", ".join(foreign))

    try:
        agree(comm, claim, timeout)
    except ConfigError:
        locks.stop()
        raise
    return locks


def _servers(comm, n_servers: int, timeout: float) -> tuple:
    """Collective: the processes of the first `n_servers` ranks (Process), on every
    rank."""
    me = json.dumps(Process.this()._asdict())
    every = gather_text(comm, me, timeout, "every rank to say where it runs")
    return tuple(Process(**json.loads(text)) for text in every[:n_servers])


def _find_checkpoint(cfg: TrainConfig, comm, timeout: float):
    """(directory, manifest) of the newest valid checkpoint in --resume, the same on every
    rank: rank 0 verifies the checksums (and says which newer ones it passed over)."""
    from ..storage import checkpoint
    assert cfg.checkpointing.resume is not None, "called under --resume only"
    found = checkpoint.latest_valid(cfg.checkpointing.resume) if comm.rank == 0 else None
    directory = broadcast_text(comm, found[0] if found else "", timeout)
    if not directory:
        error = ConfigError(f"--resume {cfg.checkpointing.resume}: no complete, undamaged "
                            f"checkpoint in it")
        error.reported = comm.rank == 0
        raise error
    return checkpoint.Resume(directory, checkpoint.read_manifest(directory))
