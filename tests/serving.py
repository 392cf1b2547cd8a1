"""The server side of the MPI tests: one mpips server over a split communicator."""
from mpips.wire.clocks import ClockTable
from mpips.models.optimizer import Optimizer
from mpips.server.loop import Server
from mpips.server.store import KVStore


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
