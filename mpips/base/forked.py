"""A file written by a forked child, from a copy-on-write image of this process: the state is
taken at the fork, in the time fork() copies the page tables, and the process goes on at
once while the child writes.

The child calls no MPI, runs no exit handlers (os._exit: mpi4py's would finalize MPI) and
gives its result back through a pipe, as JSON. It lowers its own priority (the ranks that
serve come first), ignores the signals that ask the job to stop (the job waits for its file)
and dies with its parent (PR_SET_PDEATHSIG on Linux): a killed rank leaves no writer behind.
The parent asks with waitpid(WNOHANG) whether it has finished; a child that fails, dies or
is stopped gives an entry {"error": why}, never a finished file.
"""
import contextlib
import ctypes
import json
import os
import signal
import time
from collections.abc import Callable

from .errors import WaitTimeout

_PR_SET_PDEATHSIG = 1
POLL_S = 1e-3   # between looks at a child waited for
NICE = 10   # the writer's priority below its rank's: on a shared node, serving comes first


class Written:
    """A write done in this process (no child): its entry is ready."""
    copying = False

    def __init__(self, entry: dict, started: float):
        self.entry, self.started = entry, started
        self.pid = os.getpid()

    def poll(self) -> dict | None:
        return self.entry

    def wait(self, timeout: float) -> dict:
        return self.entry

    def stop(self, why: str) -> dict:
        return self.entry


class ForkedWrite:
    """`write()` run in a forked child: a dict that can be sent as JSON, or an exception,
    which becomes {"error": ...}. `what`: the file, in messages. `cleanup(pid)`: what a child
    that did not finish may have left (its temporary files), removed by the parent."""
    copying = False

    def __init__(self, write: Callable[[], dict], what: str,
                 cleanup: Callable[[int], None] = lambda pid: None):
        self.what, self._cleanup = what, cleanup
        self.entry: dict | None = None
        parent = os.getpid()
        readable, writable = os.pipe()
        self.started = time.monotonic()
        pid = os.fork()
        if pid == 0:   # the child: never returns
            os.close(readable)
            _run_child(write, writable, parent)
        os.close(writable)
        self.pid, self._pipe = pid, readable
        self._said = b""

    def poll(self) -> dict | None:
        """The entry once the child has ended, else None."""
        if self.entry is not None:
            return self.entry
        self._read()   # the child may write more than a pipe holds before it ends
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        self._read(until_end=True)
        self.entry = self._outcome(status)
        return self.entry

    def wait(self, timeout: float) -> dict:
        """The entry, waiting up to `timeout` s for the child; past it, the child is stopped and
        the entry says so."""
        return waited(self, timeout)

    def stop(self, why: str) -> dict:
        """Kill the child if it still runs; its entry is {"error": why} unless it had finished."""
        if self.entry is not None:
            return self.entry
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        try:
            _, status = reap(self.pid, 10.0)
        except WaitTimeout as e:   # not seen on Linux: SIGKILL cannot be caught
            why = f"{why}; {e}"
        else:
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                self._read(until_end=True)
                self.entry = self._outcome(status)   # it had finished after all
                return self.entry
        self._close()
        self._cleanup(self.pid)
        self.entry = {"error": why}
        return self.entry

    def _read(self, until_end: bool = False) -> None:
        if self._pipe < 0:
            return
        os.set_blocking(self._pipe, until_end)   # at the end the child is gone: EOF comes
        while True:
            try:
                chunk = os.read(self._pipe, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._said += chunk

    def _outcome(self, status: int) -> dict:
        self._close()
        if os.WIFSIGNALED(status):
            self._cleanup(self.pid)
            return {"error": killed(self.what, self.pid, os.WTERMSIG(status))}
        try:
            entry = json.loads(self._said.decode())
        except ValueError:
            entry = None
        if not isinstance(entry, dict) or os.WEXITSTATUS(status) != 0:
            self._cleanup(self.pid)
            said = entry.get("error") if isinstance(entry, dict) else None
            return {"error": f"the writer of {self.what} (process {self.pid}) failed (exit "
                             f"status {os.WEXITSTATUS(status)}): {said or 'it said nothing'}"}
        return entry

    def _close(self) -> None:
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1


def killed(what: str, pid: int, sig: int) -> str:
    """Why the writer of `what`, process `pid`, ended by signal `sig`."""
    return (f"the writer of {what} (process {pid}) was killed by signal {sig} "
            f"({signal.Signals(sig).name}) before it finished (by the out-of-memory killer? "
            f"A forked writer may need as much memory again as what it writes)")


def waited(write, timeout: float) -> dict:
    """The entry of `write` (a ForkedWrite, a writer_process.WriterProcess's task or a
    job.snapshot_write.SnapshotWrite: `poll`, `stop`, `what`, `pid`), waiting up to `timeout`
    s; past it, its process is stopped and the entry says so."""
    deadline = time.monotonic() + timeout
    while (entry := write.poll()) is None:
        if time.monotonic() > deadline:
            return write.stop(f"the writer of {write.what} (process {write.pid}) did not "
                              f"finish within {timeout:g} s and was stopped: is the file "
                              f"system slow or hung?")
        time.sleep(POLL_S)
    return entry


def reap(pid: int, timeout: float) -> tuple[int, int]:
    """waitpid on a child just killed, within `timeout` s (WaitTimeout)."""
    deadline = time.monotonic() + timeout
    while True:
        found, status = os.waitpid(pid, os.WNOHANG)
        if found:
            return found, status
        if time.monotonic() > deadline:
            raise WaitTimeout(f"process {pid} did not end within {timeout:g} s of SIGKILL")
        time.sleep(POLL_S)


# Arrays this size and larger are mappings of their own (glibc's malloc maps anything over
# 32 MB apart), so none of the heap that a child goes on using lies in their pages.
APART_BYTES = 64 << 20
_MADV_DONTFORK, _MADV_DOFORK, _MADV_NOHUGEPAGE = 10, 11, 15   # Linux


def keep_from_children(array, keep: bool = True) -> bool:
    """Leave the pages of `array` out of forked children (Linux: madvise MADV_DONTFORK), so
    that writing to it after a fork copies no page; a child must never read it (`keep`
    False: share them again). Only for arrays of APART_BYTES or more; whether it was
    done."""
    return array.nbytes >= APART_BYTES and _advise(array, _MADV_DONTFORK if keep
                                                   else _MADV_DOFORK)


def small_pages(array) -> bool:
    """Back `array` with 4 KB pages, not transparent huge pages (madvise MADV_NOHUGEPAGE),
    for memory first touched a little at a time on a path that must not stall: a huge
    page's first touch zeroes 2 MB, and may wait for the kernel to compact memory. Only for
    arrays of APART_BYTES or more (numpy asks huge pages for them); whether it was done."""
    return array.nbytes >= APART_BYTES and _advise(array, _MADV_NOHUGEPAGE)


def _advise(array, advice: int) -> bool:
    page = os.sysconf("SC_PAGE_SIZE")
    start = -(-array.ctypes.data // page) * page   # whole pages inside it
    end = (array.ctypes.data + array.nbytes) // page * page
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), advice) == 0
    except (OSError, AttributeError):
        return False


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux); if it already has, end now."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:
        os._exit(3)


# Signals meant for the job (Ctrl-C, Slurm's SIGTERM and warning, SIGUSR2 for stacks) reach
# a writer in its process group too: they must not cut the file a stopping job waits for.
_JOBS_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def settle_child(parent: int) -> None:
    """A writer just forked from `parent`: deaf to the job's signals, dying with its parent,
    below its parent's priority."""
    for sig in _JOBS_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    _die_with_parent(parent)
    os.nice(NICE)


def _run_child(write: Callable[[], dict], pipe: int, parent: int) -> None:
    code = 1
    try:
        settle_child(parent)
        try:
            said = json.dumps(write(), allow_nan=False)
            code = 0
        except BaseException as e:   # noqa: BLE001 -- whatever it is, the parent is told
            said = json.dumps({"error": f"{type(e).__name__}: {e}"})
        data = said.encode()
        while data:
            data = data[os.write(pipe, data):]
    finally:
        os._exit(code)
