"""What /proc says of a process of this node: its state and its start time (which tells a
reused pid apart), and a process of a job as others on its host can check it. Linux only:
elsewhere nothing is known of any process."""
import os
import socket
from typing import NamedTuple


class ProcessState(NamedTuple):
    state: str   # as in /proc/PID/stat: R, S, D, T (stopped), Z (a zombie), X (dead), ...
    start: str   # clock ticks since boot at which the process started
    parent: int  # its parent's pid


def process_state(pid: int) -> ProcessState | None:
    """The state of process `pid` (None if there is no such process, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()   # the name, in (), may hold spaces
    except OSError:
        return None
    return ProcessState(fields[0], fields[19], int(fields[1])) if len(fields) > 19 else None


def siblings_before(variable: str, mine: int) -> list[int]:
    """The running processes with this one's parent (the ranks a launcher started on this
    node) whose environment sets `variable` to a number below `mine`."""
    parent, prefix, found = os.getppid(), variable.encode() + b"=", []
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        state = process_state(pid)
        if state is None or state.parent != parent or state.state in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue   # gone meanwhile, or not ours to read
        for entry in environ:
            if entry.startswith(prefix):
                value = entry[len(prefix):]
                if value.isdigit() and int(value) < mine:
                    found.append(pid)
                break
    return found


def start_time(pid: int) -> str | None:
    """The process's start time; None if it is not running (no such process, or one that
    has exited and not been reaped)."""
    found = process_state(pid)
    return found.start if found and found.state not in ("Z", "X") else None


class Process(NamedTuple):
    """A process of a job, by host, pid and start time."""
    host: str
    pid: int
    started: str | None   # its start time (see start_time)

    @classmethod
    def this(cls) -> "Process":
        return cls(socket.gethostname(), os.getpid(), start_time(os.getpid()))

    @classmethod
    def here(cls, pid: int) -> "Process":
        """Process `pid` of this host as it is now."""
        return cls(socket.gethostname(), pid, start_time(pid))

    def running(self) -> bool:
        """Whether it still runs (on this host only: elsewhere its pid tells nothing)."""
        now = start_time(self.pid)
        return now is not None and now == self.started
