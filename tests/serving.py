"""The server side of the MPI tests: one mpips server over a split communicator."""
from contextlib import contextmanager

from mpi4py import MPI

from mpips.models.optimizer import Optimizer
from mpips.ranks.roles import split
from mpips.server.loop import Server
from mpips.server.store import KVStore
from mpips.wire.clocks import ClockTable
from mpips.worker.kvworker import KVWorker


def server_for(roles, optimizer=None, staleness=0, capacity=1 << 10, timeout=60,
               **options) -> Server:
    """A server (SGD with lr 1 unless told), not yet serving."""
    store = KVStore(width=1, optimizer=optimizer or Optimizer("sgd", lr=1.0), capacity=capacity)
    return Server(roles, store, ClockTable(len(roles.workers), staleness), timeout=timeout,
                  **options)


def serve(roles, optimizer=None, staleness=0, capacity=1 << 10) -> Server:
    """Serve until every worker has said BYE; returns the server, for its store, clocks and
    stats."""
    server = server_for(roles, optimizer, staleness, capacity)
    server.run()
    return server


@contextmanager
def kv_worker(servers: int = 2, staleness=0):
    """The ranks split into `servers` servers and workers: on a server, None once it has
    served (SGD, lr 1); on a worker, its KVWorker, finished and closed after the block."""
    roles = split(servers, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            serve(roles, staleness=staleness)
            yield None
            return
        kv = KVWorker(roles, timeout=60)
        yield kv
        kv.finish()
        kv.close()
    finally:
        roles.free()
