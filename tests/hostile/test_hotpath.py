"""The short way (server/hotpath) against the general way (admission, then the handlers), on
real servers in this process (their sends caught, not made): what the short way takes,
admission admits, and both leave the same table and send the same replies; every forged
request of test_forged_requests is left to admission. Random damage to a pull and a push is
the fuzz: whatever it makes, both ways end alike.
"""
import numpy as np
import pytest
from mpi4py import MPI

from mpips.base.errors import ProtocolError
from mpips.models.optimizer import Optimizer
from mpips.ranks.roles import Roles
from mpips.server.hotpath import Taken
from mpips.server.loop import Server
from mpips.server.store import KVStore
from mpips.wire import messages, protocol
from mpips.wire.clocks import ClockTable
from mpips.wire.protocol import HEADER_BYTES, Header, Op, Report

from hostile.test_forged_requests import FORGED, PLACEMENT, WORKER, own_keys

WORKER_RANK = 3   # servers are ranks 0-2 (this one is server 0), the worker rank 3


def a_server(staleness=None, workers=1):
    """Server 0 of PLACEMENT, its sends kept in `sent` instead of made; workers are ranks 3,
    4, ..."""
    roles = Roles(MPI.COMM_WORLD, MPI.COMM_SELF, (0, 1, 2),
                  tuple(range(WORKER_RANK, WORKER_RANK + workers)))
    server = Server(roles, KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.1)),
                    ClockTable(workers, staleness), timeout=60.0, placement=PLACEMENT)
    server.sent = []
    server.ctx.outbox.send = lambda buf, dest, tag=0: server.sent.append(
        (bytes(np.ascontiguousarray(buf).data), dest, tag))
    return server


def short_way(server, buf) -> tuple:
    """(taken the short way, refused): `buf` from the worker, as the loop hands it."""
    h = protocol.header(buf) if buf.shape[0] >= HEADER_BYTES else None
    if h is not None and server.hot.take(WORKER_RANK, buf, h):
        return True, False
    return False, general_way(server, buf, h)


def general_way(server, buf, h=None) -> bool:
    """Whether the general way refused `buf`."""
    h = h if h is not None or buf.shape[0] < HEADER_BYTES else protocol.header(buf)
    try:
        server._dispatch(WORKER_RANK, buf, h)
    except ProtocolError:
        return True
    return False


def the_same(a, b) -> None:
    assert a.sent == b.sent
    keys_a, state_a = a.store.items()
    keys_b, state_b = b.store.items()
    order_a, order_b = np.argsort(keys_a), np.argsort(keys_b)
    np.testing.assert_array_equal(keys_a[order_a], keys_b[order_b])
    assert state_a[order_a].tobytes() == state_b[order_b].tobytes()
    assert a.ctx.clocks.done == b.ctx.clocks.done
    assert a.ctx.members.load.tolist() == b.ctx.members.load.tolist()


@pytest.mark.parametrize("name, build", [(f[0], f[1]) for f in FORGED if f[2] == WORKER],
                         ids=[f[0] for f in FORGED if f[2] == WORKER])
def test_the_short_way_leaves_every_forged_request_to_admission(name, build):
    server = a_server()
    taken, refused = short_way(server, build())
    assert not taken and refused
    assert server.store.items()[0].shape[0] == 0


KEYS = own_keys(32)
REPORT = Report(epoch=0, offset=7, examples=64, loss=3.0, progress=0.25)


def pull(ts, keys=KEYS, **fields):
    return protocol.pack(Header(Op.PULL, ts=ts, nkeys=keys.shape[0], **fields), keys)


def same_keys_push(ts, pulled_ts, values, report=REPORT):
    return protocol.pack(Header(Op.PUSH, ts=ts, nkeys=values.shape[0], width=1,
                                flags=protocol.SAME_KEYS | protocol.CLOCK | protocol.REPORT,
                                **messages.same_keys_push(pulled_ts)), values, report=report)


def keyed_push(ts, keys, values):
    return protocol.pack(Header(Op.PUSH, ts=ts, nkeys=keys.shape[0], width=1), keys, values)


@pytest.mark.parametrize("staleness", [None, 0, 2], ids=["asp", "bsp", "ssp"])
def test_rounds_of_pulls_and_pushes_end_alike_both_ways(staleness):
    short, general = a_server(staleness), a_server(staleness)
    rng = np.random.default_rng(1)
    taken = 0
    for clock in range(20):
        keys = np.sort(rng.choice(KEYS, 12, replace=False))
        grads = rng.standard_normal((12, 1)).astype(np.float32)
        for buf in (pull(2 * clock, keys), same_keys_push(2 * clock + 1, 2 * clock, grads),
                    keyed_push(10_000 + clock, keys[::2].copy(), grads[::2].copy())):
            took, refused = short_way(short, buf)
            taken += took
            assert not refused and not general_way(general, buf)
    assert taken == 60   # every one of them the short way
    the_same(short, general)


@pytest.mark.parametrize("staleness", [0, 1], ids=["bsp", "ssp"])
def test_pulls_the_clocks_hold_end_alike_both_ways(staleness):
    """Two workers, one as many clocks behind as the staleness allows: the ahead one's pulls
    are held, taken the short way (checked, kept), and answered when the other catches up,
    as the general way answers them."""
    short, general = a_server(staleness, workers=2), a_server(staleness, workers=2)
    rng = np.random.default_rng(5)
    held, lag, clocks = 0, staleness, 12
    for step in range(clocks + lag):
        turns = ([(WORKER_RANK, step)] if step < clocks else []) + (
            [(WORKER_RANK + 1, step - lag)] if step >= lag else [])
        for rank, clock in turns:   # each pushes its clock, with the next clock's pull
            ts = 2 * clock
            grads = rng.standard_normal((KEYS.shape[0], 1)).astype(np.float32)
            messages_in = ([pull(ts)] if clock == 0 else []) + [
                same_keys_push(ts + 1, ts, grads), pull(ts + 2)]
            for buf in messages_in:
                h = protocol.header(buf)
                if not short.hot.take(rank, buf, h):
                    short._dispatch(rank, buf, h)
                general._dispatch(rank, buf, protocol.header(buf))
            held = max(held, len(short.ctx.gate.held))
    assert held > 0, "the ahead worker's pulls were held"
    assert short.ctx.gate.pulls_held == general.ctx.gate.pulls_held > 0
    the_same(short, general)


def damaged(buf: np.ndarray, rng) -> np.ndarray:
    """`buf` with one random fault: a byte changed, cut short, grown, or a field rewritten."""
    buf = buf.copy()
    kind = rng.integers(6)
    if kind == 0:
        buf[rng.integers(buf.shape[0])] ^= np.uint8(1 << rng.integers(8))
    elif kind == 1:
        buf = buf[:rng.integers(buf.shape[0])]
    elif kind == 2:
        buf = np.concatenate([buf, rng.integers(0, 256, rng.integers(1, 17), np.uint8)])
    elif kind == 3:   # a header field: flags, ts, clock, nkeys, width or placement
        field = rng.choice([(4, np.int32), (8, np.int64), (16, np.int64), (24, np.int64),
                            (32, np.int32), (36, np.int32)])
        offset, dtype = int(field[0]), field[1]
        size = np.dtype(dtype).itemsize
        buf[offset:offset + size] = np.frombuffer(
            np.array([rng.choice([-1, 0, 1, 2, 7, 1 << 20])], dtype).tobytes(), np.uint8)
    elif kind == 4 and buf.shape[0] > HEADER_BYTES + 4:   # a value not finite
        at = HEADER_BYTES + 4 * rng.integers((buf.shape[0] - HEADER_BYTES) // 4)
        buf[at:at + 4] = np.frombuffer(np.float32(np.nan).tobytes(), np.uint8)
    elif buf.shape[0] >= HEADER_BYTES + 16:   # two keys swapped
        keys = buf[HEADER_BYTES:HEADER_BYTES + 16].view(np.uint64)
        keys[:] = keys[::-1].copy()
    return buf


def test_damaged_pulls_and_pushes_end_alike_both_ways():
    rng = np.random.default_rng(7)
    outcomes = {"taken": 0, "refused": 0, "general": 0}
    for trial in range(600):
        staleness = 0 if trial % 2 else None
        short, general = a_server(staleness), a_server(staleness)
        for server in (short, general):   # a pull, so that a push of its keys has rows
            assert not short_way(server, pull(0))[1]
        grads = rng.standard_normal((KEYS.shape[0], 1)).astype(np.float32)
        sound = [pull(2, KEYS[:8].copy(), flags=protocol.NEXT_CLOCK),
                 same_keys_push(1, 0, grads), keyed_push(1, KEYS, grads)][trial % 3]
        buf = damaged(sound, rng)
        took, refused = short_way(short, buf)
        assert refused == general_way(general, buf), f"trial {trial}"
        outcomes["taken" if took else "refused" if refused else "general"] += 1
        if not refused:
            the_same(short, general)
    # The damage must reach all three ends, or the fuzz proves little.
    assert outcomes["taken"] > 10 and outcomes["refused"] > 10, outcomes


def bundled(pull_buf, push_buf):
    return protocol.bundle(pull_buf, push_buf)


def test_a_push_and_a_pull_bundled_end_as_when_sent_apart():
    apart, together = a_server(staleness=0), a_server(staleness=0)
    rng = np.random.default_rng(3)
    for server in (apart, together):
        server.handle(WORKER_RANK, pull(0))
    for clock in range(10):
        grads = rng.standard_normal((KEYS.shape[0], 1)).astype(np.float32)
        push, next_pull = same_keys_push(2 * clock + 1, 2 * clock, grads), pull(2 * clock + 2)
        apart.handle(WORKER_RANK, push)
        apart.handle(WORKER_RANK, next_pull)
        together.handle(WORKER_RANK, bundled(next_pull, push))
    the_same(apart, together)
    assert len(together.sent) == 11   # a reply to each pull


FROM_A_SERVER = 1   # rank 1: server 1


@pytest.mark.parametrize("build, source, says", [
    (lambda: bundled(pull(2), protocol.pack(Header(Op.FINISH))), WORKER_RANK,
     "bundled with a PUSH (WITH_PUSH), with FINISH in its place"),
    (lambda: bundled(pull(2), protocol.pack(Header(77))), WORKER_RANK, "with 77 in its place"),
    (lambda: bundled(pull(2), np.zeros(0, np.uint8)), WORKER_RANK, "with no room for it"),
    (lambda: pull(2, flags=protocol.WITH_PUSH), WORKER_RANK, "with no room for it"),
    (lambda: bundled(pull(2), bundled(pull(4), same_keys_push(3, 0, np.ones((32, 1),
                                                                          np.float32)))),
     WORKER_RANK, "with PULL in its place"),
    (lambda: bundled(pull(2), same_keys_push(1, 0, np.full((32, 1), np.nan, np.float32))),
     WORKER_RANK, "PUSH with a value that is not finite"),
    (lambda: bundled(pull(2), same_keys_push(1, 0, np.ones((31, 1), np.float32))),
     WORKER_RANK, "pushed values for the 31 keys of pull #0, which this server does not hold"),
    (lambda: bundled(pull(2), same_keys_push(1, 0, np.ones((32, 1), np.float32))),
     FROM_A_SERVER, "PUSH, which this server may not send"),
], ids=["a finish inside", "an unknown op inside", "nothing inside", "the flag alone",
        "a bundle inside", "a NaN in the push", "a push of the wrong pull", "from a server"])
def test_a_forged_bundle_is_refused_naming_the_sender_and_nothing_of_it_is_read(build, source,
                                                                                says):
    server = a_server(staleness=0)
    server.handle(WORKER_RANK, pull(0))
    sent, clocks = len(server.sent), server.ctx.clocks.done
    with pytest.raises(ProtocolError) as refused:
        server.handle(source, build())
    text = str(refused.value)
    assert says in text and ("worker 0" if source == WORKER_RANK else "server 1") in text
    assert len(server.sent) == sent and server.ctx.clocks.done == clocks


def the_general_way_only(server):
    """`server` with its short way turned off: every request admitted, then handled."""
    server.hot.take = lambda source, buf, h: False
    server.hot.take_bundle = lambda source, buf, h: Taken.NONE
    return server


def handled(server, buf) -> bool:
    """Whether the loop's handling of `buf` from the worker refused it."""
    try:
        server.handle(WORKER_RANK, buf)
    except ProtocolError:
        return True
    return False


def noting(server) -> list:
    """What the short way took of each bundle `server` is handed (Taken), in a list."""
    took, bundle_way = [], server.hot.take_bundle

    def take_bundle(source, buf, h):
        took.append(bundle_way(source, buf, h))
        return took[-1]
    server.hot.take_bundle = take_bundle
    return took


def test_damaged_bundles_end_alike_both_ways():
    """A push and the next pull in one message, damaged anywhere (the pull's part, the push's
    part, the cut between them): taken whole, in part (the push, then the pull the general
    way) or not at all by the short way, it ends as the general way ends it."""
    rng = np.random.default_rng(11)
    outcomes = {Taken.BOTH: 0, Taken.PUSH: 0, Taken.NONE: 0, "refused": 0}
    for trial in range(400):
        staleness = [0, 1, None][trial % 3]
        short, general = a_server(staleness), the_general_way_only(a_server(staleness))
        for server in (short, general):
            assert not handled(server, pull(0))
            # now and then the job has stopped: the pull is refused, not the push before it
            server.ctx.gate.stopped = trial % 8 == 7
        grads = rng.standard_normal((KEYS.shape[0], 1)).astype(np.float32)
        sound = bundled(pull(2, KEYS[::2].copy(), flags=trial % 4 and protocol.READ_ONLY),
                        same_keys_push(1, 0, grads))
        buf = damaged(sound, rng)
        took = noting(short)
        refused = handled(short, buf)
        assert refused == handled(general, buf), f"trial {trial}"
        outcomes["refused" if refused else took[0] if took else Taken.NONE] += 1
        if not refused:
            the_same(short, general)
    # The damage must reach every end, or the fuzz proves little.
    assert outcomes[Taken.BOTH] > 10 and outcomes["refused"] > 10, outcomes
    assert outcomes[Taken.PUSH] > 3, outcomes
