"""Forged requests sent to real servers: the server stops with a message naming the sender,
and nothing stored changes. 2 servers + 2 workers; the rules one by one are in
tests/hostile/test_forged_requests.py.

Run with: mpiexec -n 4 python -m pytest --with-mpi tests/mpi
"""
import numpy as np
import pytest
from mpi4py import MPI
from serving import server_for

from mpips.wire import encoding, protocol

from mpips.wire import tags
from mpips.ranks.bounded import wait_all
from mpips.worker.kvworker import KVWorker
from mpips.base.errors import ProtocolError
from mpips.wire.placement import Placement
from mpips.wire.protocol import Header, Op
from mpips.ranks.roles import split

pytestmark = pytest.mark.mpi(min_size=4)

KEYS = np.arange(0, 4000, 7, dtype=np.uint64)
GRADS = np.linspace(-1, 1, KEYS.shape[0], dtype=np.float32).reshape(-1, 1)


def forged(kind: str, server: int) -> np.ndarray:
    mine = KEYS[Placement(2).owners(KEYS) == server]
    if kind == "width":
        values = np.ones((mine.shape[0], 2), np.float32)
        return protocol.pack(Header(Op.PUSH, nkeys=mine.shape[0], width=2), mine, values)
    if kind == "nan":
        values = np.ones((mine.shape[0], 1), np.float32)
        values[-1] = np.nan
        return protocol.pack(Header(Op.PUSH, nkeys=mine.shape[0], width=1), mine, values)
    if kind in ("int8 scale", "int8 cut short"):   # (see pushfilter)
        data, _ = encoding.encode_values(np.ones((mine.shape[0], 1), np.float32), protocol.INT8)
        encoding.int8_scales(data, mine.shape[0], 1)[0] = np.nan if kind == "int8 scale" else 1
        buf = protocol.pack(Header(Op.PUSH, nkeys=mine.shape[0], width=1, flags=protocol.INT8),
                            mine, data)
        return buf if kind == "int8 scale" else buf[:-8]
    return protocol.pack(Header(Op.STOP_AT, clock=1))


@pytest.mark.parametrize("kind, says", [("width", "PUSH of width 2"),
                                        ("nan", "not finite"),
                                        ("int8 scale", "int8 values whose block #0 has scale nan"),
                                        ("int8 cut short", "int8 values) makes it"),
                                        ("stop_at", "STOP_AT, which a worker may not send")])
def test_a_forged_request_stops_the_server_and_changes_nothing(kind, says):
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            # ASP: worker 0's push is applied on arrival; the forged one must not be.
            server = server_for(roles, staleness=None, capacity=1 << 12)
            with pytest.raises(ProtocolError) as stopped:
                server.run()
            assert str(stopped.value).startswith("worker 1 (rank 3) sent a bad request")
            assert says in str(stopped.value)
            keys, state = server.store.items()
            order = np.argsort(keys)
            mine = Placement(2).owners(KEYS) == roles.index
            np.testing.assert_array_equal(keys[order], KEYS[mine])
            np.testing.assert_array_equal(state[order, :1], -GRADS[mine])   # as pushed, no more
        else:
            kv = KVWorker(roles, timeout=60)
            if roles.index == 0:
                kv.wait(kv.push(KEYS, GRADS))
                np.testing.assert_array_equal(kv.wait(kv.pull(KEYS)), -GRADS)   # applied
            wait_all([roles.group.Ibarrier()], 60, lambda: "worker 0's push to be applied")
            if roles.index == 1:
                sends = [roles.comm.Isend(forged(kind, s), s, tags.REQUEST_TAG)
                         for s in roles.servers]
                wait_all(sends, 60, lambda: "the forged requests to be sent")
        wait_all([roles.comm.Ibarrier()], 60, lambda: "every rank")
    finally:
        roles.free()
