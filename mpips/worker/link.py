"""A worker's link to the servers (see Link), beneath its key-value requests (kvworker), its
conversation with the lead (lead_channel) and its dense tables (dense_client).
"""
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from ..base.errors import WaitTimeout
from ..ranks.bounded import wait_until
from ..ranks.ulfm import CannotFailOver, dead_ranks, is_failure
from ..wire import protocol, tags
from ..wire.placement import Placement, describe_ranges
from ..wire.protocol import Op
from .requests import Pending, Reply, Send

_FLOAT = MPI.FLOAT


class Link:
    """A worker's link to the servers: request timestamps, messages and their replies,
    bounded waits for them, and which servers died (under failover: the placement moves on).
    Shared by the key-value requests (KVWorker), the conversation with the lead (LeadChannel)
    and dense tables (DenseClient)."""

    def __init__(self, roles, timeout: float, placement: Placement | None, failover: bool):
        self.timeout = timeout
        self.failover = failover
        self.clock = 0            # clocks this worker has completed
        self.bytes_sent = 0
        self.comm = roles.comm
        self.servers = roles.servers
        self._placement = placement or Placement(len(roles.servers))
        self._reply_tags = protocol.reply_tags(roles.comm.Get_attr(MPI.TAG_UB))
        self._pending: dict[int, Pending] = {}
        self._ts = 0
        self._report: protocol.Report | None = None
        self._held: dict[int, Send] = {}   # server -> a pull held for the next push

    @property
    def placement(self) -> Placement:
        return self._placement

    def report(self, examples: int, loss: float, progress: float, epoch: int = 0,
               offset: int = 0, segment: int = 0, taken: Sequence[int] = ()) -> None:
        """Figures carried by this worker's next clock push and its FINISH: examples trained
        on, their summed loss, epochs done (fractional), for the servers' progress lines; and
        where the next minibatch starts (epoch, segment of the work plan, byte offset or
        row) and the epochs at which it took shares of dead workers' rows, which checkpoints
        record."""
        self._report = protocol.Report(epoch, offset, examples, loss, progress, segment,
                                       len(taken), taken[-1] if taken else 0)

    @property
    def reported(self):
        """The figures last given to `report` (a protocol.Report; None before any)."""
        return self._report

    def living(self) -> list:
        """The servers alive (indices), as this worker knows."""
        return list(self._placement.living)

    def rank_of(self, server: int) -> int:
        return self.servers[server]

    # Requests: a timestamp each, their messages, and their replies.

    def new_ts(self) -> int:
        """The next request's timestamp (its messages carry it; its replies' tag comes from
        it)."""
        self._ts += 1
        return self._ts

    def track(self, ts: int, pending: Pending) -> None:
        """Keep request `ts` until wait(ts)."""
        self._pending[ts] = pending

    def send(self, server_index: int, op: Op, payload=(), report: bool = False,
             hold: bool = False, flags: int = 0, nkeys: int = 0, width: int = 0,
             arg: int = 0) -> Send:
        """One message of request `self._ts` to a server (the header's fields but those the
        link knows). `hold` (a PULL): it travels with this worker's next PUSH that completes
        a clock to that server, in front of it (protocol.bundle: the server takes the push
        first), or alone if `send_held` is called first or another pull is held for that
        server."""
        figures = self._report if report else None
        if figures is not None:   # (set here: the header is not made twice)
            flags |= protocol.REPORT
        h = protocol.header_of(op, flags, self._ts, self.clock, nkeys, width,
                               self._placement.version, arg)
        clocked = op == Op.PUSH and flags & protocol.CLOCK
        pull = self._held.pop(server_index, None) if clocked else None
        if pull is not None:   # behind the pull (protocol.bundle)
            held = len(pull.buffer)
            pull.buffer = protocol.bundled(pull.buffer, h, *payload, report=figures)
            self.bytes_sent += len(pull.buffer) - held
            pull.request = self.comm.Isend(pull.buffer, self.servers[server_index],
                                           tags.REQUEST_TAG)
            return Send(pull.request, pull.buffer, server_index)
        buf = protocol.message(h, *payload, report=figures)
        self.bytes_sent += len(buf)
        if hold:
            earlier = self._held.pop(server_index, None)
            if earlier is not None:   # one pull rides a push: an earlier one goes alone
                self._send_alone(earlier)
            send = self._held[server_index] = Send(MPI.REQUEST_NULL, buf, server_index)
            return send
        return Send(self.comm.Isend(buf, self.servers[server_index], tags.REQUEST_TAG), buf,
                    server_index)

    def _send_alone(self, held: Send) -> None:
        held.request = self.comm.Isend(held.buffer, self.servers[held.server], tags.REQUEST_TAG)

    def send_held(self) -> None:
        """Send the pulls held for a push alone (no push is coming before they are needed)."""
        for send in self._held.values():
            self._send_alone(send)
        self._held.clear()

    def reply_into(self, into: np.ndarray, server_index: int, rows=None,
                   copy: bool = False) -> Reply:
        tag = protocol.reply_tag(self._ts, self._reply_tags)
        return Reply(self.comm.Irecv(into, self.servers[server_index], tag), server_index,
                     into, rows, copy)

    def call(self, op: Op, requests: dict, replies: dict, what: str) -> None:
        """One request of `op` (one timestamp) to each server in `requests`
        ({server: (header fields, payload arrays)}), then wait until each answered into
        `replies[server]`, an array the caller sized. For tables other than the key-value
        one (see dense_client). Under failover, a server that dies meanwhile is passed over (its
        entry left out of `replies`) and the placement moves on: the caller sees it."""
        self.new_ts()
        pending = Pending(what=what, version=self._placement.version)
        for s, (fields, payload) in requests.items():
            pending.sends.append(self.send(s, op, payload, **fields))
        for s, into in replies.items():
            pending.replies.append(self.reply_into(into, s))
        while True:
            try:
                if self._complete_unless_failed(pending) is not None:
                    break
            except WaitTimeout as e:
                raise WaitTimeout(f"{e}; {self._silent(pending)}") from None
            dead = self._placement.dead
            pending.sends = [p for p in pending.sends if p.server not in dead]
            pending.replies = [p for p in pending.replies if p.server not in dead or p.done]
        for server in set(replies) - {p.server for p in pending.replies}:
            del replies[server]
    def _silent(self, pending: Pending) -> str:
        """Which servers have not answered a request, for a message about a wait."""
        _tested(pending.replies)
        silent = [self.servers[r.server] for r in pending.replies if not r.done]
        return f"no reply yet from server rank(s) {silent}"

    def _complete(self, pending: Pending) -> float:
        """Wait until every part of a request is done; seconds waited. Each part is tested on
        its own: a Test takes a tenth of a Testall's time over a list (0.09 us against 0.73),
        and under ULFM a part that involves a dead server raises at once (a Testall would
        hide the failure until every other part is done), the others staying pending."""
        parts = [p for p in pending.sends if not p.done]
        parts += [p for p in pending.replies if not p.done]
        if _tested(parts):   # (as a send and a reply most often are, by the time they are waited)
            return 0.0
        return wait_until(lambda: _tested(parts), pending.timeout or self.timeout, pending.said)

    def refused(self, pending: Pending) -> bool:
        """Whether a server answered a completed request's read with no values (refused:
        key ranges moved, or the job stopped)."""
        for r in pending.replies:  # noqa: SIM110 (any() of a generator: twice the time)
            if r.status.Get_count(_FLOAT) == 0:
                return True
        return False

    def _complete_unless_failed(self, pending: Pending) -> float | None:
        """`_complete`, or None when a server died meanwhile (under failover: learned, the
        placement moved on, for the caller to repair the request)."""
        try:
            return self._complete(pending)
        except MPI.Exception as e:
            if not (self.failover and is_failure(e) and self._find_dead_servers()):
                raise
            return None

    def _find_dead_servers(self) -> bool:
        """After MPI told of a failure: which servers died; their keys' living copies take
        over (a new placement), or the job cannot go on. Whether a server died."""
        dead = dead_ranks(self.comm)
        gone = {s for s, rank in enumerate(self.servers) if rank in dead} - self._placement.dead
        if not gone:
            return False
        placement = self._placement = self._placement.without(gone)
        if placement.lost:
            raise CannotFailOver(f"every copy of key range(s) {describe_ranges(placement.lost)} "
                                 f"died with server(s) {sorted(placement.dead)}")
        return True


def _tested(parts: list) -> bool:
    """Test each of a request's parts (Send, Reply) not yet done; whether all are."""
    done = True
    for p in parts:
        if not p.done:
            p.done = p.request.Test(p.status)
            done = done and p.done
    return done
