"""A server's hot requests in compiled code, over the receive buffer and the table: a pull's
keys checked and looked up in one call, a push's values checked. Pure numba, no MPI.

The checks are admission's (server.admission) for these parts of a request: keys strictly
increasing and each in a key range the server may take, values finite. A request they refuse
goes to admission, which names the fault; nothing of it is stored or counted first.
"""
import numpy as np

from .hashing import PLACEMENT_SALT, first_misplaced, key_range, mix64
from .jit import njit
from .table import home_of, probe_and_read

CHUNK = 512   # keys per pass of `checked_homes`: their ranges stay in the core's cache


@njit(cache=True, nogil=True)
def checked_homes(src, bounds, allowed, counts, cap, keys, slots):
    """Copy the keys `src` into `keys` and their home rows (table of capacity `cap`) into
    `slots` (if not empty), checking that they are strictly increasing and that
    allowed[range of each] is set; each key's range is counted in `counts` (if not empty).
    Returns -1, or the index of the first key that fails (then nothing is counted)."""
    n = src.shape[0]
    homes = slots.shape[0] > 0
    n_ranges = bounds.shape[0]
    ranges = np.empty(min(n, CHUNK), np.int64)
    seen = np.zeros(n_ranges, np.int64)   # keys per range
    # Chunk by chunk: a pass without a branch, which vectorizes (hashes, ranges, home rows),
    # whether the keys are in order, then the keys counted by range. The ranges are checked
    # once, from the counts, and the first key that fails is looked for only if one did: a
    # loop that stopped at the first fault took 2.5 times as long. (Slices, not offset
    # indices: an index numba cannot prove non-negative keeps the loop from vectorizing.)
    unordered = False
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        these, copies = src[lo:hi], keys[lo:hi]
        if homes:
            rows = slots[lo:hi]
            for j in range(hi - lo):
                k = these[j]
                copies[j] = k
                h = mix64(k ^ PLACEMENT_SALT)   # one hash: the range's and the home row's
                ranges[j] = key_range(h, bounds)
                rows[j] = home_of(h, cap)
        else:
            for j in range(hi - lo):
                k = these[j]
                copies[j] = k
                ranges[j] = key_range(mix64(k ^ PLACEMENT_SALT), bounds)
        if lo > 0:
            unordered |= these[0] <= src[lo - 1]
        before, after = these[:-1], these[1:]
        for j in range(hi - lo - 1):
            unordered |= after[j] <= before[j]
        if unordered:
            return _first_failing(src, bounds, allowed)
        for j in range(hi - lo):
            seen[ranges[j]] += 1
    for r in range(n_ranges):
        if seen[r] and not allowed[r]:
            return _first_failing(src, bounds, allowed)
    if counts.shape[0] > 0:
        for r in range(n_ranges):
            counts[r] += seen[r]
    return -1


@njit(cache=True, nogil=True)
def _first_failing(src, bounds, allowed):
    """The index of the first key of `src` that breaks `checked_homes`' rules, or -1."""
    return first_misplaced(src, bounds, PLACEMENT_SALT, allowed, np.empty(0, np.int64))[0]


@njit(cache=True, nogil=True)
def pull_rows(buf, start, bounds, allowed, counts, rows, meta, insert, limit, keys, slots,
              out, fresh):
    """A pull's len(keys) keys (uint64 at buf[start:]) checked (see `checked_homes`), copied
    into `keys` and looked up in the table (`table.find_and_read`: rows into `slots`,
    weights into `out`). Returns how many keys were looked up (fewer than all: the table is
    full; grow it and look up the rest), or -1 - i if key i failed the checks (nothing looked
    up)."""
    n = keys.shape[0]
    src = buf[start:start + 8 * n].view(np.uint64)
    bad = checked_homes(src, bounds, allowed, counts, rows.shape[0] - 1, keys, slots)
    if bad >= 0:
        return -1 - bad
    return probe_and_read(rows, meta, keys, insert, limit, slots, out, fresh)


@njit(cache=True, nogil=True)
def pull_keys(buf, start, bounds, allowed, counts, keys):
    """`pull_rows`' checks of a pull's keys, copied into `keys`, without a lookup (a pull the
    clocks hold): -1, or the index of the first key that fails."""
    src = buf[start:start + 8 * keys.shape[0]].view(np.uint64)
    return checked_homes(src, bounds, allowed, counts, 0, keys, np.empty(0, np.int64))


@njit(cache=True, nogil=True)
def first_not_finite(values):
    """The flat index of the first value that is not finite, or -1."""
    flat = values.reshape(-1)
    # First whether any is, in a pass without a branch (it vectorizes: a fifth of the time of
    # a loop that stops at the first), then where.
    bad = False
    for i in range(flat.shape[0]):
        x = flat[i]
        bad |= x - x != 0   # NaN for infinities and NaN, 0 for the others
    if not bad:
        return -1
    for i in range(flat.shape[0]):
        if not np.isfinite(flat[i]):
            return i
    return -1


# The header's and the report's layouts (wire.protocol's, which this module may not import):
# int64 words of the header after its first two int32 (op, flags) ...
_OP_FLAGS, _TS, _CLOCK, _NKEYS, _WIDTH_PLACEMENT = 0, 1, 2, 3, 4
HEADER_WORDS, REPORT_WORDS = 6, 8
PUSH, CLOCK, SAME_KEYS, REPORT = 2, 1, 4, 16
SHORT_PUSH = CLOCK | SAME_KEYS | REPORT   # the flags of a push the short way takes
MAX_SHARES_TAKEN = 1 << 16                # (server.admission's)


@njit(cache=True, nogil=True)
def _words(buf, at, count):
    """`count` little-endian int64 words from buf[at:], at any alignment."""
    out = np.empty(count, np.int64)
    out.view(np.uint8)[:] = buf[at:at + 8 * count]
    return out


@njit(cache=True, nogil=True)
def _report_ok(words):
    """admission.report_ok of a Report's words (epoch, offset, examples, loss, progress,
    segment, taken, taken_epoch)."""
    floats = words.view(np.float64)
    loss, progress = floats[3], floats[4]
    return (0.0 <= loss < np.inf and 0.0 <= progress < np.inf and words[0] >= 0
            and words[1] >= -1 and words[2] >= 0 and words[5] >= 0
            and 0 <= words[6] <= MAX_SHARES_TAKEN and words[7] >= 0)


@njit(cache=True, nogil=True)
def short_push(buf, at, width, version, values):
    """A PUSH request at buf[at:] (the whole of the rest of `buf`) checked as the short way
    takes it, and its values copied into `values` (float32[nkeys, width] of its header):
    op PUSH, no flag but CLOCK, SAME_KEYS and REPORT, split by placement `version`, figures
    not negative, the table's `width`, the payload exactly as long as the header makes it,
    every value finite and the report's figures as admission.report_ok wants them. Returns
    the offset of its keys (uint64, which the caller checks against the placement) if it
    carries any, else 0; -1 if it is not one to take (`values` is then left undefined)."""
    size = buf.shape[0] - at
    if size < 8 * HEADER_WORDS:
        return -1
    h = _words(buf, at, HEADER_WORDS)
    op, flags = h[_OP_FLAGS] & 0xFFFFFFFF, h[_OP_FLAGS] >> 32
    n = h[_NKEYS]
    if (op != PUSH or flags & ~SHORT_PUSH or (h[_WIDTH_PLACEMENT] >> 32) != version
            or (h[_WIDTH_PLACEMENT] & 0xFFFFFFFF) != width or h[_TS] < 0 or h[_CLOCK] < 0
            or n != values.shape[0] or width != values.shape[1]):
        return -1
    start = 8 * HEADER_WORDS if flags & SAME_KEYS else 8 * (HEADER_WORDS + n)
    end = start + 4 * n * width
    if size != (end + 8 * REPORT_WORDS if flags & REPORT else end):
        return -1
    flat = values.reshape(-1)
    src = buf[at + start:at + end].view(np.float32)
    bad = False
    for i in range(flat.shape[0]):   # copied and checked in one pass without a branch
        x = src[i]
        flat[i] = x
        bad |= x - x != 0             # NaN for infinities and NaN, 0 for the others
    if bad or (flags & REPORT and not _report_ok(_words(buf, at + end, REPORT_WORDS))):
        return -1
    return 0 if flags & SAME_KEYS else at + 8 * HEADER_WORDS
