"""Forged and malformed requests, against the server's admission rules (no MPI needed: the
rules are a pure function of the bytes received and who sent them). tests/mpi/
test_forged_requests.py sends some of these to real servers.

To add a case: append to FORGED a name, how to build the message, who sends it, and what
the refusal must say.
"""
import numpy as np
import pytest

from mpips.data.workplan import Handover
from mpips.wire import dense_request, protocol
from mpips.wire.encoding import ENCODINGS, encode_values, int8_scales
from mpips.server.admission import admit
from mpips.wire.dense_layout import Layout, name_id, name_words
from mpips.server.dense_tables import DenseTables
from mpips.base.errors import ProtocolError
from mpips.wire.placement import Placement
from mpips.wire.protocol import HEADER_BYTES, Header, Op, Report

PLACEMENT = Placement(3, replicas=2)   # server 0 backs up server 2's ranges
SERVER = 0


def own_keys(n: int, server: int = SERVER) -> np.ndarray:
    keys = np.arange(1, 40 * n, dtype=np.uint64)
    return keys[PLACEMENT.owners(keys) == server][:n]


def with_backup(backup_keys, backup_values, keys, values, count=None, **fields):
    """A push carrying a part for ranges backed up here (protocol.BACKUP)."""
    n = backup_keys.shape[0] if count is None else count
    return protocol.pack(Header(Op.PUSH, nkeys=values.shape[0], width=1,
                                flags=protocol.BACKUP | fields.pop("flags", 0), **fields),
                         np.array([n], np.int64), backup_keys, keys, backup_values, values)


def push(keys, values, width=1, **fields):
    return protocol.pack(Header(Op.PUSH, nkeys=keys.shape[0], width=width, **fields), keys,
                         values)


def pull(keys, **fields):
    return protocol.pack(Header(Op.PULL, nkeys=keys.shape[0], **fields), keys)


def encoded(keys, values, encoding, scale=None, **fields):
    """A push of values as float16 or int8 (see pushfilter); `scale`: int8 block 0's."""
    flag = ENCODINGS[encoding]
    data, _ = encode_values(values, flag)
    if scale is not None:
        int8_scales(data, *values.shape)[0] = scale
    return protocol.pack(Header(Op.PUSH, nkeys=keys.shape[0], width=1,
                                flags=flag | fields.pop("flags", 0), **fields), keys, data)


def masked(pulled: int, sent, values, bits=None, **fields):
    """A SAME_KEYS push of the rows `sent` (indices) of a pull of `pulled` keys (MASK)."""
    rows = np.zeros(pulled, bool)
    rows[sent] = True
    return protocol.pack(Header(Op.PUSH, nkeys=pulled, width=1,
                                flags=protocol.SAME_KEYS | protocol.MASK | fields.pop("flags", 0),
                                **fields),
                         protocol.bitmap(rows) if bits is None else bits, values)


def bad_scale(values):
    """int8 values' bytes whose block 0's scale is NaN."""
    data, _ = encode_values(values, protocol.INT8)
    int8_scales(data, *values.shape)[0] = np.nan
    return data


K = own_keys(8)
G = np.ones((8, 1), np.float32)
B = own_keys(5, server=2)     # keys server 0 keeps backup copies of
BG = np.full((5, 1), 2, np.float32)
# Who sends, and where: (role, received by server 0, sent by server 0).
WORKER = ("worker", True, False)
TO_LEAD = ("server", True, False)              # another server to server 0
FROM_OTHER_SERVER = ("server", False, False)   # a server to a server that is not 0
FROM_LEAD = ("server", False, True)            # server 0 to another

FORGED = [
    ("short header", lambda: np.zeros(20, np.uint8), WORKER, "shorter than the 48-byte header"),
    ("unknown op", lambda: protocol.pack(Header(42)), WORKER, "unknown operation 42"),
    ("width 2 into a width-1 table",
     lambda: push(K, np.ones((8, 2), np.float32), width=2), WORKER, "PUSH of width 2"),
    ("more keys than sent", lambda: pull(K)[:-8], WORKER, "where its header"),
    ("a pull of a negative width", lambda: pull(K, width=-1), WORKER,
     "PULL with 8 keys of width -1"),
    ("negative key count",
     lambda: protocol.pack(Header(Op.PULL, nkeys=-5)), WORKER, "with -5 keys"),
    ("values missing", lambda: push(K, G)[:-4], WORKER, "where its header"),
    ("NaN gradient",
     lambda: push(K, np.where(np.arange(8)[:, None] == 3, np.nan, 1).astype(np.float32)),
     WORKER, "not finite (nan at position 3)"),
    ("infinite gradient", lambda: push(K, np.full((8, 1), np.inf, np.float32)), WORKER,
     "not finite"),
    ("keys of another server", lambda: pull(own_keys(8, server=1)), WORKER,
     "held by another server"),
    ("keys out of order", lambda: pull(K[::-1].copy()), WORKER,
     "not in strictly increasing order"),
    ("repeated key", lambda: pull(np.repeat(K[:4], 2)), WORKER,
     "not in strictly increasing order"),
    ("unknown flags", lambda: pull(K, flags=64), WORKER, "unknown flags 0x40"),
    ("STOP_AT from a worker", lambda: protocol.pack(Header(Op.STOP_AT, clock=3)), WORKER,
     "STOP_AT, which a worker may not send"),
    ("SHARD_SAVED from a worker",
     lambda: protocol.pack(Header(Op.SHARD_SAVED), np.frombuffer(b"{}", np.uint8)), WORKER,
     "SHARD_SAVED, which a worker may not send"),
    ("CHECKPOINT_AT to server 0 from another", lambda: protocol.pack(
        Header(Op.CHECKPOINT_AT, clock=3)), TO_LEAD, "CHECKPOINT_AT, which this server may not"),
    ("SHARD_SAVED to a server that is not 0", lambda: protocol.pack(
        Header(Op.SHARD_SAVED), np.frombuffer(b"{}", np.uint8)), FROM_OTHER_SERVER,
     "SHARD_SAVED, which this server may not"),
    ("PUSH from a server", lambda: push(K, G), FROM_LEAD, "PUSH, which this server may not"),
    ("NaN loss in the figures",
     lambda: protocol.pack(Header(Op.FINISH), report=Report(loss=float("nan"))),
     WORKER, "reporting loss nan"),
    ("shares taken past any job's deaths", lambda: protocol.pack(
        Header(Op.FINISH, flags=protocol.REPORT), report=Report(taken=1 << 32)), WORKER,
     "4294967296 shares of dead workers' rows taken"),
    ("negative epoch", lambda: protocol.pack(Header(Op.FINISH), report=Report(epoch=-1)),
     WORKER, "reporting a negative figure (epoch -1"),
    ("extra bytes after a FINISH",
     lambda: np.concatenate([protocol.pack(Header(Op.FINISH)), np.zeros(8, np.uint8)]),
     WORKER, "FINISH of 56 bytes"),
    ("a report cut short", lambda: protocol.pack(Header(Op.FINISH), report=Report())[:-8],
     WORKER, "FINISH of 104 bytes"),
    ("keys split by another placement", lambda: pull(K, placement=1), WORKER,
     "split by placement version 1; this server's is 0"),
    ("a worker saying a worker died", lambda: protocol.pack(Header(Op.GONE, clock=4, arg=1)),
     WORKER, "GONE, which a worker may not send"),
    ("a worker saying what the servers hold", lambda: protocol.pack(Header(Op.HAVE, clock=4)),
     WORKER, "HAVE, which a worker may not send"),
    ("a death from a server that does not lead", lambda: protocol.pack(
        Header(Op.DEATH, nkeys=1), np.zeros(1, np.int64)), TO_LEAD,
     "DEATH, which this server may not send"),
    ("a backed-up part of another server's keys",
     lambda: with_backup(own_keys(5, server=1), BG, K, G), WORKER,
     "5 backed-up keys whose key #0"),
    ("a backed-up part longer than sent", lambda: with_backup(B, BG, K, G, count=6), WORKER,
     "6 backed-up keys) makes it"),
    ("a backed-up part of a negative length", lambda: with_backup(B, BG, K, G, count=-2),
     WORKER, "with a backup part of -2 keys"),
    ("a backed-up part without its length", lambda: protocol.pack(
        Header(Op.PUSH, width=1, flags=protocol.BACKUP)), WORKER, "with a backup part of no length"),
    ("NaN in a backed-up part", lambda: with_backup(B, np.full((5, 1), np.nan, np.float32),
                                                    K, G), WORKER, "not finite"),
    ("backed-up keys out of order", lambda: with_backup(B[::-1].copy(), BG, K, G), WORKER,
     "not in strictly increasing order"),
    ("a pull with a backed-up part", lambda: pull(K, flags=protocol.BACKUP), WORKER,
     "PULL with unknown flags 0x20"),
    ("a death longer than its header says", lambda: protocol.pack(
        Header(Op.DEATH, nkeys=1), np.zeros(2, np.int64)), FROM_LEAD,
     "DEATH of 64 bytes, where its header"),
    ("int8 values cut short", lambda: encoded(K, G, "int8")[:-8], WORKER,
     "(8 keys, width 1, int8 values) makes it 128"),
    ("float16 values cut short", lambda: encoded(K, G, "float16")[:-8], WORKER,
     "(8 keys, width 1, float16 values) makes it 128"),
    ("an int8 scale that is not a number", lambda: encoded(K, G, "int8", scale=np.nan), WORKER,
     "PUSH of int8 values whose block #0 has scale nan"),
    ("an infinite int8 scale", lambda: encoded(K, G, "int8", scale=np.inf), WORKER,
     "whose block #0 has scale inf"),
    ("a negative int8 scale", lambda: encoded(K, G, "int8", scale=-1.0), WORKER,
     "whose block #0 has scale -1.0"),
    ("a float16 NaN", lambda: encoded(K, np.full((8, 1), np.nan, np.float32), "float16"),
     WORKER, "not finite (nan at position 0)"),
    ("values both float16 and int8",
     lambda: encoded(K, G, "int8", flags=protocol.HALF), WORKER, "both float16 and int8"),
    ("a bitmap over keys it carries", lambda: push(K, G, flags=protocol.MASK), WORKER,
     "with a bitmap (MASK) over keys it carries"),
    ("a bitmap setting bits past its keys",
     lambda: masked(5, [0], G[:1], bits=np.full(8, 255, np.uint8)), WORKER,
     "PUSH whose bitmap sets bits past its 5 keys"),
    ("a bitmap cut short", lambda: masked(100, [0], G[:1])[:HEADER_BYTES + 8], WORKER,
     "too short for its bitmap over 100 keys"),
    ("fewer values than the bitmap sends", lambda: masked(20, [1, 5, 9], G[:2]), WORKER,
     "(20 keys, 3 sent, width 1) makes it"),
    ("a pull with a bitmap", lambda: pull(K, flags=protocol.MASK), WORKER,
     "PULL with unknown flags 0x100"),
    ("a masked int8 push with a NaN scale",
     lambda: masked(300, np.arange(0, 300, 2), bad_scale(G[:1].repeat(150, 0)),
                    flags=protocol.INT8), WORKER, "whose block #0 has scale nan"),
    # Scoring the test file (see testscoring): chunks are the lead's to hand out; only
    # servers read each other's keys, read-only, from the primaries.
    ("a chunk asked of a server that does not lead", lambda: protocol.pack(Header(Op.CHUNK)),
     ("worker", False, False), "CHUNK, which a worker may not send"),
    ("a chunk asked of another server by a server", lambda: protocol.pack(Header(Op.CHUNK)),
     FROM_OTHER_SERVER, "CHUNK, which this server may not send"),
    ("a worker reading as a server", lambda: read(K), WORKER, "READ, which a worker may not"),
    ("a worker saying it scored", lambda: protocol.pack(Header(Op.SCORED)), WORKER,
     "SCORED, which a worker may not send"),
    ("a read of another server's keys", lambda: read(own_keys(8, server=1)), FROM_OTHER_SERVER,
     "held by another server"),
    ("a read from a backup", lambda: read(B), FROM_OTHER_SERVER, "held by another server"),
    ("a read of keys out of order", lambda: read(K[::-1].copy()), FROM_OTHER_SERVER,
     "not in strictly increasing order"),
    ("a read cut short", lambda: read(K)[:-8], FROM_OTHER_SERVER, "READ of 104 bytes"),
    ("a read that would store keys", lambda: read(K, flags=protocol.READ_ONLY),
     FROM_OTHER_SERVER, "READ with unknown flags 0x2"),
    ("a chunk asked with a payload",
     lambda: np.concatenate([protocol.pack(Header(Op.CHUNK)), np.zeros(8, np.uint8)]),
     WORKER, "CHUNK of 56 bytes"),
]


def read(keys, **fields):
    """A server's READ of test keys from another server (testscoring)."""
    return protocol.pack(Header(Op.READ, nkeys=keys.shape[0], **fields), keys)


def check(buf, sender):
    role, to_lead, from_lead = sender
    return admit(buf, f"{role} 1 (rank 3)", role == "worker", to_lead=to_lead,
                 from_lead=from_lead, width=1, placement=PLACEMENT, server=SERVER)


@pytest.mark.parametrize("name, build, sender, says", FORGED, ids=[f[0] for f in FORGED])
def test_a_forged_request_is_refused_naming_the_sender(name, build, sender, says):
    with pytest.raises(ProtocolError) as refused:
        check(build(), sender)
    text = str(refused.value)
    assert text.startswith(f"{sender[0]} 1 (rank 3) sent a bad request: ")
    assert says in text and "it was not applied, and the job stops" in text


@pytest.mark.parametrize("buf", [pull(K), push(K, G, flags=protocol.CLOCK),
                                 protocol.pack(Header(Op.PUSH, nkeys=8, width=1,
                                                      flags=protocol.SAME_KEYS), G),
                                 protocol.pack(Header(Op.FINISH), report=Report(2, -1, 9, 3.5)),
                                 protocol.pack(Header(Op.STATUS))],
                         ids=["pull", "push", "same-keys push", "finish", "status"])
def test_what_a_worker_sends_is_admitted(buf):
    request = check(buf, WORKER)
    assert request.op == protocol.Op(int(np.frombuffer(buf[:4], np.int32)[0]))


@pytest.mark.parametrize("fields", [[], [1, 7, 0, 0, -1, 1, 0, 2, 2], [1, 7, 0, 0, -1, 2, 0, 1, 2],
                                    [1, 7, 0, 0, -1, 1, 5, 0, 1, 2], [-1, 7, 0, 0, -1, 1, 0, 1, 2]],
                         ids=["empty", "survivors cut short", "dead neither 0 nor 1",
                              "taken epochs past the end", "a negative worker"])
def test_fields_that_hold_no_handover_are_refused(fields):
    with pytest.raises(ValueError, match="do not hold a hand-over"):
        Handover.of_fields(np.array(fields, np.int64))


@pytest.mark.parametrize("same_keys", [False, True])
def test_a_push_with_a_backed_up_part_is_read_as_two_parts(same_keys):
    keys = np.empty(0, np.uint64) if same_keys else K
    buf = with_backup(B, BG, keys, 3 * G,
                      flags=protocol.CLOCK | (protocol.SAME_KEYS if same_keys else 0))
    request = check(buf, WORKER)
    assert (request.backup_keys == B).all() and (request.backup_values == 2).all()
    assert request.keys.tolist() == keys.tolist() and (request.values == 3).all()
    assert request.values.shape == (8, 1) and request.header.flags & protocol.CLOCK


@pytest.mark.parametrize("encoding", ["float16", "int8"])
def test_encoded_values_are_read_as_the_worker_counted_on(encoding):
    values = np.linspace(-3, 3, 8, dtype=np.float32).reshape(8, 1)
    _, applied = encode_values(values, ENCODINGS[encoding])
    request = check(encoded(K, values, encoding, flags=protocol.CLOCK), WORKER)
    assert request.keys.tolist() == K.tolist() and request.values.dtype == np.float32
    np.testing.assert_array_equal(request.values, applied)


@pytest.mark.parametrize("encoding", ["float32", "int8"])
def test_a_masked_push_names_the_pulled_rows_it_sends(encoding):
    values = np.arange(1, 4, dtype=np.float32).reshape(3, 1)
    flag = ENCODINGS[encoding]
    data, applied = encode_values(values, flag)
    request = check(masked(20, [1, 5, 19], data, flags=flag), WORKER)
    assert request.rows_sent.tolist() == [1, 5, 19] and request.keys.shape[0] == 0
    np.testing.assert_array_equal(request.values, applied)
    both = check(protocol.pack(Header(Op.PUSH, nkeys=20, width=1, flags=(
        protocol.SAME_KEYS | protocol.MASK | protocol.BACKUP | flag)),
        np.array([5], np.int64), B, protocol.bitmap(np.arange(20) % 7 == 1), BG, data), WORKER)
    assert both.rows_sent.tolist() == [1, 8, 15] and (both.backup_values == 2).all()
    np.testing.assert_array_equal(both.values, applied)


def test_a_server_may_send_what_the_protocol_gives_it():
    assert check(protocol.pack(Header(Op.STOP_AT, clock=3)), FROM_LEAD).op is Op.STOP_AT
    assert check(read(K), FROM_OTHER_SERVER).keys.tolist() == K.tolist()
    assert check(protocol.pack(Header(Op.SCORED)), FROM_OTHER_SERVER).op is Op.SCORED
    assert check(protocol.pack(Header(Op.CHUNK, ts=4)), TO_LEAD).header.ts == 4
    assert check(protocol.pack(Header(Op.CHUNK)), WORKER).op is Op.CHUNK   # to the lead
    saved = protocol.pack(Header(Op.SHARD_SAVED), np.frombuffer(b'{"server": 1}', np.uint8))
    assert check(saved, TO_LEAD).op is Op.SHARD_SAVED
    assert check(protocol.pack(Header(Op.STOP)), TO_LEAD).op is Op.STOP
    assert HEADER_BYTES == 48


REPLICATED = Placement(3, replicas=2)   # range r on servers r and r+1


def range_keys(r: int, n: int = 8) -> np.ndarray:
    keys = np.arange(1, 40 * n, dtype=np.uint64)
    return keys[REPLICATED.ranges_of(keys) == r][:n]


@pytest.mark.parametrize("buf, says", [
    (pull(range_keys(0)), "held by another server"),              # server 1 only backs it up
    (push(range_keys(2), G), "held by another server"),           # servers 2 and 0 hold it
    (pull(range_keys(1)[::-1].copy()), "not in strictly increasing order"),
], ids=["read from a backup", "write to a server without a copy", "keys out of order"])
def test_a_backup_refuses_reads_and_keys_it_does_not_hold(buf, says):
    with pytest.raises(ProtocolError, match=says):
        admit(buf, "worker 0 (rank 3)", True, to_lead=False, from_lead=False, width=1,
              placement=REPLICATED, server=1)


def test_a_backup_takes_writes_of_the_ranges_it_copies():
    for keys in (range_keys(0), range_keys(1)):
        request = admit(push(keys, G), "worker 0 (rank 3)", True, to_lead=False,
                        from_lead=False, width=1, placement=REPLICATED, server=1)
        assert (request.keys == keys).all()


def copy_of(r: int, keys=None, state=None, columns=2, last=(0, 0), **fields):
    keys = range_keys(r) if keys is None else keys
    state = np.ones((keys.shape[0], columns), np.float32) if state is None else state
    return protocol.pack(Header(Op.COPY, nkeys=keys.shape[0], width=columns, arg=r, **fields),
                         keys, state, np.array(last, np.int64))


@pytest.mark.parametrize("build, sender, says", [
    (lambda: copy_of(0), "worker", "COPY, which a worker may not send"),
    (lambda: copy_of(0, keys=range_keys(1)), "server", "COPY of range 0 with keys of another"),
    (lambda: copy_of(2), "server", "held by another server"),
    (lambda: copy_of(0, columns=3), "server", "COPY of range 0 with 3 columns"),
    (lambda: copy_of(0, last=(0, 0, 0)), "server", "where its header"),
    (lambda: copy_of(0, state=np.full((8, 2), np.nan, np.float32)), "server",
     "COPY with a value that is not finite"),
    (lambda: copy_of(0, placement=2), "server", "split by placement version 2"),
], ids=["from a worker", "keys of another range", "a range it does not hold", "wrong width",
        "positions cut", "NaN state", "a placement yet to come"])
def test_a_forged_copy_of_a_range_is_refused(build, sender, says):
    """A range's copy (after a death) is checked like any request: it is loaded whole."""
    with pytest.raises(ProtocolError, match=says):
        admit(build(), f"{sender} 0 (rank 2)", sender == "worker", to_lead=False,
              from_lead=False, width=1, placement=REPLICATED, server=1, columns=2, n_workers=2)


def test_a_copy_of_a_range_the_server_holds_is_admitted():
    request = admit(copy_of(0), "server 0 (rank 0)", False, to_lead=False, from_lead=False,
                    width=1, placement=REPLICATED, server=1, columns=2, n_workers=2)
    assert request.op is Op.COPY and request.values.shape == (8, 2)


# Dense tables (densetables): admission checks the sizes; the tables check what the fields
# name. Each case: a name, the request's fields (function, tables, integers, scalars, rows,
# values), and what the refusal must say. Server 0 of PLACEMENT holds table "t" (10 rows in
# blocks of 2: blocks 0 and 3 here), with one worker per round.
def dense(function, tables=("t",), ints=(), scalars=(), rows=None, values=None, raw=None):
    head = [raw if raw is not None else name_id(function), *(name_id(t) for t in tables), *ints]
    fields, payload = dense_request.dense_payload(head, scalars, rows, values)
    return protocol.pack(Header(Op.DENSE, **fields), *payload)


FORGED_DENSE = [
    ("a function nobody registered", lambda: dense("rm -rf"), "naming no registered function"),
    ("a table that does not exist", lambda: dense("fill", ("nope",), scalars=[1.0]),
     "which does not exist on this server"),
    ("too few scalars", lambda: dense("axpy", ("t", "t")), "it takes 2, 0 and 1"),
    ("a row past the end", lambda: dense("gather", rows=[10]), "row 10 of table 't', which has 10"),
    ("rows another server holds", lambda: dense("gather", rows=[2]),
     "in block 1, which another server holds"),
    ("rows out of order", lambda: dense("gather", rows=[1, 0]), "not in strictly increasing"),
    ("a round for more workers than the job has",
     lambda: dense("scatter_add", ints=[1, 5], rows=[0], values=[1.0]), "awaiting 5 workers"),
    ("values that do not match the rows",
     lambda: dense("scatter_add", ints=[1, 1], rows=[0, 1], values=[1.0]),
     "2 rows with 1 values"),
    ("a map with no such kernel", lambda: dense("map", ("t", "t"), ints=[12345], scalars=[0.0]),
     "no function numbered 12345"),
    ("a table created under another's number",
     lambda: dense("create", ("t2",), ints=[10, 1, 2, *name_words("other")]),
     "named 'other', whose number is"),
    ("a save to a relative path",
     lambda: dense("save", (), ints=[1, name_id("t"), *name_words("out/tables")]),
     "DENSE save to 'out/tables', which is not an absolute path"),
    ("a save of more tables than it names",
     lambda: dense("save", (), ints=[5, name_id("t")]), "DENSE save of 5 tables in 2 integers"),
    ("a table of 2^41 rows", lambda: dense("create", ("big",), ints=[
        1 << 41, 1, 2, *name_words("big")]),
     "DENSE create of 2199023255552 rows"),
    ("a gram naming more tables than it lists",
     lambda: dense("gram", (), ints=[3, name_id("t"), 1]), "DENSE gram of 3 tables in 3 integers"),
    ("a gram of a table that does not exist",
     lambda: dense("gram", (), ints=[2, name_id("t"), name_id("nope"), 1]),
     f"DENSE gram of table {name_id('nope')}, which does not exist"),
    ("a gram of more rows than tables",
     lambda: dense("gram", (), ints=[1, name_id("t"), 2]), "DENSE gram of 2 rows of 1 tables"),
    ("a combine into one of its terms",
     lambda: dense("combine", (), ints=[2, name_id("t"), name_id("t")], scalars=[1.0]),
     "into 't' (one of them)"),
    ("a combine of tables of two shapes",
     lambda: dense("combine", (), ints=[2, name_id("t"), name_id("u")], scalars=[1.0]),
     "DENSE combine of tables 't' and 'u', which differ in shape"),
    ("a combine with a coefficient too many",
     lambda: dense("combine", (), ints=[2, name_id("t"), name_id("t2")], scalars=[1.0, 2.0]),
     "DENSE combine of 1 tables with 2 coefficients"),
]


@pytest.mark.parametrize("name, build, says", FORGED_DENSE, ids=[f[0] for f in FORGED_DENSE])
def test_a_forged_dense_request_is_refused(name, build, says):
    tables = DenseTables(SERVER, PLACEMENT, n_workers=2)
    tables.create("t", Layout(10, 1, 2))
    tables.create("t2", Layout(10, 1, 2))
    tables.create("u", Layout(12, 1, 2))
    buf = build()
    request = check(buf, WORKER)   # the sizes are right: the tables must refuse it
    with pytest.raises(ProtocolError) as refused:
        tables.call(1, request.header, buf)
    assert says in str(refused.value)


def test_a_server_holding_a_range_anew_refuses_its_reads_and_drops_its_writes_until_copied():
    """Server 0 of 3, every block on 2: server 1 dies and server 0 holds range 1 anew. Until
    restore brings its blocks, a read of them is refused (no worker splits reads that way)
    and a write to them is passed over (the copy will hold it)."""
    placement = Placement(3, 2)
    tables = DenseTables(0, placement, n_workers=1)
    table = tables.create("t", Layout(12, 1, 2))   # blocks 0-5; range 1: blocks 1 and 4
    tables.placement_changed(placement.without({1}))
    assert tables.incoming == {1} and 1 not in table.blocks
    with pytest.raises(ProtocolError, match="in block 1, whose copy this server waits for"):
        read = dense("gather", rows=[2])
        tables.call(0, protocol.header(read)._replace(placement=1), read)
    write = dense("scatter_add", ints=[1, 1], rows=[0, 2, 3], values=[1.0, 5.0, 1.0])
    tables.call(0, protocol.header(write)._replace(placement=1), write)
    assert sorted(table.blocks) == [0, 2, 3, 5] and table.blocks[0][0] == 1.0


@pytest.mark.parametrize("buf, says", [
    (lambda: dense("fill", scalars=[float("nan")]), "DENSE with a value that is not finite"),
    (lambda: dense("gather", rows=[0])[:-4], "whole float64 values after"),
    (lambda: protocol.pack(Header(Op.DENSE, nkeys=3)), "makes it 72"),
], ids=["NaN scalar", "cut short", "fields missing"])
def test_a_malformed_dense_request_is_refused_at_admission(buf, says):
    with pytest.raises(ProtocolError, match="worker 1 .rank 3. sent a bad request") as refused:
        check(buf(), WORKER)
    assert says in str(refused.value)


# Moves of key ranges (membership, `mpips ctl`): who may send what (a range's copy is a COPY,
# checked above).
def owners_at(n: int = 3, clock: int = 5):
    return protocol.pack(Header(Op.MOVE_AT, clock=clock, arg=1, nkeys=n),
                         np.zeros(n, np.int64))


def owners_to(n: int = 3):
    return protocol.pack(Header(Op.MOVE_TO, arg=2, nkeys=n), np.zeros(n, np.int64))


@pytest.mark.parametrize("build, role, says", [
    (lambda: owners_to(), "server", "MOVE_TO, which this server may not send"),
    (lambda: owners_to(), "worker", "MOVE_TO, which a worker may not send"),
    (lambda: owners_to(n=4), "lead", "MOVE_TO with a figure for each of 4 ranges; there are 3"),
    (lambda: owners_at(), "server", "MOVE_AT, which this server may not send"),
    (lambda: owners_at(), "worker", "MOVE_AT, which a worker may not send"),
    (lambda: owners_at(n=2), "lead", "MOVE_AT with a figure for each of 2 ranges; there are 3"),
    (lambda: protocol.pack(Header(Op.MOVE_ASK)), "worker", "MOVE_ASK, which a worker may not"),
    (lambda: protocol.pack(Header(Op.MOVE_CLOCK, nkeys=3), np.zeros(3, np.int64)), "server",
     "MOVE_CLOCK, which this server may not send"),
    (lambda: protocol.pack(Header(Op.MOVED), np.frombuffer(b"{}", np.uint8)), "worker",
     "MOVED, which a worker may not send"),
    (lambda: protocol.pack(Header(Op.PLACEMENT)), "worker", "PLACEMENT, which a worker may not"),
], ids=["new owners from a server not leading", "new owners from a worker",
        "new owners of too many ranges", "owners from a server not leading",
        "owners from a worker", "owners of too few ranges", "a worker asking to hold reads",
        "a clock to a server not leading", "moved, from a worker",
        "a placement asked of a server not leading"])
def test_a_forged_move_is_refused(build, role, says):
    """The agreement's messages go only between the lead and the others; a worker asks only
    the lead what moved."""
    with pytest.raises(ProtocolError, match=says):
        admit(build(), f"{role} 0 (rank 2)", role == "worker", to_lead=False,
              from_lead=role == "lead", width=1, placement=REPLICATED, server=1, columns=2,
              n_workers=2)


def lead_membership():
    """The lead's membership, no move under way (its context: what the handlers read)."""
    from types import SimpleNamespace

    from mpips.membership.requests import Membership
    ctx = SimpleNamespace(placement=Placement(2), copies=SimpleNamespace(on_whole=[]),
                          lead=True, roles=SimpleNamespace(servers=[0, 1], index=0),
                          sender=lambda source: f"server 1 (rank {source})",
                          register=lambda handlers: None)
    return Membership(ctx, None)


@pytest.mark.parametrize("text, says", [
    (b'{"step": "moved", "keys_sent": 9}', r"sent MOVED \('moved'\), but no move is at that step"),
    (b'{"step": "took"}', r"sent MOVED \('took'\), but no move is at that step"),
    (b'[1, 2]', "MOVED whose text is not a JSON object with a step"),
    (b'{"keys_sent": 9', "MOVED whose text is not a JSON object with a step"),
], ids=["switched, unasked", "took, unasked", "not an object", "not JSON"])
def test_a_step_of_a_move_not_under_way_is_refused(text, says):
    """A server saying it made a step of a move the lead did not ask for stops the job
    rather than answering `ctl` or the workers with a placement nobody holds."""
    with pytest.raises(ProtocolError, match=says):
        lead_membership().handlers()[Op.MOVED](1, None, protocol.pack(
            Header(Op.MOVED), np.frombuffer(text, np.uint8)))


def test_a_switch_with_no_copies_made_is_refused():
    from types import SimpleNamespace

    from mpips.wire import messages
    buf = messages.MoveAt(2, 7, np.zeros(0, np.int64)).pack()
    with pytest.raises(ProtocolError, match="no move under way whose copies are made"):
        lead_membership().handlers()[Op.MOVE_AT](
            0, SimpleNamespace(header=protocol.header(buf)), buf)


def split_of(worker: int = 0, joiner: int = 1):
    fields = Handover(worker, 3, 0, 0, -1, (), (worker, joiner), False, (2, 1)).fields()
    return protocol.pack(Header(Op.SPLIT, nkeys=fields.shape[0]), fields)


@pytest.mark.parametrize("build, role, to_lead, says", [
    (lambda: split_of(), "worker", False, "SPLIT, which a worker may not send"),
    (lambda: split_of(), "server", True, "SPLIT, which this server may not send"),
    (lambda: split_of()[:-8], "worker", True, "SPLIT of 136 bytes, where its header .* makes it 144"),
    (lambda: protocol.pack(Header(Op.JOIN_AT, clock=5, arg=1)), "worker", False,
     "JOIN_AT, which a worker may not send"),
    (lambda: protocol.pack(Header(Op.JOIN_AT, clock=5, arg=1)), "server", False,
     "JOIN_AT, which this server may not send"),
], ids=["a split to a server not leading", "a split from a server", "a split cut short",
        "a join from a worker", "a join from a server not leading"])
def test_a_forged_worker_change_is_refused(build, role, to_lead, says):
    """A worker tells only the lead how it split its rows with a worker joining; only the
    lead says when a worker joins."""
    with pytest.raises(ProtocolError, match=says):
        admit(build(), f"{role} 0 (rank 2)", role == "worker", to_lead=to_lead,
              from_lead=False, width=1, placement=REPLICATED, server=0, n_workers=2)


def test_a_split_to_the_lead_and_a_join_from_it_are_admitted():
    split = admit(split_of(), "worker 0 (rank 3)", True, to_lead=True, from_lead=False,
                  width=1, placement=REPLICATED, server=0)
    assert split.op is Op.SPLIT
    assert Handover.of_fields(protocol.int64_fields(split_of())).shares == (2, 1)
    joined = admit(protocol.pack(Header(Op.JOIN_AT, clock=5, arg=1)), "server 0 (rank 0)",
                   False, to_lead=False, from_lead=True, width=1, placement=REPLICATED,
                   server=1)
    assert joined.op is Op.JOIN_AT and joined.header.arg == 1


def test_a_placement_asked_of_the_lead_is_admitted():
    asked = admit(protocol.pack(Header(Op.PLACEMENT, arg=0)), "worker 0 (rank 3)", True,
                  to_lead=True, from_lead=False, width=1, placement=REPLICATED, server=0)
    assert asked.op is Op.PLACEMENT
