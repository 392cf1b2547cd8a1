"""Columns of a table into CSR rows: hashes of byte strings over Arrow's offsets and data
buffers, feature keys of ids, and the entries of every column gathered row by row. Pure
numba over numpy arrays (data.columns reads the Arrow columns into them)."""
import numpy as np
from numba import njit

from .criteo import feature_key
from .hashing import mix64

_SEED = np.uint64(0x5BD1E9955BD1E995)
_EIGHT = np.uint64(8)


@njit(cache=True, nogil=True)
def hash_bytes(offsets, data):
    """A 64-bit hash of each byte string data[offsets[i]:offsets[i + 1]]: its length, then
    eight bytes a mix (little-endian), then the rest, then how many those were."""
    n = offsets.shape[0] - 1
    out = np.empty(n, np.uint64)
    for i in range(n):
        a, b = offsets[i], offsets[i + 1]
        h = _SEED ^ np.uint64(b - a)
        while a + 8 <= b:
            w = np.uint64(0)
            for j in range(8):
                w |= np.uint64(data[a + j]) << (_EIGHT * np.uint64(j))
            h = mix64(h ^ w)
            a += 8
        w = np.uint64(0)
        for j in range(b - a):
            w |= np.uint64(data[a + j]) << (_EIGHT * np.uint64(j))
        out[i] = mix64(mix64(h ^ w) ^ np.uint64(b - a))
    return out


@njit(cache=True, nogil=True)
def keys_of(field, ids):
    """criteo.feature_key(field, id) of each id (uint64)."""
    out = np.empty(ids.shape[0], np.uint64)
    for i in range(ids.shape[0]):
        out[i] = feature_key(field, ids[i])
    return out


@njit(cache=True, nogil=True)
def by_row(n, rows, keys, values):
    """(indptr, keys, values) of CSR rows 0..n-1 from entries given column after column
    (`rows`: each entry's row): a stable counting sort, so that a row's entries keep the
    order of their columns."""
    indptr = np.zeros(n + 1, np.int64)
    for i in range(rows.shape[0]):
        indptr[rows[i] + 1] += 1
    for r in range(n):
        indptr[r + 1] += indptr[r]
    fill = indptr[:-1].copy()
    out_keys = np.empty(rows.shape[0], np.uint64)
    out_values = np.empty(rows.shape[0], np.float32)
    for i in range(rows.shape[0]):
        at = fill[rows[i]]
        out_keys[at] = keys[i]
        out_values[at] = values[i]
        fill[rows[i]] = at + 1
    return indptr, out_keys, out_values


@njit(cache=True, nogil=True)
def first_bad_label(labels, valid):
    """Index of the first label that is null (not `valid`) or not 0 or 1; -1 if none."""
    for i in range(labels.shape[0]):
        if not valid[i] or (labels[i] != 0.0 and labels[i] != 1.0):
            return i
    return -1
