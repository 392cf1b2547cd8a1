"""A server's messages out: every send is nonblocking, its buffer kept until MPI is done with
it (finished sends are reaped now and then, and waited for at the end). Replies go on the tag
their request's number gives (see protocol.reply_tag), a dense table's copies on one of
their own.
"""
import numpy as np
from mpi4py import MPI

from ..ranks.bounded import wait_all
from ..wire import protocol, tags

REAP_AT = 256   # sends in flight past which the finished ones are let go


class Outbox:
    def __init__(self, roles, stats, timeout: float):
        self.roles = roles
        self.stats = stats
        self.timeout = timeout
        self._reply_tags = protocol.reply_tags(roles.comm.Get_attr(MPI.TAG_UB))
        self._sending: list[tuple] = []   # (request, buffer, destination) of sends not finished

    def send(self, buf: np.ndarray, dest: int, tag: int = tags.REQUEST_TAG) -> None:
        self.stats.bytes_sent += buf.nbytes
        self._sending.append((self.roles.comm.Isend(buf, dest, tag), buf, dest))
        if len(self._sending) > REAP_AT:
            self.reap()

    def send_copy(self, buf: np.ndarray, server: int) -> None:
        """Blocks of a dense table to server `server` (index), on a tag of their own."""
        self.send(buf, self.roles.servers[server], tags.DENSE_COPY_TAG)

    def receive_copy(self, into: np.ndarray, server: int, what: str) -> None:
        """Blocks of a dense table from server `server`, waited for within --timeout."""
        wait_all([self.roles.comm.Irecv(into, self.roles.servers[server],
                                        tags.DENSE_COPY_TAG)], self.timeout, lambda: what)

    def reply(self, buf: np.ndarray, dest: int, ts: int) -> None:
        """Answer request `ts` of rank `dest`."""
        self.send(buf, dest, protocol.reply_tag(ts, self._reply_tags))

    def reap(self) -> None:
        if self._sending:   # (one MPI call for them all: a Test each took 0.3 us a send)
            done = MPI.Request.Testsome([r for r, _, _ in self._sending])
            if done:
                finished = set(done)
                self._sending = [s for i, s in enumerate(self._sending) if i not in finished]

    def forget(self, ranks: set) -> None:
        """Dead ranks: the sends to them are not waited for."""
        self._sending = [(r, b, dest) for r, b, dest in self._sending if dest not in ranks]

    def wait(self) -> None:
        """Until every send has finished (within --timeout)."""
        wait_all([r for r, _, _ in self._sending], self.timeout, lambda: "replies to be sent")
