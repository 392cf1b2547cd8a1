"""A worker's handle on the servers, after ps-lite's KVWorker.

    kv = KVWorker(roles)
    ts = kv.pull(keys)                     # keys: sorted unique uint64
    weights = kv.wait(ts)                  # float32[len(keys), width], in key order
    kv.wait(kv.push(keys, grads, clock=True))

pull and push start the transfer and return a timestamp at once; wait(ts)
completes it. A push with clock=True also completes the worker's clock (and
goes to every server, so each can track it); under BSP or SSP a server holds
a pull until the clocks allow it. Pushing the very array of keys passed to one
of the last two pulls (once waited for) sends only the values: the servers reuse
that pull's keys, so do not change a key array between its pull and its push.
"""
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from . import protocol
from .bounded import wait_all
from .errors import Stopped, WaitTimeout
from .kernels.hashing import is_sorted_unique
from .placement import Placement
from .protocol import Op


@dataclass
class _Pending:
    what: str
    requests: list          # sends, then (for a pull) the receives of the replies
    buffers: list = field(default_factory=list)
    out: np.ndarray | None = None
    perm: np.ndarray | None = None
    replies: int = 0        # how many of `requests`, at the end, are receives
    repliers: list = field(default_factory=list)   # the server rank of each reply


class KVWorker:
    def __init__(self, roles, width: int = 1, timeout: float = 600.0,
                 placement: Placement | None = None):
        """`placement`: the job's key placement (by default, an even split over the servers)."""
        self.width = width
        self.timeout = timeout
        self.clock = 0            # clocks this worker has completed
        self.bytes_sent = 0
        self.wait_s = 0.0         # time spent blocked in wait() on pulls
        self._comm = roles.comm
        self._servers = roles.servers
        self._placement = placement or Placement(len(roles.servers))
        self._reply_tags = protocol.reply_tags(roles.comm.Get_attr(MPI.TAG_UB))
        self._pending: dict[int, _Pending] = {}
        self._ts = 0
        self._report = None
        self._pulled = deque(maxlen=2)   # [ts, keys, perm, offsets, completed] of recent pulls
        self.stop_sent = False

    def report(self, examples: int, loss: float, progress: float, epoch: int = 0,
               offset: int = 0) -> None:
        """Figures carried by this worker's next clock push and its FINISH: examples trained
        on, their summed loss, epochs done (fractional), for the servers' progress lines; and
        where the next minibatch starts (epoch, byte offset or row), which checkpoints
        record."""
        self._report = protocol.Report(epoch, offset, examples, loss, progress)

    def _send(self, server_index: int, op: Op, payload=(), report: bool = False, **fields):
        h = protocol.Header(op, ts=self._ts, clock=self.clock,
                            placement=self._placement.version, **fields)
        buf = protocol.pack(h, *payload, report=self._report if report else None)
        self.bytes_sent += buf.nbytes
        req = self._comm.Isend(buf, self._servers[server_index], protocol.REQUEST_TAG)
        return req, buf

    def _reply_into(self, out: np.ndarray, server_index: int):
        tag = protocol.reply_tag(self._ts, self._reply_tags)
        return self._comm.Irecv(out, self._servers[server_index], tag)

    def _split(self, keys):
        if keys.dtype != np.uint64 or keys.ndim != 1:
            raise TypeError(f"keys must be a 1-d uint64 array, got {keys.dtype} {keys.shape}")
        if not is_sorted_unique(keys):
            raise ValueError("keys must be sorted and unique")
        perm, offsets = self._placement.split(keys)
        return perm, offsets, (keys if perm is None else keys[perm])

    def pull(self, keys: np.ndarray, read_only: bool = False, next_clock: bool = False) -> int:
        """Start reading the values of `keys`. With read_only, unknown keys read as zero
        without being stored. With next_clock, the read is for this worker's next clock, sent
        ahead of the push that completes the current one (prefetching): servers answer it
        once that push has arrived and the consistency model allows the next clock."""
        self._ts += 1
        perm, offsets, skeys = self._split(keys)
        if not read_only:
            self._pulled.append([self._ts, keys, perm, offsets, False])
        out = np.empty((keys.shape[0], self.width), np.float32)
        pending = _Pending(what="", requests=[], out=out, perm=perm)
        servers, replies = [], []
        for s in range(len(self._servers)):
            a, b = offsets[s], offsets[s + 1]
            if a == b:
                continue
            flags = ((protocol.READ_ONLY if read_only else 0)
                     | (protocol.NEXT_CLOCK if next_clock else 0))
            req, buf = self._send(s, Op.PULL, (skeys[a:b],), nkeys=b - a, flags=flags)
            pending.requests.append(req)
            replies.append(self._reply_into(out[a:b], s))
            pending.buffers.append(buf)
            servers.append(self._servers[s])
        pending.requests += replies
        pending.replies = len(replies)
        pending.repliers = servers
        pending.what = (f"the reply to pull #{self._ts} ({keys.shape[0]} keys, worker clock "
                        f"{self.clock + next_clock}) from server rank(s) {servers}; under BSP/SSP "
                        f"a server holds a pull until the slowest worker catches up")
        self._pending[self._ts] = pending
        return self._ts

    def push(self, keys: np.ndarray, values: np.ndarray, clock: bool = False) -> int:
        """Start sending values[len(keys), width] for `keys` to the servers' optimizers.
        With clock=True this push also completes the worker's current clock."""
        self._ts += 1
        # The latest completed pull of this very key array, if recent: its values are the ones
        # the pushed values were computed from. Each pull's keys serve one push.
        found = [i for i, p in enumerate(self._pulled) if p[1] is keys and p[4]]
        pulled = self._pulled[found[-1]] if found else None
        if found:
            del self._pulled[found[-1]]
        if pulled is None:
            perm, offsets, skeys = self._split(keys)
            flags, ref = 0, 0
        else:   # the keys of a recent pull: the servers still have them
            ref, _, perm, offsets, _ = pulled
            flags = protocol.SAME_KEYS
        values = np.ascontiguousarray(values, np.float32).reshape(keys.shape[0], self.width)
        svalues = values if perm is None else values[perm]
        pending = _Pending(what=f"push #{self._ts} to be sent", requests=[])
        if self._placement.replicas > 1:
            self._push_to_backups(keys, values, pending)
        for s in range(len(self._servers)):
            a, b = offsets[s], offsets[s + 1]
            if a == b and not clock:
                continue
            payload = (svalues[a:b],) if pulled else (skeys[a:b], svalues[a:b])
            req, buf = self._send(s, Op.PUSH, payload, report=clock, nkeys=b - a,
                                  width=self.width, ref=ref,
                                  flags=flags | (protocol.CLOCK if clock else 0))
            pending.requests.append(req)
            pending.buffers.append(buf)
        if clock:
            self.clock += 1
        self._pending[self._ts] = pending
        return self._ts

    def _push_to_backups(self, keys: np.ndarray, values: np.ndarray, pending: _Pending):
        """Send each server the part of a push it keeps a backup copy of, keys and values,
        ahead of its part as primary: every copy of a key sees the same pushes."""
        ranges = self._placement.ranges_of(keys)
        for s in range(len(self._servers)):
            mine = np.flatnonzero(self._placement.backup_ranges(s)[ranges])
            if mine.shape[0]:
                req, buf = self._send(s, Op.PUSH, (keys[mine], values[mine]),
                                      nkeys=mine.shape[0], width=self.width)
                pending.requests.append(req)
                pending.buffers.append(buf)

    def status(self, timeout: float | None = None) -> dict:
        """The first server's view of the workers' clocks (see protocol.STATUS_FIELDS)."""
        self._ts += 1
        out = np.empty(len(protocol.STATUS_FIELDS), np.int64)
        req, buf = self._send(0, Op.STATUS)
        wait_all([req, self._reply_into(out, 0)], timeout or self.timeout,
                 lambda: f"server rank {self._servers[0]} to report the workers' clocks")
        return dict(zip(protocol.STATUS_FIELDS, out.tolist()))

    def _who_is_slow(self) -> str:
        """What server 0 says of the slowest worker, for a message about a wait that ran out."""
        try:
            s = self.status(timeout=min(5.0, self.timeout))
        except WaitTimeout:
            return (f"; server rank {self._servers[0]} did not say which worker is slowest "
                    f"either (is it frozen?)")
        if s["slowest_worker"] < 0:
            return "; server 0 says every worker has finished"
        rank = len(self._servers) + s["slowest_worker"]
        return (f"; server 0 says the slowest is worker {s['slowest_worker']} (rank {rank}), at "
                f"clock {s['slowest_clock']}, silent for {s['slowest_silent_ms'] / 1000:.0f} s")

    def ask_to_stop(self) -> None:
        """Tell server 0 this rank was asked to stop (a signal): it stops the whole job at a
        clock every rank can reach, after a checkpoint."""
        self.stop_sent = True
        self._ts += 1
        req, buf = self._send(0, Op.STOP)
        self._pending[self._ts] = _Pending(what="the stop request to be sent", requests=[req],
                                           buffers=[buf])

    def wait(self, ts: int) -> np.ndarray | None:
        """Complete request `ts`; for a pull, return the values in the order of its keys."""
        pending = self._pending[ts]
        statuses = [MPI.Status() for _ in pending.requests]
        try:
            waited = wait_all(pending.requests, self.timeout, lambda: pending.what,
                              statuses=statuses)
        except WaitTimeout as e:
            if not pending.replies:
                raise
            silent = [rank for rank, r in zip(pending.repliers,
                                              pending.requests[-pending.replies:])
                      if not r.Test()]
            raise WaitTimeout(f"{e}; no reply yet from server rank(s) {silent}"
                              f"{self._who_is_slow()}") from None
        del self._pending[ts]  # only now: MPI may still write into the buffers until complete
        if pending.out is None:
            return None
        if pending.replies and any(st.Get_count(MPI.FLOAT) == 0
                                   for st in statuses[-pending.replies:]):
            raise Stopped("the servers stopped the job after writing a checkpoint")
        for p in self._pulled:
            if p[0] == ts:
                p[4] = True
        self.wait_s += waited
        if pending.perm is None:
            return pending.out
        values = np.empty_like(pending.out)
        values[pending.perm] = pending.out
        return values

    def _broadcast(self, op: Op):
        sends = [self._send(s, op, report=op is Op.FINISH) for s in range(len(self._servers))]
        wait_all([r for r, _ in sends], self.timeout,
                 lambda: f"the servers to receive {op.name}")

    def finish(self) -> None:
        """Tell the servers this worker advances no more clocks (others stop waiting for it)."""
        for ts in list(self._pending):
            self.wait(ts)
        self._broadcast(Op.FINISH)

    def close(self) -> None:
        """Complete outstanding requests and tell the servers this worker is done."""
        for ts in list(self._pending):
            try:
                self.wait(ts)
            except Stopped:
                pass   # a read sent ahead, refused because the job is stopping
        self._broadcast(Op.BYE)


def tell_servers_to_save(comm: MPI.Intracomm, servers, reason: str, timeout: float) -> None:
    """Tell each server in `servers` (ranks) that the job is failing, and wait until each has
    saved its shard and acknowledged. Used by a failing worker, or server for the others."""
    text = np.frombuffer(reason.encode("utf-8"), np.uint8)
    header = protocol.Header(Op.ERROR)
    message = protocol.pack(header, text)
    acks = np.zeros(len(servers), np.int64)
    requests = []
    for i, server in enumerate(servers):
        requests.append(comm.Isend(message, server, protocol.REQUEST_TAG))
        requests.append(comm.Irecv(acks[i:i + 1], server, protocol.ERROR_ACK_TAG))
    wait_all(requests, timeout,
             lambda: f"server rank(s) {list(servers)} to save their shards after an error")
