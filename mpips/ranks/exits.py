"""How a command leaves: under a launcher every rank together, an error as one line, output to
a reader that stopped early without one."""
import os
import sys

# A job's exit statuses besides 0, 1 (an error; MPI_Abort) and 2 (a configuration refused):
# 75 (signals.RESUMABLE, ulfm.LOST) stopped, to resume from a checkpoint; and this one:
NOT_SCORED = 76   # trained, the model saved whole, but not all of --test scored: `mpips score`


def _launched(names: tuple) -> int | None:
    """What the MPI launcher announced in the first of these variables that it set."""
    for name in names:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def launch_rank() -> int:
    """This process's rank as the MPI launcher announced it (0 when not launched by one)."""
    return _launched(("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")) or 0


def exit_together(code: int, message: str | None = None) -> None:
    """Print `message` (if this rank reports it) and exit with `code`, but under a launcher
    only once every rank has got here (or 10 s have passed): a launcher kills the remaining
    ranks when one exits with an error, and could kill the one still printing."""
    if message:
        print(message, file=sys.stderr, flush=True)
    if (_launched(("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")) or 1) > 1:
        from mpi4py import MPI

        from ..base.errors import WaitTimeout
        from .bounded import wait_all
        try:
            wait_all([MPI.COMM_WORLD.Ibarrier()], 10.0, lambda: "the other ranks to exit")
        except WaitTimeout:
            pass   # a rank that never arrives cannot be waited for: leave anyway
    sys.exit(code)


def fail(text: str, code: int) -> None:
    """A one-process command's error: one line, no traceback, exit `code`."""
    print(f"mpips: error: {text}", file=sys.stderr, flush=True)
    sys.exit(code)


def print_out(text: str) -> None:
    """`text` on standard output; a reader that stopped early (`| head`) is no error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
