"""Pushes and the clocks on a server: a push taken (its part for backed-up ranges first), and
the clocks it completes applied as the slowest worker moves on (`Pushes.advance`), with the
checkpoints due on the way and the reads the new clock lets through.

Under BSP the pushes of each clock are kept (`ClockPushes`) until every worker has completed
that clock, then applied in clock, worker and arrival order. The model at each clock is then
a consistent cut, and does not depend on the order in which workers' pushes arrived, so a
run with a fixed seed is reproducible bit for bit, and every replica of a key range, given
the same pushes, holds the same bits. Under SSP and ASP a push is applied on arrival.
"""
from typing import NamedTuple

import numpy as np

from ..recovery.context import Push
from ..wire.clocks import FINISHED
from ..wire.messages import same_keys_of
from ..wire.protocol import CLOCK, SAME_KEYS, Op, Report, backup_part_header

_NO_REPORT = Report()
# The records made of every push (Push, Pending) as plain tuples in their fields' order: a
# third of the time of their NamedTuples' constructors.
_new = tuple.__new__


class Pending(NamedTuple):
    """A push kept for its clock. `deferrable`: the placement version from which its ranges
    were backed up here (-1: not a backup's part), see `Pushes._apply_until`."""
    push: Push
    clock: int
    worker: int
    ts: int
    deferrable: int


class ClockPushes:
    """BSP's push buffer: each clock's pushes, given out in clock, worker and arrival order
    once every worker has completed the clock."""
    def __init__(self, applied: int = 0):
        # clock -> worker -> [Pending, ...] in arrival order
        self._pending: dict[int, dict[int, list[Pending]]] = {}
        self.applied = applied    # every push of the clocks before this one has been given out

    def add(self, clock: int, worker: int, push) -> None:
        by_worker = self._pending.get(clock)
        if by_worker is None:
            self._pending[clock] = {worker: [push]}
            return
        pushes = by_worker.get(worker)
        if pushes is None:
            by_worker[worker] = [push]
        else:
            pushes.append(push)

    def until(self, clock: int) -> list:
        """The pushes of every clock before `clock` not given out yet, in clock, worker, then
        arrival order."""
        ready: list = []
        pending = self._pending
        if pending:
            if len(pending) == 1:   # (the common case, asked of every clock)
                clocks = list(pending) if next(iter(pending)) < clock else []
            else:
                clocks = sorted(c for c in pending if c < clock)
            for c in clocks:
                by_worker = pending.pop(c)
                if len(by_worker) == 1:   # (the common case, asked of every clock)
                    for pushes in by_worker.values():
                        ready += pushes
                    continue
                for w in sorted(by_worker):
                    ready += by_worker[w]
        if clock > self.applied:
            self.applied = clock
        return ready

    def drop(self, worker: int, from_clock: int) -> int:
        """Forget `worker`'s pushes of `from_clock` and later (a dead worker's, which not every
        server holds); returns how many."""
        dropped = 0
        for clock, pending in self._pending.items():
            if clock >= from_clock:
                dropped += len(pending.pop(worker, []))
        return dropped


class Pushes:
    def __init__(self, ctx):
        self.ctx = ctx
        self.buffer = ClockPushes(ctx.ckpt.first_clock())
        self._backups_due = []    # pushes to backed-up ranges of clocks complete (see advance)
        self._last_applied = [-1] * len(ctx.roles.workers)   # ts of its last
        # Resuming, a worker that had left stands before the checkpoint's clock until it says
        # FINISH again: the checkpoints before that clock are not written again.
        self._slowest = max(ctx.clocks.slowest(), ctx.ckpt.first_clock())
        ctx.register({Op.PUSH: self.on_push})

    def on_push(self, source: int, r, buf) -> None:
        self.take(self.ctx.roles.worker_index(source), r, buf.shape[0])

    def take(self, worker: int, r, nbytes: int) -> None:
        """`worker`'s push `r` (an admission.Request of `nbytes` bytes on the wire)."""
        if r.backup_keys.shape[0]:   # first the part for ranges this server backs up
            h = backup_part_header(r.header, r.backup_keys.shape[0])
            self._take(worker, h, r.backup_keys, r.backup_values, None, None, backup=True)
        self.take_own(worker, r.header, r.keys, r.values, r.report, nbytes, r.rows_sent)

    def take_own(self, worker: int, h, keys: np.ndarray, values: np.ndarray, report,
                 nbytes: int, rows_sent: np.ndarray | None = None, owned: bool = False) -> None:
        """`worker`'s push (header `h`, `nbytes` on the wire) without a part for ranges this
        server backs up, or the rest of one: `take` of its fields (the short way's, which
        makes no Request). `owned`: `values` is a copy, not a view of the receive buffer."""
        ctx = self.ctx
        ctx.stats.push_bytes += nbytes
        self._take(worker, h, keys, values, report, rows_sent, owned=owned)
        ctx.copies.send_copies()

    def _take(self, worker: int, h, keys: np.ndarray, values: np.ndarray, report,
              rows_sent: np.ndarray | None, backup: bool = False, owned: bool = False) -> None:
        """`backup`: the part for ranges this server backs up (no read needs it at once);
        `owned`: as take_own's."""
        ctx = self.ctx
        clocks = ctx.clocks
        clock = clocks.done[worker]
        bsp = clocks.staleness == 0
        push = ctx.copies.route(worker, clock, h.ts, h.placement,
                                self._push_of(worker, h, keys, values, rows_sent, bsp, owned))
        if bsp:
            # Deferred (see _apply_until) only while the ranges stay backed up here: split by
            # a placement with this one's primaries, and still when the clock completes.
            since = ctx.placement.backups_since
            deferrable = since if backup and h.placement >= since else -1
            pending = _new(Pending, (push, clock, worker, h.ts, deferrable))
            self.buffer.add(clock, worker, pending)
        else:
            self._apply(push, clock)
            self._applied(worker, h.ts)
        if h.flags & CLOCK:
            clocks.tick(worker)
            ctx.ckpt.note(worker, clock + 1, report or _NO_REPORT, False)
            self.advance()

    def keep(self, clock: int, worker: int, ts: int, keys: np.ndarray, values: np.ndarray,
             deferrable: int) -> None:
        """BSP: a push (its keys stored anew) kept for its clock, as those received."""
        self.buffer.add(clock, worker, Pending(Push(keys, None, -1, values), clock, worker, ts,
                                               deferrable))

    def _push_of(self, worker: int, h, keys: np.ndarray, values: np.ndarray,
                 rows_sent: np.ndarray | None, keep: bool, owned: bool) -> Push:
        """`keep`: the push is kept past this message (BSP), so what of it is a view of the
        receive buffer, which is reused, is copied: its keys, and its values unless `owned`."""
        if keep and not owned:
            values = values.copy()
        if not h.flags & SAME_KEYS:
            return _new(Push, ((keys.copy() if keep else keys), None, -1, values))
        if not h.nkeys:
            return _new(Push, (keys, None, -1, values))
        keys, rows, generation = self.ctx.rows.take(worker, same_keys_of(h), h.nkeys)
        if rows_sent is not None:   # a filtered push: values for these of the pull's keys
            keys, rows = keys[rows_sent], rows[rows_sent]
        return _new(Push, (keys, rows, generation, values))

    def _apply(self, push: Push, clock: int) -> None:
        store = self.ctx.store
        if push.rows is not None and push.generation == store.generation:
            store.update(push.rows, push.values, clock)
            return
        if push.rows is not None:   # the table grew since the pull: its rows moved
            self.ctx.stats.refound += 1
        store.push(push.keys, push.values, clock)

    def _apply_until(self, clock: int) -> None:
        """Apply the pushes of the clocks before `clock`; those for ranges backed up here are
        kept for `apply_backups`, once the reads they let through are answered (reads go to
        primaries: no read needs the backed-up ranges). Not if a server died since the push
        arrived: its ranges may be this server's to answer now."""
        since = self.ctx.placement.backups_since
        for pending in self.buffer.until(clock):
            if pending.deferrable == since:
                self._backups_due.append((pending.push, pending.clock))
            else:
                self._apply(pending.push, pending.clock)
            self._applied(pending.worker, pending.ts)

    def apply_backups(self) -> None:
        if not self._backups_due:
            return
        for push, clock in self._backups_due:
            self._apply(push, clock)
        self._backups_due.clear()

    def _applied(self, worker: int, ts: int) -> None:
        if ts != self._last_applied[worker]:   # a push's parts (a backup's, a primary's)
            self._last_applied[worker] = ts
            self.ctx.stats.pushes_applied += 1
        self.ctx.copies.applied(worker, ts)

    def advance(self) -> None:
        """After a worker's clock or FINISH: if the slowest worker moved on, apply the clocks'
        pushes (BSP) and write the checkpoints due at each clock on the way, then answer the
        pulls the new clock lets through."""
        ctx = self.ctx
        ckpt = ctx.ckpt
        slowest = ctx.clocks.slowest()
        if slowest > self._slowest:
            self._slowest_moved(slowest)
        if ctx.losses:
            ctx.losses.tell_what_is_here()
        if ckpt.planned:
            for clock in ckpt.reached(slowest):
                ctx.rounds.take(clock, paced=True)
        stop_at = ckpt.stop_at
        # Here at the latest: STOP_AT may arrive after this server reached the clock (and no
        # worker reads past it: the lead refuses). If every worker has finished meanwhile,
        # there is nothing left to stop.
        if (stop_at is not None and slowest >= stop_at and not ctx.gate.stopped
                and slowest != FINISHED):
            ctx.rounds.take(stop_at)
            ctx.gate.stopped = True
            ctx.stats.train_requests = ctx.stats.requests   # (what follows is not training)
        ctx.members.reached()
        if ctx.gate.held:
            ctx.reads.release()
        if self._backups_due:
            self.apply_backups()   # replication overlaps the workers' next minibatch

    def _slowest_moved(self, slowest: int) -> None:
        """The slowest worker moved on to `slowest`: the pushes of the clocks before it
        applied (BSP), with the checkpoints due on the way."""
        ctx = self.ctx
        ckpt, rounds = ctx.ckpt, ctx.rounds
        last = ckpt.last_clock(self._slowest) if slowest == FINISHED else slowest
        if ckpt.may_be_due:
            for clock in range(self._slowest + 1, last + 1):
                if ckpt.due(clock):
                    self._apply_until(clock)
                    rounds.take(clock, paced=True)
        self._apply_until(last)
        if slowest == FINISHED and ckpt.periodic:
            rounds.take(last)   # every worker has finished: the final state
        self._slowest = slowest
        ckpt.forget_before(slowest)
        if slowest != FINISHED and ctx.reached("clock", slowest):
            ctx.members.poll_soon()
