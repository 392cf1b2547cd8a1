"""A worker's requests in flight: the messages sent, the replies awaited, and what a pull
leaves behind for the push that follows it.
"""
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from mpi4py import MPI


@dataclass(slots=True)
class Send:
    """One message of a request, on its way to a server."""
    request: MPI.Request
    buffer: bytes                 # the message (protocol.message), kept until sent
    server: int                   # index of the server it goes to
    done: bool = False
    status: ClassVar[MPI.Status] = MPI.Status()   # where its status goes: never read


@dataclass(slots=True)
class Reply:
    """One server's answer to a request, awaited."""
    request: MPI.Request
    server: int                   # index of the server that answers
    into: np.ndarray              # the receive buffer
    rows: object                  # the rows of the pull's output it answers (slice or indices)
    copy: bool = False            # whether `into` is a buffer of its own, copied out after
    done: bool = False
    status: MPI.Status = field(default_factory=MPI.Status)


@dataclass(slots=True)
class Pending:
    """A request not yet waited for (one timestamp): its messages and replies."""
    what: str | Callable[["Pending"], str]   # what a wait for it waits for, for messages (or
                                     # what makes it of the request, asked only if a wait
                                     # fails: see `said`; given the request, so that it holds
                                     # none: a request in a cycle of its own waits for the
                                     # garbage collector, which then runs every few rounds)
    sends: list = field(default_factory=list)     # Send
    replies: list = field(default_factory=list)   # Reply
    out: np.ndarray | None = None    # where the replies go (a pull's values, a lead's answer)
    perm: np.ndarray | None = None   # a pull: the order of `out` in the caller's key order
    keys: np.ndarray | None = None   # a pull's keys in the order of `out`, to ask again
    flags: int = 0
    clock: int = 0                   # the worker's clock when it was sent
    version: int = 0                 # the placement its requests were sent by
    sent_by: int = 0                 # a pull: the placement its first parts were split by
    # A question to the lead: asks it of the next lead (returning that reply) should the
    # one asked die. None for the key-value table's requests.
    ask_next_lead: Callable[["Pending"], Reply] | None = None
    timeout: float | None = None     # if not the worker's

    @property
    def to_lead(self) -> bool:
        return self.ask_next_lead is not None

    def said(self) -> str:
        """What a wait for it waits for."""
        return self.what if isinstance(self.what, str) else self.what(self)


@dataclass(slots=True)
class Pulled:
    """A recent pull (not read-only), kept for the push of its keys that follows."""
    ts: int
    keys: np.ndarray              # the caller's array: a push of this very array reuses it
    perm: np.ndarray | None       # the split by servers (see Placement.split)
    offsets: np.ndarray
    version: int                  # the placement it was split by
    completed: bool = False       # waited for
    values: np.ndarray | None = None   # its values, once waited for
