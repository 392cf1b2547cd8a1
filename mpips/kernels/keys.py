"""The sorted unique keys of a minibatch and each entry's position among them. Pure numba.

Two ways, the first tried first:
- `sorted_entries`: the entries themselves are put in order (a bucket per top bits of
  their offset from the least key, about one bucket an entry, then one insertion pass)
  and one pass over them numbers the unique keys. For keys that spread (hashed keys, ids
  over a range) it is about twice as fast as the hash pass below, since each step is a
  sequential pass or one scattered write. It gives up (returns -1) when the insertion
  pass would move too much: keys that bunch into few buckets.
- `sorted_unique_inverse`: a hash pass finds the unique keys in a scratch table reused
  across minibatches (a stamp marks this call's slots, so nothing is cleared between
  calls), sized to the unique keys rather than the entries so that it stays in cache.
  Then just the unique keys are sorted: by buckets, as above, when they spread; otherwise
  (keys that bunch, like a field's in its top byte) by an LSD radix sort, about 4x faster
  than a comparison sort for the ~20k keys of a typical minibatch.
"""
import numpy as np

from .hashing import mix64
from .jit import njit

_LOW32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_BITS = 11
_DIGIT = np.uint64((1 << _BITS) - 1)
_PASSES = (64 + _BITS - 1) // _BITS   # 6: an even number, so the result ends where it began
_MOST_IN_BUCKET = 32


_MOST_BUCKET_BITS = 16
_MOVES_PER_ENTRY = 4     # the insertion pass's budget: beyond it the keys bunch


@njit(cache=True, nogil=True, inline="always")
def _offsets(values, n, bits):
    """(lo, shift): the least of values[:n], and the shift that puts each one's offset from
    it, (v - lo) >> shift, below 2^bits (its top bits: the keys' bucket)."""
    lo = values[0]
    hi = values[0]
    for i in range(1, n):
        lo = min(lo, values[i])
        hi = max(hi, values[i])
    width = 0
    span = hi - lo
    while width < 64 and (span >> np.uint64(width)) > 0:
        width += 1
    return lo, np.uint64(max(width - bits, 0))


@njit(cache=True, nogil=True)
def sorted_entries(indices, keys, cols, counts, entries):
    """Fill keys[:n] with the sorted unique values of `indices` and cols[p] with the position
    of indices[p] among them by sorting the entries; returns n, or -1 (keys and cols
    undefined) if the keys bunch so that the insertion pass would move more than
    _MOVES_PER_ENTRY places an entry.

    Scratch: counts int32[at least len(indices) + 1]; entries uint64[len(indices), 2], each
    row a key and where it came from (one cache line written per entry, not two).
    """
    m = indices.shape[0]
    if m == 0:
        return 0
    bits = 0
    while bits < _MOST_BUCKET_BITS and (2 << bits) <= m:
        bits += 1
    lo, shift = _offsets(indices, m, bits)
    buckets = 1 << bits
    counts[:buckets + 1] = 0
    for p in range(m):
        counts[((indices[p] - lo) >> shift) + 1] += 1
    for b in range(buckets):
        counts[b + 1] += counts[b]
    for p in range(m):
        k = indices[p]
        b = (k - lo) >> shift
        at = counts[b]
        entries[at, 0] = k
        entries[at, 1] = p
        counts[b] = at + 1
    # Buckets are in key order, so no entry moves past its bucket's start.
    budget = _MOVES_PER_ENTRY * m
    for i in range(1, m):
        k = entries[i, 0]
        if entries[i - 1, 0] <= k:
            continue
        p = entries[i, 1]
        j = i
        while j > 0 and entries[j - 1, 0] > k:
            entries[j, 0] = entries[j - 1, 0]
            entries[j, 1] = entries[j - 1, 1]
            j -= 1
        budget -= i - j
        if budget < 0:
            return -1
        entries[j, 0] = k
        entries[j, 1] = p
    n = 0
    keys[0] = entries[0, 0]
    for i in range(m):
        k = entries[i, 0]
        if k != keys[n]:
            n += 1
            keys[n] = k
        cols[entries[i, 1]] = n
    return n + 1


@njit(cache=True, nogil=True)
def sorted_unique_inverse(indices, table, stamp, keys, cols, ids, scratch_keys, scratch_ids):
    """Fill keys[:n] with the sorted unique values of `indices` and cols[p] with the position
    of indices[p] among them; returns n, or -1 if there are more unique values than 3/4 of the
    table's slots (the caller gives a larger table and calls again with a new stamp).

    Scratch: `table` uint64[size, 2] with size a power of two, no slot of which is stamped
    `stamp` (1 <= stamp < 2^32); ids, scratch_keys and scratch_ids of at least len(indices)
    entries. A slot is [key, stamp << 32 | first-seen id].
    """
    mask = np.uint64(table.shape[0] - 1)
    limit = table.shape[0] * 3 // 4
    ustamp = np.uint64(stamp)
    n = 0
    for p in range(indices.shape[0]):
        k = indices[p]
        j = mix64(k) & mask
        while True:
            tag = table[j, 1]
            if (tag >> _S32) != ustamp:
                if n == limit:
                    return -1
                table[j, 0] = k
                table[j, 1] = (ustamp << _S32) | np.uint64(n)
                keys[n] = k
                ids[n] = n
                cols[p] = n
                n += 1
                break
            if table[j, 0] == k:
                cols[p] = np.int64(tag & _LOW32)
                break
            j = (j + np.uint64(1)) & mask
    if not _bucket_sort(keys, ids, scratch_keys, scratch_ids, n):
        _radix_sort(keys, ids, scratch_keys, scratch_ids, n)
    for i in range(n):          # sorted keys are in `keys`; reuse scratch as the rank map
        scratch_ids[ids[i]] = i
    for p in range(indices.shape[0]):
        cols[p] = scratch_ids[cols[p]]
    return n


@njit(cache=True, nogil=True)
def _bucket_sort(keys, ids, scratch_keys, scratch_ids, n):
    """Sort keys[:n] (ids alongside) if the keys spread: bucket b holds the keys whose offset
    from the least key has b for its top bits (about n/4 buckets), and if none holds more than
    _MOST_IN_BUCKET, one counting pass and one scatter put the buckets in order, and an
    insertion pass orders each (no key moves past its bucket). Returns False, nothing moved,
    if a bucket holds more."""
    if n < 2:
        return True
    bits = 1
    while bits < 16 and (4 << bits) < n:
        bits += 1
    lo, shift = _offsets(keys, n, bits)
    counts = np.zeros((1 << bits) + 1, np.int64)
    for i in range(n):
        counts[((keys[i] - lo) >> shift) + 1] += 1
    for b in range(1 << bits):
        if counts[b + 1] > _MOST_IN_BUCKET:
            return False
        counts[b + 1] += counts[b]
    for i in range(n):
        b = (keys[i] - lo) >> shift
        scratch_keys[counts[b]] = keys[i]
        scratch_ids[counts[b]] = ids[i]
        counts[b] += 1
    for i in range(n):
        k = scratch_keys[i]
        d = scratch_ids[i]
        j = i
        while j > 0 and keys[j - 1] > k:
            keys[j] = keys[j - 1]
            ids[j] = ids[j - 1]
            j -= 1
        keys[j] = k
        ids[j] = d
    return True


@njit(cache=True, nogil=True)
def _radix_sort(keys, ids, scratch_keys, scratch_ids, n):
    """Sort keys[:n] (ids alongside) by LSD radix, 11 bits a pass; the result ends in keys."""
    counts = np.empty((1 << _BITS) + 1, np.int64)
    src_k, src_i, dst_k, dst_i = keys, ids, scratch_keys, scratch_ids
    for rnd in range(_PASSES):
        shift = np.uint64(rnd * _BITS)
        counts[:] = 0
        for i in range(n):
            counts[((src_k[i] >> shift) & _DIGIT) + 1] += 1
        for d in range(1 << _BITS):
            counts[d + 1] += counts[d]
        for i in range(n):
            d = (src_k[i] >> shift) & _DIGIT
            dst_k[counts[d]] = src_k[i]
            dst_i[counts[d]] = src_i[i]
            counts[d] += 1
        src_k, src_i, dst_k, dst_i = dst_k, dst_i, src_k, src_i
