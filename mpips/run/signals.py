"""Asking a running job to stop, by signal.

The first SIGUSR1, SIGTERM or SIGINT only asks: whichever rank gets it tells
server 0 (a worker with its next message), server 0 names the next clock
every rank can reach, every server writes its part of a checkpoint there, and all
ranks exit with status 75 (EX_TEMPFAIL: resumable). This is what Slurm's warning
(`#SBATCH --signal=B:USR1@120`, forwarded by the job script) and Ctrl-C do.
A second SIGTERM or SIGINT stops at once: each server saves its shard as it is.

Open MPI's mpiexec forwards SIGUSR1 and lets the ranks finish; it kills them about
0.1 s after forwarding SIGTERM, so use SIGUSR1 with it. srun leaves Slurm's
KillWait (30 s by default) between SIGTERM and SIGKILL.

SIGUSR2 asks nothing: the rank writes where each of its threads is (Python's stacks) to its
standard error and goes on, to see where a rank that seems stuck waits (`kill -USR2 PID`).
A rank that crashes (a segmentation fault, an abort in a library) writes them too before it
dies: MPI would say only that the rank died.
"""
import faulthandler
import signal

from ..base.errors import Interrupted

RESUMABLE = 75          # exit status of a job that stopped after writing a checkpoint
_asked: list[int] = []   # the signals asking to stop, in order


def install() -> None:
    for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _handle)
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    faulthandler.enable(all_threads=True)


def _handle(signum, frame) -> None:
    if not _asked or signum == signal.SIGUSR1:
        _asked.append(signum)
        return
    error = Interrupted(f"stopped by a second {signal.Signals(signum).name}")
    error.exit_status = 128 + signum
    raise error


def stop_requested() -> bool:
    return bool(_asked)

