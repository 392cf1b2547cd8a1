"""What a server does, under ULFM, when another rank dies: the living copies of a dead
server's keys take over (a new placement), the first living server leads if server 0 died,
and the copies lost are rebuilt (`rebuild` holds that state machine; this module carries its
messages). A death nobody can take over raises CannotFailOver.

It works on the server it belongs to: the loop hands it deaths, pushes, copies and the
moments a copy may be due; the rest of the server does not know of failover.
"""
import logging
import time

import numpy as np
from mpi4py import MPI

from . import protocol
from .bounded import wait_until
from .clocks import FINISHED
from .failover import CannotFailOver, dead_ranks, is_failure
from .placement import by_range, describe_ranges
from .protocol import Op
from .rebuild import Rebuilds

log = logging.getLogger("mpips")


class Takeover:
    def __init__(self, server):
        self.server = server
        self.rebuilds = Rebuilds(server.roles.index, len(server.roles.workers))
        self.failures = []        # what this server saw of other servers' deaths

    def learn(self) -> bool:
        """After MPI told of a failure: learn which ranks died. Another server: the living
        copies of its keys take over (a new placement), and nobody waits for it. Whether
        a server died (raises CannotFailOver when the job cannot go on)."""
        s, roles = self.server, self.server.roles
        began = time.monotonic()
        dead = dead_ranks(roles.comm)
        servers = {roles.servers.index(r) for r in dead if r in roles.servers}
        gone = servers - s.placement.dead
        if not gone:
            return False
        was_lead = s.lead
        previous = s.placement
        before = previous.primary_ranges(roles.index)
        placement = s.placement = previous.without(gone)
        if placement.lost:
            raise CannotFailOver(f"every copy of key range(s) {describe_ranges(placement.lost)} died with "
                                 f"server(s) {sorted(placement.dead)}")
        self.rebuilds.plan(previous, placement, time.monotonic())
        partial = [int(r) for r in np.flatnonzero(placement.primary_ranges(roles.index))
                   if not self.rebuilds.complete(int(r))]
        if partial:
            raise CannotFailOver(f"every whole copy of key range(s) {describe_ranges(partial)} died with "
                                 f"server(s) {sorted(placement.dead)} (this server, their new "
                                 f"primary, had no complete copy of them yet)")
        self.send_copies()
        s.servers_died(gone, was_lead)
        took = np.flatnonzero(placement.primary_ranges(roles.index) & ~before).tolist()
        for server in sorted(gone):
            self.failures.append({"server": server, "role": f"server {server}",
                                  "rank": roles.servers[server], "learned_at": time.time(),
                                  "failover_s": time.monotonic() - began,
                                  "ranges_taken_over": took})
            log.warning("server %d (rank %d) died; the living copies of its keys take over "
                        "(placement version %d): this server now answers key range(s) %s",
                        server, roles.servers[server], placement.version,
                        describe_ranges(took) if took else "none")
        return True

    def catch_up(self, version: int, sender: str) -> None:
        """A sender split its keys by a placement that counts more dead servers than this
        server knows of: it learned of a death first. Wait (bounded) until this server's
        MPI tells of it too; a sender's word alone is not taken for a death."""
        s = self.server

        def learned() -> bool:
            s.roles.comm.Iprobe(MPI.ANY_SOURCE, protocol.REQUEST_TAG)   # MPI progress
            self.learn()
            return s.placement.version >= version
        try:
            wait_until(learned, min(s.timeout, 60.0),
                       lambda: f"MPI to tell of the servers' deaths that {sender} knows of "
                               f"(placement version {version})")
        except MPI.Exception as e:
            if not (is_failure(e) and self.learn()):
                raise

    def route(self, worker: int, clock: int, ts: int, version: int, push):
        """A push as the server received it: noted (the rebuild waits for every worker to
        split by the new map), and without the part kept aside for ranges this server waits
        for a copy of."""
        self.rebuilds.pushed(worker, clock, version)
        if not self.rebuilds.incoming or push[1] is not None:   # SAME_KEYS: own ranges only
            return push
        keys, values = self.rebuilds.keep(self.server.placement.ranges_of(push[0]), clock,
                                          worker, ts, push[0], push[3])
        return keys, None, -1, values

    def applied(self, worker: int, ts: int) -> None:
        """Push `ts` of `worker` is in the store (a replayed one can be older than the last)."""
        self.rebuilds.last_ts[worker] = max(self.rebuilds.last_ts[worker], ts)

    def awaited(self) -> list:
        """Key ranges this server holds anew and still waits for a copy of."""
        return sorted(self.rebuilds.incoming)

    def handlers(self) -> dict:
        """The operations failover brings to the server's loop."""
        return {Op.COPY: self.on_copy}

    def on_copy(self, source: int, r, buf) -> None:
        """A copy of a range this server holds anew: load it, then apply the pushes kept
        meanwhile that it lacks, in the order its primary applied them."""
        s = self.server
        sender = s.sender(source)
        began = time.monotonic()
        range_ = r.header.ref
        if range_ not in self.rebuilds.incoming:
            log.warning("a copy of key range %d from %s, which this server does not wait for: "
                        "passed over", range_, sender)
            return
        s.store.load(r.keys, r.values)
        replay = self.rebuilds.arrived(range_, protocol.copied_positions(buf, r.header),
                                       time.monotonic(), r.keys.shape[0])
        # The range is one this server backs up (a new holder is never its primary): its
        # kept pushes are deferred as the parts that arrive after the copy will be, so that
        # each key's pushes of a clock are applied in worker order, all after the reads.
        deferrable = s.placement.version
        for clock, worker, ts, keys, values in replay:
            if s.clocks.staleness == 0 and clock >= s.clock_pushes.applied:
                s.clock_pushes.add(clock, worker,
                                   (keys, None, -1, values, clock, worker, ts, deferrable))
            else:
                s.store.push(keys, values, clock)
                self.applied(worker, ts)
        _, keys_n, took = self.rebuilds.done[-1]
        log.debug("key range %d: %d keys copied here from %s in %.2f s, then %d kept pushes",
                  range_, keys_n, sender, took, len(replay))
        if self.failures:
            self.failures[-1].setdefault("rebuilt", []).append(
                {"range": range_, "keys": keys_n, "seconds": round(took, 4),
                 "load_s": round(time.monotonic() - began, 4)})
        if not self.rebuilds.incoming:   # every range this server held anew is whole
            done = self.rebuilds.this_round
            keys_n, took = sum(d[1] for d in done), max(d[2] for d in done)
            log.warning("key range(s) %s have their copies again: %d keys copied here in "
                        "%.2f s (%.0f keys/s)", describe_ranges([d[0] for d in done]), keys_n,
                        took, keys_n / max(took, 1e-9))

    def send_copies(self) -> None:
        """The range copies due (see `rebuild`): sorted keys and their state rows, and the
        last push applied per worker; sent while serving goes on."""
        if not self.rebuilds.outgoing:
            return
        s = self.server
        # A copy says which pushes it holds (the last applied per worker): the parts for
        # ranges backed up here that an advance cut short by a death left aside go in first.
        s.apply_backups()
        left = [w for w in range(len(s.roles.workers)) if s.clocks.done[w] != FINISHED]
        due = self.rebuilds.due(left, s.clock_pushes.applied if s.clocks.staleness == 0
                                else None)
        if not due:
            return
        keys, state = s.store.items()
        wanted = np.zeros(s.placement.n_ranges, np.bool_)
        wanted[[c.range for c in due]] = True
        order, starts = by_range(keys, s.placement.ranges_of(keys), wanted)
        for copy in due:
            mine = order[starts[copy.range]:starts[copy.range + 1]]
            s.send(protocol.pack(
                protocol.Header(Op.COPY, nkeys=mine.shape[0], width=s.store.columns,
                                ref=copy.range, placement=s.placement.version),
                keys[mine], state[mine], self.rebuilds.last_ts), s.roles.servers[copy.to])
        for to in sorted({c.to for c in due}):
            sent = [c.range for c in due if c.to == to]
            log.info("sending server %d a copy of key range(s) %s (%d keys)", to,
                     describe_ranges(sent), sum(starts[r + 1] - starts[r] for r in sent))
