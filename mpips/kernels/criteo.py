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
from numba import njit

from .hashing import field_key, mix64

INTEGER_FIELDS, CATEGORICAL_FIELDS = 13, 26
FIELDS = INTEGER_FIELDS + CATEGORICAL_FIELDS
OK, BAD_LABEL, BAD_INTEGER, BAD_HEX, FIELD_COUNT = range(5)
ERROR_TEXT = {
    BAD_LABEL: "label must be 0 or 1",
    BAD_INTEGER: "an integer field (2 to 14) is not an integer",
    BAD_HEX: "a categorical field (15 to 40) is not hexadecimal",
    FIELD_COUNT: f"expected {1 + FIELDS} tab-separated fields",
}
_BLANK = -1
_NL, _CR, _TAB, _MINUS = 10, 13, 9, 45
_FIELD_SALT = np.uint64(0xC12E0000)


@njit(cache=True, nogil=True, inline="always")
def feature_key(field, value):
    """The key of `value` (a bucket or a hexadecimal number) in `field`."""
    return field_key(field, mix64(mix64(np.uint64(field) ^ _FIELD_SALT) ^ np.uint64(value)))


@njit(cache=True, nogil=True, inline="always")
def bucket(v):
    """v up to 2 (negatives too), else floor(ln(v)^2): 3 -> 1... far fewer keys for counts."""
    if v <= 2:
        return v
    lg = math.log(v)
    return 3 + np.int64(lg * lg)


@njit(cache=True, nogil=True)
def parse_line(buf, pos, end, labels, indices, values, row, nnz):
    """(code, column of the error, features written) for the line buf[pos:end]; the
    svmlight module's parse_lines reads whole buffers of them (format CRITEO)."""
    if end == pos:
        return _BLANK, 0, 0
    c = buf[pos]
    if not (c == 48 or c == 49) or pos + 1 >= end or buf[pos + 1] != _TAB:
        if pos + 1 == end and (c == 48 or c == 49):
            return FIELD_COUNT, 1, 0
        return BAD_LABEL, 0, 0
    labels[row] = np.float32(c - 48)
    i = pos + 2
    k = 0
    for field in range(FIELDS):
        start = i
        if field < INTEGER_FIELDS:
            neg = False
            if i < end and buf[i] == _MINUS:
                neg = True
                i += 1
            v = np.int64(0)
            digits = 0
            while i < end and 48 <= buf[i] <= 57 and digits < 18:
                v = v * 10 + (buf[i] - 48)
                digits += 1
                i += 1
            if i < end and buf[i] != _TAB:
                return BAD_INTEGER, i - pos, 0
            if digits == 0 and neg:
                return BAD_INTEGER, start - pos, 0
            if digits > 0:
                indices[nnz + k] = feature_key(field, bucket(-v if neg else v))
                values[nnz + k] = 1.0
                k += 1
        else:
            h = np.uint64(0)
            digits = 0
            while i < end and buf[i] != _TAB:
                c = buf[i]
                if 48 <= c <= 57:
                    d = c - 48
                elif 97 <= c <= 102:
                    d = c - 87
                elif 65 <= c <= 70:
                    d = c - 55
                else:
                    return BAD_HEX, i - pos, 0
                h = (h << np.uint64(4)) | np.uint64(d)   # the last 16 digits count
                digits += 1
                i += 1
            if digits > 0:
                indices[nnz + k] = feature_key(field, h)
                values[nnz + k] = 1.0
                k += 1
        if field < FIELDS - 1:
            if i >= end:
                return FIELD_COUNT, i - pos, 0
            i += 1   # the tab
    if i != end:
        return FIELD_COUNT, i - pos, 0
    return OK, 0, k
