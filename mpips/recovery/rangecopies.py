"""Key ranges copied to a server that holds them anew, while training goes on: after a failover
(a dead server's copies rebuilt) and when ranges move (`mpips ctl`, see rangemoves). The
placement adds the new holder as a backup; `rebuild` decides when each copy is due and which
pushes kept meanwhile the new holder applies after it. This module carries the messages.
"""
import logging
import time
from collections.abc import Callable

import numpy as np

from ..wire import messages, protocol
from ..wire.clocks import FINISHED
from ..wire.placement import by_range, describe_ranges
from ..wire.protocol import Op
from .context import Push, RecoveryContext
from .rebuild import Outgoing, Rebuilds

log = logging.getLogger("mpips")

CHUNK_KEYS = 1 << 18   # keys copied per turn of the loop, at least one range: serving goes on


class RangeCopies:
    def __init__(self, ctx: RecoveryContext):
        """`ctx`: the server's context (what a handler may read and do)."""
        self.ctx = ctx
        self.rebuilds = Rebuilds(ctx.roles.index, len(ctx.roles.workers))
        self.sending: list[Outgoing] = []   # copies due, not sent yet (a few ranges each turn)
        self.keys_sent = 0
        self.keys_received = 0
        self.send_s = 0.0         # finding, sorting and sending the ranges copied from here
        self.load_s = 0.0         # storing the ranges copied here
        # called with (range, keys, seconds, load_s) of each copy in
        self.on_received: list[Callable[[int, int, float, float], None]] = []
        self.on_whole: list[Callable[[], None]] = []   # called once every range held anew has
                                                       # its copy
        self._index: tuple | None = None   # see _stored
        # range -> the last push per worker its copy holds: a part of one of those arriving
        # after the copy (from another sender, MPI does not order them) is passed over
        self.covered: dict[int, np.ndarray] = {}
        ctx.register({Op.COPY: self.on_copy})

    def plan(self, before, after) -> None:
        """The placement went from `before` to `after`: the copies to send and to wait for."""
        self.rebuilds.plan(before, after, time.monotonic())
        self.sending = [c for c in self.sending if c.range in {o.range for o in
                                                                 self.rebuilds.outgoing}]
        if not self.rebuilds.incoming:
            self._whole()

    def route(self, worker: int, clock: int, ts: int, version: int, push: Push) -> Push:
        """A push as the server received it: noted (the rebuild waits for every worker to
        split by the new map), and without the part kept aside for ranges this server waits
        for a copy of."""
        if self.rebuilds.outgoing:   # (a plan names who switched anew: none is asked before)
            self.rebuilds.pushed(worker, clock, version)
        if push.rows is not None:   # SAME_KEYS: ranges this server answers reads for only
            return push
        if self.covered:
            push = self._not_covered(worker, ts, push)
        if not self.rebuilds.incoming:
            return push
        keys, values = self.rebuilds.keep(self.ctx.placement.ranges_of(push.keys), clock,
                                          worker, ts, push.keys, push.values)
        return Push(keys, None, -1, values)

    def _not_covered(self, worker: int, ts: int, push: Push) -> Push:
        """`push` without its part for ranges whose copy, received already, holds it."""
        late = []
        for r, last in list(self.covered.items()):
            if ts <= last[worker]:
                late.append(r)
                continue
            last[worker] = -1   # every later push of this worker is newer
            if (last < 0).all():
                del self.covered[r]
        if not late:
            return push
        keep = ~np.isin(self.ctx.placement.ranges_of(push.keys), late)
        return Push(push.keys[keep], None, -1, push.values[keep])

    def applied(self, worker: int, ts: int) -> None:
        """Push `ts` of `worker` is in the store (a replayed one can be older than the last)."""
        last_ts = self.rebuilds.last_ts
        if ts > last_ts[worker]:
            last_ts[worker] = ts

    def awaited(self) -> list:
        """Key ranges this server holds anew and still waits for a copy of."""
        return sorted(self.rebuilds.incoming)

    def needed(self) -> bool:
        """Whether this server must still wait for copies of ranges it holds anew. Once every
        worker has finished, only for ranges it answers for: a copy that only restores a
        range's backups (after a server died as the job ended) serves no read and is not
        written to the model, and the server that would send it may have left its loop."""
        s = self.ctx
        if not self.rebuilds.incoming or not s.clocks.all_finished:
            return bool(self.rebuilds.incoming)
        primary = s.placement.primary_ranges(s.roles.index)
        return any(primary[r] for r in self.rebuilds.incoming)

    def on_copy(self, source: int, r, buf) -> None:
        """A copy of a range this server holds anew: load it, then apply the pushes kept
        meanwhile that it lacks, in the order its primary applied them."""
        s = self.ctx
        sender = s.sender(source)
        began = time.monotonic()
        range_ = messages.CopyHeader.of(r.header).range_index
        if range_ not in self.rebuilds.incoming:
            log.warning("a copy of key range %d from %s, which this server does not wait for: "
                        "passed over", range_, sender)
            return
        # room for every range still awaited, this size: the table grows once, not each copy
        s.store.reserve(len(s.store) + r.keys.shape[0] * len(self.rebuilds.incoming))
        s.store.load(r.keys, r.values)
        last = protocol.copied_positions(buf, r.header).copy()
        replay = self.rebuilds.arrived(range_, last, time.monotonic(), r.keys.shape[0])
        left = np.array([s.clocks.done[w] == FINISHED for w in range(last.shape[0])])
        last[left] = -1   # (a worker that finished sends no more pushes)
        if (last >= 0).any():
            self.covered[range_] = last
        # The range is one this server backs up (a new holder is never its primary): its
        # kept pushes are deferred as the parts that arrive after the copy will be, so that
        # each key's pushes of a clock are applied in worker order, all after the reads.
        deferrable = s.placement.backups_since
        for clock, worker, ts, keys, values in replay:
            if s.clocks.staleness == 0 and clock >= s.pushes.buffer.applied:
                s.pushes.keep(clock, worker, ts, keys, values, deferrable)
            else:
                s.store.push(keys, values, clock)
                self.applied(worker, ts)
        _, keys_n, took = self.rebuilds.done[-1]
        load_s = time.monotonic() - began
        self.keys_received += int(keys_n)
        self.load_s += load_s
        log.debug("key range %d: %d keys copied here from %s in %.2f s, then %d kept pushes",
                  range_, keys_n, sender, took, len(replay))
        for note in self.on_received:
            note(range_, keys_n, took, load_s)
        if not self.rebuilds.incoming:   # every range this server held anew is whole
            done = self.rebuilds.this_round
            keys_n, took = sum(d[1] for d in done), max(d[2] for d in done)
            log.info("key range(s) %s have their copies here: %d keys copied in %.2f s "
                     "(%.0f keys/s)", describe_ranges([d[0] for d in done]), keys_n, took,
                     keys_n / max(took, 1e-9))
            self._whole()

    def _whole(self) -> None:
        for note in self.on_whole:
            note()

    def _stored(self):
        """(rows, keys, order, starts) of the store, grouped by range (see `by_range`), found
        again only when a key was stored or removed since: the copies of a move share one
        pass over the table."""
        store, p = self.ctx.store, self.ctx.placement
        stamp = (store.generation, len(store), p.version)
        if self._index is None or self._index[0] != stamp:
            rows, keys = store.stored()
            self._index = (stamp, rows, keys, *by_range(p.ranges_of(keys), p.n_ranges))
        return self._index[1:]

    def send_copies(self) -> None:
        """The range copies due (see `rebuild`): sorted keys and their state rows, and the
        last push applied per worker; a few ranges each call, serving going on between."""
        s = self.ctx
        if self.rebuilds.outgoing:
            left = [w for w in range(len(s.roles.workers)) if s.clocks.done[w] != FINISHED]
            self.sending += self.rebuilds.due(left, s.pushes.buffer.applied
                                              if s.clocks.staleness == 0 else None)
        if not self.sending:
            return
        began = time.monotonic()
        # A copy says which pushes it holds (the last applied per worker): the parts for
        # ranges backed up here that an advance cut short by a death left aside go in first.
        s.pushes.apply_backups()
        rows, keys, order, starts = self._stored()
        counts = np.diff(starts)
        chunk: list[Outgoing] = []
        n = 0
        while self.sending and (not chunk or n + counts[self.sending[0].range] <= CHUNK_KEYS):
            chunk.append(self.sending.pop(0))
            n += counts[chunk[-1].range]
        for copy in chunk:
            mine = order[starts[copy.range]:starts[copy.range + 1]]
            mine = mine[np.argsort(keys[mine])]   # a write's keys go in increasing order
            s.send(protocol.pack(
                messages.CopyHeader(copy.range, mine.shape[0], s.store.columns,
                                    s.placement.version).header(),
                keys[mine], s.store.state(rows[mine]), np.array(self.rebuilds.last_ts, np.int64)),
                s.roles.servers[copy.to])
        self.keys_sent += int(n)
        self.send_s += time.monotonic() - began
        if not self.sending:
            self._index = None
        for to in sorted({c.to for c in chunk}):
            sent = [c.range for c in chunk if c.to == to]
            log.info("sending server %d a copy of key range(s) %s (%d keys)", to,
                     describe_ranges(sent), sum(starts[r + 1] - starts[r] for r in sent))
