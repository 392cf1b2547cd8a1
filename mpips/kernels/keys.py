"""The sorted unique keys of a minibatch and each entry's position among them. Pure numba.

A hash pass finds the unique keys in a scratch table reused across minibatches
(a stamp marks this call's slots, so nothing is cleared between calls), sized to
the unique keys rather than the entries so that it stays in cache. An LSD radix
sort then orders just the unique keys: about 4x faster than a comparison sort for
the ~20k keys of a typical minibatch.
"""
import numpy as np
from numba import njit

from .hashing import mix64

_LOW32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_BITS = 11
_DIGIT = np.uint64((1 << _BITS) - 1)
_PASSES = (64 + _BITS - 1) // _BITS   # 6: an even number, so the result ends where it began


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
    for i in range(n):          # sorted keys are back in `keys`; reuse scratch as the rank map
        scratch_ids[ids[i]] = i
    for p in range(indices.shape[0]):
        cols[p] = scratch_ids[cols[p]]
    return n
