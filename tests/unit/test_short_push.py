"""The compiled check of a push the short way takes (kernels.requests.short_push) against
admission, the rules it stands for: each rule broken on its own is refused; a push it takes,
admission admits with the same values; random damage to real pushes, alone and behind a
pull's keys, never makes it take what admission refuses (a push's keys, where it carries
them, checked next against the placement, as server.hotpath does)."""
import numpy as np
import pytest

from mpips.base.errors import ProtocolError
from mpips.kernels.requests import short_push
from mpips.server.admission import MAX_SHARES_TAKEN, admit
from mpips.wire import messages, protocol
from mpips.wire.placement import Placement
from mpips.wire.protocol import HEADER_BYTES, Header, Op, Report

PLACEMENT = Placement(1)
WIDTH = 2
REPORT = Report(epoch=1, offset=7, examples=64, loss=3.0, progress=0.25)


def push(n: int = 3, same_keys: bool = True, report: Report | None = REPORT, flags: int = 0,
         **fields) -> np.ndarray:
    """A push of n keys' float32 values, of the keys of pull 4 (SAME_KEYS) or with its keys."""
    keys = np.arange(1, n + 1, dtype=np.uint64)
    values = np.arange(n * WIDTH, dtype=np.float32).reshape(n, WIDTH) / 7
    h = Header(Op.PUSH, ts=5, clock=2, nkeys=n, width=WIDTH,
               flags=protocol.CLOCK | (protocol.SAME_KEYS if same_keys else 0) | flags)
    h = h._replace(**({**messages.same_keys_push(4), **fields} if same_keys else fields))
    payload = (values,) if same_keys else (keys, values)
    return protocol.pack(h, *payload, report=report)


def taken(buf: np.ndarray, at: int = 0, version: int = 0):
    """(short_push's verdict, the values it copied) of the push at buf[at:]."""
    h = protocol.header(buf, at)
    n = h.nkeys if h.nkeys >= 0 and 4 * h.nkeys * WIDTH <= buf.shape[0] else 0
    values = np.empty((n, WIDTH), np.float32)
    return short_push(buf, at, WIDTH, version, values), values


def admitted(buf: np.ndarray):
    """admission's Request for `buf` from a worker, or None if it refuses it."""
    try:
        return admit(buf, "worker 0 (rank 1)", True, to_lead=False, from_lead=False,
                     width=WIDTH, placement=PLACEMENT, server=0)
    except ProtocolError:
        return None


def test_a_push_of_a_pulls_keys_is_taken_with_its_values():
    for n in (0, 1, 3, 10):   # odd counts leave the report at an offset not a multiple of 8
        buf = push(n)
        verdict, values = taken(buf)
        assert verdict == 0
        np.testing.assert_array_equal(values, admitted(buf).values)


def test_a_push_with_its_keys_is_taken_and_says_where_they_are():
    buf = push(3, same_keys=False)
    verdict, values = taken(buf)
    assert verdict == HEADER_BYTES
    np.testing.assert_array_equal(buf[verdict:verdict + 24].view(np.uint64), [1, 2, 3])
    np.testing.assert_array_equal(values, admitted(buf).values)


def test_a_push_behind_a_pulls_keys_is_read_where_it_starts():
    keys = np.arange(1, 6, dtype=np.uint64)
    pull = protocol.pack(Header(Op.PULL, ts=6, nkeys=5), keys)
    buf = protocol.bundle(pull, push(3))
    verdict, values = taken(buf, at=pull.shape[0])
    assert verdict == 0
    np.testing.assert_array_equal(values, admitted(push(3)).values)
    assert taken(protocol.bundle(pull, push(3, same_keys=False)), at=pull.shape[0])[0] \
        == pull.shape[0] + HEADER_BYTES


def with_value(value: float) -> np.ndarray:
    buf = push(3)
    buf[HEADER_BYTES + 4:HEADER_BYTES + 8].view(np.float32)[0] = value
    return buf


BROKEN = {
    "a pull": lambda: protocol.pack(Header(Op.PULL, ts=1, nkeys=1),
                                    np.ones(1, np.uint64)),
    "a flag the short way leaves (BACKUP)": lambda: push(flags=protocol.BACKUP),
    "another placement": lambda: push(placement=1),
    "another width": lambda: _with_header(width=1),
    "a negative ts": lambda: _with_header(ts=-1),
    "a negative clock": lambda: _with_header(clock=-1),
    "a byte short": lambda: push()[:-1],
    "a byte over": lambda: np.concatenate((push(), np.zeros(1, np.uint8))),
    "no report where the flag says one": lambda: push(report=None, flags=protocol.REPORT),
    "a NaN": lambda: with_value(np.nan),
    "an infinity": lambda: with_value(-np.inf),
    "a NaN loss": lambda: push(report=REPORT._replace(loss=np.nan)),
    "a negative progress": lambda: push(report=REPORT._replace(progress=-1.0)),
    "negative examples": lambda: push(report=REPORT._replace(examples=-1)),
    "an offset before a file's start": lambda: push(report=REPORT._replace(offset=-2)),
    "too many shares taken": lambda: push(report=REPORT._replace(taken=MAX_SHARES_TAKEN + 1)),
    "a header cut short": lambda: push()[:HEADER_BYTES - 1],
}


def _with_header(**fields) -> np.ndarray:
    """A push whose header says `fields` (its payload as made for the real one)."""
    buf = push()
    h = protocol.header(buf)._replace(**fields)
    protocol._LAYOUT.pack_into(buf, 0, *h)
    return buf


@pytest.mark.parametrize("what", list(BROKEN))
def test_each_rule_broken_alone_is_refused_as_admission_refuses_it(what):
    buf = BROKEN[what]()
    if buf.shape[0] >= HEADER_BYTES:
        assert taken(buf)[0] == -1
    if what != "a flag the short way leaves (BACKUP)" and what != "a pull":
        assert admitted(buf) is None


def test_random_damage_never_makes_it_take_what_admission_refuses():
    rng = np.random.default_rng(7)
    keys = np.arange(1, 4, dtype=np.uint64)
    pull = protocol.pack(Header(Op.PULL, ts=6, nkeys=3), keys)
    takes = 0
    for trial in range(4000):
        buf = push(int(rng.integers(0, 6)), same_keys=bool(rng.integers(2)),
                   report=REPORT if rng.integers(2) else None)
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(buf.shape[0]))
            buf[i] = rng.integers(256) if rng.integers(2) else buf[i] ^ (1 << rng.integers(8))
        behind = bool(rng.integers(2))
        whole = protocol.bundle(pull, buf) if behind else buf
        verdict, values = taken(whole, at=pull.shape[0] if behind else 0)
        if verdict < 0:
            continue
        if verdict:   # its keys: checked next, as server.hotpath does
            n = protocol.header(buf).nkeys
            at = verdict - (pull.shape[0] if behind else 0)
            if n and PLACEMENT.first_misplaced(buf[at:at + 8 * n].view(np.uint64), 0,
                                               False)[0] >= 0:
                continue
        takes += 1
        request = admitted(buf)
        assert request is not None, f"trial {trial}: taken, but admission refuses it"
        np.testing.assert_array_equal(values, request.values)
    assert takes > 200   # damage to the values alone leaves most of them good


def test_the_kernels_copies_of_the_wire_layout_are_the_wires():
    """kernels may not import wire or server: their copies of the layout and limits."""
    from mpips.kernels import requests
    assert requests.HEADER_WORDS * 8 == HEADER_BYTES
    assert requests.REPORT_WORDS * 8 == protocol.REPORT_BYTES
    assert (requests.PUSH, requests.CLOCK, requests.SAME_KEYS, requests.REPORT) == (
        Op.PUSH, protocol.CLOCK, protocol.SAME_KEYS, protocol.REPORT)
    assert requests.MAX_SHARES_TAKEN == MAX_SHARES_TAKEN
