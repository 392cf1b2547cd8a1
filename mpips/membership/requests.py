"""Servers and workers joining and leaving a running job, and key ranges moving off a busy
server (`mpips ctl`): the lead takes the requests (see `channel`) oldest first, refuses one
that cannot be carried out now, answers `status`, and hands the others to their part:
`rangemoves` and `movelead` (add-server, remove-server, rebalance: key ranges move between
servers) or `workermoves` (add-worker, remove-worker: a worker's rows move). `Membership` is
the server's one handle on them; all work through the server's context (what a handler may
read and do).
"""
import logging

from ..ranks.ulfm import CannotFailOver
from ..wire.clocks import FINISHED
from . import channel as control
from .context import MembershipContext
from .movelead import MoveLead
from .rangemoves import RangeMoves
from .workermoves import WorkerMoves

log = logging.getLogger("mpips")

POLL_S = 0.2   # how often the lead looks for requests


class Membership:
    def __init__(self, ctx: MembershipContext, run_dir: str | None, run_id: str | None = None):
        self.ctx = ctx
        self.run_dir = run_dir
        self.run_id = run_id   # the run requests must be for
        self.done: list[dict] = []   # what each change did (the summary's "moves")
        self.ranges = RangeMoves(self)       # every server's part in a move of key ranges
        self.move_lead = MoveLead(self)      # the lead's
        self.workers = WorkerMoves(self)
        # What the server and `workerloss` use of the parts (the arrays and dicts are the
        # parts' own, changed in place only):
        self.load = self.ranges.load   # keys read per range, counted as reads are admitted
        self.leaving = self.workers.leaving
        self.reached = self.ranges.reached
        self.refused_stale = self.ranges.refused_stale
        self.worker_gone = self.workers.worker_gone
        self.worker_finished = self.workers.worker_finished
        self.idle_joining = self.workers.idle_joining
        self.next_poll = 0.0   # when the loop next calls poll
        ctx.register(self.handlers())

    def handlers(self) -> dict:
        return {**self.ranges.handlers(), **self.move_lead.handlers(),
                **self.workers.handlers()}

    @property
    def busy(self) -> bool:
        """A move is being agreed or carried out (the lead names no stop meanwhile)."""
        return (self.ranges.busy or self.move_lead.busy
                or self.workers.joining is not None)

    def poll_soon(self) -> None:
        """Look for requests at the next turn of the loop (one was just made)."""
        self.next_poll = 0.0

    def poll(self, now: float) -> None:
        """The lead: the requests waiting, oldest first, until one starts a change."""
        if now < self.next_poll:
            return
        self.next_poll = now + POLL_S
        if not self.run_dir or not self.ctx.lead:   # (asked here, not by the loop every turn)
            return
        while self.move_lead.request is None and self.workers.joining is None:
            request = control.take(self.run_dir, self.run_id)
            if request is None:
                return
            self._carry_out(request)

    def _carry_out(self, request: dict) -> None:
        if "error" in request:
            self.answer(request, {"ok": False, "error": request["error"]})
            return
        command = request["command"]
        log.info("ctl: %s%s asked", command,
                 "" if request.get("target") is None else f" {request['target']}")
        if command == "status":
            self.answer(request, {"ok": True, **self.status()})
            return
        problem = self._refusal(command, request.get("target"))
        if problem:
            self.answer(request, {"ok": False, "error": problem})
            log.warning("ctl: %s refused: %s", command, problem)
        elif command == "remove-worker":
            self.workers.ask_to_leave(request)
        elif command == "add-worker":
            self.workers.ask_to_give(request)
        else:
            self.move_lead.start(request)

    def _refusal(self, command: str, target) -> str | None:
        """Why the request cannot be carried out now, or None."""
        s = self.ctx
        if s.clocks.slowest() == FINISHED:
            return "training has ended"
        if s.ckpt.stop_at is not None or s.stopping.asked:
            return "the job is stopping"
        if command == "remove-worker":
            return self.workers.leave_refusal(target)
        if command == "add-worker":
            return self.workers.join_refusal(target)
        return self.move_lead.refusal(command, target)

    def servers_died(self) -> None:
        if self.busy:
            raise CannotFailOver("a server died while key ranges moved (mpips ctl): the job "
                                 "cannot go on; resume from the last checkpoint")

    def status(self) -> dict:
        """What `ctl status` prints: the placement, the workers' clocks, the moves so far."""
        s = self.ctx
        p = s.placement
        done = s.clocks.done
        return {"placement_version": p.version, "replicas": p.replicas,
                "ranges": p.n_ranges, "lead": s.roles.index,   # this server answers
                "servers": [{"server": i, "rank": s.roles.servers[i],
                             "ranges": int(sum(1 for o in p.assign if o == i)),
                             "state": ("dead" if i in p.dead else
                                       "spare" if i in p.spares else "owner")}
                            for i in range(p.n_servers)],
                "workers": [{"worker": w, "rank": s.roles.workers[w],
                             "clock": "finished" if done[w] == FINISHED else int(done[w]),
                             **({"state": "leaving"} if w in self.leaving else
                                {"state": "dead"} if w in s.clocks.gone else {})}
                            for w in range(len(done))],
                "moves": len(self.done)}

    def answer(self, request: dict, result: dict) -> None:
        """`ctl`'s answer to `request`; the next request waiting is taken at once."""
        self.poll_soon()
        assert self.run_dir is not None, "requests are taken only with a run_dir (see poll)"
        try:
            control.answer(self.run_dir, request["id"], result)
        except Exception as e:   # noqa: BLE001 -- an answer not written must not stop training
            log.warning("ctl: the answer to request %s was not written: %s", request["id"], e)
