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
that pull's keys, so do not change a key array between its pull and its push. A push filter
(see pushfilter) decides what of the values is sent, and how.
"""
import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from ..data.workplan import Handover
from ..wire import protocol
from ..wire import tags
from ..ranks.bounded import wait_all, wait_until
from ..base.errors import ProtocolError, Stopped, WaitTimeout
from ..ranks.ulfm import CannotFailOver, dead_ranks, is_failure
from ..kernels.hashing import is_sorted_unique
from ..wire.placement import Placement, describe_ranges
from ..wire.protocol import Op
from .pushfilter import Plain

log = logging.getLogger("mpips")


@dataclass
class _Send:
    request: MPI.Request
    buffer: np.ndarray
    server: int                   # index of the server it goes to
    done: bool = False


@dataclass
class _Reply:
    request: MPI.Request
    server: int                   # index of the server that answers
    into: np.ndarray              # the receive buffer
    rows: object                  # the rows of the pull's output it answers (slice or indices)
    copy: bool = False            # whether `into` is a buffer of its own, copied out after
    done: bool = False
    status: MPI.Status = field(default_factory=MPI.Status)


@dataclass
class _Pending:
    what: str
    sends: list = field(default_factory=list)     # _Send
    replies: list = field(default_factory=list)   # _Reply of a pull
    out: np.ndarray | None = None
    perm: np.ndarray | None = None
    keys: np.ndarray | None = None   # a pull's keys in the order of `out`, to ask again
    flags: int = 0
    clock: int = 0                   # the worker's clock when it was sent
    version: int = 0                 # the placement its requests were sent by
    sent_by: int = 0                 # a pull: the placement its first parts were split by
    lead_op: Op | None = None        # a question to the lead: asked of the next should it die
    timeout: float | None = None     # if not the worker's


class KVWorker:
    def __init__(self, roles, width: int = 1, timeout: float = 600.0,
                 placement: Placement | None = None, failover: bool = False,
                 push_filter=None):
        """`placement`: the job's key placement (by default, an even split over the servers).
        `failover` (under ULFM): a dead server's requests go to the living copies of its keys
        instead of failing the job. `push_filter`: what pushes send (a pushfilter.PushFilter;
        by default every value, float32)."""
        self.width = width
        self.filter = push_filter or Plain()
        self.timeout = timeout
        self.failover = failover
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
        # [ts, keys, perm, offsets, completed, placement version, values] of recent pulls
        self._pulled = deque(maxlen=2)
        self._backups = None      # (placement version, what `_backs_up` found for it)
        self.stop_sent = False
        self.asked_to_leave = False   # the lead said LEAVE_NOTICE (see notices)
        self.asked_to_give = None     # (joiner, weight) of a GIVE_NOTICE not yet acted on
        self.join_clock = None        # the clock of a JOIN_NOTICE not yet acted on

    @property
    def placement(self) -> Placement:
        return self._placement

    def report(self, examples: int, loss: float, progress: float, epoch: int = 0,
               offset: int = 0, segment: int = 0, taken: tuple = ()) -> None:
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
        return [s for s in range(len(self._servers)) if s not in self._placement.dead]

    def _lead(self) -> int:
        """The server that leads: server 0, or after it died the first living one."""
        return self.living()[0]

    def _send(self, server_index: int, op: Op, payload=(), report: bool = False, **fields):
        h = protocol.Header(op, ts=self._ts, clock=self.clock,
                            placement=self._placement.version, **fields)
        buf = protocol.pack(h, *payload, report=self._report if report else None)
        self.bytes_sent += buf.nbytes
        req = self._comm.Isend(buf, self._servers[server_index], tags.REQUEST_TAG)
        return _Send(req, buf, server_index)

    def _reply_into(self, into: np.ndarray, server_index: int, rows=None,
                    copy: bool = False) -> _Reply:
        tag = protocol.reply_tag(self._ts, self._reply_tags)
        return _Reply(self._comm.Irecv(into, self._servers[server_index], tag), server_index,
                      into, rows, copy)

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
            self._pulled.append([self._ts, keys, perm, offsets, False, self._placement.version,
                                 None])
        flags = ((protocol.READ_ONLY if read_only else 0)
                 | (protocol.NEXT_CLOCK if next_clock else 0))
        out = np.empty((keys.shape[0], self.width), np.float32)
        pending = _Pending(what="", out=out, perm=perm, keys=skeys, flags=flags,
                           clock=self.clock, version=self._placement.version,
                           sent_by=self._placement.version)
        for s in self.living():
            a, b = offsets[s], offsets[s + 1]
            if a < b:
                pending.sends.append(self._send(s, Op.PULL, (skeys[a:b],), nkeys=b - a,
                                                flags=flags))
                pending.replies.append(self._reply_into(out[a:b], s, slice(a, b)))
        servers = [self._servers[r.server] for r in pending.replies]
        pending.what = (f"the reply to pull #{self._ts} ({keys.shape[0]} keys, worker clock "
                        f"{self.clock + next_clock}) from server rank(s) {servers}; under BSP/SSP "
                        f"a server holds a pull until the slowest worker catches up")
        self._pending[self._ts] = pending
        return self._ts

    def push(self, keys: np.ndarray, values: np.ndarray, clock: bool = False,
             flush: bool = False) -> int:
        """Start sending values[len(keys), width] for `keys` to the servers' optimizers.
        With clock=True this push also completes the worker's current clock. With flush (the
        worker's last push) it also delivers what the push filter holds back of other keys:
        one push, so that the clocks count it as every other."""
        self._ts += 1
        values = np.ascontiguousarray(values, np.float32).reshape(keys.shape[0], self.width)
        # The latest completed pull of this very key array, if recent and split as this push
        # is: its values are the ones the pushed values were computed from. Each pull's keys
        # serve one push.
        found = [i for i, p in enumerate(self._pulled) if p[1] is keys and p[4]]
        pulled = self._pulled[found[-1]] if found else None
        if found:
            del self._pulled[found[-1]]
        # The pulled weights: the push filter's, wherever the keys are now.
        weights = None if pulled is None else pulled[6]
        if pulled is not None and pulled[5] != self._placement.version:
            pulled = None   # a server died since: the rows are elsewhere now
        if flush:
            pushed, values = self.filter.flushing(keys, values)
            if pushed is not keys:   # more keys than the pull's: they go on the wire
                keys, pulled, weights = pushed, None, None
        if pulled is None:
            perm, offsets, skeys = self._split(keys)
            flags, ref = 0, 0
        else:   # the keys of a recent pull: the servers still have them
            ref, _, perm, offsets = pulled[:4]
            flags = protocol.SAME_KEYS
            skeys = None
        out = self.filter.prepare(keys, values, perm, offsets, weights, flush=flush)
        if skeys is None and self._placement.has_backups:
            skeys = keys if perm is None else keys[perm]
        if skeys is not None and out.skept is not None:   # the keys of the rows sent
            skeys = skeys[out.skept]
        pending = _Pending(what=f"push #{self._ts} to be sent", version=self._placement.version)
        backups = {}
        if self._placement.has_backups:
            kept = slice(None) if out.kept is None else out.kept
            backups = self._backup_parts(keys[kept], out.values[kept], skeys, out.svalues,
                                         out.offsets)
        for s in self.living():
            a, b = offsets[s], offsets[s + 1]
            sa, sb = out.offsets[s], out.offsets[s + 1]
            parts = backups.get(s, [])
            for bkeys, bvalues in parts[1:]:   # (several primaries backed up: R > 2)
                pending.sends.append(self._send(s, Op.PUSH, (bkeys, bvalues),
                                                nkeys=bkeys.shape[0], width=self.width))
            if sa == sb and not clock and not parts:
                continue
            encoding, own_values = out.parts[s]
            own_keys, nkeys = ((skeys[sa:sb],), sb - sa) if pulled is None else ((), b - a)
            if pulled is not None and sb - sa < b - a:   # some rows held back
                own_keys, encoding = (protocol.bitmap(out.skept[a:b]),), encoding | protocol.MASK
            payload = (*own_keys, own_values)
            if parts:   # one message: the backed-up part first (see protocol.unpack)
                bkeys, bvalues = parts[0]
                payload = (np.array([bkeys.shape[0]], np.int64), bkeys, *own_keys, bvalues,
                           own_values)
            pending.sends.append(self._send(
                s, Op.PUSH, payload, report=clock, nkeys=nkeys, width=self.width, ref=ref,
                flags=(flags | encoding | (protocol.CLOCK if clock else 0)
                       | (protocol.BACKUP if parts else 0))))
        if clock:
            self.clock += 1
        self._pending[self._ts] = pending
        return self._ts

    def _backup_parts(self, keys: np.ndarray, values: np.ndarray, skeys: np.ndarray,
                      svalues: np.ndarray, offsets: np.ndarray) -> dict:
        """{server: [(keys, values)]}: the parts of a push each server keeps a backup copy of,
        each in key order. Keys come grouped by primary (`skeys`, `offsets`): when each server
        backs up whole primaries' parts, as it does until a server dies, its parts are slices
        of them."""
        backs = self._backs_up()
        parts = {}
        if backs is None:   # a primary whose ranges have different backups: key by key
            ranges = self._placement.ranges_of(keys)
            for t in self.living():
                mine = np.flatnonzero(self._placement.backup_ranges(t)[ranges])
                if mine.shape[0]:
                    parts[t] = [(keys[mine], values[mine])]
            return parts
        for t, primaries in backs.items():
            slices = [(offsets[s], offsets[s + 1]) for s in primaries]
            parts[t] = [(skeys[a:b], svalues[a:b]) for a, b in slices if a < b]
        return {t: p for t, p in parts.items() if p}

    def _backs_up(self) -> dict | None:
        """{server: the primaries whose every range it backs up}, for the current placement;
        None if some server backs up part of a primary's ranges only."""
        p = self._placement
        if self._backups is not None and self._backups[0] == p.version:
            return self._backups[1]
        backs = {t: [] for t in self.living()}
        for s in self.living():
            mine = p.primary_ranges(s)
            for t in backs:
                held = p.backup_ranges(t)[mine]
                if held.any() and not held.all():
                    backs = None
                    break
                if held.any():
                    backs[t].append(s)
            if backs is None:
                break
        self._backups = (p.version, backs)
        return backs

    def call(self, op: Op, requests: dict, replies: dict, what: str) -> None:
        """One request of `op` (one timestamp) to each server in `requests`
        ({server: (header fields, payload arrays)}), then wait until each answered into
        `replies[server]`, an array the caller sized. For tables other than the key-value
        one (see dense). Under failover, a server that dies meanwhile is passed over (its
        entry left out of `replies`) and the placement moves on: the caller sees it."""
        self._ts += 1
        pending = _Pending(what=what, version=self._placement.version)
        for s, (fields, payload) in requests.items():
            pending.sends.append(self._send(s, op, payload, **fields))
        for s, into in replies.items():
            pending.replies.append(self._reply_into(into, s))
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

    def status(self, timeout: float | None = None) -> dict:
        """The lead server's view of the workers' clocks (see protocol.STATUS_FIELDS)."""
        out = np.empty(len(protocol.STATUS_FIELDS), np.int64)
        self.wait(self._ask_lead(Op.STATUS, out, "to report the workers' clocks", timeout))
        return dict(zip(protocol.STATUS_FIELDS, out.tolist()))

    def test_chunk(self) -> int:
        """Start asking the lead which chunk of the test file to score next (see
        testscoring); wait(ts) gives it, as int64 (start, stop): equal once none is left."""
        return self._ask_lead(Op.CHUNK, np.empty(2, np.int64), "to hand out a chunk of the "
                                                               "test rows")

    def _ask_lead(self, op: Op, out: np.ndarray, what: str, timeout: float | None = None) -> int:
        """Start asking the lead server `op`, its answer into `out`; wait(ts) completes it.
        Should the lead die meanwhile (under failover), the next lead is asked."""
        self._ts += 1
        lead = self._lead()
        self._pending[self._ts] = _Pending(
            what=f"server rank {self._servers[lead]} {what}", sends=[self._send(lead, op)],
            replies=[self._reply_into(out, lead)], out=out, version=self._placement.version,
            lead_op=op, timeout=timeout)
        return self._ts

    def notices(self) -> list:
        """The deaths the lead server has told this worker of since the last call: (number,
        workplan.Handover), in the order they arrived. A notice to leave, to give rows to a worker
        that joins or to join sets `asked_to_leave`, `asked_to_give` or `join_clock`."""
        out = []
        status = MPI.Status()
        while True:
            try:
                if not self._comm.Iprobe(MPI.ANY_SOURCE, tags.NOTICE_TAG, status):
                    return out
            except MPI.Exception as e:   # under ULFM: a death not yet acknowledged
                if not is_failure(e):
                    raise
                dead_ranks(self._comm)
                continue
            fields = np.empty(status.Get_count(MPI.BYTE) // 8, np.int64)
            self._comm.Recv(fields, status.Get_source(), tags.NOTICE_TAG)
            if status.Get_source() not in self._servers:
                raise ProtocolError(f"rank {status.Get_source()}, not a server, sent this worker "
                                    f"a notice")
            kind = int(fields[0]) if fields.shape[0] else 0
            if kind == protocol.LEAVE_NOTICE and fields.shape[0] == 1:
                self.asked_to_leave = True
                continue
            if kind == protocol.GIVE_NOTICE and fields.shape[0] == 3 and fields[2] > 0:
                self.asked_to_give = (int(fields[1]), int(fields[2]))
                continue
            if kind == protocol.JOIN_NOTICE and fields.shape[0] == 2 and fields[1] >= 0:
                self.join_clock = int(fields[1])
                continue
            try:
                out.append((int(fields[0]), Handover.of_fields(fields[1:])))
            except (ValueError, IndexError) as e:
                raise ProtocolError(f"rank {status.Get_source()} sent a notice that holds no "
                                    f"death: {e}") from None

    def _who_is_slow(self) -> str:
        """What the lead server says of the slowest worker, for a message about a wait that
        ran out."""
        try:
            s = self.status(timeout=min(5.0, self.timeout))
        except WaitTimeout:
            return (f"; server rank {self._servers[self._lead()]} did not say which worker is "
                    f"slowest either (is it frozen?)")
        if s["slowest_worker"] < 0:
            return f"; server {self._lead()} says every worker has finished"
        rank = len(self._servers) + s["slowest_worker"]
        return (f"; server {self._lead()} says the slowest is worker {s['slowest_worker']} "
                f"(rank {rank}), at "
                f"clock {s['slowest_clock']}, silent for {s['slowest_silent_ms'] / 1000:.0f} s")

    def split(self, fields: np.ndarray) -> None:
        """Tell the lead this worker split its rows left with the worker joining (a
        Handover.fields()): it numbers the split and tells every worker."""
        self.asked_to_give = None
        self._ts += 1
        self._pending[self._ts] = _Pending(
            what="this worker's split of its rows to be sent",
            sends=[self._send(self._lead(), Op.SPLIT, (fields,), nkeys=fields.shape[0])],
            version=self._placement.version)

    def ask_to_stop(self) -> None:
        """Tell server 0 this rank was asked to stop (a signal): it stops the whole job at a
        clock every rank can reach, after a checkpoint."""
        log.info("asked to stop (a signal): telling the lead server")
        self.stop_sent = True
        self._ts += 1
        self._pending[self._ts] = _Pending(what="the stop request to be sent",
                                           sends=[self._send(self._lead(), Op.STOP)],
                                           version=self._placement.version)

    def wait(self, ts: int) -> np.ndarray | None:
        """Complete request `ts`; for a pull, return the values in the order of its keys."""
        pending = self._pending[ts]
        while True:
            if pending.version != self._placement.version:
                self._repair(pending)
            try:
                waited = self._complete_unless_failed(pending)
                if waited is None:
                    continue
            except WaitTimeout as e:
                if not pending.replies:
                    raise
                slow = self._who_is_slow() if pending.lead_op is None else ""
                raise WaitTimeout(f"{e}; {self._silent(pending)}{slow}") from None
            if pending.out is not None and any(r.status.Get_count(MPI.FLOAT) == 0
                                               for r in pending.replies):
                # Refused: key ranges moved (read again from their owners), or the job stopped.
                if not self._moved_on(pending.sent_by):
                    del self._pending[ts]
                    raise Stopped("the servers stopped the job after writing a checkpoint")
                self._ask_owners(pending)
                continue
            break
        del self._pending[ts]  # only now: MPI may still write into the buffers until complete
        if pending.out is None:
            return None
        for r in pending.replies:
            if r.copy:
                pending.out[r.rows] = r.into
        if pending.lead_op is None:   # a pull's
            self.wait_s += waited
        values = pending.out
        if pending.perm is not None:
            values = np.empty_like(pending.out)
            values[pending.perm] = pending.out
        for p in self._pulled:
            if p[0] == ts:
                p[4], p[6] = True, values
        return values

    def _silent(self, pending: _Pending) -> str:
        """Which servers have not answered a request, for a message about a wait."""
        for r in pending.replies:
            r.done = r.done or r.request.Test(r.status)
        silent = [self._servers[r.server] for r in pending.replies if not r.done]
        return f"no reply yet from server rank(s) {silent}"

    def _complete(self, pending: _Pending) -> float:
        """Wait until every part of a request is done; seconds waited. Under ULFM each part
        is polled on its own: a part that involves a dead server raises at once (a Testall
        would hide the failure until every other part is done), and the others stay
        pending."""
        parts = [p for p in pending.sends + pending.replies if not p.done]
        timeout = pending.timeout or self.timeout
        if not self.failover:
            statuses = [p.status if isinstance(p, _Reply) else MPI.Status() for p in parts]
            waited = wait_all([p.request for p in parts], timeout, lambda: pending.what,
                              statuses=statuses)
            for p in parts:
                p.done = True
            return waited

        def poll() -> bool:
            for p in parts:
                if not p.done:
                    p.done = p.request.Test(p.status if isinstance(p, _Reply) else None)
            return all(p.done for p in parts)
        return wait_until(poll, timeout, lambda: pending.what)

    def _complete_unless_failed(self, pending: _Pending) -> float | None:
        """`_complete`, or None when a server died meanwhile (under failover: learned, the
        placement moved on, for the caller to repair the request)."""
        try:
            return self._complete(pending)
        except MPI.Exception as e:
            if not (self.failover and is_failure(e) and self._learn_failures()):
                raise
            return None

    def _learn_failures(self) -> bool:
        """After MPI told of a failure: which servers died; their keys' living copies take
        over (a new placement), or the job cannot go on. Whether a server died."""
        dead = dead_ranks(self._comm)
        gone = {s for s, rank in enumerate(self._servers) if rank in dead} - self._placement.dead
        if not gone:
            return False
        placement = self._placement = self._placement.without(gone)
        if placement.lost:
            raise CannotFailOver(f"every copy of key range(s) {describe_ranges(placement.lost)} "
                                 f"died with server(s) {sorted(placement.dead)}")
        return True

    def _repair(self, pending: _Pending) -> None:
        """Drop a request's parts that went to servers that died since it was sent, and ask
        the living copies for the values a dead server did not send."""
        dead = self._placement.dead
        pending.sends = [send for send in pending.sends if send.server not in dead]
        living = []
        for r in pending.replies:
            if r.server not in dead or r.done:   # (a dead server may have answered first)
                living.append(r)
                continue
            if pending.lead_op is not None:
                living.append(self._ask_lead_again(pending))
                continue
            living += self._ask_again(pending, np.arange(pending.out.shape[0])[r.rows])
        pending.replies = living
        pending.version = self._placement.version

    def _ask_lead_again(self, pending: _Pending) -> _Reply:
        """Ask the lead now (the one asked died) what `pending` asked; its reply."""
        self._ts += 1
        lead = self._lead()
        pending.sends.append(self._send(lead, pending.lead_op))
        return self._reply_into(pending.out, lead)

    def _moved_on(self, version: int) -> bool:
        """A read split by placement `version` was refused: whether key ranges moved since
        (the new placement learned from the lead, which answers once the move is over), or
        the job stopped."""
        if self._placement.version > version:
            return True
        self._ts += 1
        p = self._placement
        answer = np.empty(3 + p.n_ranges * (1 + p.replicas), np.int64)
        lead = self._lead()
        wait_all([self._send(lead, Op.PLACEMENT, ref=version).request,
                  self._reply_into(answer, lead).request],
                 self.timeout, lambda: f"server rank {self._servers[lead]} (the lead) to say "
                                       f"whether key ranges moved or the job stopped")
        kind, new_version = int(answer[0]), int(answer[1])
        if kind == 0:
            return False
        if new_version <= p.version:
            return True   # learned already
        q = p.n_ranges
        extra = Placement.extra_of(answer[3 + q:].reshape(q, p.replicas))
        self._placement = Placement(p.n_servers, p.replicas, p.nodes, version=new_version,
                                    dead=p.dead, assign=answer[3:3 + q].tolist(), extra=extra)
        if extra:
            log.info("key ranges are being copied to new holders (placement version %d): "
                     "sending them their part of each push", new_version)
        else:
            log.info("key ranges moved at clock %d (placement version %d): reading from their "
                     "new owners", int(answer[2]), new_version)
        return True

    def _ask_owners(self, pending: _Pending) -> None:
        """A read refused because key ranges moved: all its keys asked again of their owners
        under the current placement."""
        pending.sends = []
        pending.replies = self._ask_again(pending, np.arange(pending.keys.shape[0]))
        pending.version = pending.sent_by = self._placement.version

    def _ask_again(self, pending: _Pending, rows: np.ndarray) -> list:
        """Send the keys at `rows` of a pull (its output's rows) to their primaries under the
        current placement, as one new request; their replies, copied into place on arrival."""
        keys, p = pending.keys[rows], self._placement
        owners = p.owners(keys)
        order = np.lexsort((keys, owners))   # by owner, each owner's keys sorted
        starts = np.searchsorted(owners[order], np.arange(p.n_servers + 1))
        flags = pending.flags
        if self.clock > pending.clock:   # a read sent ahead, now for the current clock
            flags &= ~protocol.NEXT_CLOCK
        self._ts += 1
        replies = []
        for s in range(p.n_servers):
            a, b = starts[s], starts[s + 1]
            if a < b:
                part = order[a:b]
                pending.sends.append(self._send(s, Op.PULL, (keys[part],), nkeys=b - a,
                                                flags=flags))
                replies.append(self._reply_into(np.empty((b - a, self.width), np.float32), s,
                                                rows[part], True))
        return replies

    def _broadcast(self, op: Op):
        pending = _Pending(what=f"the servers to receive {op.name}",
                           sends=[self._send(s, op, report=op is Op.FINISH)
                                  for s in self.living()], version=self._placement.version)
        while True:
            if pending.version != self._placement.version:
                self._repair(pending)
            if self._complete_unless_failed(pending) is not None:
                return

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
