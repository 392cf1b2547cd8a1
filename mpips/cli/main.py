"""Command line: `python -m mpips COMMAND ...`: the parser of every command, and `train` run
with the exit status and one message for each way a job ends."""
import argparse
import contextlib
import os
import sys
import traceback

from ..ranks.exits import exit_together, launch_rank, print_out
from ..run.options import config_of, train_parser
from . import ctl
from .datacommands import convert_parser, make_data_parser
from .readouts import inspect_parser, report_parser, schedule_parser, score_parser

DESCRIPTION = """\
mpips: parameter-server training on an MPI job. Launch `train` with mpiexec or
srun; the first --servers ranks hold the model, the others are workers.

  mpiexec -n 4 python -m mpips train --train data/ctr.train.svm --test data/ctr.test.svm
"""


class _Parser(argparse.ArgumentParser):
    """Under mpiexec every rank parses the same arguments: only rank 0 prints the error."""

    def error(self, message):
        if launch_rank() == 0:
            self.print_usage(sys.stderr)
        exit_together(2, f"{self.prog}: error: {message}" if launch_rank() == 0 else None)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    parser = _Parser(
        prog="python -m mpips", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train_parser(sub).set_defaults(run=_run_train)
    score_parser(sub)
    report_parser(sub)
    schedule_parser(sub)
    inspect_parser(sub)
    convert_parser(sub)
    make_data_parser(sub)
    ctl.add_parser(sub)
    return parser


def _run_train(args) -> None:
    """`train` on this rank: the job, then an exit status and a message for each way it ends."""
    from mpi4py import MPI

    from ..base.log import setup
    from ..job.training import train
    from ..ranks.ulfm import KeepAlive
    from ..ranks.ulfm_launch import local_verdict
    from ..run import signals

    world = MPI.COMM_WORLD
    log = setup(f"rank {world.rank}")
    signals.install()
    # Under ULFM a rank busy without MPI calls would count as dead: KeepAlive calls MPI for it.
    cfg = None
    with KeepAlive() if local_verdict().on else contextlib.nullcontext():
        try:
            cfg = config_of(args)
            if args.print_schedule:
                from ..job.stage_part import describe_pipeline
                if world.rank == 0:
                    print_out(describe_pipeline(cfg))
                return
            train(cfg, world)
        except Exception as e:  # noqa: BLE001 (any failure: said once, then every rank stops)
            _leave(e, cfg, world, log)


def _leave(e: Exception, cfg, world, log) -> None:
    """How `train` ends on this rank after `e`: an exit status, and a message said once."""
    from ..base.errors import ConfigError, Interrupted, MpipsError

    if isinstance(e, ConfigError):
        # Every rank raises the same error before any work starts: exit together, print once.
        exit_together(2, f"mpips train: error: {e}"
                      if getattr(e, "reported", world.rank == 0) else None)
    # Not for a refused launch: job.ending loads numba.
    from ..job.ending import JobStopped, NotScored, how_to_go_on
    from ..ranks.ulfm import LOST, CannotFailOver, is_failure, leave_after_failure, what_died
    from ..run import signals

    if isinstance(e, JobStopped):   # said by rank 0 (job.ending)
        sys.exit(signals.RESUMABLE)
    elif isinstance(e, NotScored):   # said once; leave as after a death (no finalizing)
        leave_after_failure(e.exit_status, e.raised_together)
    elif isinstance(e, CannotFailOver):
        if not getattr(e, "reported", False):
            log.error("%s: the job stops; %s (exit %d, which the requeue template resumes)",
                      e, how_to_go_on(cfg), e.exit_status)
        leave_after_failure(e.exit_status, e.raised_together)
    elif isinstance(e, Interrupted):
        # A second signal: leave at once, without MPI_Abort (which could kill a server while
        # it saves its shard) and without MPI_Finalize (which waits for the other ranks).
        if not getattr(e, "reported", False):
            log.error("%s", e)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(e.exit_status)
    else:
        if is_failure(e):   # a rank died where no other takes over its part
            log.error("%s: the job stops; %s (exit %d, which the requeue template resumes)",
                      what_died(world, e), how_to_go_on(cfg), LOST)
            leave_after_failure(LOST)
        if not getattr(e, "reported", False):
            log.error("%s", e if isinstance(e, MpipsError) else traceback.format_exc())
        log.error("stopping the whole job (MPI_Abort)")
        sys.stdout.flush()
        sys.stderr.flush()
        world.Abort(1)


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.run(args)
