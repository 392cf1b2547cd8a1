"""The server side of the MPI tests: one mpips server over a split communicator."""
from mpips.clocks import ClockTable
from mpips.optimizer import Optimizer
from mpips.server import Server
from mpips.store import KVStore


def serve(roles, optimizer=None, staleness=0, capacity=1 << 10) -> Server:
    """Serve until every worker has said BYE (SGD with lr 1 unless told); returns the server,
    for its store, clocks and stats."""
    store = KVStore(width=1, optimizer=optimizer or Optimizer("sgd", lr=1.0), capacity=capacity)
    server = Server(roles, store, ClockTable(len(roles.workers), staleness), timeout=60)
    server.run()
    return server
