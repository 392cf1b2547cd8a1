"""Criteo display-advertising TSV parsing into CSR. Pure numba over a uint8 buffer.

A line: label (0 or 1), 13 integer fields, 26 categorical fields of hexadecimal digits, tab
separated, any field but the label may be empty. Every non-empty field becomes one feature
of value 1 whose key is its field (0..38, in the top byte) and a 56-bit hash of (field,
value) (hashing.field_key); an integer v is first put in a
bucket: v itself up to 2, else floor(ln(v)^2) (negative values keep their own buckets), so
that counts spread over few keys.
"""
import math

import numpy as np

from .hashing import field_key, mix64
from .jit import njit
from .shapes import CRITEO_FIELDS as FIELDS
from .shapes import CRITEO_INTEGERS as INTEGER_FIELDS
from .text import (
    ZEROS,
    ends_line,
    first_set_byte,
    hex_digits,
    hex_value,
    leading_digits,
    load8,
    non_digits,
)

OK, BAD_LABEL, BAD_INTEGER, BAD_HEX, FIELD_COUNT = range(5)
ERROR_TEXT = {
    BAD_LABEL: "label must be 0 or 1",
    BAD_INTEGER: "an integer field (2 to 14) is not an integer",
    BAD_HEX: "a categorical field (15 to 40) is not hexadecimal",
    FIELD_COUNT: f"expected {1 + FIELDS} tab-separated fields",
}
_BLANK = -1
_TAB, _MINUS = 9, 45
_FIELD_SALT = np.uint64(0xC12E0000)
_FIELD_SEEDS = mix64.py_func(np.arange(FIELDS, dtype=np.uint64) ^ _FIELD_SALT)
_NOT_HEX = 255
_HEX = np.full(256, _NOT_HEX, np.uint8)   # a byte's hexadecimal digit value, or _NOT_HEX
_HEX[48:58] = range(10)
_HEX[97:103] = range(10, 16)
_HEX[65:71] = range(10, 16)


@njit(cache=True, nogil=True, inline="always")
def field_seed(field):
    """What feature_key mixes a value of `field` with: one per field, to compute once."""
    return mix64(np.uint64(field) ^ _FIELD_SALT)


@njit(cache=True, nogil=True, inline="always")
def seeded_key(field, seed, value):
    """feature_key(field, value), given field_seed(field)."""
    return field_key(field, mix64(seed ^ np.uint64(value)))


@njit(cache=True, nogil=True, inline="always")
def feature_key(field, value):
    """The key of `value` (a bucket or a hexadecimal number) in `field`."""
    return seeded_key(field, field_seed(field), value)


@njit(cache=True, nogil=True, inline="always")
def _key(field, value):
    """feature_key(field, value), its first mix of the field looked up."""
    return field_key(field, mix64(_FIELD_SEEDS[field] ^ np.uint64(value)))


def _small_buckets(size):
    """bucket(v) for v below `size`: Python's math.log is the libm log numba calls."""
    return np.array([v if v <= 2 else 3 + int(math.log(v) * math.log(v)) for v in range(size)],
                    np.int16)


_BUCKETS = _small_buckets(4096)   # most counts: a lookup, not a log


@njit(cache=True, nogil=True, inline="always")
def log_bucket(v):
    """floor(ln(v)^2) + 3 for v >= 3."""
    lg = math.log(v)
    return 3 + np.int64(lg * lg)


@njit(cache=True, nogil=True, inline="always")
def bucket(v):
    """v up to 2 (negatives too), else floor(ln(v)^2): 3 -> 1... far fewer keys for counts."""
    if 0 <= v < _BUCKETS.shape[0]:
        return np.int64(_BUCKETS[v])
    if v <= 2:
        return v
    return log_bucket(v)


@njit(cache=True, nogil=True)
def _parse_count(buf, i, n):
    """(value, digits) of the decimal digits at buf[i:n], 18 at most."""
    v = np.int64(0)
    digits = 0
    while i < n and 48 <= buf[i] <= 57 and digits < 18:
        v = v * 10 + (buf[i] - 48)
        digits += 1
        i += 1
    return v, digits


@njit(cache=True, nogil=True)
def parse_line(buf, pos, n, labels, indices, values, row, nnz):
    """(code, column of the error, features written, where it stopped: the line's end, or
    the problem) for the line of buf[:n] that starts at `pos`; the svmlight module's
    parse_lines reads whole buffers of them (format CRITEO). Fields of up to 7 digits (8
    hexadecimal) take one word each and no call that passes `buf` (see kernels.text); an
    empty field's key is written too, and overwritten (no branch on a coin toss).
    Capacity: 39 entries a line."""
    if ends_line(buf, pos, n):
        return _BLANK, 0, 0, pos
    c = buf[pos]
    if not ((c == 48 or c == 49) and pos + 1 < n and buf[pos + 1] == _TAB):
        if (c == 48 or c == 49) and ends_line(buf, pos + 1, n):
            return FIELD_COUNT, 1, 0, pos + 1
        return BAD_LABEL, 0, 0, pos
    labels[row] = np.float32(c - 48)
    i = pos + 2
    k = 0
    for field in range(INTEGER_FIELDS):
        start = i
        neg = i < n and buf[i] == _MINUS
        if neg:
            i += 1
        digits = 8
        if i + 8 <= n:
            x = load8(buf, i) ^ ZEROS
            digits = first_set_byte(non_digits(x))
            v = np.int64(leading_digits(x, digits))
        if digits == 8:
            v, digits = _parse_count(buf, i, n)
        i += digits
        if i < n and buf[i] != _TAB and not ends_line(buf, i, n):
            return BAD_INTEGER, i - pos, 0, i
        if digits == 0 and neg:
            return BAD_INTEGER, start - pos, 0, i
        indices[nnz + k] = _key(field, bucket(-v if neg else v))   # kept if not empty
        values[nnz + k] = 1.0
        k += digits > 0
        if i >= n or buf[i] != _TAB:
            return FIELD_COUNT, i - pos, 0, i
        i += 1
    for field in range(INTEGER_FIELDS, FIELDS):
        h = np.uint64(0)
        digits = 0
        if i + 8 <= n:
            x = load8(buf, i)
            digits = hex_digits(x)
            h = hex_value(x, digits)
            i += digits
        # a digit at a time past 8 digits (the last 16 count) or near the buffer's end
        while i < n and _HEX[buf[i]] != _NOT_HEX:
            h = (h << np.uint64(4)) | np.uint64(_HEX[buf[i]])
            digits += 1
            i += 1
        if i < n and buf[i] != _TAB and not ends_line(buf, i, n):
            return BAD_HEX, i - pos, 0, i
        indices[nnz + k] = _key(field, h)
        values[nnz + k] = 1.0
        k += digits > 0
        if field < FIELDS - 1:
            if i >= n or buf[i] != _TAB:
                return FIELD_COUNT, i - pos, 0, i
            i += 1
    if not ends_line(buf, i, n):
        return FIELD_COUNT, i - pos, 0, i
    return OK, 0, k, i
