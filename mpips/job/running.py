"""A training job on every rank once its checks have passed (job.training): numba kernels
are compiled once per node, while the last rank (a worker) samples the data to choose the
minibatch size and learning rate and every other rank imports the module of its own part.
Then the roles and the key placement are made, each rank plays its part, and `ending.finish`
gathers every rank's figures.
"""
import importlib
import json
import logging
import time
from dataclasses import replace

from ..base.errors import MpipsError
from ..base.log import setup
from ..data.inputs import is_parquet
from ..data.samples import sample_rows
from ..kernels import jit
from ..models import defaults
from ..ranks.collectives import broadcast_text
from ..ranks.roles import Roles, split
from ..ranks.ulfm import end_together
from ..ranks.ulfm_launch import Verdict
from ..run import testevents
from ..run.config import TrainConfig
from ..run.startup import compile_per_node
from ..run.warmup import CompileWatch
from ..storage import checkpoint, rundir
from ..wire.placement import Placement, dealt
from .ending import finish, summary_lost
from .part_result import PartResult

# A server's, a worker's and a full-batch solver's modules are imported by the ranks that
# run them (see _part): every rank would pay for all three before its first minibatch.

log = logging.getLogger("mpips")


def _average_after(cfg: TrainConfig) -> float | None:
    """Epochs before SGD averages: defaults.AVERAGE_AFTER unless given; None: never."""
    after = defaults.AVERAGE_AFTER if cfg.solver.average_after is None else cfg.solver.average_after
    return None if after < 0 else after


def run(cfg: TrainConfig, comm, name: str, resume, started: float, bound: float,
        verdict: Verdict, locks: rundir.RunLocks):
    """The job on this rank, its checks passed and its directories claimed (job.training).
    Returns the summary on rank 0, None elsewhere."""
    cfg, chosen, compile_s = _agree_on_choices(cfg, comm, resume, bound)
    # Collective: nobody writes before the old run is gone.
    roles = split(cfg.server_ranks, comm, bound)
    # The one key placement every part uses: the key ranges dealt to the servers, none to
    # the spares.
    placement = Placement(len(roles.servers), cfg.faults.replicas, roles.nodes[:len(roles.servers)],
                          assign=dealt(cfg.layout.servers, cfg.layout.vnodes))
    setup(f"rank {comm.rank} ({roles.name})")
    testevents.arm(cfg.diagnostics.test_events, comm.rank, roles.is_server, roles.pids_on_node(),
                   cfg.data.out,
                   cfg.faults.timeout, driver=cfg.solver.full_batch and roles.index == 0
                   and not roles.is_server, run_id=name, checkpoints=cfg.checkpoints)
    ulfm = verdict.on
    failover = ulfm and cfg.faults.replicas > 1
    # A pipeline's stages need each other: a dead worker cannot be stood in for.
    hot = ulfm and cfg.pipeline.stages == 1
    if comm.rank == 0:   # said once the log names the rank's role
        _say_how_it_runs(cfg, roles, name, resume, verdict, hot, chosen, compile_s)
    ended = False
    try:
        watch = CompileWatch()
        # The servers' deaths this rank saw (server 0's go in the summary).
        failures: list[dict] = []
        moves: list[dict] = []      # the lead's key range moves (mpips ctl), for the summary
        with watch.watching():
            part = _play_part(cfg, roles, name, resume, placement, failover, failures, locks,
                              hot, moves, ulfm)
        if watch.compiled:
            log.warning("numba compiled during the job, after warm-up: %s",
                        "; ".join(watch.compiled))
        part.record["compile_s"] = compile_s
        part.record["late_compiles"] = len(watch.compiled)
        # Collectives cannot span a dead rank: the survivors finish on their own.
        finishing = roles.survived() if ulfm else roles
        if finishing is not roles:
            _say_who_died_late(roles, finishing, failures)
        together = False   # every rank raised the job's error together, having waited
        try:
            result = finish(cfg, finishing, name, part, started, failures, moves)
            testevents.unfired()
            ended = True
            return result
        except MpipsError as e:
            together = e.raised_together
            raise
        finally:
            if ulfm and not together:   # see end_together
                dead = end_together(finishing.comm, cfg.faults.timeout)
                if dead:   # (communicators that span a dead rank are not freed: see below)
                    lost = summary_lost(cfg, finishing.comm, name, dead) if ended else None
                    ended = False
                    if lost:
                        raise lost
            if finishing is not roles and ended:
                finishing.comm.Free()
    finally:
        # A rank failing under ULFM leaves without freeing its communicators: freeing one
        # that spans a dead rank is not bounded, and the process ends next anyway.
        if ended or not ulfm:
            roles.free()


def _agree_on_choices(cfg: TrainConfig, comm, resume, bound: float) -> tuple:
    """(the TrainConfig with what was not given chosen, the choices and what was said of
    them, seconds compiling kernels). One worker, the last rank, samples the data (not every
    rank) to choose what was not given, and to check what was; all use its choice. A worker:
    it reads the data anyway, and has less to load than server 0, which gets ready
    meanwhile. Each rank loads its role's kernels only (a worker's parse the sample)."""
    sampler = comm.size - 1
    role = "server" if comm.rank < cfg.server_ranks else "worker"
    compile_s = compile_per_node(comm, bound, role, model=cfg.model.spec(),
                                 optimizer=cfg.optimizer.name,
                                 full_batch=cfg.solver.full_batch,
                                 push_filter=cfg.push.filtered,
                                 parquet=any(is_parquet(p) for p in (cfg.data.train,
                                                                     cfg.data.test) if p))
    chosen, workers = None, comm.size - cfg.server_ranks
    if comm.rank == sampler:   # with --stages, a pipeline reads as one worker does
        chosen = json.dumps(_choose(cfg, workers // cfg.pipeline.stages, resume))
    # The other ranks import their part's modules while the sampler samples.
    importlib.import_module(_part(cfg, role), __package__)
    chosen = json.loads(broadcast_text(comm, chosen, bound, root=sampler))
    if not cfg.solver.full_batch:
        cfg = replace(cfg, solver=replace(cfg.solver, batch_size=chosen["batch_size"]),
                      optimizer=replace(cfg.optimizer, lr=chosen["lr"], beta=chosen["beta"],
                                        eps=chosen["eps"], average_from=chosen["average_from"]))
    return cfg, chosen, compile_s


def _say_how_it_runs(cfg: TrainConfig, roles: Roles, name: str, resume, verdict: Verdict,
                     hot: bool, chosen: dict, compile_s: float) -> None:
    """Rank 0's lines on the job at its start: fault tolerance, the layout, what a resumed
    run has left, the choices made for it, the kernels."""
    log.info("%s", verdict.sentence)
    if verdict.on and not hot:
        log.warning("--stages %d: a dead worker stops the job (exit 75, to resume from the "
                    "last checkpoint); dead servers are still stood in for", cfg.pipeline.stages)
    log.info("run %s: %d server(s)%s, %d worker(s), writing to %s", name, cfg.layout.servers,
             f" and {cfg.faults.spares} spare(s) (server(s) "
             f"{cfg.layout.servers}-{cfg.server_ranks - 1})" if cfg.faults.spares else "",
             len(roles.workers), cfg.data.out)
    if resume:
        if not cfg.solver.full_batch:
            _say_what_is_left(cfg, resume)
        steps = f"{cfg.solver.step}s"
        every = (f"every {cfg.checkpointing.every} {steps}" if cfg.checkpointing.every else
                 f"every {cfg.checkpointing.seconds:g} s" if cfg.checkpointing.seconds else
                 "only when asked to stop")
        log.info("checkpoints %s, keeping the newest %d (as the run resumed, unless given "
                 "again)", every, cfg.checkpointing.keep)
    for line in chosen["notes"]:
        log.info("%s", line)
    for line in chosen["warnings"]:
        log.warning("%s", line)
    if jit.AHEAD:
        log.info("kernels ready in %.1f s (compiled ahead by make kernels)", compile_s)
    else:
        log.info("numba kernels ready in %.1f s (compiled on the first run on a machine, "
                 "~20 s; `make kernels` compiles them ahead: %s)", compile_s, jit.WHY_NOT)


def _play_part(cfg: TrainConfig, roles: Roles, name: str, resume, placement: Placement,
               failover: bool, failures: list, locks: rundir.RunLocks, hot: bool,
               moves: list, ulfm: bool) -> PartResult:
    """This rank's part of the job: a server's, a full-batch solver's or a worker's."""
    if roles.is_server:
        from .server_part import serve_job
        return serve_job(cfg, roles, name, resume, placement, failover, failures, locks,
                         hot=hot, moves=moves, ulfm=ulfm)
    if cfg.solver.full_batch:
        from .fullbatch_part import solve
        return solve(cfg, roles, name, resume, placement, failover)
    from .worker_part import work
    return work(cfg, roles, resume, placement, failover, hot=hot)


def _part(cfg: TrainConfig, role: str) -> str:
    """The module of this rank's part of the job: a server's, a full-batch solver's (a
    worker's under --solver lbfgs) or a worker's."""
    return (".server_part" if role == "server" else
            ".fullbatch_part" if cfg.solver.full_batch else ".worker_part")


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
    epochs = [p.epoch for p in checkpoint.positions(resume).values()]
    if min(epochs) < cfg.solver.epochs:
        return
    beyond = max(epochs) > cfg.solver.epochs
    log.warning("the checkpoint at clock %d (%s) has %s --epochs %d (its workers are at epoch "
                "%d): nothing is left to train; its model is saved%s. Pass a larger --epochs "
                "to train on", manifest["clock"], directory,
                "gone beyond" if beyond else "finished", cfg.solver.epochs, max(epochs),
                " and scored" if cfg.data.test else "")


def _choose(cfg: TrainConfig, workers: int, resume) -> dict:
    """The sampler (the last rank, a worker): what was not given, from a sample of the data
    (see defaults.choose)."""
    if cfg.solver.full_batch:
        return {"notes": [], "warnings": []}
    sample = sample_rows(cfg.data.train, workers)
    return defaults.choose(
        sample.rows, sample.per_part, sample.exact, workers=workers, bias=cfg.model.bias,
        optimizer=cfg.optimizer.name, lr=cfg.optimizer.lr, batch=cfg.solver.batch_size,
        beta=cfg.optimizer.beta, average_after=_average_after(cfg),
        resumed_batch=resume.manifest["config"]["batch_size"] if resume else None,
        resumed=resume.manifest["config"]["optimizer"] if resume else None,
        epochs=cfg.solver.epochs)
