"""What /proc says of a process of this node: its state and its start time (which tells a
reused pid apart). Linux only: elsewhere nothing is known of any process."""
from typing import NamedTuple


class ProcessState(NamedTuple):
    state: str   # as in /proc/PID/stat: R, S, D, T (stopped), Z (a zombie), X (dead), ...
    start: str   # clock ticks since boot at which the process started


def process_state(pid: int) -> ProcessState | None:
    """The state of process `pid` (None if there is no such process, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()   # the name, in (), may hold spaces
    except OSError:
        return None
    return ProcessState(fields[0], fields[19]) if len(fields) > 19 else None
