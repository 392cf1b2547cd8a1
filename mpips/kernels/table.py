"""Open-addressing hash table with the key and its state in one row. Pure numba.

A table is `rows: uint32[cap + 1, 2 + C]`: words 0 and 1 hold the key (low,
high), words 2.. hold C float32 of state (weights first), reached through a
float32 view of the same memory. One lookup touches one row: one cache miss for
the key and the state together. Any capacity works (the home slot is a
multiply-shift of the hash, not a mask), so the table can stay 72-90% full.
Linear probing: inserting never moves a stored key, so slots stay valid until
the table is rebuilt larger.

EMPTY (both key words all ones) marks a free row; the key that equals EMPTY
itself lives in the extra row `cap`. `meta[0]` counts stored keys, `meta[1]` is 1
when the EMPTY-valued key is stored.
"""
import numpy as np

from .hashing import PLACEMENT_SALT, mix64
from .jit import njit
from .prefetch import AHEAD, prefetch

EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
KEY_WORDS = 2
_ONES = np.uint32(0xFFFFFFFF)
_LOW = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


@njit(cache=True, nogil=True, inline="always")
def home_of(h, cap):
    """The row a key whose hash is h starts its probe at: the hash's low bits (its top bits
    are the key's range, which all keys of a server share; see hashing.PLACEMENT_SALT)."""
    if cap <= 0xFFFFFFFF:
        return np.int64(((h & _LOW) * np.uint64(cap)) >> _S32)
    return np.int64(h % np.uint64(cap))


@njit(cache=True, nogil=True, inline="always")
def home(key, cap):
    """The row a key's probe starts at."""
    return home_of(mix64(key ^ PLACEMENT_SALT), cap)


@njit(cache=True, nogil=True)
def find_and_read(rows, meta, keys, insert, limit, slots, out, fresh):
    """Row of each key in `slots`, copying its first out.shape[1] state words (its weights)
    to out[i] while the row is in cache. A missing key is inserted (fresh[i] = 1: its row
    is zero), or gets row -1 and zeros if not `insert`. Stops before an insert would store
    more than `limit` keys, and returns how many keys it got through (the caller grows the
    table and starts again)."""
    cap = rows.shape[0] - 1
    # Home rows first, in a pass of their own: hashing then overlaps freely, and the
    # probing pass (probe_and_read) only loads (a quarter faster at 80% full).
    for i in range(keys.shape[0]):
        slots[i] = home(keys[i], cap)
    return probe_and_read(rows, meta, keys, insert, limit, slots, out, fresh)


@njit(cache=True, nogil=True)
def probe_and_read(rows, meta, keys, insert, limit, slots, out, fresh):
    """`find_and_read` once slots[i] holds key i's home row (see `home`)."""
    cap = rows.shape[0] - 1
    width = out.shape[1]
    state = rows.view(np.float32)
    n = keys.shape[0]
    for i in range(min(AHEAD, n)):
        prefetch(rows, slots[i])
    for i in range(n):
        if i + AHEAD < n:
            prefetch(rows, slots[i + AHEAD])
        k = keys[i]
        fresh[i] = 0
        if k == EMPTY:
            if meta[1] == 0:
                if not insert:
                    slots[i] = -1
                    out[i, :] = 0.0
                    continue
                if meta[0] >= limit:
                    return i
                meta[1] = 1
                meta[0] += 1
                fresh[i] = 1
            slots[i] = cap
            for c in range(width):
                out[i, c] = state[cap, KEY_WORDS + c]
            continue
        lo = np.uint32(k & _LOW)
        hi = np.uint32(k >> _S32)
        j = slots[i]
        while True:
            a = rows[j, 0]
            b = rows[j, 1]
            if a == lo and b == hi:
                slots[i] = j
                break
            if a == _ONES and b == _ONES:
                if not insert:
                    slots[i] = -1
                    break
                if meta[0] >= limit:
                    return i
                rows[j, 0] = lo
                rows[j, 1] = hi
                meta[0] += 1
                fresh[i] = 1
                slots[i] = j
                break
            j += 1
            if j == cap:
                j = 0
        if slots[i] < 0:
            out[i, :] = 0.0
        else:
            for c in range(width):
                out[i, c] = state[j, KEY_WORDS + c]
    return keys.shape[0]


@njit(cache=True, nogil=True)
def rehash(old_rows, new_rows):
    """Move every stored row into a larger, empty table (its key words all ones)."""
    old_cap = old_rows.shape[0] - 1
    cap = new_rows.shape[0] - 1
    for i in range(old_cap):
        if old_rows[i, 0] == _ONES and old_rows[i, 1] == _ONES:
            continue
        k = np.uint64(old_rows[i, 0]) | (np.uint64(old_rows[i, 1]) << _S32)
        j = home(k, cap)
        while not (new_rows[j, 0] == _ONES and new_rows[j, 1] == _ONES):
            j += 1
            if j == cap:
                j = 0
        new_rows[j, :] = old_rows[i, :]
    new_rows[cap, :] = old_rows[old_cap, :]


@njit(cache=True, nogil=True)
def stored(rows, meta):
    """(slots, keys) of every stored key, in row order (the EMPTY-valued key's row last)."""
    cap = rows.shape[0] - 1
    # One entry more than stored: each row is written at n, as in `gather` (no branch).
    slots = np.empty(meta[0] + 1, np.int64)
    keys = np.empty(meta[0] + 1, np.uint64)
    n = 0
    for i in range(cap):
        a = rows[i, 0]
        b = rows[i, 1]
        slots[n] = i
        keys[n] = np.uint64(a) | (np.uint64(b) << _S32)
        n += not (a == _ONES and b == _ONES)
    if meta[1] == 1:
        slots[n] = cap
        keys[n] = EMPTY
    return slots[:meta[0]], keys[:meta[0]]


@njit(cache=True, nogil=True)
def gather(rows, start, stop, keys, state):
    """The keys stored in rows [start, stop) (not the EMPTY-valued key's row) into `keys`,
    in row order, and if state has columns their rows' words after the key into `state`
    (rows' dtype, [stop - start, words - 2] at least): one pass, for writing a table a
    block at a time. Returns how many."""
    n = 0
    words = state.shape[1]
    # Every row is written at n, and n moves on past the stored ones only: no branch. A
    # table's empty rows (a tenth to a half of them) lie in no order, and a branch on each
    # was mispredicted so often that the loop took 4x as long (20M rows: 0.20 s, now 0.05).
    for i in range(start, stop):
        a = rows[i, 0]
        b = rows[i, 1]
        keys[n] = np.uint64(a) | (np.uint64(b) << _S32)
        for j in range(words):
            state[n, j] = rows[i, KEY_WORDS + j]
        n += not (a == _ONES and b == _ONES)
    return n


@njit(cache=True, nogil=True)
def remove(rows, meta, keys):
    """Delete `keys` (those stored) in place, each gap closed by moving back the rows after
    it that probing would otherwise no longer reach (linear probing's backward shift): no
    tombstones, and the rows left are as if the deleted keys had never been stored.
    Returns how many keys it deleted."""
    cap = rows.shape[0] - 1
    removed = 0
    for i in range(keys.shape[0]):
        k = keys[i]
        if k == EMPTY:
            if meta[1] == 1:
                meta[1] = 0
                meta[0] -= 1
                rows[cap, KEY_WORDS:] = 0
                removed += 1
            continue
        lo = np.uint32(k & _LOW)
        hi = np.uint32(k >> _S32)
        gap = home(k, cap)
        while True:
            if rows[gap, 0] == lo and rows[gap, 1] == hi:
                break
            if rows[gap, 0] == _ONES and rows[gap, 1] == _ONES:
                gap = -1
                break
            gap += 1
            if gap == cap:
                gap = 0
        if gap < 0:
            continue
        j = gap
        while True:
            j += 1
            if j == cap:
                j = 0
            if rows[j, 0] == _ONES and rows[j, 1] == _ONES:
                break
            at = home(np.uint64(rows[j, 0]) | (np.uint64(rows[j, 1]) << _S32), cap)
            # Row j may fill the gap if its home is not cyclically in (gap, j].
            if (gap < j and (at <= gap or at > j)) or (gap > j and at <= gap and at > j):
                rows[gap, :] = rows[j, :]
                gap = j
        rows[gap, 0] = _ONES
        rows[gap, 1] = _ONES
        rows[gap, KEY_WORDS:] = 0
        meta[0] -= 1
        removed += 1
    return removed
