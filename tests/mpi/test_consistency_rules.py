"""Consistency rules the servers enforce, whatever the clients do. 2 servers + 2 workers.

Run with: mpiexec -n 4 python -m pytest --with-mpi tests/mpi
"""
import numpy as np
import pytest
from mpi4py import MPI
from serving import serve

from mpips.ranks.bounded import wait_all
from mpips.worker.kvworker import KVWorker
from mpips.base.errors import WaitTimeout
from mpips.ranks.roles import split

pytestmark = pytest.mark.mpi(min_size=4)


def both_workers_reach(roles, what):
    wait_all([roles.group.Ibarrier()], 60, lambda: what)


@pytest.mark.parametrize("staleness", [None, 2], ids=["asp", "ssp2"])
def test_a_worker_always_reads_its_own_writes(staleness):
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            serve(roles, staleness=staleness)
            return
        kv = KVWorker(roles, timeout=60)
        me = roles.index
        keys = np.arange(me * 1000, me * 1000 + 300, dtype=np.uint64) * np.uint64(7919)
        total = np.zeros((300, 1), np.float32)
        rng = np.random.default_rng(me)
        for clock in range(30 if me == 0 else 5):   # worker 1 falls behind at once
            grad = rng.integers(-4, 5, (300, 1)).astype(np.float32)
            kv.wait(kv.push(keys, grad, clock=True))
            total -= grad     # SGD with lr 1 and small integers: exact in float32
            np.testing.assert_array_equal(kv.wait(kv.pull(keys)), total, err_msg=f"clock {clock}")
            if staleness is not None and me == 0 and clock == staleness:
                break         # SSP: further reads would wait for worker 1, which stopped at 5
        kv.finish()
        kv.close()
    finally:
        roles.free()


@pytest.mark.parametrize("how", ["lying about its clock", "read-only"])
def test_a_read_ahead_is_held_by_the_clocks_whatever_the_client_says(how):
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            serve(roles, staleness=0)
            return
        kv = KVWorker(roles, timeout=60)
        keys = np.arange(8, dtype=np.uint64)
        if roles.index == 0:
            for _ in range(3):
                kv.wait(kv.push(keys, np.ones(8, np.float32), clock=True))
            if how == "read-only":
                ts = kv.pull(keys, read_only=True)   # read-only does not mean "skip the clocks"
            else:
                kv.clock = 0         # claim, in the request header, never to have advanced
                ts = kv.pull(keys)
            kv.timeout = 1.0
            with pytest.raises(WaitTimeout):
                kv.wait(ts)          # BSP: held, since worker 1 has not finished clock 0
            both_workers_reach(roles, "worker 1 to catch up")
            kv.timeout = 60
            np.testing.assert_array_equal(kv.wait(ts)[:, 0], -3 * np.ones(8) - 3 * np.ones(8))
        else:
            both_workers_reach(roles, "worker 0 to be held")
            for _ in range(3):
                kv.wait(kv.push(keys, np.ones(8, np.float32), clock=True))
        kv.finish()
        kv.close()
    finally:
        roles.free()
