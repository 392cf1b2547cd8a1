"""A training job's end on every rank: every rank's figures gathered, the test scores, a
full-batch solver's steps, the timelines and a pipeline's tasks; rank 0 writes summary.json,
timeline.h5 and the live curves' last points; then the exit every rank ends with: a model
that lacks key ranges or rows refused, a stop for a checkpoint (JobStopped, 75), a model
trained but not wholly scored (NotScored).
"""
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import NoReturn

import numpy as np

from ..base import timeline
from ..base.errors import MpipsError, WaitTimeout
from ..models.lbfgs import Step
from ..pipeline.schedule import logged_bubbles, theoretical_bubble
from ..ranks.exits import NOT_SCORED
from ..ranks.ulfm import CannotFailOver, end_together, world_ranks
from ..run import summary, testevents
from ..run.config import TrainConfig
from ..storage.checkpoint import complete_checkpoints
from . import livecurves
from .chunks import covered
from .part_result import PartResult
from .server_files import drop_unfinished_snapshots

log = logging.getLogger("mpips")


class JobStopped(MpipsError):
    """Raised on every rank after a job stopped early with a checkpoint: exit status 75."""


class NotScored(MpipsError):
    """Raised on every rank after a job trained and saved its model but lost the scores of
    part of --test with a rank that died: exits.NOT_SCORED."""
    exit_status = NOT_SCORED


def _pipeline_figures(cfg, tasks: np.ndarray) -> dict:
    """What summary.json says of a pipelined run: its shape, and the bubble measured on the
    minibatches whose tasks were logged, beside the schedule's (S-1)/(M+S-1)."""
    bubbles = logged_bubbles(tasks["worker"], tasks["clock"], tasks["start"], tasks["end"],
                             cfg.pipeline.stages)
    return {"stages": cfg.pipeline.stages, "copies": None if not tasks.shape[0] else
            int(tasks["worker"].max()) // cfg.pipeline.stages + 1,
            "micro_batches": cfg.pipeline.micro_batches,
            "schedule": cfg.pipeline.schedule, "steps_logged": len(bubbles),
            "bubble_measured": float(np.median(bubbles)) if bubbles else None,
            "bubble_theory": theoretical_bubble(cfg.pipeline.stages, cfg.pipeline.micro_batches)}


def _refuse_a_model_that_lacks_some(cfg: TrainConfig, records, comm) -> None:
    """CannotFailOver if the model lacks key ranges or rows that died with ranks (every rank
    sees the same records: all end alike)."""
    for lost, what in ((records["ranges_lost"], "the model written lacks key ranges whose "
                        "every copy died before they were saved (see above)"),
                       (records["rows_abandoned"], "rows of a worker that died or left could "
                        "go to no living worker (see above): the model lacks them")):
        if lost.any():
            error = CannotFailOver(what)
            _raise_together(error, comm, cfg.faults.timeout, logging.ERROR,
                            f"{error}: the job stops; {how_to_go_on(cfg)} (exit "
                            f"{error.exit_status}, which the requeue template resumes)")


def _raise_together(error: MpipsError, comm, timeout: float, level: int,
                    said: str) -> NoReturn:
    """Raise `error` on every rank of `comm`, rank 0 having said `said`, once all have got
    here (or --timeout passed, or a rank died): the ranks leave on their own, and a launcher
    could end rank 0 before its line was out had another left first (seen on a loaded
    machine). Rank 0 may come late, from waiting for its snapshot scorer."""
    if comm.rank == 0:
        log.log(level, "%s", said)
    error.reported = True
    try:
        end_together(comm, timeout)
    except WaitTimeout:
        pass   # a rank that never comes cannot be waited for: leave anyway
    error.raised_together = True
    raise error


def how_to_go_on(cfg) -> str:
    """What a job stopped by a death can be continued from: its newest complete checkpoint
    (or the one it resumed from), or, where there is none, a new start."""
    if cfg is None:
        return "run it again"
    for root in (cfg.checkpoints, cfg.checkpointing.resume):
        if root and complete_checkpoints(root):
            return f"continue from its last checkpoint with --resume {root}"
    # The options as given (a resumed run's None is its checkpoint's, found above).
    if not (cfg.checkpointing.every or cfg.checkpointing.seconds):
        return ("checkpoints were off (--checkpoint-every): run it again from the start, "
                "with checkpoints to keep what a job trains")
    return (f"it died before its first checkpoint was complete (none in {cfg.checkpoints}): "
            f"run it again from the start")


def finish(cfg, roles, name, part: PartResult, started, failures: list,
           moves: Sequence[dict] = ()) -> dict | None:
    """Gather every rank's figures, the test scores, a full-batch solver's steps, the
    timelines and a pipeline's tasks (`part`: this rank's); rank 0 writes the summary and
    RUN_DIR/timeline.h5."""
    comm = roles.comm
    # Gathered to rank 0 below: None elsewhere.
    margins: np.ndarray | None
    labels: np.ndarray | None
    steps: np.ndarray | None
    samples: np.ndarray | None
    tasks: np.ndarray | None
    record, margins, labels, held = part.record, part.margins, part.labels, part.held
    steps, samples, tasks = part.steps, part.samples, part.tasks
    record["samples"], record["tasks"] = samples.shape[0], tasks.shape[0]
    record["epoch_entries"] = part.epoch_rows.shape[0]
    records = summary.allgather(comm, record, cfg.faults.timeout)
    _refuse_a_model_that_lacks_some(cfg, records, comm)
    samples = summary.gather_to_root(comm, samples, records["samples"], cfg.faults.timeout,
                                     "the timelines")
    tasks = summary.gather_to_root(comm, tasks, records["tasks"], cfg.faults.timeout,
                                   "the pipeline's tasks")
    epoch_rows = summary.gather_to_root(comm, part.epoch_rows, records["epoch_entries"],
                                        cfg.faults.timeout, "the rows trained per epoch")
    held = summary.max_over_ranks(comm, held, cfg.faults.timeout, "the servers' hold times")
    counts = records["test_rows"]
    margins = summary.gather_to_root(comm, margins, counts, cfg.faults.timeout, "the test scores")
    labels = summary.gather_to_root(comm, labels, counts, cfg.faults.timeout, "the test labels")
    width = len(Step._fields)
    steps = summary.gather_to_root(comm, steps.reshape(-1), records["solver_steps"] * width,
                                   cfg.faults.timeout, "the solver's steps")
    # The job stopped if any worker was stopped (one that had finished its data was not).
    stopped = bool((records["stopped_at"][len(roles.servers):] >= 0).any())
    # Where: a checkpoint's clock (servers), or a full-batch solver's iteration (workers).
    where = (records["stopped_at"][len(roles.servers):] if cfg.solver.full_batch else
             records["stopped_at"][:len(roles.servers)])
    stopped_at = int(where.max()) if stopped else -1
    scored = stopped or covered(cfg, int(records["test_units"].sum()))
    result = None
    if comm.rank == 0:
        assert (steps is not None and samples is not None and tasks is not None
                and epoch_rows is not None), "gathered to rank 0"
        result = summary.build(
            records, len(roles.servers), margins if scored else None, labels, held,
            run_id=name, config=cfg.to_record(), consistency=cfg.consistency.mode,
            staleness=cfg.consistency.max_staleness,
            status="stopped" if stopped else "complete" if scored else "not scored",
            stopped_at_clock=stopped_at if stopped else None,
            checkpoints=os.path.abspath(cfg.checkpoints), wall_s=time.monotonic() - started,
            model_dir=os.path.abspath(cfg.model_dir), failures=failures, moves=list(moves),
            balance=cfg.consistency.balance,
            rows_per_epoch=summary.rows_per_epoch(epoch_rows, len(roles.workers),
                                                  cfg.solver.epochs),
            **({"solver": summary.solver_steps(steps.reshape(-1, width))}
               if cfg.solver.full_batch else {}))
        if cfg.pipeline.stages > 1:
            result["pipeline"] = _pipeline_figures(cfg, tasks)
        testevents.reached("summary")
        timeline.write(cfg.data.out, samples, records["samples"], len(roles.servers), name, tasks)
        summary.print_lines(result, summary.write(cfg.data.out, result))
        if cfg.diagnostics.tensorboard:
            livecurves.write_final(cfg.diagnostics.tensorboard, result)
    if comm.rank == 0 and cfg.diagnostics.snapshot_every:
        drop_unfinished_snapshots(cfg.run_dir, records["snapshots"][:len(roles.servers)])
    if part.scorer:   # the lead's; the others wait for it at the end, bounded by --timeout
        part.scorer.finish(cfg.faults.timeout / 2)
    _end_unless_done(cfg, comm, stopped_at if stopped else None, scored)
    return result


def summary_lost(cfg: TrainConfig, comm, run_id: str, dead: set) -> NotScored | None:
    """The error a rank of `comm` leaves with when the ranks' last wait found `dead` (ranks of
    `comm`) and among them rank 0, which writes summary.json, before it did: the figures and
    test scores gathered to it died with it, the model is saved. None if no such death, on
    rank 0 itself, or if this run's summary.json is there (it died after writing it). The
    first rank left says so."""
    if 0 not in dead or comm.rank == 0:
        return None
    assert cfg.data.out is not None, "train() gives --out its default before this"
    path = os.path.join(cfg.data.out, "summary.json")
    try:
        with open(path) as f:
            if json.load(f).get("run_id") == run_id:
                return None
    except (OSError, ValueError):
        pass   # not written (or not seen from this node)
    score = (f"; score it with `python -m mpips score {cfg.data.out} --test {cfg.data.test}`"
             if cfg.data.test else "")
    error = NotScored(f"rank {world_ranks(comm, [0])[0]}, which writes summary.json, died at the "
                      f"job's end before it wrote {path}: the figures and test scores gathered "
                      f"to it died with it. The model is trained and saved whole in "
                      f"{cfg.model_dir}{score}")
    if comm.rank == min(set(range(comm.size)) - dead):
        log.error("%s (exit %d)", error, error.exit_status)
    error.reported = error.raised_together = True   # (each rank left finds it dead)
    return error


def _end_unless_done(cfg: TrainConfig, comm, stopped_at: int | None, scored: bool) -> None:
    """A job stopped (at a checkpoint's clock or a solver's iteration), or trained but not
    scored, ends with its own exit status on every rank (each sees the same records); rank 0
    says why."""
    error: MpipsError
    if stopped_at is not None:
        error = JobStopped(f"stopped at {cfg.solver.step} "
                           f"{stopped_at} after writing a checkpoint; continue with --resume "
                           f"{cfg.checkpoints}")
        _raise_together(error, comm, cfg.faults.timeout, logging.INFO, str(error))
    if not scored:
        error = NotScored(f"the model is trained and saved whole in {cfg.model_dir}, but the "
                          f"scores of part of --test {cfg.data.test} died with a rank (see above): "
                          f"score it with `python -m mpips score {cfg.data.out} "
                          f"--test {cfg.data.test}`")
        _raise_together(error, comm, cfg.faults.timeout, logging.ERROR,
                        f"{error} (exit {error.exit_status})")
