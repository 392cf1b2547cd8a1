"""A writer process forked once and kept: told by a Unix socket what to write next, one task
at a time, as a line of JSON with the file descriptors of the shared memory it reads
(SCM_RIGHTS); it answers with a line of JSON, the file's entry. Its parent forks no more
after the first task, and takes no copy-on-write faults on the pages it shared with it.

Like a ForkedWrite's child (base.forked), it calls no MPI, runs no exit handlers, ignores the
job's signals, lowers its priority, keeps none of its parent's descriptors but the standard
three, and dies with its parent. After a task that failed it
ends (HDF5, when a write fails under it, leaves objects a process must not go on with): the
next task needs a new one. It ends too when its parent closes the socket (or dies).
"""
import contextlib
import json
import os
import signal
import socket
from collections.abc import Callable

from .errors import WaitTimeout
from .forked import killed, reap, settle_child, waited
from .shared_memory import forget_inherited

READ_BYTES = 1 << 16
MAX_FDS = 4   # descriptors a task may carry


class WriterProcess:
    """`work(task, fds)` run in a child forked now and kept, for each task `start` sends: a
    dict that can be sent as JSON, or an exception, which becomes {"error": ...}; `fds` are
    the task's descriptors, closed after it. `what`: the process, in messages."""

    def __init__(self, work: Callable[[dict, list], dict], what: str):
        self.what = what
        parent = os.getpid()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:   # the child: never returns
            mine.close()
            _serve(work, theirs, parent)
        theirs.close()
        mine.setblocking(False)
        self.pid, self._sock = pid, mine
        self.busy = False
        self.ended: str | None = None   # why it takes no more tasks
        self._said = b""
        self._cleanup: Callable[[int], None] = lambda pid: None

    @property
    def idle(self) -> bool:
        """Whether it can take a task now (it lives, and writes nothing)."""
        if self.ended is None and not self.busy:
            found, status = os.waitpid(self.pid, os.WNOHANG)
            if found:   # died between tasks (the out-of-memory killer?)
                self._close()
                self.ended = f"it had ended (status {status})"
        return self.ended is None and not self.busy

    def start(self, task: dict, fds: list, cleanup: Callable[[int], None] = lambda pid: None,
              what: str | None = None) -> None:
        """Send `task` with descriptors `fds` (an idle process's: see `idle`). `cleanup(pid)`:
        what a task that did not finish may have left, removed here; `what`: the file, in
        messages."""
        assert self.idle, "one task at a time"
        self.what = what or self.what
        self.busy, self._cleanup = True, cleanup
        data = f"{json.dumps(task, allow_nan=False)}\n".encode()
        try:   # a small message into an empty socket buffer: it goes at once
            sent = socket.send_fds(self._sock, [data], fds)
            if sent < len(data):
                self._sock.sendall(data[sent:])
        except OSError as e:   # it died meanwhile: poll says how
            self._said = json.dumps({"error": f"the writer of {self.what} (process "
                                              f"{self.pid}) could not be told what to write "
                                              f"({e})"}).encode() + b"\n"

    def poll(self) -> dict | None:
        """The task's entry once it is written (or the process ended), else None."""
        assert self.busy, "a task was started"
        self._read()
        entry = self._answer()
        if entry is not None:
            return entry
        found, status = os.waitpid(self.pid, os.WNOHANG)
        if not found:
            return None
        self._read()   # it may have answered just before it ended
        entry = self._answer()
        if entry is None:
            self._cleanup(self.pid)
            entry = {"error": killed(self.what, self.pid, os.WTERMSIG(status))
                     if os.WIFSIGNALED(status) else
                     f"the writer of {self.what} (process {self.pid}) ended (exit status "
                     f"{os.WEXITSTATUS(status)}) before it answered"}
        self._gone("it ended")
        return entry

    def wait(self, timeout: float) -> dict:
        """The task's entry, waiting up to `timeout` s; past it, the process is stopped and
        the entry says so."""
        return waited(self, timeout)

    def stop(self, why: str) -> dict:
        """The task ended now: its entry if it was written, else the process is killed and
        the entry is {"error": why}."""
        if self.busy:
            self._read()
            entry = self._answer()
            if entry is not None:
                return entry
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        try:
            reap(self.pid, 10.0)
        except WaitTimeout as e:   # not seen on Linux: SIGKILL cannot be caught
            why = f"{why}; {e}"
        except ChildProcessError:   # reaped already
            pass
        self._cleanup(self.pid)
        self._gone("it was stopped")
        return {"error": why}

    def close(self) -> None:
        """No more tasks: the process ends (it reads the end of its socket), reaped here."""
        if self.ended is not None:
            return
        self._close()
        try:
            reap(self.pid, 10.0)
        except WaitTimeout:
            self.stop("it did not end when told")
        except ChildProcessError:
            pass
        self.ended = "it was closed"

    def _answer(self) -> dict | None:
        """The task's entry, once its line is in."""
        if b"\n" not in self._said:
            return None
        line, self._said = self._said.split(b"\n", 1)
        self.busy = False
        try:
            entry = json.loads(line.decode())
        except ValueError:
            entry = None
        if not isinstance(entry, dict):
            entry = {"error": f"the writer of {self.what} (process {self.pid}) answered "
                              f"what is not a JSON object"}
        if "error" in entry:   # it ends after a failure (see the module's doc)
            self.close()
        return entry

    def _read(self) -> None:
        if self._sock.fileno() < 0:
            return
        while True:
            try:
                chunk = self._sock.recv(READ_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:   # reset: it died
                return
            if not chunk:
                return
            self._said += chunk

    def _gone(self, why: str) -> None:
        self.busy = False
        self._close()
        self.ended = why

    def _close(self) -> None:
        if self._sock.fileno() >= 0:
            self._sock.close()


def _serve(work: Callable[[dict, list], dict], sock: socket.socket, parent: int) -> None:
    """The child: tasks until the socket ends, or one fails."""
    code = 1
    try:
        settle_child(parent)
        forget_inherited()
        _close_inherited(keep=sock.fileno())
        said, fds = b"", []
        while True:
            data, got, _, _ = socket.recv_fds(sock, READ_BYTES, MAX_FDS)
            fds += got
            if not data:
                code = 0
                return
            said += data
            while b"\n" in said:
                line, said = said.split(b"\n", 1)
                try:
                    entry = work(json.loads(line.decode()), fds)
                    answer = json.dumps(entry, allow_nan=False)
                except BaseException as e:   # noqa: BLE001 -- whatever it is, the parent is told
                    entry = {"error": f"{type(e).__name__}: {e}"}
                    answer = json.dumps(entry)
                for fd in fds:
                    os.close(fd)
                fds = []
                sock.sendall(f"{answer}\n".encode())
                if "error" in entry:
                    code = 0
                    return
    finally:
        os._exit(code)


def _close_inherited(keep: int) -> None:
    """The parent's descriptors closed but the standard three and `keep`: a long-lived child
    must hold no pipe its parent opened (a pipe whose reader waits for its end, as the
    snapshot scorer waits for the lead's), nor a socket of the job's."""
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        fd = int(name)
        if fd > 2 and fd != keep:
            with contextlib.suppress(OSError):
                os.close(fd)
