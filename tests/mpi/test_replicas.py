"""Replicas under BSP: 2 servers, each key on both, 2 workers pushing to the same keys.

Each server writes a checkpoint of every clock (its hooks keep the state in memory): a range's
backup must hold, at every clock, exactly the bits its primary holds.
"""
import hashlib

import numpy as np
import pytest
from mpi4py import MPI
from serving import server_for

from mpips.base.forked import Written
from mpips.ranks.bounded import wait_all
from mpips.server.checkpoint_clocks import Checkpoints
from mpips.worker.kvworker import KVWorker
from mpips.models.optimizer import Optimizer
from mpips.wire.placement import Placement
from mpips.worker.pushfilter import PushFilter
from mpips.ranks.roles import split
from mpips.server.loop import Hooks

pytestmark = pytest.mark.mpi(min_size=4)

CLOCKS = 10
PLACEMENT = Placement(2, replicas=2)


def digest(keys: np.ndarray, state: np.ndarray) -> bytes:
    order = np.argsort(keys)
    return hashlib.sha256(keys[order].tobytes() + state[order].tobytes()).digest()


@pytest.mark.parametrize("push_filter", [None, PushFilter(1, "int8", threshold=0.5)],
                         ids=["float32", "int8 and rows held back"])
def test_a_backup_holds_its_primarys_bits_at_every_clock(push_filter):
    """A filtered push (pushfilter) sends a backup the values its primary decodes, of the
    rows it sends. A row held back is in the primary alone (a pull stored it), at its first
    state, as a backup that became primary would store it: rows still there are left out."""
    roles = split(2, MPI.COMM_WORLD)
    try:
        # [clock, range]: sha256 of the range's keys and state rows; key counts
        digests = np.zeros((CLOCKS + 1, 2, 32), np.uint8)
        counts = np.zeros((CLOCKS + 1, 2), np.int64)
        if roles.is_server:
            server = None

            def write_shard(clock: int, paced: bool = False) -> Written:
                keys, state = server.store.items()
                if push_filter is not None:
                    keys, state = keys[state.any(axis=1)], state[state.any(axis=1)]
                ranges = PLACEMENT.ranges_of(keys)
                for r in range(2):
                    mine = ranges == r
                    digests[clock, r] = np.frombuffer(digest(keys[mine], state[mine]), np.uint8)
                    counts[clock, r] = mine.sum()
                return Written({"server": roles.index}, 0.0)

            server = server_for(
                roles, Optimizer("adagrad", lr=0.3, l2=0.01), placement=PLACEMENT,
                checkpoints=Checkpoints(1, 0.0, 2, bsp=True),
                hooks=Hooks(write_shard=write_shard, write_manifest=lambda *_: None))
            server.run()
            if push_filter is None:
                assert len(server.store) == counts[CLOCKS].sum(), "every key, both ranges"
        else:
            # Both workers touch shared keys (so the order of their pushes matters to the
            # bits) and keys of their own; worker 1 pushes first, though BSP applies worker
            # 0's pushes first.
            rng = np.random.default_rng(7 + roles.index)
            shared = np.arange(0, 3000, 3, dtype=np.uint64)
            kv = KVWorker(roles, timeout=60, placement=PLACEMENT, push_filter=push_filter)
            token = np.zeros(1, np.int64)
            for clock in range(CLOCKS):
                own = np.unique(rng.integers(1, 2**63, 300, dtype=np.uint64))
                keys = np.union1d(shared, own)
                kv.wait(kv.pull(keys))
                grads = rng.normal(size=keys.shape[0]).astype(np.float32)
                if roles.index == 0:
                    wait_all([roles.group.Irecv(token, 1)], 60, lambda: "worker 1's push")
                kv.wait(kv.push(keys, grads, clock=True))
                if roles.index == 1:
                    wait_all([roles.group.Isend(token, 0)], 60, lambda: "worker 0")
            kv.finish()
            kv.close()
        gathered = np.empty((roles.comm.size,) + digests.shape, np.uint8)
        roles.comm.Allgather(digests, gathered)
        counted = np.empty((roles.comm.size,) + counts.shape, np.int64)
        roles.comm.Allgather(counts, counted)
        servers, sizes = gathered[:2], counted[:2]
        for clock in range(1, CLOCKS + 1):
            for r in range(2):
                assert sizes[0, clock, r] > 0
                assert sizes[0, clock, r] == sizes[1, clock, r], (clock, r)
                assert (servers[0, clock, r] == servers[1, clock, r]).all(), \
                    f"range {r} differs between its copies at clock {clock}"
            assert (servers[0, clock] != servers[0, clock - 1]).any(), "the model moved"
    finally:
        roles.free()
