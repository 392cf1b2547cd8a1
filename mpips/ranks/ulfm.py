"""Hot failover on ULFM: the survivors of a dead rank learn who died and go on.

Survivors keep the job's communicator. ULFM fails only the operations that involve a dead
rank (and receives from any source, until the failure is acknowledged), so point-to-point
traffic between living ranks goes on and nothing in flight between them is lost. Nothing
needs resending either: every copy of a key range received each push straight from its
worker. What changes is the placement (each dead primary's first living backup answers its
reads) and, at the end of the job, the communicator: collectives cannot span a dead rank,
so the survivors agree that there were failures and shrink to a communicator of their own.
"""
import logging
import os
import signal
import sys
import threading
import time
from typing import TypeGuard, cast

from mpi4py import MPI

from ..base.errors import MpipsError
from ..base.processes import Process, process_state, siblings_before
from ..wire.tags import KEEPALIVE_TAG
from .bounded import wait_all
from .ulfm_launch import detector_timeout

log = logging.getLogger("mpips")

_FAILURES = (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED)
LOST = 75   # exit status of a job that lost every copy of some keys: resume from a checkpoint
LEAVE_APART_S = 0.02   # between the exits of a node's ranks leaving after a failure
LEAVE_WAIT_S = 2.0     # the most a rank waits for the node's ranks before it to have left
_job_comm: list[MPI.Intracomm] = []   # the job's communicator, once its ranks have roles


class CannotFailOver(MpipsError):
    """A failure the survivors cannot go on from (every copy of some keys died, or a rank
    whose part no other rank takes over): the job stops, to resume from a checkpoint."""
    exit_status = LOST


def is_failure(e: BaseException) -> TypeGuard[MPI.Exception]:
    """Whether `e` is MPI telling of a dead rank, or of the job's communicator revoked by a
    rank that left after one (directly, or as the error of one request of several: then only
    if MPI knows of a dead rank, or the communicator is revoked)."""
    if not isinstance(e, MPI.Exception):
        return False
    if e.Get_error_class() in _FAILURES:
        return True
    if e.Get_error_class() != MPI.ERR_IN_STATUS:
        return False
    return _any_dead() or _job_revoked()


def dead_ranks(comm: MPI.Intracomm) -> set:
    """The ranks of `comm` known to have failed, acknowledged (so that receives from any
    source work again). Those on this node that still exist are ended (see end_the_dead)."""
    global _deaths_seen
    comm.Ack_failed(comm.size)
    failed = comm.Get_failed()
    _deaths_seen = _deaths_seen or failed.size > 0
    try:
        if _neighbours and failed.size:
            world = MPI.COMM_WORLD.Get_group()
            end_the_dead(MPI.Group.Translate_ranks(failed, list(range(failed.size)), world))
            world.Free()
        return set(MPI.Group.Translate_ranks(failed, list(range(failed.size)),
                                             comm.Get_group()))
    finally:
        failed.Free()


def world_ranks(comm: MPI.Intracomm, ranks) -> list:
    """The ranks in MPI_COMM_WORLD of these ranks of `comm` (a local call, dead or alive)."""
    group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        return MPI.Group.Translate_ranks(group, list(ranks), world)
    finally:
        group.Free()
        world.Free()


def _any_dead() -> bool:
    """Whether MPI knows of a dead rank of the job (False where it cannot say: no ULFM)."""
    try:
        return bool(dead_ranks(MPI.COMM_WORLD))
    except (MPI.Exception, NotImplementedError):
        return False


# The other ranks on this rank's node, by rank of MPI_COMM_WORLD.
_neighbours: dict = {}   # rank -> processes.Process
_deaths_seen = False   # whether this rank has learned of a dead rank


def know_neighbours(pids: dict) -> None:
    """Remember the other ranks on this node (world rank -> pid), so that they can be ended
    here once the failure detector declares them dead."""
    _neighbours.clear()
    for rank, pid in pids.items():
        if pid != os.getpid():
            _neighbours[rank] = Process.here(pid)


def end_the_dead(world_ranks) -> None:
    """SIGKILL the ranks of this node among `world_ranks` (declared dead) that still exist.
    A frozen rank (SIGSTOP, a hung node process) would otherwise stay, and the launcher waits
    for every process it started: the launch, and a Slurm allocation, would never end. A rank
    that was only slow is ended too, since ULFM has already cut it off from the job."""
    for rank in world_ranks:
        known = _neighbours.pop(rank, None)
        if known is None or not known.running():
            continue   # gone already, or the pid is another process's now
        pid, now = known.pid, process_state(known.pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        log.warning("rank %d (pid %d, on this node) was declared dead by the failure detector "
                    "%s: ended it (SIGKILL), so that the launch can end", rank, pid,
                    "while frozen (stopped)" if now and now.state in ("T", "t") else
                    "while its process still existed")


def what_died(comm: MPI.Intracomm, e: MPI.Exception) -> str:
    """A sentence on a failure MPI reported as `e`: which ranks of `comm` died."""
    try:
        dead = sorted(dead_ranks(comm))
    except MPI.Exception:
        dead = []
    who = f"rank(s) {dead} died" if dead else "a rank died"
    if revoked(e):
        stopped = "another rank stopped the job, which cannot go on (its reason above)"
        return f"{who}, and {stopped}" if dead else stopped
    return f"{who} (MPI: {e.Get_error_string()})"


def revoked(e: BaseException) -> bool:
    """Whether `e` is MPI saying that another rank revoked the communicator (stop_the_others):
    the job stops, and nothing more can be said to the others over it. A wait on several
    requests (Testall) says MPI_ERR_IN_STATUS instead, the revocation in a request's status:
    then the job's communicator is asked."""
    if not isinstance(e, MPI.Exception):
        return False
    return e.Get_error_class() == MPI.ERR_REVOKED or (
        e.Get_error_class() == MPI.ERR_IN_STATUS and _job_revoked())


def _job_revoked() -> bool:
    """Whether the job's communicator (job_communicator) is revoked."""
    try:
        return any(comm.Is_revoked() for comm in _job_comm)
    except (MPI.Exception, NotImplementedError):
        return False


def stop_the_others(comm: MPI.Intracomm) -> None:
    """This rank leaves a job that cannot go on: `comm` revoked, so that the other ranks'
    waits on it end at once (MPI_ERR_REVOKED) instead of when the failure detector finds this
    rank gone (its whole timeout later)."""
    try:
        comm.Revoke()
    except (MPI.Exception, NotImplementedError):
        pass   # no ULFM: the job ends by MPI_Abort


def survivors(comm: MPI.Intracomm) -> MPI.Intracomm | None:
    """Collective over the living ranks of `comm`: their own communicator (ranks in the same
    order) if any rank has died, else None. Every survivor gets the same answer."""
    while True:
        none_dead = not dead_ranks(comm)
        try:
            agreed = comm.Agree(int(none_dead))   # a bitwise AND over the survivors
            break
        except MPI.Exception as e:   # a death not yet acknowledged: acknowledge, agree again
            if not is_failure(e):
                raise
    if agreed:
        return None
    while True:
        try:
            return cast(MPI.Intracomm, comm.Shrink())   # mpi4py types it as any Comm
        except MPI.Exception as e:   # another death during the shrink
            if not is_failure(e):
                raise
            dead_ranks(comm)


def agreed_dead(comm: MPI.Intracomm) -> set:
    """Collective over the living ranks of `comm`: the ranks of `comm` that have died, the same
    set on every survivor (empty if none)."""
    living = survivors(comm)
    if living is None:
        return set()
    try:
        kept = living.Get_group().Translate_ranks(list(range(living.size)), comm.Get_group())
    finally:
        living.Free()
    return set(range(comm.size)) - set(kept)


def job_communicator(comm: MPI.Intracomm) -> None:
    """`comm` is the communicator the job's ranks talk and wait on (Roles.comm): a rank that
    leaves after a failure revokes it (leave_after_failure)."""
    _job_comm[:] = [comm]


def leave_after_failure(status: int, together: bool = False) -> None:
    """End this rank after a death the job cannot go on from. Under ULFM each rank leaves on
    its own, without MPI_Abort (several ranks aborting at once left Open MPI's launcher
    waiting with no rank left) and without finalizing (which can wait on the dead rank).
    It revokes the job's communicator first (stop_the_others): the others' waits end at
    once, and they leave too, rather than when the failure detector finds this rank gone.
    Not if every rank leaves `together` on its own: a revocation would end the others' last
    wait before they saw what this rank saw."""
    if not together:
        for comm in _job_comm:
            stop_the_others(comm)
    sys.stdout.flush()
    sys.stderr.flush()
    _leave_in_turn()
    os._exit(status)


def _leave_in_turn() -> None:
    """The ranks of a node leave in turn: Open MPI's launcher (5.0.11, under ULFM) now and then
    waits forever once its ranks have all exited with an error at the same moment (5 ranks
    leaving at once: 5 of 120 launches never ended; 20 ms apart: none of 60). A rank leaves
    LEAVE_APART_S after the node's ranks before it have (seen in /proc: the launcher's other
    children), within LEAVE_WAIT_S; and never sooner than LEAVE_APART_S per rank before it,
    as where they are not its siblings (a rank started through a wrapper): spaced by their
    order, not by when each learned of the failure, which a loaded node spreads apart."""
    began = time.monotonic()
    local, variable = _local_rank()
    if not local:
        return
    spacing = LEAVE_APART_S * min(local, 64)
    while (siblings_before(variable, local)
           and time.monotonic() - began < LEAVE_WAIT_S + spacing):
        time.sleep(0.005)
    time.sleep(max(spacing - (time.monotonic() - began), LEAVE_APART_S))


def _local_rank() -> tuple[int, str]:
    """This rank's number among the job's ranks on its node, as the launcher says, and the
    variable that says it ((0, "") if none does)."""
    for name in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value), name
    return 0, ""


def end_together(comm: MPI.Intracomm, timeout: float) -> set:
    """Every rank of `comm` waits for the others. Under ULFM it is the last wait before
    finalizing, so that the ranks finalize together: a rank that finalizes stops answering
    the failure detector, and ranks still at work then take it for dead. It is also the wait
    of ranks that leave together once rank 0 has said why (job.ending). A death found here
    ends the wait: the ranks of `comm` this rank knows dead (none if the wait ended)."""
    try:
        wait_all([comm.Ibarrier()], timeout, lambda: "every rank to finish")
    except MPI.Exception as e:
        if not is_failure(e):
            raise
        return dead_ranks(comm)
    return set()


def silence(late_s: float, detector_s: float) -> str | None:
    """What a rank says when it reached MPI `late_s` seconds later than it meant to (its
    keep-alive thread was not run: the node's cores were taken, or the process stopped): a
    warning from a third of the way to being taken for dead, so that a death declared of a
    live rank can be told from a real one."""
    if late_s < detector_s / 3:
        return None
    return (f"this rank did not reach MPI for {late_s:.1f} s (the failure detector declares a "
            f"rank silent for {detector_s:g} s dead): its process was not run, on a node whose "
            f"cores are taken or that stopped it. Run fewer processes a node, or launch with "
            f"a longer --mca mpi_ft_detector_timeout")


class KeepAlive:
    """ULFM's failure detector has no thread of its own here: a rank that makes no MPI call
    for the detector's timeout (compiling kernels, reading a sample, writing a file) counts
    as dead. A thread that calls MPI every `every` seconds keeps such a rank from being
    declared dead; the numba kernels release the GIL (nogil) so that it runs during them too.

    On leaving, it finalizes MPI at once: left to the end of the interpreter, finalizing
    comes after a silence (Python's own teardown) long enough to be taken for a death, and
    the rank so accused aborts while the others wait for it. Finalizing is bounded too:
    after `finalize_s` the rank is ended (ULFM's finalize can wait on a dead rank)."""

    def __init__(self, every: float = 0.05, finalize_s: float = 30.0):
        self._every = every
        self._finalize_s = finalize_s
        self._detector_s = detector_timeout(os.environ)
        self._last = time.monotonic()   # when the thread last called MPI
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mpips-keepalive", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            now = time.monotonic()
            said = silence(now - self._last - self._every, self._detector_s)
            if said:
                log.warning("%s", said)
            self._last = now
            try:
                MPI.COMM_WORLD.Iprobe(MPI.ANY_SOURCE, KEEPALIVE_TAG)
            except MPI.Exception:
                pass   # a dead rank, which the job's own calls deal with

    def __enter__(self):
        self._last = time.monotonic()   # a stop before the thread first runs counts too
        if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            self._thread.start()
        return self

    def __exit__(self, kind, error, _):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        sys.stdout.flush()
        sys.stderr.flush()
        if kind in (None, SystemExit) and (_deaths_seen or _any_dead()):
            # After a death ULFM's finalize now and then waits for the dead rank until the
            # alarm below (30 s of a launch that has done its work): leave without it. MPI is
            # asked as well: a failure a wait reported directly (MPI_ERR_PROC_FAILED) leaves
            # _deaths_seen unset.
            code = 0 if error is None else error.code
            if isinstance(code, str):
                print(code, file=sys.stderr, flush=True)
            os._exit(code if isinstance(code, int) else 0 if code is None else 1)
        # MPI_Finalize holds the GIL: no Python thread could end a finalize that hangs, but
        # the kernel can (SIGALRM's default action ends the process).
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(max(1, int(self._finalize_s)))
        MPI.Finalize()
        signal.alarm(0)


