"""Rebuilding a lost copy, as a state machine: what a server sends, keeps and replays."""
import numpy as np

from mpips.wire.placement import Placement
from mpips.recovery.context import Push
from mpips.recovery.rebuild import Rebuilds

BEFORE = Placement(3, replicas=2)          # range r on servers r and r+1
AFTER = BEFORE.without({1})                # range 0 -> (0, 2), range 1 -> (2, 0)


def test_the_primary_sends_and_the_new_holder_waits():
    at0, at2 = Rebuilds(0, n_workers=2), Rebuilds(2, n_workers=2)
    at0.plan(BEFORE, AFTER, now=0.0)
    at2.plan(BEFORE, AFTER, now=0.0)
    assert [(o.range, o.to) for o in at0.outgoing] == [(0, 2)]
    assert [(o.range, o.to) for o in at2.outgoing] == [(1, 0)]
    assert list(at0.incoming) == [1] and list(at2.incoming) == [0]
    assert not at0.complete(1) and at0.complete(0)


def test_a_copy_is_due_once_every_worker_pushed_by_the_new_map_and_bsp_applied_before():
    at0 = Rebuilds(0, n_workers=2)
    at0.plan(BEFORE, AFTER, now=0.0)
    at0.pushed(worker=0, clock=7, version=AFTER.version)
    assert at0.due([0, 1], applied_clock=9) == [], "worker 1 still splits by the old map"
    at0.pushed(worker=1, clock=0, version=BEFORE.version)   # an old push changes nothing
    at0.pushed(worker=1, clock=8, version=AFTER.version)
    assert at0.due([0, 1], applied_clock=7) == [], "clock 7 (before worker 1's switch) unapplied"
    assert [o.range for o in at0.due([0, 1], applied_clock=8)] == [0]
    assert at0.due([0, 1], applied_clock=8) == [], "sent once"
    finished = Rebuilds(0, n_workers=2)
    finished.plan(BEFORE, AFTER, now=0.0)
    assert [o.range for o in finished.due([], applied_clock=None)] == [0], "no worker left"


def test_the_new_holder_replays_what_the_copy_lacks_in_the_primarys_order():
    at2 = Rebuilds(2, n_workers=2)
    at2.plan(BEFORE, AFTER, now=0.0)
    keys = np.array([1, 2, 3], np.uint64)
    grads = np.ones((3, 1), np.float32)
    ranges = np.array([0, 2, 0])     # keys 1 and 3 in range 0, which waits for its copy
    rest = at2.keep(ranges, clock=5, worker=1, ts=40, keys=keys, values=grads)
    assert rest[0].tolist() == [2], "range 2 is whole here: applied as usual"
    at2.keep(ranges, clock=5, worker=0, ts=30, keys=keys, values=2 * grads)
    at2.keep(ranges, clock=4, worker=1, ts=38, keys=keys, values=3 * grads)
    at2.keep(ranges, clock=6, worker=0, ts=32, keys=keys, values=4 * grads)
    # The copy holds worker 0's pushes up to ts 30 and worker 1's up to ts 38.
    replay = at2.arrived(0, np.array([30, 38]), now=1.0, n_keys=2)
    assert [(c, w, ts, v[0, 0]) for c, w, ts, _, v in replay] == [(5, 1, 40, 1.0),
                                                                  (6, 0, 32, 4.0)]
    assert replay[0][3].tolist() == [1, 3]
    assert at2.complete(0) and at2.done == [(0, 2, 1.0)]


def test_a_target_that_dies_is_replaced_and_a_dead_source_forgotten():
    at0 = Rebuilds(0, n_workers=1)
    at0.plan(BEFORE, AFTER, now=0.0)
    again = AFTER.without({2})       # everything on server 0 now
    at0.plan(AFTER, again, now=1.0)
    assert at0.outgoing == [] and again.holders[1] == (0,)
    assert not at0.complete(1), "range 1's copy never came: server 0 cannot serve it"


def test_a_push_that_arrives_after_a_copy_holding_it_is_not_applied_twice():
    """A range's copy and a worker's push to its new holder come from different ranks, so
    MPI may deliver the push after the copy that already holds it: its part for that range
    is passed over (the copy says each worker's last push it holds), the rest kept."""
    from types import SimpleNamespace

    from mpips.recovery.rangecopies import RangeCopies
    placement = Placement(2, vnodes=4)
    copies = RangeCopies(SimpleNamespace(roles=SimpleNamespace(index=1, workers=[2, 3]),
                                         placement=placement, register=lambda handlers: None))
    copies.covered[3] = np.array([10, 12])   # the copy of range 3 holds pushes 10 and 12
    keys = np.arange(1, 2000, dtype=np.uint64)
    values = np.ones((keys.shape[0], 1), np.float32)
    in_3 = placement.ranges_of(keys) == 3

    def routed(worker: int, ts: int) -> np.ndarray:
        return copies.route(worker, 5, ts, 1, Push(keys, None, -1, values)).keys
    np.testing.assert_array_equal(routed(0, 10), keys[~in_3])   # held by the copy
    np.testing.assert_array_equal(routed(0, 13), keys)           # newer: all of it
    np.testing.assert_array_equal(routed(1, 12), keys[~in_3])
    assert copies.covered, "worker 1 may still send a push the copy holds"
    np.testing.assert_array_equal(routed(1, 14), keys)
    assert not copies.covered, "every worker is past the copy: nothing more to check"
