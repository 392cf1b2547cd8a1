"""Key ranges moving between servers (`mpips ctl add-server / remove-server / rebalance`):
the ranges' new holders receive copies while training goes on, then, at a clock the servers
agree on, they become the owners. Workers, their reads refused there, ask the lead for the
new placement and read again from the new owners.

A move, in messages:
1. MOVE_ASK (not holding reads): the lead asks every other server for its keys read per
   range since the last move (MOVE_CLOCK), from which `rebalance` chooses; `add-server` and
   `remove-server` need no figures but take the same path.
2. MOVE_TO: the new owners. Every server takes the placement on the way
   (`Placement.toward`: owners unchanged, each range's new holders added as its backups)
   and says so (MOVED "took"); reads split by the old placement are refused from then on, so
   that workers learn it (PLACEMENT, answered once every server has taken it) and send the
   new holders their part of each push. Each range's primary sends its new holders a copy
   once every worker pushes by the new map (`rangecopies`, as after a failover); a new
   holder applies the pushes kept meanwhile after it and tells the lead (MOVED "whole").
3. MOVE_ASK (holding reads), every range whole: each server holds reads past the highest
   clock it let a read through for and says it (MOVE_CLOCK); MOVE_AT names C, one past the
   highest. Reads of clock C or later routed by the placement on the way are refused.
4. When every worker has completed C clocks on a server (the new holders, as backups, have
   every push before C), it takes the new placement, tells the lead (MOVED "moved") and drops
   the ranges it no longer holds. Every server moved, the lead answers the workers' PLACEMENT
   requests with the new owners, and `ctl` with what moved.
Pushes are applied in the order they would have been without the move, so under BSP the
model is bitwise that of an uninterrupted run. Training goes on while the ranges are copied
(a few ranges each turn of the sender's loop); it waits only from the slowest worker reaching
C until every server has switched, no keys moving then. A worker joining (`workermoves`)
takes its clock from the same agreement as step 3.

A server that leaves keeps running, owning nothing, as a spare: an MPI job cannot hand its
rank's node back to the allocation. `add-server` gives ranges to a spare (`--spares`).

This module is every server's part in a move; the lead's (steps 1 to 3, the answers) is
`movelead`'s.
"""
import json
import logging
import time
from dataclasses import dataclass

import numpy as np

from ..base.errors import ProtocolError
from ..wire import messages
from ..wire.clocks import FINISHED
from ..wire.placement import Placement, Switch
from ..wire.protocol import Op
from .context import MembershipContext

log = logging.getLogger("mpips")


@dataclass
class Move:
    """A move under way on this server."""
    after: Placement
    began: float                          # when this server learned of it (monotonic)
    took: bool = False                    # the placement on the way taken, the lead told
    whole: float | None = None            # when every range new here had its copy
    clock: int | None = None              # C, once named
    named: float | None = None            # when C was named here
    reached: float | None = None          # when every worker had completed C here
    copies_before: tuple = (0, 0, 0.0, 0.0)   # this server's copy figures when it began


class RangeMoves:
    """Every server's part in a move: the placement on the way taken, the copies made, the
    switch at the clock agreed, the keys read per range (for `rebalance`)."""
    def __init__(self, members):
        self.members = members   # the front: the lead's part, its answers to `ctl`
        self.ctx: MembershipContext = members.ctx
        ctx = self.ctx
        self.load = np.zeros(ctx.placement.n_ranges, np.int64)   # keys read per range
        self.move: Move | None = None
        self.floor = 0          # reads split by a placement older than this are refused
        self.asked = False      # a clock is being agreed (MOVE_ASK taken, no MOVE_AT yet)
        self.asks = 0           # MOVE_ASKs taken (a test event's point: `move K`)
        ctx.copies.on_whole.append(self._whole)

    def handlers(self) -> dict:
        return {Op.MOVE_ASK: self.on_ask, Op.MOVE_AT: self.on_at, Op.MOVE_TO: self.on_to}

    @property
    def busy(self) -> bool:
        return self.move is not None or self.asked

    def figures(self, hold: bool):
        gate = self.ctx.gate
        if hold:
            self.asked = True
            gate.ceiling = gate.highest
        return gate.highest, self.load.copy()

    def on_ask(self, source: int, r, buf) -> None:
        s = self.ctx
        self.asks += 1
        s.reached("move", self.asks)
        highest, load = self.figures(hold=messages.MoveAsk.of(r.header).hold)
        s.send(messages.MoveClock(highest + 1, load).pack(), source)

    def on_to(self, source: int, r, buf) -> None:
        to = messages.MoveTo.of(r.header, buf)
        self.begin(to.version, to.owners)

    def on_at(self, source: int, r, buf) -> None:
        at = messages.MoveAt.of(r.header, buf)
        after = self.move.after.assign if self.move else None
        if after is not None and tuple(at.owners.tolist()) != after:
            raise ProtocolError("MOVE_AT to owners other than those MOVE_TO named")
        self.switch_at(at.clock, at.version)

    def begin(self, version: int, fields: np.ndarray) -> None:
        """The new owners named: take the placement on the way to them (the new holders
        added as backups), so that they receive copies and pushes (see `rangecopies`)."""
        s = self.ctx
        p = s.placement
        if version != p.version + 2 or self.move is not None:
            raise ProtocolError(f"MOVE_AT to placement version {version}, where this server's "
                                f"is {p.version}{' and a move is under way' if self.move else ''}")
        if fields.min() < 0 or fields.max() >= p.n_servers or p.dead & set(fields.tolist()):
            raise ProtocolError(f"MOVE_AT giving key ranges to servers that are not living "
                                f"servers of the job ({sorted(set(fields.tolist()))})")
        after = Placement(p.n_servers, p.replicas, p.nodes, version=version, dead=p.dead,
                          assign=fields.tolist())
        c = s.copies
        self.move = Move(after, time.monotonic(),
                         copies_before=(c.keys_sent, c.keys_received, c.send_s, c.load_s))
        self._take(p.toward(after))
        c.plan(p, s.placement)
        self.floor = s.placement.version
        self._report("took", {})
        self.move.took = True
        if not c.awaited():
            self._whole()
        c.send_copies()

    def _take(self, placement: Placement) -> None:
        s = self.ctx
        s.placement = placement
        s.dense.placement = placement
        s.hooks.placement_changed(placement)

    def _whole(self) -> None:
        """Every range new to this server has its copy (called by `rangecopies`)."""
        m = self.move
        if m is None or not m.took or m.whole is not None:
            return
        m.whole = time.monotonic()
        self._report("whole", {})

    def switch_at(self, clock: int, version: int) -> None:
        s, m = self.ctx, self.move
        if m is None or m.whole is None or version != m.after.version or m.clock is not None:
            raise ProtocolError(f"MOVE_AT clock {clock} to placement version {version}, but "
                                f"this server has no move under way whose copies are made")
        m.clock, m.named = clock, time.monotonic()
        self.agreed()
        s.gate.moving = Switch(clock, version)
        self.reached()
        s.reads.release()

    def agreed(self) -> None:
        """The clock is named: reads past the highest let through are held no more."""
        self.asked = False
        self.ctx.gate.ceiling = None

    def reached(self) -> None:
        """After the clocks moved (or the clock was named): once every worker has completed
        the move's clock here, take the new placement (or, if every worker finished before
        it, there is nothing to move)."""
        s, m = self.ctx, self.move
        if m is None or m.clock is None or m.reached is not None:
            return
        slowest = s.clocks.slowest()
        if slowest == FINISHED:
            self._cancel(m.clock)
            return
        if slowest < m.clock:
            return
        m.reached = time.monotonic()
        s.pushes.apply_backups()   # the new holders' copies hold every push before the clock
        after, me, c = m.after, s.roles.index, s.copies
        gone = s.placement.held_ranges(me) & ~after.held_ranges(me)
        self._take(after)
        self.floor = after.version
        self.load[:] = 0
        self.move = None
        assert m.whole is not None and m.named is not None, "set before a clock is named"
        sent, received, send_s, load_s = m.copies_before
        figures = {"server": me, "keys_sent": c.keys_sent - sent,
                   "keys_received": c.keys_received - received,
                   "copy_s": round(m.whole - m.began, 4),
                   "wait_s": round(m.reached - m.named, 4),
                   "reached_at": time.time() - (time.monotonic() - m.reached),
                   "send_s": round(c.send_s - send_s, 4), "load_s": round(c.load_s - load_s, 4)}
        self._report("moved", figures)
        dropped = 0
        if gone.any():   # after telling the lead: workers go on meanwhile
            began = time.monotonic()
            _, keys = s.store.stored()
            held = after.held_ranges(me)[after.ranges_of(keys)]
            dropped = int((~held).sum())
            if dropped > 3 * (keys.shape[0] - dropped):   # most go: a smaller table
                s.store.keep(held)
            else:
                s.store.remove(keys[~held])
            log.info("dropped %d keys of the ranges this server no longer holds in %.2f s",
                     dropped, time.monotonic() - began)
        log.info("key ranges moved at clock %d (placement version %d): %d keys sent, %d "
                 "received, %d dropped here", m.clock, after.version, figures["keys_sent"],
                 figures["keys_received"], dropped)

    def _report(self, step: str, figures: dict) -> None:
        s = self.ctx
        figures = {"step": step, **figures}
        if s.lead:
            self.members.move_lead.step_in(s.roles.index, figures)
        else:
            s.send(messages.Moved(json.dumps(figures)).pack(), s.lead_rank)

    def _cancel(self, clock: int) -> None:
        """The move named for `clock` is not made."""
        s = self.ctx
        self.move = None
        s.gate.moving = None
        log.warning("the move named for clock %d was not made: every worker finished first "
                    "(the ranges stay with their owners)", clock)
        if s.lead:
            self.members.move_lead.cancelled(clock)

    def refused_stale(self, h, source: int) -> bool:
        """A worker's read of keys split before key ranges moved: refused (an empty reply),
        so that the worker asks the lead and reads again; whether it was."""
        if h.op != Op.PULL or h.placement >= self.floor or h.ts < 0:
            return False
        self.ctx.reply(np.empty(0, np.float32), source, h.ts)
        return True
