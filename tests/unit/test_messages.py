"""Control messages (mpips.wire.messages): each op's message packs and reads back the same,
every op that gives its header slots a meaning has exactly one type, and no code outside
the wire reads or sets the header's per-op slot `arg` itself."""
import ast
from pathlib import Path

import numpy as np
import pytest

from mpips.wire import messages, protocol
from mpips.wire.handover import Handover
from mpips.wire.protocol import Op

MPIPS = Path(__file__).resolve().parents[2] / "mpips"
HANDOVER = Handover(2, 30, 1, 1, 250, taken=(0, 1), survivors=(2, 1), shares=(3, 1), dead=False)

EXAMPLES = [
    messages.Bye(), messages.Error("worker 1: disk full"), messages.Stop(), messages.Scored(), messages.StopAt(41),
    messages.CheckpointAt(12), messages.Have(7), messages.ShardSaved(9, '{"file": "a.h5"}'),
    messages.Gone(3, 18), messages.Death(2, HANDOVER), messages.Split(HANDOVER),
    messages.JoinAt(1, 44), messages.MoveAsk(True), messages.MoveAsk(False),
    messages.MoveClock(30, np.array([5, 0, 9], np.int64)),
    messages.MoveTo(6, np.array([0, 1, 1], np.int64)),
    messages.MoveAt(7, 31, np.array([1, 1, 0], np.int64)), messages.Moved('{"step": "took"}'),
    messages.HandOutCopy(4, '{"balance": {}}'), messages.HandOutHeld(4),
]


def read_back(message):
    buf = message.pack()
    h = protocol.header(buf)
    kind = messages.TYPES[Op(h.op)]
    assert kind is type(message)
    if not hasattr(kind, "of"):
        return kind()
    names = kind.of.__code__.co_varnames[:kind.of.__code__.co_argcount]
    args = {"h": h, "buf": buf}
    return kind.of(*(args[n] for n in names))


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_a_message_reads_back_as_it_was_packed(message):
    back = read_back(message)
    for a, b in zip(back, message):
        if isinstance(b, np.ndarray):
            assert np.array_equal(a, b)
        else:
            assert a == b


def test_a_copy_header_and_a_placement_ask_name_their_slot():
    h = messages.CopyHeader(range_index=5, nkeys=10, width=3, placement=2).header()
    assert messages.CopyHeader.of(h) == (5, 10, 3, 2)
    assert messages.PlacementAsk.of(protocol.Header(Op.PLACEMENT, arg=4)).version == 4


def test_a_death_without_a_handover_is_refused():
    buf = protocol.pack(protocol.Header(Op.DEATH, nkeys=2, arg=1), np.array([1, 2], np.int64))
    with pytest.raises(ValueError, match="do not hold a hand-over"):
        messages.Death.of(protocol.header(buf), buf)


def test_every_type_is_registered_under_its_own_op():
    for op, kind in messages.TYPES.items():
        example = [m for m in EXAMPLES if type(m) is kind]
        for m in example:
            assert protocol.header(m.pack()).op == op


def test_only_the_wire_reads_or_sets_the_per_op_slot():
    found = []
    for path in MPIPS.rglob("*.py"):
        if path.parent.name == "wire":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in ("arg", "ref")) or (isinstance(node, ast.keyword) and node.arg in ("arg", "ref")):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []


def test_every_op_is_typed_or_on_the_data_plane():
    typed, data = set(messages.TYPES), set(messages.DATA_PLANE)
    assert typed.isdisjoint(data)
    assert typed | data == set(Op)


def test_what_a_worker_sends_of_a_push_behind_its_pull_is_the_bundle_of_the_two():
    """What a worker sends (protocol.bundled of two `message`s) is what protocol.bundle makes
    of the two requests packed apart; payloads not contiguous or empty go as their bytes."""
    keys = np.arange(5, dtype=np.uint64) * 3
    pull = protocol.message(protocol.Header(Op.PULL, nkeys=5), keys)
    values = np.arange(10, dtype=np.float32).reshape(5, 2)[:, :1]   # a strided column
    report = protocol.Report(1, 2, 300, 4.5, 0.5, 6, 0, 0)
    push = protocol.Header(Op.PUSH, flags=protocol.CLOCK, nkeys=5, width=1)
    sent = protocol.bundled(pull, push, np.empty(0, np.uint64), values, report=report)
    bundled = protocol.bundle(np.frombuffer(pull, np.uint8),
                              protocol.pack(push, values, report=report))
    assert sent == bundled.tobytes()
    packed = np.frombuffer(sent, np.uint8)
    h = protocol.header(packed)
    assert h.op == Op.PULL and h.flags == protocol.WITH_PUSH
    assert protocol.header(pull).flags == 0   # the pull alone is left as it was
    push_h = protocol.header(packed[len(pull):])
    assert push_h.flags == protocol.CLOCK | protocol.REPORT
    assert np.array_equal(packed[len(pull) + protocol.HEADER_BYTES:][:20].view(np.float32),
                          values.ravel())
    assert protocol.report_at(packed, len(sent) - protocol.REPORT_BYTES) == report


def test_a_packed_request_is_an_array_of_its_own():
    """protocol.pack's buffer is writable and shares nothing with the arrays packed."""
    keys = np.arange(4, dtype=np.uint64)
    buf = protocol.pack(protocol.Header(Op.PULL, nkeys=4), keys)
    buf[protocol.HEADER_BYTES:] = 0
    assert np.array_equal(keys, np.arange(4, dtype=np.uint64))
    assert protocol.unpack(buf)[1].sum() == 0
