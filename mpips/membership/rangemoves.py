"""Key ranges moving between servers (`mpips ctl add-server / remove-server / rebalance`):
the ranges' new holders receive copies while training goes on, then, at a clock the servers
agree on, they become the owners. Workers, their reads refused there, ask the lead for the
new placement and read again from the new owners.

A move, in messages:
1. MOVE_ASK (ref 0): the lead asks every other server for its keys read per range since the
   last move (MOVE_CLOCK), from which `rebalance` chooses; `add-server` and `remove-server`
   need no figures but take the same path.
2. MOVE_TO: the new owners. Every server takes the placement on the way
   (`Placement.toward`: owners unchanged, each range's new holders added as its backups)
   and says so (MOVED "took"); reads split by the old placement are refused from then on, so
   that workers learn it (PLACEMENT, answered once every server has taken it) and send the
   new holders their part of each push. Each range's primary sends its new holders a copy
   once every worker pushes by the new map (`rangecopies`, as after a failover); a new
   holder applies the pushes kept meanwhile after it and tells the lead (MOVED "whole").
3. MOVE_ASK (ref 1), every range whole: each server holds reads past the highest clock it let
   a read through for and says it (MOVE_CLOCK); MOVE_AT names C, one past the highest. Reads
   of clock C or later split by the placement on the way are refused.
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
"""
import json
import logging
import time
from dataclasses import dataclass

import numpy as np

from ..wire import protocol
from ..wire.clocks import FINISHED
from ..base.errors import ProtocolError
from ..wire.placement import Placement, load_spread, moved, rebalanced, with_server, without_server
from ..wire.protocol import Op

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
    """Every server's part in a move, and the lead's: its steps, and the clock the servers
    agree on (for a move's switch or a worker joining)."""
    def __init__(self, members):
        self.members = members   # the front: its answers to `ctl`, the workers joining
        self.ctx = ctx = members.ctx
        self.load = np.zeros(ctx.placement.n_ranges, np.int64)   # keys read per range
        self.move: Move | None = None
        self.floor = 0          # reads split by a placement older than this are refused
        self.asked = False      # a clock is being agreed (MOVE_ASK taken, no MOVE_AT yet)
        ctx.copies.on_whole.append(self._whole)
        # The lead's part:
        self.request = None     # the request being carried out
        self.step = None        # of its move: "planning", "taking", "copying", "agreeing",
        #                         "switching" (see the module's docstring)
        self.before: Placement | None = None
        self.clocks_in = {}     # server -> the highest clock it let a read through for
        self.loads = {}         # server -> its keys read per range
        self.steps_in = {}      # step -> {server: its figures} (MOVED)
        self.asking = []        # (rank, ts) of workers' PLACEMENT requests held
        self._joins = None      # a worker joining at the clock agreed: called with it
        self._began = 0.0

    def handlers(self) -> dict:
        return {Op.MOVE_ASK: self.on_ask, Op.MOVE_CLOCK: self.on_clock, Op.MOVE_AT: self.on_at,
                Op.MOVE_TO: self.on_to, Op.MOVED: self.on_moved, Op.PLACEMENT: self.on_placement}

    @property
    def busy(self) -> bool:
        return self.request is not None or self.move is not None or self.asked

    # The lead: a request carried out.
    def start(self, request: dict) -> None:
        """A server joins or leaves, or ranges rebalance: first every server's figures."""
        self.step = "planning"
        self._ask(request, hold=False)

    def agree(self, request: dict, joins) -> None:
        """A worker joins: `joins(clock)` with the clock the servers agree on."""
        self._joins = joins
        self._ask(request, hold=True)

    def refusal(self, command: str, target) -> str | None:
        """Why `add-server`, `remove-server` or `rebalance` cannot be carried out, or None."""
        s = self.ctx
        p = s.placement
        if p.dead:
            return (f"server(s) {sorted(p.dead)} died in this launch; key ranges move only "
                    f"among living servers of a job that lost none (resume from a checkpoint)")
        if s.dense.tables:
            return "the job has dense tables (--solver lbfgs): their blocks do not move"
        owners = sorted(set(p.assign))
        no_such = f"there is no server {target}: the job has {p.n_servers} (0-{p.n_servers - 1})"
        if command == "add-server":
            if target is not None and not 0 <= target < p.n_servers:
                return no_such
            if target is not None and target in owners:
                return f"server {target} owns key ranges already"
            if not p.spares:
                return "no spare server to add: start the job with --spares K"
        if command == "remove-server":
            if target is None:
                return "remove-server needs the number of the server to remove"
            if not 0 <= target < p.n_servers:
                return no_such
            if target not in owners:
                return f"server {target} owns no key range (a spare)"
            if len(owners) - 1 < p.replicas:
                return (f"{len(owners) - 1} server(s) would be left for --replicas "
                        f"{p.replicas} copies of each key")
        if command == "rebalance" and len(owners) < 2:
            return "one server owns every key range: there is nothing to rebalance"
        return None

    # The lead: every server's figures, and the clock agreed.
    def _ask(self, request: dict, hold: bool) -> None:
        """Every server's keys read per range; with `hold`, also the highest clock it let a
        read through for, holding reads past it until the lead names the next."""
        s = self.ctx
        self.request = request
        if self.step == "planning":
            self.before = s.placement
            self._began = time.monotonic()
            self.steps_in = {}
        self.clocks_in, self.loads = {}, {}
        for server in self.ctx.others():
            s.send(protocol.pack(protocol.Header(Op.MOVE_ASK, ref=int(hold))),
                   s.roles.servers[server])
        self.clocks_in[s.roles.index], self.loads[s.roles.index] = self._figures(hold)
        self._name_clock()

    def _figures(self, hold: bool):
        gate = self.ctx.gate
        if hold:
            self.asked = True
            gate.ceiling = gate.highest
        return gate.highest, self.load.copy()

    def on_ask(self, source: int, r, buf) -> None:
        s = self.ctx
        highest, load = self._figures(hold=bool(r.header.ref))
        s.send(protocol.pack(protocol.Header(Op.MOVE_CLOCK, clock=highest + 1,
                                             nkeys=load.shape[0]), load), source)

    def on_clock(self, source: int, r, buf) -> None:
        s = self.ctx
        if self.request is None or self.step not in (None, "planning", "agreeing"):
            raise ProtocolError(f"{s.sender(source)} sent MOVE_CLOCK, but no move is being "
                                f"agreed")
        self.clocks_in[s.roles.servers.index(source)] = r.header.clock - 1
        self.loads[s.roles.servers.index(source)] = protocol.int64_fields(buf).copy()
        self._name_clock()

    def _name_clock(self) -> None:
        """The lead, every server's figures in: a worker joins at the next clock; or the
        ranges' new owners (then their copies); or, every copy made, the clock they own
        from."""
        s = self.ctx
        if set(self.ctx.others()) - set(self.clocks_in):
            return
        clock = max(self.clocks_in.values()) + 1
        if self._joins is not None:
            # A read for clock c is of the minibatch whose push completes c + 1: the others may
            # complete `clock` before the word of the join is in, so the joiner's first clock
            # is the one after (else a checkpoint of `clock` could leave the joiner out).
            joins, self._joins = self._joins, None
            joins(clock + 1)
            self.request = None
            return
        if self.step == "agreeing":
            self.step = "switching"
            after = self.move.after
            self._tell(Op.MOVE_AT, clock, after.version, np.array(after.assign, np.int64))
            self._switch_at(clock, after.version)
            return
        p = s.placement
        command, target = self.request["command"], self.request.get("target")
        load = sum(self.loads.values())
        if command == "add-server":
            assign = with_server(p.assign, p.spares[0] if target is None else target)
        elif command == "remove-server":
            assign = without_server(p.assign, target,
                                    servers=[x for x in set(p.assign) if x != target])
        else:
            assign = rebalanced(p.assign, load)
        self.request["load_spread_before"] = round(load_spread(p.assign, load), 4)
        self.request["load_spread_after"] = round(load_spread(assign, load), 4)
        self.request["copy_clock"] = max(self.clocks_in.values())   # the clock then
        self.step = "taking"
        fields = np.array(assign, np.int64)
        self._tell(Op.MOVE_TO, 0, p.version + 2, fields)
        self._begin(p.version + 2, fields)

    def _tell(self, op: Op, clock: int, version: int, fields: np.ndarray) -> None:
        s = self.ctx
        for server in self.ctx.others():
            s.send(protocol.pack(protocol.Header(op, clock=clock, ref=version,
                                                 nkeys=fields.shape[0]), fields),
                   s.roles.servers[server])

    # Every server: the move.
    def on_to(self, source: int, r, buf) -> None:
        self._begin(r.header.ref, protocol.int64_fields(buf))

    def on_at(self, source: int, r, buf) -> None:
        after = self.move.after.assign if self.move else None
        if after is not None and tuple(protocol.int64_fields(buf).tolist()) != after:
            raise ProtocolError("MOVE_AT to owners other than those MOVE_TO named")
        self._switch_at(r.header.clock, r.header.ref)

    def _begin(self, version: int, fields: np.ndarray) -> None:
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

    def _switch_at(self, clock: int, version: int) -> None:
        s, m = self.ctx, self.move
        if m is None or m.whole is None or version != m.after.version or m.clock is not None:
            raise ProtocolError(f"MOVE_AT clock {clock} to placement version {version}, but "
                                f"this server has no move under way whose copies are made")
        m.clock, m.named = clock, time.monotonic()
        self.agreed()
        s.gate.moving = (clock, version)
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
            self._cancel()
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
            self._step_in(s.roles.index, figures)
        else:
            text = np.frombuffer(json.dumps(figures).encode(), np.uint8)
            s.send(protocol.pack(protocol.Header(Op.MOVED), text), s.lead_rank)

    def _cancel(self) -> None:
        s, m = self.ctx, self.move
        self.move = None
        s.gate.moving = None
        log.warning("the move named for clock %d was not made: every worker finished first "
                    "(the ranges stay with their owners)", m.clock)
        if s.lead and self.request is not None:
            error = f"every worker finished training before clock {m.clock}"
            self.members.answer(self.request, {"ok": False, "error": error})
            self.request = self.step = None
            self._reply_to_workers()

    # The lead: the steps of a move.
    def on_moved(self, source: int, r, buf) -> None:
        s = self.ctx
        try:
            figures = json.loads(protocol.error_text(buf))
            step = figures["step"]
        except (ValueError, KeyError, TypeError):
            raise ProtocolError(f"{s.sender(source)} sent MOVED whose text is not a JSON "
                                f"object with a step") from None
        expected = {"took": ("taking", "copying"), "whole": ("taking", "copying"),
                    "moved": ("switching",)}
        if self.request is None or self.step not in expected.get(step, ()):
            raise ProtocolError(f"{s.sender(source)} sent MOVED ({step!r}), but no move is at "
                                f"that step")
        self._step_in(s.roles.servers.index(source), figures)

    def _step_in(self, server: int, figures: dict) -> None:
        s = self.ctx
        step = figures["step"]
        self.steps_in.setdefault(step, {})[server] = figures
        servers = {s.roles.index, *self.ctx.others()}
        if servers - set(self.steps_in[step]):
            return
        if step == "took":   # workers may split keys by it now
            self.step = "copying"
            self._reply_to_workers()
        if self.step == "copying" and not servers - set(self.steps_in.get("whole", {})):
            self.step = "agreeing"
            log.info("ctl %s: every copy made in %.2f s; agreeing on the clock to switch at",
                     self.request["command"], time.monotonic() - self._began)
            self._ask(self.request, hold=True)
        if step == "moved":
            self._moved()

    def _moved(self) -> None:
        s = self.ctx
        before, after = self.before, s.placement
        now = time.time()
        figures = [self.steps_in["moved"][k] for k in sorted(self.steps_in["moved"])]
        paused = now - min(f.pop("reached_at") for f in figures)
        owned = lambda p: {str(x): int(sum(1 for o in p.assign if o == x))   # noqa: E731
                           for x in range(p.n_servers)}
        result = {
            "ok": True, "command": self.request["command"], "target": self.request.get("target"),
            "clock": int(s.gate.moving[0]), "copy_clock": self.request["copy_clock"],
            "version": after.version,
            "ranges_moved": sum(a != b for a, b in zip(before.assign, after.assign)),
            "fraction_moved": round(moved(before.assign, after.assign), 6),
            "keys_moved": sum(f["keys_sent"] for f in figures),
            "seconds": round(time.monotonic() - self._began, 4),
            "copy_s": max(f["copy_s"] for f in figures),
            "paused_s": round(paused, 4),
            "ranges_before": owned(before), "ranges_after": owned(after),
            "spares": list(after.spares), "servers": figures}
        for name in ("load_spread_before", "load_spread_after"):
            if name in self.request:
                result[name] = self.request[name]
        self.members.done.append(result)
        log.warning("ctl %s%s done at clock %d: %d of %d key ranges (%.1f%%) moved, %d keys "
                    "copied in %.2f s while training went on; training waited %.2f s for the "
                    "switch", result["command"],
                    "" if result["target"] is None else f" {result['target']}", result["clock"],
                    result["ranges_moved"], before.n_ranges, 100 * result["fraction_moved"],
                    result["keys_moved"], result["copy_s"], result["paused_s"])
        self.members.answer(self.request, result)
        self.request = self.step = None
        self._reply_to_workers()

    def on_placement(self, source: int, r, buf) -> None:
        """A worker's read was refused: the placement changed (answered once every server
        holds the new one) or the job stopped."""
        s = self.ctx
        if not s.lead:
            raise ProtocolError(f"{s.sender(source)} sent PLACEMENT to a server that does "
                                f"not lead")
        self.asking.append((source, r.header.ts, r.header.ref))
        if self.members.workers.joining is None and self.step not in ("taking", "switching"):
            self._reply_to_workers()

    def _reply_to_workers(self) -> None:
        s = self.ctx
        p = s.placement
        for rank, ts, version in self.asking:
            moved_since = version < self.floor
            s.reply(np.concatenate([[int(moved_since), p.version, s.gate.moving[0]
                                     if s.gate.moving else -1], p.assign,
                                    p.extra_fields().ravel()]).astype(np.int64), rank, ts)
        self.asking = []

    def refused_stale(self, h, source: int) -> bool:
        """A worker's read of keys split before key ranges moved: refused (an empty reply),
        so that the worker asks the lead and reads again; whether it was."""
        if h.op != Op.PULL or h.placement >= self.floor or h.ts < 0:
            return False
        self.ctx.reply(np.empty(0, np.float32), source, h.ts)
        return True
