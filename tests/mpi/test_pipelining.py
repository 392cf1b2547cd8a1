"""Pulls sent ahead (NEXT_CLOCK) and pushes that reuse a pull's keys (SAME_KEYS), against
real servers: 2 servers + 2 workers. Run with mpiexec -n 4 python -m pytest --with-mpi."""
import numpy as np
import pytest
from mpi4py import MPI
from serving import serve

from mpips.ranks.bounded import wait_all
from mpips.worker.kvworker import KVWorker
from mpips.ranks.roles import split

pytestmark = pytest.mark.mpi(min_size=4)
CLOCKS = 8


def test_a_read_sent_ahead_under_bsp_sees_every_workers_previous_clock():
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            serve(roles, staleness=0)
            return
        kv = KVWorker(roles, timeout=60)
        shared = np.arange(0, 4000, 7, dtype=np.uint64)   # both workers push ones to these
        ones = np.ones(shared.shape[0], np.float32)
        batch = shared.copy()
        kv.wait(kv.pull(batch))
        for clock in range(CLOCKS):
            following = shared.copy()                       # the next minibatch's key array
            ahead = kv.pull(following, next_clock=True)     # sent before this clock's push
            kv.wait(kv.push(batch, ones, clock=True))       # reuses the keys of batch's pull
            # Served only once both workers' pushes for this clock are in: SGD, lr 1.
            np.testing.assert_array_equal(kv.wait(ahead)[:, 0], -2.0 * (clock + 1))
            batch = following
        kv.finish()
        kv.close()
    finally:
        roles.free()


def test_a_push_reusing_keys_after_the_table_grew_updates_the_right_keys():
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            server = serve(roles, staleness=None, capacity=256)
            assert server.stats.refound == len(roles.workers), "rows had moved: found by key"
            return
        kv = KVWorker(roles, timeout=60)
        me = roles.index
        keys = np.arange(me, 200, 2, dtype=np.uint64)       # disjoint between the workers
        grads = np.arange(keys.shape[0], dtype=np.float32).reshape(-1, 1)
        kv.wait(kv.pull(keys))
        # Both workers' rows are placed before the table grows, so that growing moves both.
        wait_all([roles.group.Ibarrier()], 60, lambda: "both workers to pull their keys")
        filler = np.arange(10**6 + me * 10**5, 10**6 + me * 10**5 + 5000, dtype=np.uint64)
        kv.wait(kv.pull(filler))                            # inserts: the table grows
        kv.wait(kv.push(keys, grads, clock=True))           # the keys of the first pull
        np.testing.assert_array_equal(kv.wait(kv.pull(keys, read_only=True)), -grads)
        kv.finish()
        kv.close()
    finally:
        roles.free()
