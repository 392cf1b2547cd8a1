"""Pulls sent ahead (NEXT_CLOCK), pulls that travel with the next push (with_push: one message
per server per clock) and pushes that reuse a pull's keys (SAME_KEYS), against real servers:
2 servers + 2 workers. Run with mpiexec -n 4 python -m pytest --with-mpi."""
import gc

import numpy as np
import pytest
from mpi4py import MPI
from serving import kv_worker, serve

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


@pytest.mark.parametrize("staleness", [0, None], ids=["bsp", "asp"])
def test_a_read_that_travels_with_the_push_reads_after_it_in_one_message(staleness):
    """The training loop's messages: the next clock's pull made while this one's reply is
    awaited, sent with this clock's push. Each server receives one message per worker per
    clock, and the read sees the push it travelled with (BSP: both workers' pushes)."""
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            server = serve(roles, staleness=staleness)
            # From each worker a pull, then per clock one message (push and pull), then
            # FINISH and BYE; the lead also hears the other server's BYE.
            others = len(roles.servers) - 1 if roles.index == 0 else 0
            assert server.stats.requests == len(roles.workers) * (1 + CLOCKS + 2) + others
            return
        kv = KVWorker(roles, timeout=60)
        mine = np.arange(roles.index, 4000, 2, dtype=np.uint64)   # each worker its own keys
        ones = np.ones(mine.shape[0], np.float32)
        batch = mine.copy()
        kv.wait(kv.pull(batch))
        for clock in range(CLOCKS):
            following = mine.copy()
            ahead = kv.pull(following, with_push=True) if clock + 1 < CLOCKS else None
            kv.wait(kv.push(batch, ones, clock=True))         # carries `ahead`
            if ahead is not None:   # SGD, lr 1: this worker's pushes so far, its own included
                np.testing.assert_array_equal(kv.wait(ahead)[:, 0], -1.0 * (clock + 1))
            batch = following
        kv.finish()
        kv.close()
    finally:
        roles.free()


def test_a_pull_held_for_a_push_that_does_not_come_goes_alone():
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            serve(roles, staleness=0)
            return
        kv = KVWorker(roles, timeout=60)
        keys = np.arange(roles.index, 100, 2, dtype=np.uint64)
        held = kv.pull(keys, with_push=True)
        np.testing.assert_array_equal(kv.wait(held), 0.0)   # sent alone: no push came
        first = kv.pull(keys, with_push=True)
        second = kv.pull(keys.copy(), with_push=True)       # one rides a push: first goes
        np.testing.assert_array_equal(kv.wait(first), 0.0)
        kv.wait(kv.push(keys, np.ones(keys.shape[0], np.float32), clock=True))   # + second
        np.testing.assert_array_equal(kv.wait(second)[:, 0], -1.0)   # SGD, lr 1: its push
        kv.finish()
        kv.close()
    finally:
        roles.free()


def test_a_held_pull_reads_the_keys_it_was_made_with_not_what_its_array_holds_later():
    """A pull held for the next push is made into its message at once: a caller that changes
    the key array before the push (its mistake) does not change what the servers read."""
    with kv_worker() as kv:
        if kv is None:
            return
        worker = kv.comm.rank - len(kv.servers)
        trained = np.arange(worker, 100, 2, dtype=np.uint64)   # disjoint per worker
        kv.wait(kv.pull(trained))
        keys = trained.copy()
        held = kv.pull(keys, with_push=True)
        keys += 1000                                        # keys no push ever reaches
        kv.wait(kv.push(trained, np.ones(trained.shape[0], np.float32), clock=True))
        np.testing.assert_array_equal(kv.wait(held)[:, 0], -1.0)   # SGD, lr 1: trained's


def test_the_training_loops_requests_leave_nothing_for_the_garbage_collector():
    """A request is freed as it completes (none holds itself through what its wait says):
    otherwise the cyclic collector runs every few rounds of a worker's loop."""
    with kv_worker() as kv:
        if kv is None:
            return
        keys = np.arange(0, 4000, 2, dtype=np.uint64)
        ones = np.ones(keys.shape[0], np.float32)
        pull = kv.pull(keys)
        gc.collect()
        gc.disable()
        try:
            for _ in range(CLOCKS):
                following = keys.copy()
                ahead = kv.pull(following, with_push=True)
                kv.wait(pull)
                kv.wait(kv.push(keys, ones, clock=True))
                pull, keys = ahead, following
            kv.wait(pull)
            assert gc.collect() == 0, "requests left in cycles of their own"
        finally:
            gc.enable()


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
