"""The worker API against real servers: 4 ranks, 2 servers + 2 workers.

Run with: mpiexec -n 4 python -m pytest --with-mpi tests/mpi
"""
import numpy as np
import pytest
from mpi4py import MPI
from reference import weights_after_each_step
from serving import serve, server_for

from mpips.ranks.bounded import wait_all
from mpips.worker.kvworker import KVWorker
from mpips.base.errors import WaitTimeout
from mpips.models.optimizer import Optimizer
from mpips.wire.placement import Placement
from mpips.ranks.roles import split

pytestmark = pytest.mark.mpi(min_size=4)

CLOCKS = 12


def keys_of(worker: int) -> np.ndarray:
    """Each worker's own keys (disjoint between workers), spread over the key space."""
    rng = np.random.default_rng(100 + worker)
    keys = np.unique(rng.integers(0, 2**64 - 1, 400, dtype=np.uint64, endpoint=True))
    return keys[keys % np.uint64(2) == np.uint64(worker)]


def grads_of(worker: int, keys) -> np.ndarray:
    rng = np.random.default_rng(200 + worker)
    return rng.normal(size=(CLOCKS, keys.shape[0], 1)).astype(np.float32)


@pytest.mark.parametrize("optimizer", [
    Optimizer("sgd", lr=0.5, l2=0.01),
    Optimizer("adagrad", lr=0.1, l2=0.001),
    Optimizer("ftrl", lr=0.2, l1=0.01, l2=0.1, beta=1.0),
    Optimizer("adam", lr=0.05, l2=0.001),
], ids=["sgd", "adagrad", "ftrl", "adam"])
def test_pull_after_push_is_the_optimizer_formula(optimizer):
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            store = serve(roles, optimizer).store
            n_own = len(store)
        else:
            me, other = roles.index, 1 - roles.index
            kv = KVWorker(roles, timeout=60)
            keys, other_keys = keys_of(me), keys_of(other)
            assert set(Placement(2).owners(keys).tolist()) == {0, 1}, "keys span both servers"
            expect = weights_after_each_step(optimizer, grads_of(me, keys))
            expect_other = weights_after_each_step(optimizer, grads_of(other, other_keys))
            for clock, g in enumerate(grads_of(me, keys)):
                got = kv.wait(kv.pull(keys))
                # Read-my-writes: exactly my `clock` pushes so far, nothing lost, nothing extra.
                np.testing.assert_array_equal(got, expect[clock])
                seen = kv.wait(kv.pull(other_keys))
                # BSP: every server has applied the other worker's first `clock` pushes, and
                # may have its next one too (servers keep clocks independently, so per key).
                ahead = expect_other[min(clock + 1, CLOCKS)]
                ok = (seen == expect_other[clock]) | (seen == ahead)
                assert ok.all(), f"clock {clock}: {np.flatnonzero(~ok)[:5]}"
                kv.wait(kv.push(keys, g, clock=True))
            kv.finish()
            np.testing.assert_array_equal(kv.wait(kv.pull(keys, read_only=True)), expect[CLOCKS])
            kv.close()
            n_own = 0
        total = roles.comm.allreduce(n_own)
        assert total == keys_of(0).shape[0] + keys_of(1).shape[0]
    finally:
        roles.free()


def test_unknown_keys_read_as_zero_and_bad_keys_are_refused():
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            store = serve(roles).store
            n = len(store)
        else:
            kv = KVWorker(roles, timeout=60)
            keys = np.array([0, 1, 2**63, 2**64 - 1], np.uint64)
            assert (kv.wait(kv.pull(keys, read_only=True)) == 0).all()
            with pytest.raises(ValueError, match="sorted and unique"):
                kv.pull(np.array([5, 3], np.uint64))
            with pytest.raises(TypeError, match="uint64"):
                kv.pull(np.array([1, 2], np.int64))
            if roles.index == 0:
                assert (kv.wait(kv.pull(keys)) == 0).all()
            kv.finish()
            kv.close()
            n = 0
        assert roles.comm.allreduce(n) == 4, "only the stored (non read-only) pull inserts keys"
    finally:
        roles.free()


def test_a_finished_worker_does_not_hold_back_the_others():
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            server = server_for(roles, record_pulls=True)
            server.run()
            reads = server.pull_records()
            late = reads[(reads["worker"] == 1) & (reads["clock"] > 3)]
            assert late.shape[0] == 16, "worker 1 read for each of its clocks 4 to 19"
            # Worker 0 finished after clock 3: from then on worker 1 is the slowest itself.
            np.testing.assert_array_equal(late["slowest"], late["clock"])
            assert [server.positions[w].clock for w in (0, 1)] == [3, 20]
        else:
            kv = KVWorker(roles, timeout=30)
            keys = np.arange(10, dtype=np.uint64)
            for _ in range(3 if roles.index == 0 else 20):
                kv.wait(kv.pull(keys))
                kv.wait(kv.push(keys, np.ones(10, np.float32), clock=True))
            kv.finish()
            kv.close()
            assert kv.clock == (3 if roles.index == 0 else 20)
    finally:
        roles.free()


def test_a_server_that_hears_nothing_names_the_silent_worker_that_holds_the_others():
    """The servers' own bound: when no worker has sent anything for --timeout, they name the
    slowest worker first (not only every worker's state), and can then serve on."""
    roles = split(2, MPI.COMM_WORLD)

    def sent():   # worker 1's push and pull, before the servers' silence bound starts
        wait_all([MPI.COMM_WORLD.Ibarrier()], 30, lambda: "worker 1's push and pull sent")
    try:
        keys = np.arange(5, dtype=np.uint64)
        if roles.is_server:
            server = server_for(roles, timeout=3.0)
            sent()
            with pytest.raises(WaitTimeout) as silence:
                server.run()
            said = str(silence.value)
            assert "the slowest is worker 0 (rank 2), at clock 0" in said, said
            assert "worker 1 (rank 3) at clock 1" in said, said
            wait_all([MPI.COMM_WORLD.Ibarrier()], 30, lambda: "every rank")
            server.timeout = 30
            server.run()
        else:
            kv = KVWorker(roles, timeout=30)
            if roles.index == 1:
                kv.wait(kv.push(keys, np.ones(5, np.float32), clock=True))
                ts = kv.pull(keys)   # clock 1: held until worker 0 finishes clock 0
            sent()
            wait_all([MPI.COMM_WORLD.Ibarrier()], 30, lambda: "every rank")
            if roles.index == 0:     # silent until the servers gave up waiting for it
                kv.wait(kv.push(keys, np.ones(5, np.float32), clock=True))
            else:
                kv.wait(ts)
            kv.finish()
            kv.close()
    finally:
        roles.free()


def test_a_pull_held_by_bsp_times_out_and_says_why():
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            serve(roles)
        else:
            kv = KVWorker(roles, timeout=1.0)
            keys = np.arange(5, dtype=np.uint64)
            if roles.index == 1:
                kv.wait(kv.push(keys, np.ones(5, np.float32), clock=True))
                ts = kv.pull(keys)   # clock 1: held until worker 0 finishes clock 0
                with pytest.raises(WaitTimeout, match=r"pull #\d+ .*worker clock 1"):
                    kv.wait(ts)
            wait_all([roles.group.Ibarrier()], 30, lambda: "the other worker")
            kv.timeout = 30
            kv.finish()              # releases the held pull on the servers
            kv.close()               # and completes it here
    finally:
        roles.free()
