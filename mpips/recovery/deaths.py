"""Whether a server goes on after MPI (ULFM) tells it of a failure: a dead server's keys are
answered by their living copies (`takeover`), a dead worker's rows go to the others
(`workerloss`); a death neither can take ends the serving.
"""
from mpi4py import MPI

from ..ranks.ulfm import CannotFailOver, dead_ranks, is_failure
from .context import RecoveryContext


def survived(ctx: RecoveryContext, e: MPI.Exception) -> bool:
    """Under ULFM another rank died: whether this server goes on without it. `ctx`: the
    server's context (what a handler may read and do)."""
    if not is_failure(e):
        return False
    roles = ctx.roles
    dead = dead_ranks(roles.comm)
    servers = {roles.servers.index(r) for r in dead if r in roles.servers}
    workers = {roles.worker_index(r) for r in dead if r not in roles.servers}
    if servers and not ctx.takeover:
        return False
    if workers and not (ctx.losses and ctx.losses.hot):
        raise CannotFailOver(f"worker(s) {sorted(workers)} died: without ULFM's failover "
                             f"a dead worker's rows are not handed over")
    # Deaths known already (another server said, or MPI tells again of a request to a
    # dead rank) need nothing more.
    takeover, losses = ctx.takeover, ctx.losses   # both present here if needed (above)
    if takeover and servers - ctx.placement.dead:
        takeover.find_dead()
    if losses and workers:
        losses.workers_died(workers)   # those it knows of already are passed over
    return True
