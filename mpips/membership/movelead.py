"""The lead's part in a move of key ranges between servers (`mpips ctl add-server /
remove-server / rebalance`, see `rangemoves` for the messages): it asks every server for its
figures, names the new owners and then the clock to switch at, collects each server's steps
(MOVED), and answers `ctl` and the workers asking for the placement. The clock agreed also
lets a worker join (`workermoves`).
"""
import json
import logging
import time

import numpy as np

from ..base.errors import ProtocolError
from ..wire import messages
from ..wire.placement import Placement, load_spread, moved, rebalanced, with_server, without_server
from ..wire.protocol import Op
from .context import MembershipContext

log = logging.getLogger("mpips")


class MoveLead:
    """The lead's part in a move of key ranges: a request carried out step by step, every
    server's figures and the clock the servers agree on (for a move's switch or a worker
    joining), the answers to workers asking for the placement."""
    def __init__(self, members):
        self.members = members   # the front: its answers to `ctl`, the workers joining
        self.ctx: MembershipContext = members.ctx
        self.ranges = members.ranges   # this server's own part in a move
        self.request: dict | None = None   # the request being carried out
        self.step = None        # of its move: "planning", "taking", "copying", "agreeing",
        #                         "switching" (see rangemoves' docstring)
        self.before: Placement | None = None
        self.clocks_in = {}     # server -> the highest clock it let a read through for
        self.loads = {}         # server -> its keys read per range
        self.steps_in = {}      # step -> {server: its figures} (MOVED)
        self.asking = []        # (rank, ts) of workers' PLACEMENT requests held
        self._joins = None      # a worker joining at the clock agreed: called with it
        self._began = 0.0

    def handlers(self) -> dict:
        return {Op.MOVE_CLOCK: self.on_clock, Op.MOVED: self.on_moved,
                Op.PLACEMENT: self.on_placement}

    @property
    def busy(self) -> bool:
        return self.request is not None

    # A request carried out.
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

    # Every server's figures, and the clock agreed.
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
            s.send(messages.MoveAsk(hold).pack(), s.roles.servers[server])
        self.clocks_in[s.roles.index], self.loads[s.roles.index] = self.ranges.figures(hold)
        self._name_clock()

    def on_clock(self, source: int, r, buf) -> None:
        s = self.ctx
        if self.request is None or self.step not in (None, "planning", "agreeing"):
            raise ProtocolError(f"{s.sender(source)} sent MOVE_CLOCK, but no move is being "
                                f"agreed")
        told = messages.MoveClock.of(r.header, buf)
        self.clocks_in[s.roles.servers.index(source)] = told.clock - 1
        self.loads[s.roles.servers.index(source)] = told.load.copy()
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
            # complete `clock` before the notice of the join arrives, so the joiner's first clock
            # is the one after (else a checkpoint of `clock` could leave the joiner out).
            joins, self._joins = self._joins, None
            joins(clock + 1)
            self.request = None
            return
        if self.step == "agreeing":
            self.step = "switching"
            after = self.ranges.move.after
            self._tell(messages.MoveAt(after.version, clock, np.array(after.assign, np.int64)))
            self.ranges.switch_at(clock, after.version)
            return
        p, request = s.placement, self.request
        assert request is not None, "figures are asked for a request only (_ask)"
        command, target = request["command"], request.get("target")
        load = sum(self.loads.values())
        if command == "add-server":
            assign = with_server(p.assign, p.spares[0] if target is None else target)
        elif command == "remove-server":
            assert target is not None, "refusal() turns down remove-server without a target"
            assign = without_server(p.assign, target,
                                    servers=[x for x in set(p.assign) if x != target])
        else:
            assign = rebalanced(p.assign, load)
        request["load_spread_before"] = round(load_spread(p.assign, load), 4)
        request["load_spread_after"] = round(load_spread(assign, load), 4)
        request["copy_clock"] = max(self.clocks_in.values())   # the clock then
        self.step = "taking"
        fields = np.array(assign, np.int64)
        self._tell(messages.MoveTo(p.version + 2, fields))
        self.ranges.begin(p.version + 2, fields)

    def _tell(self, message: "messages.MoveAt | messages.MoveTo") -> None:
        s = self.ctx
        buf = message.pack()
        for server in self.ctx.others():
            s.send(buf, s.roles.servers[server])

    # The steps of a move.
    def on_moved(self, source: int, r, buf) -> None:
        s = self.ctx
        try:
            figures = json.loads(messages.Moved.of(buf).text)
            step = figures["step"]
        except (ValueError, KeyError, TypeError):
            raise ProtocolError(f"{s.sender(source)} sent MOVED whose text is not a JSON "
                                f"object with a step") from None
        expected = {"took": ("taking", "copying"), "whole": ("taking", "copying"),
                    "moved": ("switching",)}
        if self.request is None or self.step not in expected.get(step, ()):
            raise ProtocolError(f"{s.sender(source)} sent MOVED ({step!r}), but no move is at "
                                f"that step")
        self.step_in(s.roles.servers.index(source), figures)

    def step_in(self, server: int, figures: dict) -> None:
        s = self.ctx
        step = figures["step"]
        self.steps_in.setdefault(step, {})[server] = figures
        servers = {s.roles.index, *self.ctx.others()}
        if servers - set(self.steps_in[step]):
            return
        if step == "took":   # workers may split keys by it now
            self.step = "copying"
            self.reply_to_workers()
        if self.step == "copying" and not servers - set(self.steps_in.get("whole", {})):
            request = self.request
            assert request is not None, "a move is at a step only while its request is"
            self.step = "agreeing"
            log.info("ctl %s: every copy made in %.2f s; agreeing on the clock to switch at",
                     request["command"], time.monotonic() - self._began)
            self._ask(request, hold=True)
        if step == "moved":
            self._moved()

    def _moved(self) -> None:
        s = self.ctx
        before, after, request, moving = self.before, s.placement, self.request, s.gate.moving
        assert before is not None and request is not None, "a move's request, planned (_ask)"
        assert moving is not None, "the servers switch at the clock named (switch_at)"
        now = time.time()
        figures = [self.steps_in["moved"][k] for k in sorted(self.steps_in["moved"])]
        paused = now - min(f.pop("reached_at") for f in figures)

        def owned(p: Placement) -> dict:
            return {str(x): int(sum(1 for o in p.assign if o == x)) for x in range(p.n_servers)}

        result = {
            "ok": True, "command": request["command"], "target": request.get("target"),
            "clock": int(moving.clock), "copy_clock": request["copy_clock"],
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
            if name in request:
                result[name] = request[name]
        self.members.done.append(result)
        log.warning("ctl %s%s done at clock %d: %d of %d key ranges (%.1f%%) moved, %d keys "
                    "copied in %.2f s while training went on; training waited %.2f s for the "
                    "switch", result["command"],
                    "" if result["target"] is None else f" {result['target']}", result["clock"],
                    result["ranges_moved"], before.n_ranges, 100 * result["fraction_moved"],
                    result["keys_moved"], result["copy_s"], result["paused_s"])
        self.members.answer(request, result)
        self.request = self.step = None
        self.reply_to_workers()

    def on_placement(self, source: int, r, buf) -> None:
        """A worker's read was refused: the placement changed (answered once every server
        holds the new one) or the job stopped."""
        s = self.ctx
        if not s.lead:
            raise ProtocolError(f"{s.sender(source)} sent PLACEMENT to a server that does "
                                f"not lead")
        self.asking.append((source, r.header.ts, messages.PlacementAsk.of(r.header).version))
        if self.members.workers.joining is None and self.step not in ("taking", "switching"):
            self.reply_to_workers()

    def reply_to_workers(self) -> None:
        s = self.ctx
        p = s.placement
        for rank, ts, version in self.asking:
            moved_since = version < self.ranges.floor
            s.reply(np.concatenate([[int(moved_since), p.version, s.gate.moving.clock
                                     if s.gate.moving else -1], p.assign,
                                    p.extra_fields().ravel()]).astype(np.int64), rank, ts)
        self.asking = []

    def cancelled(self, clock: int) -> None:
        """The move named for `clock` was not made (every worker finished first)."""
        if self.request is not None:
            error = f"every worker finished training before clock {clock}"
            self.members.answer(self.request, {"ok": False, "error": error})
            self.request = self.step = None
            self.reply_to_workers()
