"""A worker's handle on the servers, after ps-lite's KVWorker.

    kv = KVWorker(roles)
    ts = kv.pull(keys)                     # keys: sorted unique uint64
    weights = kv.wait(ts)                  # float32[len(keys), width], in key order
    kv.wait(kv.push(keys, grads, clock=True))
    ahead = kv.pull(next_keys, with_push=True)   # travels with the next clock's push

pull and push start the transfer and return a timestamp at once; wait(ts)
completes it. A push with clock=True also completes the worker's clock (and
goes to every server, so each can track it); under BSP or SSP a server holds
a pull until the clocks allow it. Pushing the very array of keys passed to one
of the last two pulls (once waited for) sends only the values: the servers reuse
that pull's keys, so do not change a key array between its pull and its push. A push filter
(see pushfilter) decides what of the values is sent, and how. Under failover, a request a dead
server was to answer goes to the living copies of its keys; a read refused because key ranges
moved is asked again of their owners. The conversation with the lead server (status, chunks,
notices, splits, stops) is `kv.lead` (see lead_channel).
"""
import logging
from collections import deque

import numpy as np

from ..base.errors import Stopped, WaitTimeout
from ..kernels.hashing import is_sorted_unique
from ..ranks.bounded import wait_all
from ..wire import protocol
from ..wire.messages import PlacementAnswer, placement_question, same_keys_push
from ..wire.placement import Placement
from ..wire.protocol import Op
from .backups import BackupParts
from .lead_channel import LeadChannel
from .link import Link
from .pushfilter import Outgoing, Plain
from .requests import Pending, Pulled

log = logging.getLogger("mpips")


_NO_PARTS: list = []
_NO_FIELDS: dict = {}


class KVWorker(Link):
    def __init__(self, roles, width: int = 1, timeout: float = 600.0,
                 placement: Placement | None = None, failover: bool = False,
                 push_filter=None):
        """`placement`: the job's key placement (by default, an even split over the servers).
        `failover` (under ULFM): a dead server's requests go to the living copies of its keys
        instead of failing the job. `push_filter`: what pushes send (a pushfilter.PushFilter;
        by default every value, float32)."""
        super().__init__(roles, timeout, placement, failover)
        self.width = width
        self.filter = push_filter or Plain()
        self.wait_s = 0.0         # time spent blocked in wait() on pulls
        self._pulled: deque[Pulled] = deque(maxlen=2)   # the recent pulls
        self._backups = BackupParts()
        self.lead = LeadChannel(self)

    def _by_server(self, keys):
        if keys.dtype != np.uint64 or keys.ndim != 1:
            raise TypeError(f"keys must be a 1-d uint64 array, got {keys.dtype} {keys.shape}")
        if not is_sorted_unique(keys):
            raise ValueError("keys must be sorted and unique")
        perm, offsets = self._placement.by_server(keys)
        return perm, offsets, (keys if perm is None else keys[perm])

    # The data plane: pull, push, wait.

    def pull(self, keys: np.ndarray, read_only: bool = False, next_clock: bool = False,
             with_push: bool = False) -> int:
        """Start reading the values of `keys`. With read_only, unknown keys read as zero
        without being stored. With next_clock, the read is for this worker's next clock, sent
        ahead of the push that completes the current one (prefetching): servers answer it
        once that push has arrived and the consistency model allows the next clock. With
        with_push, the same read travels with that push instead, one message to each server
        (ps-lite's and BytePS's push-pull): its messages are made now and held until the
        push, which a server takes first, holding the read until the clocks allow it. Waited
        for before any push, it goes alone and reads the current clock. Under failover, where
        a request is repaired on its own, it is sent ahead as with next_clock."""
        if with_push and self.failover:
            with_push, next_clock = False, True
        ts = self.new_ts()
        perm, offsets, skeys = self._by_server(keys)
        version = self._placement.version
        if not read_only:
            self._pulled.append(Pulled(ts, keys, perm, offsets, version))
        flags = ((protocol.READ_ONLY if read_only else 0)
                 | (protocol.NEXT_CLOCK if next_clock else 0))
        out = np.empty((keys.shape[0], self.width), np.float32)
        ahead = next_clock or with_push
        pending = Pending(lambda p: self._pull_said(p, ts, keys, ahead),
                          [], [], out, perm, skeys, flags, self.clock, version, version)
        bounds = offsets.tolist()
        for s in self._placement.living:
            a, b = bounds[s], bounds[s + 1]
            if a < b:
                pending.sends.append(self.send(s, Op.PULL, (skeys[a:b],), nkeys=b - a,
                                               flags=flags, hold=with_push))
                pending.replies.append(self.reply_into(out[a:b], s, slice(a, b)))
        self._pending[ts] = pending
        return ts

    def _pull_said(self, pending: Pending, ts: int, keys: np.ndarray, next_clock: bool) -> str:
        """What a wait for pull `ts` waits for."""
        servers = [self.servers[r.server] for r in pending.replies]
        return (f"the reply to pull #{ts} ({keys.shape[0]} keys, worker clock "
                f"{pending.clock + next_clock}) from server rank(s) {servers}; under BSP/SSP a "
                f"server holds a pull until the slowest worker catches up")

    def _pulled_for(self, keys: np.ndarray) -> tuple:
        """(the latest completed pull of this very key array, if recent and split as a push
        now is, else None; its values, if recent, wherever the keys are now). Its values are
        the ones the pushed values were computed from. Each pull's keys serve one push."""
        recent = self._pulled
        for i in range(len(recent) - 1, -1, -1):
            pulled = recent[i]
            if pulled.keys is keys and pulled.completed:
                del recent[i]
                if pulled.version != self._placement.version:
                    return None, pulled.values   # a server died since: the rows are elsewhere
                return pulled, pulled.values
        return None, None

    def push(self, keys: np.ndarray, values: np.ndarray, clock: bool = False,
             flush: bool = False) -> int:
        """Start sending values[len(keys), width] for `keys` to the servers' optimizers.
        With clock=True this push also completes the worker's current clock. With flush (the
        worker's last push) it also delivers what the push filter holds back of other keys:
        one push, so that the clocks count it as every other."""
        ts = self.new_ts()
        values = np.ascontiguousarray(values, np.float32).reshape(keys.shape[0], self.width)
        pulled, weights = self._pulled_for(keys)   # weights: for the push filter
        if flush:
            pushed, values = self.filter.flushing(keys, values)
            if pushed is not keys:   # more keys than the pull's: they go on the wire
                keys, pulled, weights = pushed, None, None
        if pulled is None:
            perm, offsets, skeys = self._by_server(keys)
        else:   # the keys of a recent pull: the servers still have them
            perm, offsets, skeys = pulled.perm, pulled.offsets, None
        out = self.filter.prepare(keys, values, perm, offsets, weights, flush=flush)
        if skeys is None and self._placement.has_backups:
            skeys = keys if perm is None else keys[perm]
        if skeys is not None and out.skept is not None:   # the keys of the rows sent
            skeys = skeys[out.skept]
        pending = Pending(lambda _: f"push #{ts} to be sent", version=self._placement.version)
        backups = {}
        if self._placement.has_backups:
            kept = slice(None) if out.kept is None else out.kept
            backups = self._backups.of(self._placement, self.living(), keys[kept],
                                       out.values[kept], skeys, out.svalues, out.offsets)
        bounds, sbounds = offsets.tolist(), out.offsets.tolist()
        for s in self._placement.living:
            pending.sends += self._push_to(s, pulled, bounds[s], bounds[s + 1], out,
                                           sbounds[s], sbounds[s + 1], skeys,
                                           backups.get(s, _NO_PARTS), clock)
        if clock:
            self.clock += 1
        self._pending[ts] = pending
        return ts

    def _push_to(self, s: int, pulled: Pulled | None, a: int, b: int, out: Outgoing,
                 sa: int, sb: int, skeys, parts: list, clock: bool) -> list:
        """The messages of a push to server `s`: what the push filter sends (`out`) of the
        push's rows a:b, rows sa:sb of what it sends (in server order), the `parts` it backs
        up (see backups), and the clock."""
        sends = []
        for bkeys, bvalues in parts[1:]:   # (several primaries backed up: R > 2)
            sends.append(self.send(s, Op.PUSH, (bkeys, bvalues), nkeys=bkeys.shape[0],
                                   width=self.width))
        if sa == sb and not clock and not parts:
            return sends
        encoding, own_values = out.parts[s]
        own_keys: tuple
        if pulled is None:
            own_keys, nkeys, fields = (skeys[sa:sb],), sb - sa, _NO_FIELDS
        else:
            own_keys, nkeys, fields = (), b - a, same_keys_push(pulled.ts)
            if sb - sa < nkeys:   # some rows held back
                assert out.skept is not None, "a push filter that holds rows back says which"
                own_keys, encoding = (protocol.bitmap(out.skept[a:b]),), encoding | protocol.MASK
        payload: tuple = (*own_keys, own_values)
        if parts:   # one message: the backed-up part first (see protocol.unpack)
            bkeys, bvalues = parts[0]
            payload = (np.array([bkeys.shape[0]], np.int64), bkeys, *own_keys, bvalues,
                       own_values)
        flags = ((0 if pulled is None else protocol.SAME_KEYS) | encoding
                 | (protocol.CLOCK if clock else 0) | (protocol.BACKUP if parts else 0))
        sends.append(self.send(s, Op.PUSH, payload, report=clock, nkeys=nkeys, width=self.width,
                               flags=flags, **fields))
        return sends

    def wait(self, ts: int) -> np.ndarray | None:
        """Complete request `ts`; for a pull, return the values in the order of its keys."""
        pending = self._pending[ts]
        if self._held:
            for send in pending.sends:
                if self._held.get(send.server) is send:
                    self.send_held()   # a pull held for a push that has not come: alone
                    break
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
                slow = "" if pending.to_lead else self.lead.who_is_slow()
                raise WaitTimeout(f"{e}; {self._silent(pending)}{slow}") from None
            if pending.out is not None and self.refused(pending):
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
        return self._values(ts, pending, waited)

    def _values(self, ts: int, pending: Pending, waited: float) -> np.ndarray:
        """The answer to completed request `ts`: a pull's values in the order of its keys (kept
        for the push that follows), or what the lead said."""
        out = pending.out
        assert out is not None, "wait() answers requests without an output before this"
        for r in pending.replies:
            if r.copy:
                out[r.rows] = r.into
        if not pending.to_lead:   # a pull's
            self.wait_s += waited
        values = out
        if pending.perm is not None:
            values = np.empty_like(out)
            values[pending.perm] = out
        for p in self._pulled:
            if p.ts == ts:
                p.completed, p.values = True, values
        return values

    # Failover: servers that died, and key ranges that moved.

    def _repair(self, pending: Pending) -> None:
        """Drop a request's parts that went to servers that died since it was sent, and ask
        the living copies for the values a dead server did not send."""
        dead = self._placement.dead
        pending.sends = [send for send in pending.sends if send.server not in dead]
        living = []
        for r in pending.replies:
            if r.server not in dead or r.done:   # (a dead server may have answered first)
                living.append(r)
                continue
            if pending.ask_next_lead is not None:   # (to_lead)
                living.append(pending.ask_next_lead(pending))
                continue
            assert pending.out is not None, "a request with replies has an output (a pull's)"
            living += self._ask_again(pending, np.arange(pending.out.shape[0])[r.rows])
        pending.replies = living
        pending.version = self._placement.version

    def _moved_on(self, version: int) -> bool:
        """A read split by placement `version` was refused: whether key ranges moved since
        (the new placement learned from the lead, which answers once the move is over), or
        the job stopped."""
        if self._placement.version > version:
            return True
        self.new_ts()
        p = self._placement
        buffer = PlacementAnswer.buffer(p)
        lead = self.lead.server()
        wait_all([self.send(lead, Op.PLACEMENT, **placement_question(version)).request,
                  self.reply_into(buffer, lead).request],
                 self.timeout, lambda: f"server rank {self.servers[lead]} (the lead) to say "
                                       f"whether key ranges moved or the job stopped")
        answer = PlacementAnswer.of(buffer, p)
        if not answer.moved:
            return False
        if answer.version <= p.version:
            return True   # learned already
        self._placement = Placement(p.n_servers, p.replicas, p.nodes, version=answer.version,
                                    dead=p.dead, assign=answer.assign, extra=answer.extra)
        if answer.extra:
            log.info("key ranges are being copied to new holders (placement version %d): "
                     "sending them their part of each push", answer.version)
        else:
            log.info("key ranges moved at clock %d (placement version %d): reading from their "
                     "new owners", answer.clock, answer.version)
        return True

    def _ask_owners(self, pending: Pending) -> None:
        """A read refused because key ranges moved: all its keys asked again of their owners
        under the current placement."""
        assert pending.keys is not None, "only pulls are refused, and a pull keeps its keys"
        pending.sends = []
        pending.replies = self._ask_again(pending, np.arange(pending.keys.shape[0]))
        pending.version = pending.sent_by = self._placement.version

    def _ask_again(self, pending: Pending, rows: np.ndarray) -> list:
        """Send the keys at `rows` of a pull (its output's rows) to their primaries under the
        current placement, as one new request; their replies, copied into place on arrival."""
        assert pending.keys is not None, "only pulls are asked again, and a pull keeps its keys"
        keys, p = pending.keys[rows], self._placement
        owners = p.owners(keys)
        order = np.lexsort((keys, owners))   # by owner, each owner's keys sorted
        starts = np.searchsorted(owners[order], np.arange(p.n_servers + 1))
        flags = pending.flags
        if self.clock > pending.clock:   # a read sent ahead, now for the current clock
            flags &= ~protocol.NEXT_CLOCK
        self.new_ts()
        replies = []
        for s in range(p.n_servers):
            a, b = starts[s], starts[s + 1]
            if a < b:
                part = order[a:b]
                pending.sends.append(self.send(s, Op.PULL, (keys[part],), nkeys=b - a,
                                               flags=flags))
                replies.append(self.reply_into(np.empty((b - a, self.width), np.float32), s,
                                               rows[part], True))
        return replies

    # The end: no more clocks, no more requests.

    def _broadcast(self, op: Op):
        self.send_held()
        pending = Pending(what=f"the servers to receive {op.name}",
                          sends=[self.send(s, op, report=op is Op.FINISH)
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
                pass   # a read sent ahead (or held), refused because the job is stopping
        self._broadcast(Op.BYE)
