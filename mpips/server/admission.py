"""What a server accepts: every request is checked before anything in it is used.

A server trusts no message: the operation must be one the sender's role may send, the payload
must be as long as the header says, a push's width must be the table's, keys must be sorted,
unique and this server's, values and the sender's figures finite. A request that fails is not
applied; the server stops the job with a message naming the sender and what was wrong (the
numba kernels do no bounds checks, so nothing unchecked may reach them).
"""
import math
from typing import NamedTuple

import numpy as np

from ..base.errors import ProtocolError
from ..kernels.requests import first_not_finite
from ..wire import dense_request, encoding, messages, protocol
from ..wire.protocol import HEADER_BYTES, Op

# Who may send what: workers talk to every server; servers to server 0 (their checkpoint files,
# their end, a stop they were asked for) and server 0 to the others (clocks to checkpoint at).
FROM_WORKERS = {Op.PULL, Op.PUSH, Op.FINISH, Op.BYE, Op.STATUS, Op.ERROR, Op.STOP,
                Op.DENSE}
WORKERS_TO_LEAD = {Op.PLACEMENT, Op.SPLIT, Op.CHUNK, Op.WORK}
FROM_SERVERS_TO_LEAD = {Op.SHARD_SAVED, Op.BYE, Op.ERROR, Op.STOP, Op.MOVE_CLOCK, Op.MOVED,
                        Op.CHUNK, Op.HANDOUT_HELD}
FROM_LEAD = {Op.STOP_AT, Op.CHECKPOINT_AT, Op.ERROR, Op.DEATH, Op.MOVE_ASK, Op.MOVE_TO, Op.MOVE_AT,
             Op.JOIN_AT, Op.HANDOUT}
FROM_SERVERS = {Op.COPY, Op.ERROR, Op.GONE, Op.HAVE, Op.READ, Op.SCORED}   # any to any
FLAGS = {Op.PULL: protocol.READ_ONLY | protocol.NEXT_CLOCK,
         Op.PUSH: (protocol.CLOCK | protocol.SAME_KEYS | protocol.REPORT | protocol.BACKUP
                   | protocol.HALF | protocol.INT8 | protocol.MASK),
         Op.FINISH: protocol.REPORT}
TEXT_PAYLOAD = {Op.ERROR, Op.SHARD_SAVED, Op.MOVED, Op.HANDOUT}   # UTF-8 text of any length
# What each sender may send: (from a worker, to the lead, from the lead) -> ops.
ALLOWED = {(worker, to_lead, from_lead): frozenset(
    FROM_WORKERS | (WORKERS_TO_LEAD if to_lead else set()) if worker else
    (FROM_SERVERS_TO_LEAD if to_lead else set()) | (FROM_LEAD if from_lead else set())
    | FROM_SERVERS)
    for worker in (False, True) for to_lead in (False, True) for from_lead in (False, True)}
TEXT_LIMIT = 1 << 20
_OPS = frozenset(int(op) for op in Op)
MAX_SHARES_TAKEN = 1 << 16   # a report's shares of dead workers' rows (kept per worker)
INT64_PAYLOAD = frozenset({Op.DEATH, Op.SPLIT, Op.MOVE_TO, Op.MOVE_AT, Op.MOVE_CLOCK,
                           Op.WORK})
PER_RANGE = frozenset({Op.MOVE_TO, Op.MOVE_AT, Op.MOVE_CLOCK})   # a figure per key range
KEYED = frozenset({Op.PULL, Op.PUSH, Op.READ})            # keys, values, maybe a report
PLACED = KEYED | {Op.COPY}                                 # keys split by a placement


_NO_KEYS = np.empty(0, np.uint64)
_NO_VALUES = np.empty((0, 0), np.float32)


class Request(NamedTuple):
    op: Op
    header: protocol.Header
    keys: np.ndarray
    values: np.ndarray
    report: protocol.Report | None
    backup_keys: np.ndarray = _NO_KEYS        # a BACKUP push's part for ranges backed up here
    backup_values: np.ndarray = _NO_VALUES
    rows_sent: np.ndarray | None = None       # a MASK push: the pulled keys its values are of


def _expected_bytes(op: Op, h, n_workers: int, backup: int, rows: int | None) -> int:
    if op is Op.COPY:
        return HEADER_BYTES + h.nkeys * (8 + 4 * h.width) + 8 * n_workers
    report = protocol.REPORT_BYTES if h.flags & protocol.REPORT else 0
    if op in INT64_PAYLOAD:
        return HEADER_BYTES + 8 * h.nkeys
    if op in KEYED:
        return HEADER_BYTES + protocol.payload_bytes(h, backup, rows) + report
    return HEADER_BYTES + report


def _check(buf: np.ndarray, from_worker: bool, to_lead: bool, from_lead: bool, width: int,
           placement, server: int, columns: int, n_workers: int, load=None, header=None):
    """The request, or raise ProtocolError(what is wrong)."""
    op, h = _checked_header(buf, from_worker, to_lead, from_lead, width, placement, columns,
                            header)
    rows_sent = _checked_size(buf, op, h, n_workers)
    rows = None if rows_sent is None else rows_sent.shape[0]
    if h.ts < 0 or h.clock < 0:
        raise ProtocolError(f"{op.name} with a negative ts {h.ts} or clock {h.clock}")
    # Placements only move keys to servers that held them already (a dead primary's backup
    # answers for it), so keys split by an earlier one are checked against this one.
    if (op in PLACED
            and not 0 <= h.placement <= placement.version):
        raise ProtocolError(f"{op.name} of keys split by placement version {h.placement}; "
                            f"this server's is {placement.version}")
    # int64, read by handlers
    if op in INT64_PAYLOAD:
        return Request(op, h, _NO_KEYS, _NO_VALUES, None)
    if op is Op.DENSE:   # what its fields mean is the function's to check (dense_tables)
        _, scalars, _, values = dense_request.dense_fields(buf, h)
        for these in (scalars, values):
            if these.size and first_not_finite(these) >= 0:
                raise ProtocolError("DENSE with a value that is not finite")
        return Request(op, h, _NO_KEYS, _NO_VALUES, None)
    _, keys, values, report = protocol.unpack(buf, rows, h)
    backup_keys, backup_values = (protocol.backup_of(buf, h) if h.flags & protocol.BACKUP
                                  else (_NO_KEYS, _NO_VALUES))
    if report is not None:
        check_report(op, report)
    # Reads go to a key's primary, writes to every server holding it.
    read = op is Op.PULL or op is Op.READ
    for part, these in (("", keys), ("backed-up ", backup_keys)):
        if these.shape[0]:
            i, why = placement.first_misplaced(these, server, as_primary=read,
                                               counts=load if op is Op.PULL else None)
            if i >= 0:
                raise ProtocolError(f"{op.name} of {these.shape[0]} {part}keys whose key "
                                    f"#{i} ({int(these[i])}) is {why}")
    if op is Op.COPY and keys.shape[0]:
        copied = messages.CopyHeader.of(h).range_index
        if (placement.ranges_of(keys) != copied).any():
            raise ProtocolError(f"COPY of range {copied} with keys of another range")
    for these in (values, backup_values):
        bad = first_not_finite(these) if these.size else -1
        if bad >= 0:
            raise ProtocolError(f"{op.name} with a value that is not finite "
                                f"({these.reshape(-1)[bad]} at position {bad})")
    return Request(op, h, keys, values, report, backup_keys, backup_values, rows_sent)


def _checked_header(buf: np.ndarray, from_worker: bool, to_lead: bool, from_lead: bool,
                    width: int, placement, columns: int, header=None):
    """(op, header) of a request whose sender may send it, its fields in range. `header`:
    buf's, if read already."""
    if buf.shape[0] < HEADER_BYTES:
        raise ProtocolError(f"a message of {buf.shape[0]} bytes, shorter than the "
                            f"{HEADER_BYTES}-byte header")
    h = protocol.header(buf) if header is None else header
    try:
        op = Op(h.op)
    except ValueError:
        raise ProtocolError(f"unknown operation {h.op}") from None
    if op not in ALLOWED[(from_worker, to_lead, from_lead)]:
        raise ProtocolError(f"{op.name}, which {'a worker' if from_worker else 'this server'} "
                            f"may not send {'' if from_worker else 'to this one'}".rstrip())
    if h.flags & ~FLAGS.get(op, 0):
        raise ProtocolError(f"{op.name} with unknown flags {h.flags:#x}")
    if h.flags & protocol.HALF and h.flags & protocol.INT8:
        raise ProtocolError(f"{op.name} of values both float16 and int8")
    if h.nkeys < 0 or h.width < 0:
        raise ProtocolError(f"{op.name} with {h.nkeys} keys of width {h.width}")
    if op is Op.PUSH and h.width != width:
        raise ProtocolError(f"PUSH of width {h.width}; this table's width is {width}")
    if op is Op.COPY:
        copied = messages.CopyHeader.of(h).range_index
        if h.width != columns or not 0 <= copied < placement.n_ranges:
            raise ProtocolError(f"{op.name} of range {copied} with {h.width} columns; this "
                                f"table keeps {columns}, over {placement.n_ranges} ranges")
    if op in PER_RANGE and h.nkeys != placement.n_ranges:
        raise ProtocolError(f"{op.name} with a figure for each of {h.nkeys} ranges; there "
                            f"are {placement.n_ranges}")
    return op, h


def _checked_size(buf: np.ndarray, op: Op, h, n_workers: int):
    """A MASK push's rows sent (else None), the request's size being the one its header
    makes."""
    backup = 0
    if h.flags & protocol.BACKUP:
        if buf.shape[0] < HEADER_BYTES + 8:
            raise ProtocolError(f"{op.name} with a backup part of no length")
        backup = protocol.backup_count(buf)
        if not 0 <= backup <= buf.shape[0]:
            raise ProtocolError(f"{op.name} with a backup part of {backup} keys")
    rows_sent = _rows_sent(buf, h) if op is Op.PUSH and h.flags & protocol.MASK else None
    rows = None if rows_sent is None else rows_sent.shape[0]
    if op is Op.DENSE:   # fields the header counts, then float64 values
        fixed = dense_request.dense_fixed_bytes(h)
        if dense_request.dense_rows(h) < 0 or buf.shape[0] < fixed or (buf.shape[0] - fixed) % 8:
            raise ProtocolError(f"DENSE of {buf.shape[0]} bytes, where its header ({h.nkeys} "
                                f"integers, {h.width} scalars, {dense_request.dense_rows(h)} rows) "
                                f"makes it {fixed} and whole float64 values after")
    elif op in TEXT_PAYLOAD:
        if buf.shape[0] > HEADER_BYTES + TEXT_LIMIT:
            raise ProtocolError(f"{op.name} with {buf.shape[0] - HEADER_BYTES} bytes of text")
    elif buf.shape[0] != _expected_bytes(op, h, n_workers, backup, rows):
        raise ProtocolError(f"{op.name} of {buf.shape[0]} bytes, where its header "
                            f"({h.nkeys} keys{'' if rows is None else f', {rows} sent'}, "
                            f"width {h.width}{f', {backup} backed-up keys' if backup else ''}"
                            f"{_encoding(h)}) makes it "
                            f"{_expected_bytes(op, h, n_workers, backup, rows)}")
    if op is Op.PUSH and h.flags & protocol.INT8:
        _check_scales(buf, h, rows)
    return rows_sent


def report_ok(r) -> bool:
    """Whether a worker's figures `r` (a Report) are finite and not negative, and its shares
    taken of dead workers' rows a list a server can keep (one share per death)."""
    # (asked of every push: one expression, NaN failing its comparisons)
    return (0.0 <= r.loss < math.inf and 0.0 <= r.progress < math.inf and r.epoch >= 0
            and r.examples >= 0 and r.segment >= 0 and 0 <= r.taken <= MAX_SHARES_TAKEN
            and r.taken_epoch >= 0 and r.offset >= -1)


def check_report(op: Op, report) -> None:
    """ProtocolError naming the figure unless `report_ok(report)`."""
    if not report_ok(report):
        _refuse_report(op, report)


def _refuse_report(op: Op, report) -> None:
    """Raise ProtocolError naming the figure of `report` that check_report refuses."""
    for name in ("loss", "progress"):
        value = getattr(report, name)
        if not (math.isfinite(value) and value >= 0):
            raise ProtocolError(f"{op.name} reporting {name} {value}")
    if min(report.epoch, report.examples, report.segment, report.taken,
           report.taken_epoch) < 0 or report.offset < -1:
        raise ProtocolError(f"{op.name} reporting a negative figure (epoch {report.epoch}, "
                            f"segment {report.segment}, offset {report.offset}, examples "
                            f"{report.examples}, shares taken {report.taken} at epoch "
                            f"{report.taken_epoch})")
    if report.taken > MAX_SHARES_TAKEN:
        raise ProtocolError(f"{op.name} reporting {report.taken} shares of dead workers' rows "
                            f"taken (a share per death: at most {MAX_SHARES_TAKEN})")


def _encoding(h) -> str:
    return (", float16 values" if h.flags & protocol.HALF else
            ", int8 values" if h.flags & protocol.INT8 else "")


def _rows_sent(buf: np.ndarray, h) -> np.ndarray:
    """The pulled keys a MASK push carries values for, from its bitmap, checked."""
    if not h.flags & protocol.SAME_KEYS:
        raise ProtocolError("PUSH with a bitmap (MASK) over keys it carries (no SAME_KEYS)")
    bits = protocol.bitmap_of(buf, h)
    if bits.shape[0] < protocol.bitmap_bytes(h.nkeys):
        raise ProtocolError(f"PUSH of {buf.shape[0]} bytes, too short for its bitmap over "
                            f"{h.nkeys} keys")
    rows = protocol.set_bits(bits)   # the bitmap's one unpacking (see unpack's `sent`)
    if rows.shape[0] and rows[-1] >= h.nkeys:
        raise ProtocolError(f"PUSH whose bitmap sets bits past its {h.nkeys} keys")
    return rows


def _check_scales(buf: np.ndarray, h, sent: int | None) -> None:
    """An int8 push's block scales must be finite and not negative. `sent`: a MASK push's
    rows."""
    start, rows = protocol.own_values_at(buf, h, sent)
    scales = encoding.int8_scales(buf[start:], rows, h.width)
    bad = np.flatnonzero(~(np.isfinite(scales) & (scales >= 0)))
    if bad.shape[0]:
        raise ProtocolError(f"PUSH of int8 values whose block #{bad[0]} has scale "
                            f"{scales[bad[0]]}")


def unbundle(buf: np.ndarray, h: protocol.Header, sender: str) -> tuple:
    """(push, its header, pull, its header without WITH_PUSH) of a PULL that carries a PUSH
    (WITH_PUSH), each to be admitted as a request of its own, the push first; raises
    ProtocolError naming `sender` if the bundle does not hold a PUSH after the pull's
    keys."""
    parts = protocol.unbundle(buf, h)
    push_h = None if parts is None else protocol.header(parts[0])
    inner = -1 if push_h is None else push_h.op
    if parts is None or push_h is None or inner != Op.PUSH:
        what = ("no room for it" if parts is None else
                f"{Op(inner).name if inner in _OPS else inner} in its place")
        raise ProtocolError(f"{sender} sent a bad request: PULL of {h.nkeys} keys bundled with a "
                            f"PUSH (WITH_PUSH), with {what}; it was not applied, and the job "
                            f"stops")
    push, pull, pull_h = parts
    return push, push_h, pull, pull_h


def admit(buf: np.ndarray, sender: str, from_worker: bool, to_lead: bool, from_lead: bool,
          width: int, placement, server: int, columns: int = 0, n_workers: int = 0,
          load: np.ndarray | None = None, header: protocol.Header | None = None) -> Request:
    """The request in `buf` from `sender` (e.g. "worker 1 (rank 3)"), checked; raises
    ProtocolError naming the sender and the fault otherwise. `columns`: of the table's state
    rows; `n_workers`: of the job (for COPY); `load` (int64 per key range): a read's keys
    counted by range; `header`: buf's, if read already."""
    try:
        return _check(buf, from_worker, to_lead, from_lead, width, placement, server, columns,
                      n_workers, load, header)
    except ProtocolError as e:
        raise ProtocolError(f"{sender} sent a bad request: {e}; it was not applied, and the job "
                            f"stops") from None
