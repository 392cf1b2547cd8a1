"""Messages between workers and servers: one contiguous numpy buffer each, no pickle.

A request is a 48-byte header followed by its payload: for PULL the keys
(uint64), for PUSH the keys then the values (float32, `width` per key), for
ERROR the UTF-8 text of the error. With replicas, a push to a server can carry,
besides the server's own part, the part for the ranges it backs up (flag BACKUP):
so that replicas do not multiply the messages. A push of the same keys as an earlier pull
(flag SAME_KEYS) carries only the values, in that pull's order, and names the
pull in `arg`: keys cross the wire once per minibatch, and the server reuses the
rows it found for the pull. A worker's figures (where its next minibatch starts,
examples and loss so far: what checkpoints and progress lines need) travel as a
64-byte Report after the payload, on the messages that complete a clock and on
FINISH (flag REPORT). A pull's reply is the bare values, sent with a tag derived
from the request's timestamp so replies can be matched out of order.

A worker's push filter (see pushfilter) may send a push's own values as float16 (flag HALF)
or int8 with a float32 scale per block of 256 (INT8), and a SAME_KEYS push only some of its
pull's keys' rows (MASK: a bitmap over them); a backed-up part stays float32, the values the
primary applies.
"""
import struct
from collections.abc import Callable
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

from .encoding import HALF as HALF
from .encoding import INT8 as INT8
from .encoding import decode_values, pad8, values_bytes
from .tags import REPLY_TAG0


class Header(NamedTuple):
    op: int
    flags: int = 0
    ts: int = 0          # the sender's request number
    clock: int = 0       # clocks the sender has completed
    nkeys: int = 0
    width: int = 0
    placement: int = 0   # the version of the placement the sender split its keys by
    arg: int = 0         # the op's own number (see messages.TYPES): for a SAME_KEYS push,
                         # the ts of the pull whose keys it reuses


class Report(NamedTuple):
    """A worker's figures: where its next minibatch starts, and what it has done."""
    epoch: int = 0       # this epoch, ...
    offset: int = 0      # ... at this byte offset (text) or row (binary shards); -1: its start
    examples: int = 0    # examples the sender has trained on so far
    loss: float = 0.0    # their summed training logloss
    progress: float = 0.0  # epochs done, fractional
    segment: int = 0     # the range of the epoch's work plan `offset` is in (see workplan)
    taken: int = 0       # shares of dead workers' rows taken so far, ...
    taken_epoch: int = 0  # ... the latest of them at this epoch


# Little-endian, multiples of 8 bytes so the payload after the header stays aligned.
_LAYOUT = struct.Struct("<iiqqqiiq")
_new = tuple.__new__   # a record of the fields unpacked (NamedTuple._make checks their count)
# The unpacking of a buffer: a numpy array is one (a memoryview of it, .data, took as long
# as the unpacking).
_header_fields: Callable[[Any, int], tuple] = _LAYOUT.unpack_from
HEADER_BYTES = _LAYOUT.size
assert HEADER_BYTES == 48
_REPORT = struct.Struct("<qqqddqqq")
REPORT_BYTES = _REPORT.size
_report_fields: Callable[[Any, int], tuple] = _REPORT.unpack_from
_FLAGS = struct.Struct("<i")   # a header's flags, at byte 4


class Op(IntEnum):
    PULL = 1
    PUSH = 2
    FINISH = 3   # the sender will advance no more clocks (it counts as infinitely far ahead)
    BYE = 4      # the sender will send nothing more
    ERROR = 5    # the sender (worker or server) failed; servers save what they hold, then ack
    STATUS = 6   # reply: STATUS_FIELDS, the server's view of the workers' clocks
    STOP_AT = 7  # server 0 to the others: write a checkpoint at `clock`, then stop the workers
    SHARD_SAVED = 8  # a server to server 0: its file of checkpoint `clock` (JSON payload)
    CHECKPOINT_AT = 9  # server 0 to the others: write a checkpoint at `clock` (a timed one)
    STOP = 10    # any rank to server 0: this rank was asked to stop (a signal); stop the job
    COPY = 11    # a range's primary to its new holder: the range's keys (sorted) and state
                 # rows (`width` columns), then the last push applied per worker (int64)
    GONE = 12    # a server to the others: worker `arg` died; this server holds its pushes of
                 # its first `clock` clocks
    HAVE = 13    # a server to the others (BSP under ULFM): every living worker has completed
                 # `clock` clocks here, so clocks before it may be applied everywhere
    DEATH = 14   # the lead to the others: a dead worker's rows went to the survivors
                 # (`nkeys` int64: see `Handover.fields`), numbered
    DENSE = 15   # an operation on dense tables (see server/dense_tables): int64 fields (the
                 # function's number, its tables', its integers), float64 scalars, uint64
                 # rows, then float64 values; reply: float64 (see dense_fields)
    # Servers joining and leaving (see membership):
    MOVE_ASK = 16    # the lead to the others: say your keys read per range; and maybe
                     # hold reads past the clocks let through so far
    MOVE_CLOCK = 17  # a server to the lead: the highest clock it let a read through for, then
                     # its keys read per range (`nkeys` int64)
    MOVE_AT = 18     # the lead to the others: the new owners (named by MOVE_TO, the `nkeys` int64
                     # that follow) own their ranges from `clock` (a placement version)
    MOVE_TO = 19     # the lead to the others: the ranges' new owners, the `nkeys` int64 that
                     # follow (a placement version): copy the ranges to them now
    MOVED = 20       # a server to the lead: JSON {"step": "took" | "whole" | "moved", figures}
    PLACEMENT = 21   # a worker to the lead, a read refused: what now? Reply: int64 kind (0:
                     # the job stopped, 1: moved), version, clock, each range's owner, then
                     # its extra holders (a move under way), `replicas` a range, -1 for none
    # Workers joining (see membership/workermoves):
    SPLIT = 22       # a worker to the lead: it split its rows left with the worker joining
                     # (`nkeys` int64: a Handover.fields() record whose worker is a survivor)
    JOIN_AT = 23     # the lead to the others: a worker trains again from clock `clock`
    # Every rank scoring chunks of the test rows (see job/scoring):
    CHUNK = 24       # any rank to the lead: which chunk of the test file to score next?
                     # Reply: int64 start and stop (rows, or bytes of text), equal for none left
    READ = 25        # a server to another, once training is over: the final weights of the
                     # `nkeys` sorted keys that follow (reply: float32, as to a PULL)
    SCORED = 26      # a server to the others: it has scored its chunks; it reads no more
    # --balance dynamic (see data/balance):
    WORK = 27        # a worker to the lead: its next chunk of training rows (`nkeys` int64:
                     # its epoch, its speed in milli-rows per busy second, a row's size in
                     # milli-units of the file, the chunks it holds). Reply: int64 epoch,
                     # start, stop, minibatch rows (start == stop: none left)
    HANDOUT = 28     # under ULFM, the lead to the server that would lead next: the whole
                     # hand-out as JSON text, copy number `arg` (see server/rowhandout)
    HANDOUT_HELD = 29   # that server to the lead: it holds copy number `arg`


CLOCK = 1        # PUSH flag: this push completes the sender's current clock
READ_ONLY = 2    # PULL flag: do not store unknown keys (evaluation)
NEXT_CLOCK = 8   # PULL flag: a read for the sender's next clock, sent before the push that
                 # completes its current one (prefetching); served once that push has arrived
SAME_KEYS = 4    # PUSH flag: no keys in the message; they are those of pull `arg`
REPORT = 16      # PUSH or FINISH flag: a Report follows the payload
BACKUP = 32      # PUSH flag: the message also carries the part of the push for ranges this
                 # server keeps a backup copy of, applied before its own part (see unpack)
# HALF = 64, INT8 = 128: PUSH flags, the own part's values float16 or int8 (see encoding)
MASK = 256       # PUSH flag, with SAME_KEYS: a bitmap over the pull's `nkeys` keys (bit i % 8
                 # of byte i // 8: key i) precedes the values, which are those of its set bits
WITH_PUSH = 512  # PULL flag: a whole PUSH request (header and payload) follows the pull's keys
                 # in the message, taken first: a worker's push of a clock and its read for
                 # the next travel as one message (see `bundle`)

# Reply to STATUS: int64 values in this order. `slowest_worker` is -1 once all have finished;
# `slowest_silent_ms` is how long server 0 has heard nothing from it; `deaths`: how many dead
# workers' rows it has handed over; `stopping`: 1 once the job stops (a checkpoint is its end).
STATUS_FIELDS = ("slowest_clock", "slowest_worker", "finished", "slowest_silent_ms", "deaths",
                 "stopping")

# On tags.NOTICE_TAG, the lead to a worker: a hand-over whose rows it shares (int64: its
# number, then DEATH's payload), or one of these notices:
LEAVE_NOTICE = -1   # the lead to a worker (mpips ctl remove-worker): leave after this clock
GIVE_NOTICE = -2    # ..., joiner, weight: keep `weight` shares of the rows left, give it one
JOIN_NOTICE = -3    # ..., clock: train again (shares handed to it), from clock + 1


def reply_tags(tag_ub: int) -> int:
    """How many distinct reply tags to cycle through, given the MPI's largest tag."""
    return min(1 << 20, tag_ub - REPLY_TAG0 + 1)


def reply_tag(ts: int, n_tags: int) -> int:
    """The tag of the reply to request `ts`; it is reused only after n_tags newer requests."""
    return REPLY_TAG0 + ts % n_tags


def message(header: Header, *payload: np.ndarray, report: Report | None = None) -> bytes:
    """The bytes of one request: the header, the payload arrays' bytes and the report (a
    worker's messages: an Isend takes bytes as they are). `bundled` puts a push behind a
    pull's message."""
    return _joined(_parts(header, payload, report))


def pack(header: Header, *payload: np.ndarray, report: Report | None = None) -> np.ndarray:
    """`message` as a uint8 array of its own (writable)."""
    return np.frombuffer(bytearray(message(header, *payload, report=report)), np.uint8)


def bundled(pull: bytes, header: Header, *payload: np.ndarray,
            report: Report | None = None) -> bytes:
    """One message of the PULL request `pull` (`message`'s bytes) and a PUSH request (as
    `message` takes it) to take before it: `bundle` as a worker sends it, the push's arrays
    copied once."""
    return _joined((*_with_push(pull), *_parts(header, payload, report)))


def _parts(header: Header, payload: tuple, report: Report | None) -> tuple:
    if report is None:
        return (_LAYOUT.pack(*header), *payload)
    if not header.flags & REPORT:
        header = with_flags(header, header.flags | REPORT)
    return (_LAYOUT.pack(*header), *payload, _REPORT.pack(*report))


def _with_push(pull: bytes) -> tuple:
    """The parts of a PULL request's bytes with WITH_PUSH set in its flags."""
    return pull[:4], _FLAGS.pack(_FLAGS.unpack_from(pull, 4)[0] | WITH_PUSH), memoryview(pull)[8:]


def _joined(parts: tuple) -> bytes:
    """The parts' bytes in one (a join of their buffers: a tenth of the time of copies into
    a numpy array); an array not C-contiguous, copied first."""
    try:
        return b"".join(parts)
    except TypeError:
        contiguous: list[Any] = [np.ascontiguousarray(p) if isinstance(p, np.ndarray) else p
                                 for p in parts]
        return b"".join(contiguous)


def header_of(op: int, flags: int, ts: int, clock: int, nkeys: int, width: int,
              placement: int, arg: int) -> Header:
    """Header(...) of every field, in order, in a third of its constructor's time (a
    worker makes one a message)."""
    return _new(Header, (op, flags, ts, clock, nkeys, width, placement, arg))


def header(buf: np.ndarray, at: int = 0) -> Header:
    """The header of the request at buf[at:]."""
    return _new(Header, _header_fields(buf, at))


def backup_count(buf: np.ndarray) -> int:
    """The number of keys in a BACKUP push's backup part (its first payload field)."""
    return int(buf[HEADER_BYTES:HEADER_BYTES + 8].view(np.int64)[0])


def bitmap_bytes(nkeys: int) -> int:
    """The bytes of a MASK push's bitmap over `nkeys` keys (padded to 8)."""
    return pad8(-(-nkeys // 8))


def payload_bytes(h: Header, backup: int = 0, rows: int | None = None) -> int:
    """The bytes after the header of a PUSH or PULL with header `h` (report excluded), given
    the backup part's key count and the rows of own values (default `nkeys`; MASK: its bits
    set)."""
    n_keys = 0 if h.flags & SAME_KEYS else h.nkeys
    size = 8 * n_keys
    if h.op == Op.PUSH:
        size += values_bytes(h.nkeys if rows is None else rows, h.width, h.flags)
        if h.flags & MASK:
            size += bitmap_bytes(h.nkeys)
        if h.flags & BACKUP:
            size += 8 + backup * (8 + 4 * h.width)
    return size


def bitmap(sent: np.ndarray) -> np.ndarray:
    """A MASK push's bitmap (uint8, padded to 8 bytes) of `sent` (bool per pulled key)."""
    out = np.zeros(bitmap_bytes(sent.shape[0]), np.uint8)
    packed = np.packbits(sent, bitorder="little")
    out[:packed.shape[0]] = packed
    return out


def bitmap_of(buf: np.ndarray, h: Header) -> np.ndarray:
    """A MASK push's bitmap: a view of `buf` (its own keys are absent: SAME_KEYS)."""
    start = HEADER_BYTES + (8 + 8 * backup_count(buf) if h.flags & BACKUP else 0)
    return buf[start:start + bitmap_bytes(h.nkeys)]


def set_bits(bits: np.ndarray) -> np.ndarray:
    """The indices (int64) of every bit set in a bitmap, its padding included: a MASK push's
    rows sent, and any bit past its keys, from one unpacking."""
    return np.flatnonzero(np.unpackbits(bits, bitorder="little"))


def own_values_at(buf: np.ndarray, h: Header, sent: int | None = None) -> tuple[int, int]:
    """(where a PUSH's own values start, their rows): after the backup part's count and keys,
    the own keys or MASK's bitmap, and the backup part's values. `sent`: a MASK push's bits
    set, if counted already."""
    backup = backup_count(buf) if h.flags & BACKUP else 0
    start = HEADER_BYTES + (8 + 8 * backup if h.flags & BACKUP else 0)
    rows = h.nkeys
    if h.flags & MASK:
        rows = int(np.unpackbits(bitmap_of(buf, h)).sum()) if sent is None else sent
        start += bitmap_bytes(h.nkeys)
    elif not h.flags & SAME_KEYS:
        start += 8 * h.nkeys
    return start + 4 * backup * h.width, rows


_NO_VALUES = np.empty((0, 0), np.float32)


def unpack(buf: np.ndarray, sent: int | None = None, h: Header | None = None):
    """(header, keys, values, report) of a received buffer: views of it, keys and values
    empty when absent, report None. `sent`: a MASK push's bits set, if counted already;
    `h`: its header, if read already.

    A BACKUP push's payload is: the backup part's key count (int64), its keys, the own
    part's keys (absent with SAME_KEYS; MASK's bitmap in their place), the backup part's
    values, the own part's values (decoded: HALF, INT8): keys before values keeps both
    aligned. Its backup part is read by `backup_of`."""
    h = header(buf) if h is None else h
    n_keys = 0 if h.flags & SAME_KEYS else h.nkeys
    backup = backup_count(buf) if h.flags & BACKUP else 0
    start = HEADER_BYTES + (8 + 8 * backup if h.flags & BACKUP else 0)
    keys = buf[start:start + 8 * n_keys].view(np.uint64)
    end = start + 8 * n_keys
    values = _NO_VALUES
    if h.op == Op.PUSH:
        start, rows = own_values_at(buf, h, sent)
        end = start + values_bytes(rows, h.width, h.flags)
        values = decode_values(buf[start:end], rows, h.width, h.flags)
    elif h.op == Op.COPY:
        start = end
        end = start + 4 * h.nkeys * h.width
        values = buf[start:end].view(np.float32).reshape(h.nkeys, h.width)
    report = report_at(buf, end) if h.flags & REPORT else None
    return h, keys, values, report


def bundle(pull: np.ndarray, push: np.ndarray) -> np.ndarray:
    """One message of a PULL request and the PUSH request to take before it (WITH_PUSH), as
    a uint8 array of its own."""
    return np.frombuffer(bytearray(_joined((*_with_push(pull.tobytes()), push))), np.uint8)


def unbundle(buf: np.ndarray, h: Header) -> tuple | None:
    """(the PUSH request, the PULL request, its header without WITH_PUSH) of a bundle (see
    `bundle`), or None if its header's key count leaves no room for a push's header."""
    cut = HEADER_BYTES + 8 * h.nkeys
    if h.nkeys < 0 or cut + HEADER_BYTES > buf.shape[0]:
        return None
    return buf[cut:], buf[:cut], with_flags(h, h.flags & ~WITH_PUSH)


def with_flags(h: Header, flags: int) -> Header:
    """`h` with `flags` for its flags (a third of NamedTuple._replace's time: asked of every
    bundle)."""
    return _new(Header, (h.op, flags, *h[2:]))


def report_at(buf: np.ndarray, offset: int) -> Report:
    """The Report at buf[offset:]."""
    return _new(Report, _report_fields(buf, offset))


def backup_of(buf: np.ndarray, h: Header):
    """(keys, values) of a BACKUP push's backup part, views of `buf`."""
    n = backup_count(buf)
    start = HEADER_BYTES + 8
    keys = buf[start:start + 8 * n].view(np.uint64)
    start += 8 * n + (bitmap_bytes(h.nkeys) if h.flags & MASK else
                      0 if h.flags & SAME_KEYS else 8 * h.nkeys)
    values = buf[start:start + 4 * n * h.width].view(np.float32).reshape(n, h.width)
    return keys, values


def backup_part_header(h: Header, nkeys: int) -> Header:
    """The header of a BACKUP push's backup part, applied as a push of its own: `nkeys`
    float32 rows with their keys, no flags."""
    return h._replace(flags=0, nkeys=nkeys, arg=0)


def copied_positions(buf: np.ndarray, h: Header) -> np.ndarray:
    """A COPY's last field: the last push applied per worker (int64)."""
    return buf[HEADER_BYTES + h.nkeys * (8 + 4 * h.width):].view(np.int64)


def int64_fields(buf: np.ndarray) -> np.ndarray:
    """The int64 payload of DEATH, SPLIT, MOVE_AT, MOVE_CLOCK or WORK (a view of `buf`)."""
    return buf[HEADER_BYTES:].view(np.int64)


def text(value: str) -> np.ndarray:
    """A text payload (ERROR, SHARD_SAVED, MOVED): its UTF-8 bytes."""
    return np.frombuffer(value.encode(), np.uint8)


def text_of(buf: np.ndarray) -> str:
    """The text payload of a received ERROR, SHARD_SAVED or MOVED."""
    return buf[HEADER_BYTES:].tobytes().decode("utf-8", "replace")
