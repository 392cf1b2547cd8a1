"""Servers joining and leaving a running job, and key ranges moving off a busy server
(`mpips ctl`): the lead takes a request (see `control`), the servers agree on a clock, and at
that clock key ranges change owner. Workers, their reads refused there, ask the lead for the
new placement and read again from the new owners.

A move, in messages:
1. MOVE_ASK: the lead asks every other server for the highest clock it has let a read through
   for (MOVE_CLOCK, with the keys read per range since the last move, for `rebalance`); from
   then on a server holds reads past that clock, so no worker reads the clock named next
   before every server knows of it.
2. MOVE_AT: the lead names that clock, C (one past the highest), and the ranges' new owners.
   Reads of clock C or later, of keys split by the old placement, are refused from then on.
3. When every worker has completed C clocks on a server (its last pushes by the old placement
   applied), the server sends each range it answered for to every server that holds it anew
   (MOVE); once it holds every range new to it, it takes the new placement, drops the ranges
   it no longer holds, and tells the lead (MOVED).
4. Every server moved, the lead answers the workers' PLACEMENT requests with the new owners,
   and `ctl` with what moved.
Pushes are applied in the order they would have been without the move, so under BSP the
model is bitwise that of an uninterrupted run. Training waits from the moment the slowest
worker reaches C until the ranges have moved.

A server that leaves keeps running, owning nothing, as a spare: an MPI job cannot hand its
rank's node back to the allocation. `add-server` gives ranges to a spare (`--spares`).
"""
import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from . import control, protocol
from .clocks import FINISHED
from .errors import ProtocolError
from .failover import CannotFailOver
from .placement import (Placement, by_range, describe_ranges, load_spread, moved,
                        rebalanced, with_server, without_server)
from .protocol import Op

log = logging.getLogger("mpips")

POLL_S = 0.2   # how often the lead looks for requests


@dataclass
class Move:
    """A move under way on this server."""
    clock: int
    after: Placement
    began: float                          # when this server learned of it (monotonic)
    reached: float | None = None          # when every worker had completed `clock` here
    incoming: set = field(default_factory=set)   # ranges it still waits for
    keys_sent: int = 0
    keys_received: int = 0
    send_s: float = 0.0                   # finding, sorting and sending the ranges given
    load_s: float = 0.0                   # storing the ranges received


class Membership:
    def __init__(self, server, run_dir: str | None):
        self.server = server
        self.run_dir = run_dir
        self.load = np.zeros(server.placement.n_ranges, np.int64)   # keys read per range
        self.move: Move | None = None
        self.floor = 0          # reads split by a placement older than this are refused
        self.arrived = {}       # range -> (version, keys) of copies in before MOVE_AT
        self.asked = False      # a move is being agreed (MOVE_ASK taken, no MOVE_AT yet)
        # The lead's part:
        self.request = None     # the request being carried out
        self.before: Placement | None = None
        self.clocks_in = {}     # server -> the highest clock it let a read through for
        self.loads = {}         # server -> its keys read per range
        self.moved_in = {}      # server -> its figures (MOVED)
        self.asking = []        # (rank, ts) of workers' PLACEMENT requests held
        self.done = []          # what each move did (the summary's "moves")
        self.leaving = {}       # worker -> (the request it leaves for, when asked)
        self.left = []          # workers that left, in order (the first joins again first)
        self.joining = None     # a worker joining: its request, the workers yet to split,...
        self._began = 0.0
        self._next_poll = 0.0

    def handlers(self) -> dict:
        return {Op.MOVE_ASK: self.on_ask, Op.MOVE_CLOCK: self.on_clock, Op.MOVE_AT: self.on_at,
                Op.MOVE: self.on_move, Op.MOVED: self.on_moved,
                Op.PLACEMENT: self.on_placement, Op.SPLIT: self.on_split,
                Op.JOIN_AT: self.on_join_at}

    @property
    def busy(self) -> bool:
        """A move is being agreed or carried out (the lead names no stop meanwhile)."""
        return (self.request is not None or self.move is not None or self.asked
                or self.joining is not None)

    # The lead: requests.
    def poll(self, now: float) -> None:
        if (now < self._next_poll or self.request is not None or self.joining is not None
                or not self.run_dir):
            return
        self._next_poll = now + POLL_S
        request = control.take(self.run_dir)
        if request is None:
            return
        if "error" in request:
            self._answer(request, {"ok": False, "error": request["error"]})
            return
        command = request["command"]
        log.info("ctl: %s%s asked", command,
                 "" if request.get("target") is None else f" {request['target']}")
        if command == "status":
            self._answer(request, {"ok": True, **self.status()})
            return
        problem = self._refusal(command, request.get("target"))
        if problem:
            self._answer(request, {"ok": False, "error": problem})
            log.warning("ctl: %s refused: %s", command, problem)
        elif command == "remove-worker":
            self._ask_to_leave(request)
        elif command == "add-worker":
            self._ask_to_give(request)
        else:
            self._ask(request)

    def _refusal(self, command: str, target) -> str | None:
        """Why the request cannot be carried out now, or None."""
        s = self.server
        p = s.placement
        if s.clocks.slowest() == FINISHED:
            return "training has ended"
        if s.ckpt.stop_at is not None or s._stop_asked:
            return "the job is stopping"
        if command == "remove-worker":
            return self._leave_refusal(target)
        if command == "add-worker":
            return self._join_refusal(target)
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

    def _leave_refusal(self, worker) -> str | None:
        s = self.server
        n = len(s.roles.workers)
        if not s.losses or s.dense.tables:
            return ("a worker leaves only a job of minibatch training without --stages: a "
                    "pipeline's stages and a full-batch solver's rows are not handed on")
        if worker is None:
            return "remove-worker needs the number of the worker to remove"
        if not 0 <= worker < n:
            return f"there is no worker {worker}: the job has {n} (0-{n - 1})"
        if worker in s.clocks.gone:
            return f"worker {worker} died"
        if s.clocks.done[worker] == FINISHED:
            return f"worker {worker} has finished training"
        if worker in self.leaving:
            return f"worker {worker} is leaving already"
        if not set(s.losses.training(but=worker)) - set(self.leaving):
            return "no other worker is still training to take its rows"
        return None

    def _idle_workers(self) -> list:
        """Living workers not training (they left, or finished their rows): those that left
        first, in order."""
        s = self.server
        idle = [w for w in range(len(s.roles.workers))
                if s.clocks.done[w] == FINISHED and w not in s.clocks.gone]
        return sorted(idle, key=lambda w: self.left.index(w) if w in self.left else len(idle))

    def _donors(self) -> list:
        return [w for w in self.server.losses.training(but=-1) if w not in self.leaving]

    def _join_refusal(self, worker) -> str | None:
        s = self.server
        n = len(s.roles.workers)
        if not s.losses or s.dense.tables:
            return ("a worker joins only a job of minibatch training without --stages: a "
                    "pipeline's stages and a full-batch solver's rows are not handed on")
        if worker is not None and not 0 <= worker < n:
            return f"there is no worker {worker}: the job has {n} (0-{n - 1})"
        if worker is not None and worker in s.clocks.gone:
            return f"worker {worker} died"
        if worker is not None and worker not in self._idle_workers():
            return f"worker {worker} is training"
        if not self._idle_workers():
            return ("no worker is idle to join: one that left (ctl remove-worker) or finished "
                    "its rows can")
        if not self._donors():
            return "no worker is training to share its rows"
        return None

    def _ask_to_give(self, request: dict) -> None:
        """A worker joins: every worker training splits its rows left, keeping n shares for
        the one it gives (n: the workers training), and tells the lead (SPLIT); then the
        servers agree on the clock it joins at (see `_join`)."""
        s = self.server
        worker = request.get("target")
        worker = self._idle_workers()[0] if worker is None else worker
        donors = self._donors()
        self.joining = {"request": request, "worker": worker, "waiting": set(donors),
                        "given": [], "began": time.monotonic()}
        for w in donors:
            s.send(np.array([protocol.GIVE_NOTICE, worker, len(donors)], np.int64),
                   s.roles.workers[w], protocol.NOTICE_TAG)

    def on_split(self, source: int, r, buf) -> None:
        """The lead: a worker split its rows with the one joining; number it, as a death."""
        s, j = self.server, self.joining
        sender = s.roles.worker_index(source)
        try:
            death = protocol.death_of(protocol.int64_fields(buf))
        except ValueError as e:
            raise ProtocolError(f"{s.sender(source)} sent a bad request: SPLIT: {e}") from None
        if (j is None or sender not in j["waiting"] or death.worker != sender or death.dead
                or death.survivors != (sender, j["worker"]) or len(death.shares) != 2):
            raise ProtocolError(f"{s.sender(source)} sent a bad request: SPLIT of its rows "
                                f"with worker(s) {list(death.survivors)}, which no join asked "
                                f"of it")
        j["waiting"].discard(sender)
        j["given"].append(sender)
        s.losses.announce(death)
        self._split_done()

    def _split_done(self) -> None:
        """Once every worker asked has split its rows (or finished instead), the clock."""
        j = self.joining
        if j["waiting"]:
            return
        if not j["given"]:
            self._answer(j["request"], {"ok": False, "error": "every worker finished its rows "
                                                              "before sharing them"})
            self.joining = None
            return
        self._ask(j["request"])

    def _join(self, clock: int) -> None:
        """The lead, the clock agreed: the worker trains again from it, on every server."""
        s, j = self.server, self.joining
        worker = j["worker"]
        for server in self._others():
            s.send(protocol.pack(protocol.Header(Op.JOIN_AT, clock=clock, ref=worker)),
                   s.roles.servers[server])
        self._joined(worker, clock)
        if worker in s.clocks.gone:
            self._answer(j["request"], {"ok": False, "error": f"worker {worker} died before "
                                                              f"it joined"})
            self.request = self.joining = None
            return
        s.send(np.array([protocol.JOIN_NOTICE, clock - 1], np.int64), s.roles.workers[worker],
               protocol.NOTICE_TAG)
        result = {"ok": True, "command": "add-worker", "target": worker, "clock": clock,
                  "seconds": round(time.monotonic() - j["began"], 4), "from": j["given"]}
        self.done.append(result)
        log.warning("ctl add-worker %d done: it trains again from clock %d, with a share of "
                    "the rows left of worker(s) %s", worker, clock, j["given"])
        if worker in self.left:
            self.left.remove(worker)
        self._answer(j["request"], result)
        self.request = self.joining = None

    def on_join_at(self, source: int, r, buf) -> None:
        s = self.server
        worker = r.header.ref
        if not 0 <= worker < len(s.roles.workers):
            raise ProtocolError(f"{s.sender(source)} sent JOIN_AT of worker {worker}; the job "
                                f"has {len(s.roles.workers)}")
        self._joined(worker, r.header.clock)

    def _joined(self, worker: int, clock: int) -> None:
        """`worker` trains again from `clock` (unless it died meanwhile); reads held for the
        agreement go on."""
        s = self.server
        if worker not in s.clocks.gone:
            s.clocks.resume(worker, clock - 1)
            s.heard(worker)
        self.asked = False
        s.gate.ceiling = None
        s.release()

    def idle_joining(self) -> int:
        """1 if a worker is joining but not training yet (the lead counts it as training:
        the others must not end before it has trained its share), else 0."""
        j = self.joining
        return int(j is not None and self.server.clocks.done[j["worker"]] == FINISHED)

    def _ask_to_leave(self, request: dict) -> None:
        """Tell the worker to leave after the minibatch it is at; its FINISH says where its
        rows left start, and the lead hands them on (see workerloss)."""
        s = self.server
        worker = request["target"]
        self.leaving[worker] = (request, time.monotonic())
        s.send(np.array([protocol.LEAVE_NOTICE], np.int64), s.roles.workers[worker],
               protocol.NOTICE_TAG)

    def worker_gone(self, worker: int) -> None:
        """The lead: `worker` died (its rows handed on); a change waiting for it goes on."""
        if worker in self.leaving:
            request, _ = self.leaving.pop(worker)
            self._answer(request, {"ok": False, "error": f"worker {worker} died before it "
                                                         f"left; its rows were handed on"})
        j = self.joining
        if j is not None and worker == j["worker"] and j["given"]:
            # The shares given to it go on as a finished worker's would (see workerloss).
            losses, place = self.server.losses, self.server.ckpt.positions.get(worker, {})
            losses.finished(worker, 0, {"epoch": losses.epochs, "taken": place.get("taken", [])})
        if j is not None and worker in j["waiting"]:
            j["waiting"].discard(worker)
            self._split_done()

    def worker_finished(self, worker: int, clock: int, handed) -> None:
        """The lead: `worker` said FINISH (`handed`: the workplan.Death its rows left went on
        by, if any); if it was asked to leave, the answer."""
        if self.joining is not None and worker in self.joining["waiting"]:
            self.joining["waiting"].discard(worker)
            self._split_done()
        if worker not in self.leaving:
            return
        self.left.append(worker)
        request, began = self.leaving.pop(worker)
        result = {"ok": True, "command": "remove-worker", "target": worker, "clock": clock,
                  "seconds": round(time.monotonic() - began, 4),
                  "from_epoch": handed.epoch if handed else None,
                  "handed_to": list(handed.survivors) if handed else []}
        self.done.append(result)
        log.warning("ctl remove-worker %d done: it left at clock %d%s", worker, clock,
                    f"; its rows left from epoch {handed.epoch} go to worker(s) "
                    f"{list(handed.survivors)}" if handed else ", having trained all its rows")
        self._answer(request, result)

    def _ask(self, request: dict) -> None:
        s = self.server
        self.request, self.before = request, s.placement
        self._began = time.monotonic()
        self.clocks_in, self.loads, self.moved_in = {}, {}, {}
        for server in self._others():
            s.send(protocol.pack(protocol.Header(Op.MOVE_ASK)), s.roles.servers[server])
        self.clocks_in[s.roles.index], self.loads[s.roles.index] = self._hold_reads()
        self._name_clock()

    def _others(self) -> list:
        s = self.server
        return [i for i in range(s.placement.n_servers)
                if i != s.roles.index and i not in s.placement.dead]

    def _hold_reads(self):
        gate = self.server.gate
        gate.ceiling = gate.highest
        return gate.highest, self.load.copy()

    def on_ask(self, source: int, r, buf) -> None:
        s = self.server
        self.asked = True
        highest, load = self._hold_reads()
        s.send(protocol.pack(protocol.Header(Op.MOVE_CLOCK, clock=highest + 1,
                                             nkeys=load.shape[0]), load), source)

    def on_clock(self, source: int, r, buf) -> None:
        s = self.server
        if self.request is None:
            raise ProtocolError(f"{s.sender(source)} sent MOVE_CLOCK, but no move is being "
                                f"agreed")
        self.clocks_in[s.roles.servers.index(source)] = r.header.clock - 1
        self.loads[s.roles.servers.index(source)] = protocol.int64_fields(buf).copy()
        self._name_clock()

    def _name_clock(self) -> None:
        """The lead, every server's highest read clock in: the clock of the move and the new
        owners, to every server."""
        s = self.server
        if set(self._others()) - set(self.clocks_in):
            return
        clock = max(self.clocks_in.values()) + 1
        p = s.placement
        command, target = self.request["command"], self.request.get("target")
        if command == "add-worker":
            self._join(clock)
            return
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
        version = p.version + 1
        fields = np.array(assign, np.int64)
        for server in self._others():
            s.send(protocol.pack(protocol.Header(Op.MOVE_AT, clock=clock, ref=version,
                                                 nkeys=fields.shape[0]), fields),
                   s.roles.servers[server])
        self._at(clock, version, fields)

    # Every server: the move.
    def on_at(self, source: int, r, buf) -> None:
        self._at(r.header.clock, r.header.ref, protocol.int64_fields(buf))

    def _at(self, clock: int, version: int, fields: np.ndarray) -> None:
        s = self.server
        p = s.placement
        if version != p.version + 1 or self.move is not None:
            raise ProtocolError(f"MOVE_AT to placement version {version}, where this server's "
                                f"is {p.version}{' and a move is under way' if self.move else ''}")
        if fields.min() < 0 or fields.max() >= p.n_servers or p.dead & set(fields.tolist()):
            raise ProtocolError(f"MOVE_AT giving key ranges to servers that are not living "
                                f"servers of the job ({sorted(set(fields.tolist()))})")
        after = Placement(p.n_servers, p.replicas, p.nodes, version=version, dead=p.dead,
                          assign=fields.tolist())
        self.move = Move(clock, after, time.monotonic())
        self.asked = False
        s.gate.ceiling = None
        s.gate.moving = (clock, version)
        self.reached()
        s.release()

    def reached(self) -> None:
        """After the clocks moved (or the move was named): once every worker has completed
        the move's clock here, send the ranges this server gives (or, if every worker
        finished before it, there is nothing to move)."""
        s, m = self.server, self.move
        if m is None or m.reached is not None:
            return
        slowest = s.clocks.slowest()
        if slowest == FINISHED:
            self._cancel()
            return
        if slowest < m.clock:
            return
        m.reached = time.monotonic()
        s.apply_backups()
        began = time.monotonic()
        before, me = s.placement, s.roles.index
        given = np.array([h[0] == me and bool(set(m.after.holders[r]) - set(h))
                          for r, h in enumerate(before.holders)])
        if given.any():
            keys, state = s.store.items()
            order, starts = by_range(keys, before.ranges_of(keys), given)
        for r in range(before.n_ranges):
            old, new = before.holders[r], m.after.holders[r]
            if given[r]:
                mine = order[starts[r]:starts[r + 1]]
                for to in (t for t in new if t not in old):
                    s.send(protocol.pack(
                        protocol.Header(Op.MOVE, nkeys=mine.shape[0], width=s.store.columns,
                                        ref=r, placement=m.after.version),
                        keys[mine], state[mine]), s.roles.servers[to])
                    m.keys_sent += mine.shape[0]
            if me in new and me not in old:
                m.incoming.add(r)
        m.send_s = time.monotonic() - began
        early = {r for r, (version, _) in self.arrived.items() if version == m.after.version}
        if early - m.incoming:
            raise ProtocolError(f"copies of key range(s) {describe_ranges(early - m.incoming)} "
                                f"arrived, which this server does not take")
        m.incoming -= early
        m.keys_received += sum(n for _, n in self.arrived.values())
        self.arrived.clear()
        if not m.incoming:
            self._finish()

    def on_move(self, source: int, r, buf) -> None:
        s, m = self.server, self.move
        version, range_ = r.header.placement, r.header.ref
        if version <= s.placement.version or (m is not None and version != m.after.version):
            raise ProtocolError(f"{s.sender(source)} sent a copy of key range {range_} for "
                                f"placement version {version}; this server's is "
                                f"{s.placement.version}")
        if m is not None and m.reached is not None and range_ not in m.incoming:
            raise ProtocolError(f"{s.sender(source)} sent a copy of key range {range_}, which "
                                f"this server does not take")
        began = time.monotonic()
        waiting = len(m.incoming) if m is not None and m.reached is not None else 1
        s.store.reserve(len(s.store) + r.keys.shape[0] * max(waiting, 1))
        s.store.load(r.keys, r.values)   # ranges it did not hold: nothing else writes them
        if m is not None:
            m.load_s += time.monotonic() - began
        if m is None or m.reached is None:
            self.arrived[range_] = (version, r.keys.shape[0])
            return
        m.incoming.discard(range_)
        m.keys_received += r.keys.shape[0]
        if not m.incoming:
            self._finish()

    def _finish(self) -> None:
        """This server holds every range new to it: it takes the new placement."""
        s, m = self.server, self.move
        after = m.after
        began = time.monotonic()
        dropped = 0
        if (s.placement.held_ranges(s.roles.index) & ~after.held_ranges(s.roles.index)).any():
            keys, _ = s.store.items()
            held = after.held_ranges(s.roles.index)[after.ranges_of(keys)]
            dropped = int((~held).sum())
            s.store.keep(held)
        drop_s = time.monotonic() - began
        s.placement = after
        s.dense.placement = after
        s.hooks.placement_changed(after)
        self.floor = after.version
        self.load[:] = 0
        self.move = None
        figures = {"server": s.roles.index, "keys_sent": m.keys_sent,
                   "keys_received": m.keys_received, "keys_dropped": dropped,
                   "wait_s": round(m.reached - m.began, 4),
                   "move_s": round(time.monotonic() - m.reached, 4),
                   "send_s": round(m.send_s, 4), "load_s": round(m.load_s, 4),
                   "drop_s": round(drop_s, 4)}
        log.info("key ranges moved at clock %d (placement version %d): %d keys sent, %d "
                 "received, %d dropped here, in %.2f s", m.clock, after.version, m.keys_sent,
                 m.keys_received, figures["keys_dropped"], figures["move_s"])
        if s.lead:
            self._moved(s.roles.index, figures)
        else:
            text = np.frombuffer(json.dumps(figures).encode(), np.uint8)
            s.send(protocol.pack(protocol.Header(Op.MOVED), text), s._lead_rank)

    def _cancel(self) -> None:
        s, m = self.server, self.move
        self.move = None
        s.gate.moving = None
        log.warning("the move named for clock %d was not made: every worker finished first",
                    m.clock)
        if s.lead and self.request is not None:
            self._answer(self.request, {"ok": False, "error": f"every worker finished "
                                                              f"training before clock {m.clock}"})
            self.request = None
            self._reply_to_workers()

    # The lead: the end of a move.
    def on_moved(self, source: int, r, buf) -> None:
        s = self.server
        try:
            figures = json.loads(protocol.error_text(buf))
        except ValueError:
            raise ProtocolError(f"{s.sender(source)} sent MOVED whose text is not JSON") from None
        if self.request is None:
            raise ProtocolError(f"{s.sender(source)} sent MOVED, but no move is under way")
        self._moved(s.roles.servers.index(source), figures)

    def _moved(self, server: int, figures: dict) -> None:
        s = self.server
        self.moved_in[server] = figures
        if ({s.roles.index, *self._others()} - set(self.moved_in)) or self.move is not None:
            return
        before, after = self.before, s.placement
        figures = [self.moved_in[k] for k in sorted(self.moved_in)]
        owned = lambda p: {str(x): int(sum(1 for o in p.assign if o == x))   # noqa: E731
                           for x in range(p.n_servers)}
        result = {
            "ok": True, "command": self.request["command"], "target": self.request.get("target"),
            "clock": int(s.gate.moving[0]), "version": after.version,
            "ranges_moved": sum(a != b for a, b in zip(before.assign, after.assign)),
            "fraction_moved": round(moved(before.assign, after.assign), 6),
            "keys_moved": sum(f["keys_sent"] for f in figures),
            "keys_dropped": sum(f["keys_dropped"] for f in figures),
            "seconds": round(time.monotonic() - self._began, 4),
            "paused_s": max(f["move_s"] for f in figures),
            "ranges_before": owned(before), "ranges_after": owned(after),
            "spares": list(after.spares), "servers": figures}
        for name in ("load_spread_before", "load_spread_after"):
            if name in self.request:
                result[name] = self.request[name]
        self.done.append(result)
        log.warning("ctl %s%s done at clock %d: %d of %d key ranges (%.1f%%) moved, %d keys, "
                    "in %.2f s (training waited %.2f s)", result["command"],
                    "" if result["target"] is None else f" {result['target']}", result["clock"],
                    result["ranges_moved"], before.n_ranges, 100 * result["fraction_moved"],
                    result["keys_moved"], result["seconds"], result["paused_s"])
        self._answer(self.request, result)
        self.request = None
        self._reply_to_workers()

    def on_placement(self, source: int, r, buf) -> None:
        """A worker's read was refused: it moved (answered once the move is over) or the job
        stopped."""
        s = self.server
        if not s.lead:
            raise ProtocolError(f"{s.sender(source)} sent PLACEMENT to a server that does "
                                f"not lead")
        self.asking.append((source, r.header.ts, r.header.ref))
        if not self.busy:
            self._reply_to_workers()

    def _reply_to_workers(self) -> None:
        s = self.server
        p = s.placement
        for rank, ts, version in self.asking:
            moved_since = version < self.floor
            s.reply(np.array([int(moved_since), p.version, s.gate.moving[0] if s.gate.moving
                              else -1, *p.assign], np.int64), rank, ts)
        self.asking = []

    def refused_stale(self, h, source: int) -> bool:
        """A worker's read of keys split before key ranges moved: refused (an empty reply),
        so that the worker asks the lead and reads again; whether it was."""
        if h.op != Op.PULL or h.placement >= self.floor or h.ts < 0:
            return False
        self.server.reply(np.empty(0, np.float32), source, h.ts)
        return True

    def servers_died(self) -> None:
        if self.busy:
            raise CannotFailOver("a server died while key ranges moved (mpips ctl): the job "
                                 "cannot go on; resume from the last checkpoint")

    def status(self) -> dict:
        """What `ctl status` prints: the placement, the workers' clocks, the moves so far."""
        s = self.server
        p = s.placement
        done = s.clocks.done
        return {"placement_version": p.version, "replicas": p.replicas,
                "ranges": p.n_ranges,
                "servers": [{"server": i, "rank": s.roles.servers[i],
                             "ranges": int(sum(1 for o in p.assign if o == i)),
                             "state": ("dead" if i in p.dead else
                                       "spare" if i in p.spares else "owner")}
                            for i in range(p.n_servers)],
                "workers": [{"worker": w, "rank": s.roles.workers[w],
                             "clock": "finished" if done[w] == FINISHED else int(done[w]),
                             **({"state": "leaving"} if w in self.leaving else
                                {"state": "dead"} if w in s.clocks.gone else {})}
                            for w in range(done.shape[0])],
                "moves": len(self.done)}

    def _answer(self, request: dict, result: dict) -> None:
        try:
            control.answer(self.run_dir, request["id"], result)
        except Exception as e:   # noqa: BLE001 -- an answer not written must not stop training
            log.warning("ctl: the answer to request %s was not written: %s", request["id"], e)
