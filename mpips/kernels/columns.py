"""Columns of a table into CSR rows: hashes of byte strings over Arrow's offsets and data
buffers, and each column's features placed in their rows. Pure numba over numpy arrays
(data.columns reads the Arrow columns into them)."""
import numpy as np

from .criteo import field_seed, seeded_key
from .hashing import mix64
from .jit import njit

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


# A row group's entries go straight to their places in its CSR arrays: `fill[r]` is where
# row r's next entry goes (from its row pointer on), and the columns are placed in field
# order, so that a row's entries keep the order of their fields.


@njit(cache=True, nogil=True)
def place_ids(fill, valid, field, ids, out_keys, out_values):
    """Row i's feature (criteo.feature_key(field, ids[i]), 1) if valid[i]."""
    seed = field_seed(field)
    for i in range(valid.shape[0]):
        if valid[i]:
            at = fill[i]
            out_keys[at] = seeded_key(field, seed, ids[i])
            out_values[at] = 1.0
            fill[i] = at + 1


@njit(cache=True, nogil=True)
def place_numbers(fill, valid, key, values, out_keys, out_values):
    """Row i's feature (key, values[i]) if valid[i]."""
    for i in range(valid.shape[0]):
        if valid[i]:
            at = fill[i]
            out_keys[at] = key
            out_values[at] = values[i]
            fill[i] = at + 1


@njit(cache=True, nogil=True)
def place_listed(fill, rows, keep, field, ids, values, out_keys, out_values):
    """Element i of a list column, in row rows[i], if keep[i]: (feature_key(field,
    ids[i]), values[i]), or value 1 if `values` is empty."""
    weighted = values.shape[0] > 0
    seed = field_seed(field)
    for i in range(rows.shape[0]):
        if keep[i]:
            r = rows[i]
            at = fill[r]
            out_keys[at] = seeded_key(field, seed, ids[i])
            out_values[at] = values[i] if weighted else np.float32(1.0)
            fill[r] = at + 1


@njit(cache=True, nogil=True)
def first_bad_label(labels, valid):
    """Index of the first label that is null (not `valid`) or not 0 or 1; -1 if none."""
    for i in range(labels.shape[0]):
        if not valid[i] or (labels[i] != 0.0 and labels[i] != 1.0):
            return i
    return -1
