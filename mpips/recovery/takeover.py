"""What a server does, under ULFM, when another rank dies: the living copies of a dead
server's keys take over (a new placement), the first living server leads if server 0 died,
and the copies lost are rebuilt (by `rangecopies`). A death nobody can take over raises
CannotFailOver. The server's loop hands it deaths; the rest of the server does not know of
failover. It works through the server's context (what a handler may read and do).
"""
import logging
import time

import numpy as np
from mpi4py import MPI

from ..ranks.bounded import wait_until
from ..ranks.ulfm import CannotFailOver, dead_ranks, is_failure
from ..wire import tags
from ..wire.placement import describe_ranges
from .context import RecoveryContext

log = logging.getLogger("mpips")


class Takeover:
    def __init__(self, ctx: RecoveryContext):
        self.ctx = ctx
        self.failures: list[dict] = []   # what this server saw of other servers' deaths
        ctx.copies.on_received.append(self._rebuilt)
        ctx.copies.on_whole.append(self._whole)

    def find_dead(self) -> bool:
        """After MPI told of a failure: learn which ranks died. Another server: the living
        copies of its keys take over (a new placement), and nobody waits for it. Whether
        a server died (raises CannotFailOver when the job cannot go on)."""
        s, roles = self.ctx, self.ctx.roles
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
            raise CannotFailOver(f"every copy of key range(s) {describe_ranges(placement.lost)} "
                                 f"died with server(s) {sorted(placement.dead)}")
        s.copies.plan(previous, placement)
        partial = [int(r) for r in np.flatnonzero(placement.primary_ranges(roles.index))
                   if not s.copies.rebuilds.complete(int(r))]
        if partial:
            raise CannotFailOver(f"every whole copy of key range(s) {describe_ranges(partial)} "
                                 f"died with server(s) {sorted(placement.dead)} (this server, "
                                 f"their new primary, had no complete copy of them yet)")
        s.copies.send_copies()
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
        MPI tells of it too; a sender's placement alone is not taken as proof of a death."""
        s = self.ctx

        def found() -> bool:
            s.roles.comm.Iprobe(MPI.ANY_SOURCE, tags.REQUEST_TAG)   # MPI progress
            self.find_dead()
            return s.placement.version >= version
        try:
            wait_until(found, min(s.timeout, 60.0),
                       lambda: f"MPI to tell of the servers' deaths that {sender} knows of "
                               f"(placement version {version})")
        except MPI.Exception as e:
            if not (is_failure(e) and self.find_dead()):
                raise

    def _rebuilt(self, range_: int, keys: int, seconds: float, load_s: float) -> None:
        if self.failures:
            self.failures[-1].setdefault("rebuilt", []).append(
                {"range": range_, "keys": keys, "seconds": round(seconds, 4),
                 "load_s": round(load_s, 4)})

    def _whole(self) -> None:
        done = self.ctx.copies.rebuilds.this_round
        if self.failures and done:
            keys_n, took = sum(d[1] for d in done), max(d[2] for d in done)
            log.warning("key range(s) %s have their copies again: %d keys copied here in "
                        "%.2f s (%.0f keys/s)", describe_ranges([d[0] for d in done]), keys_n,
                        took, keys_n / max(took, 1e-9))
