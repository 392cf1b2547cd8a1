"""A push filter's flush (pushfilter): the worker's last push delivers every row its filter
held back, keys of earlier minibatches included, as part of its last clock. 2 servers + 2
workers, BSP, SGD with lr 1: a key's weight is minus the sum of its gradients."""
import numpy as np
import pytest
from mpi4py import MPI
from serving import server_for

from mpips.worker.kvworker import KVWorker
from mpips.worker.pushfilter import PushFilter
from mpips.ranks.roles import split

pytestmark = pytest.mark.mpi(min_size=4)

CLOCKS = 3


def minibatches(worker: int):
    """Each worker's keys per clock (disjoint between workers, spread over both servers):
    some only in the first clocks, some in every one; small gradients."""
    rng = np.random.default_rng(40 + worker)
    early = np.unique(rng.integers(0, 2**63, 200, dtype=np.uint64)) * np.uint64(2)
    always = np.unique(rng.integers(0, 2**63, 100, dtype=np.uint64)) * np.uint64(2)
    early, always = early + np.uint64(worker), always + np.uint64(worker)
    for clock in range(CLOCKS):
        keys = np.union1d(always, early) if clock < CLOCKS - 1 else always
        yield keys, rng.uniform(-0.1, 0.1, size=(keys.shape[0], 1)).astype(np.float32)


def test_the_last_push_delivers_every_row_held_back():
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            server = server_for(roles)
            server.run()
            assert server.stats.pushes_applied == 2 * CLOCKS, "the flush is one push a clock"
        else:
            kv = KVWorker(roles, timeout=60, push_filter=PushFilter(1, threshold=10.0))
            total = {}
            every = np.unique(np.concatenate([k for k, _ in minibatches(roles.index)]))
            for clock, (keys, grads) in enumerate(minibatches(roles.index)):
                assert (kv.wait(kv.pull(keys)) == 0).all(), "every row was held back so far"
                for k, g in zip(keys.tolist(), grads[:, 0]):
                    total[k] = np.float32(total.get(k, np.float32(0)) + g)
                last = clock == CLOCKS - 1
                if last:
                    assert (kv.wait(kv.pull(every, read_only=True)) == 0).all()
                kv.wait(kv.push(keys, grads, clock=True, flush=last))
            kv.finish()
            got = kv.wait(kv.pull(every, read_only=True))
            expect = -np.array([total[k] for k in every.tolist()], np.float32)
            np.testing.assert_array_equal(got[:, 0], expect)
            assert (got != 0).all(), "keys of the first clocks too"
            f = kv.filter.figures()
            assert f["residual_keys_flushed"] == every.shape[0]
            assert f["residual_keys_left"] == 0 and f["residual_left"] == 0
            held = sum(k.shape[0] for k, _ in list(minibatches(roles.index))[:-1])
            assert f["push_rows_held"] == held and f["push_rows"] == every.shape[0]
            kv.close()
    finally:
        roles.free()
