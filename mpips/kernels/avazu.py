"""Avazu click-through CSV parsing into CSR. Pure numba over a uint8 buffer.

A line: id, click (0 or 1), hour (YYMMDDHH), then 21 categorical columns (C1, banner_pos,
site_id, ..., C21), comma separated; the header line (it starts with "id,") is passed over.
The id is ignored; the hour becomes two features, its hour of day and its weekday; every
other non-empty value is hashed with its column. A key is its field (hour of day 0, weekday
1, column c from the fourth on c - 1) in the top byte and a 56-bit hash of (field, value)
(hashing.field_key). Each feature has value 1.
"""
import numpy as np

from .hashing import field_key, mix64
from .jit import njit
from .shapes import AVAZU_COLUMNS as COLUMNS

OK, BAD_LABEL, BAD_HOUR, FIELD_COUNT = range(4)
ERROR_TEXT = {
    BAD_LABEL: "click must be 0 or 1",
    BAD_HOUR: "hour must be YYMMDDHH",
    FIELD_COUNT: f"expected {COLUMNS} comma-separated columns",
}
_BLANK = -1
_COMMA = 44
_SALT = np.uint64(0xA7A20000)
_HOUR_OF_DAY, _WEEKDAY = 0, 1   # the fields of the hour's two features


@njit(cache=True, nogil=True, inline="always")
def feature_key(field, value):
    return field_key(field, mix64(mix64(np.uint64(field) ^ _SALT) ^ np.uint64(value)))


@njit(cache=True, nogil=True)
def weekday(yy, mm, dd):
    """0 = Monday, for the date 20yy-mm-dd (days from the civil calendar)."""
    y = 2000 + yy - (1 if mm <= 2 else 0)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (mm + (-3 if mm > 2 else 9)) + 2) // 5 + dd - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468   # since 1970-01-01, a Thursday
    return (days + 3) % 7


@njit(cache=True, nogil=True)
def _bytes_hash(buf, a, b):
    h = np.uint64(0x243F6A8885A308D3) ^ np.uint64(b - a)
    for i in range(a, b):
        h = mix64(h ^ np.uint64(buf[i]))
    return h


@njit(cache=True, nogil=True)
def parse_line(buf, pos, end, labels, indices, values, row, nnz):
    """(code, column of the error, features written) for the line buf[pos:end]."""
    if end == pos or (end - pos >= 3 and buf[pos] == 105 and buf[pos + 1] == 100
                      and buf[pos + 2] == _COMMA):
        return _BLANK, 0, 0   # blank, or the header ("id,...")
    i = pos
    while i < end and buf[i] != _COMMA:   # the id
        i += 1
    if i + 2 >= end or buf[i + 2] != _COMMA or not (buf[i + 1] == 48 or buf[i + 1] == 49):
        return (FIELD_COUNT if i >= end else BAD_LABEL), i + 1 - pos, 0
    labels[row] = np.float32(buf[i + 1] - 48)
    i += 3
    start = i
    digits = np.zeros(8, np.int64)
    n = 0
    while i < end and buf[i] != _COMMA:
        if n >= 8 or not 48 <= buf[i] <= 57:
            return BAD_HOUR, start - pos, 0
        digits[n] = buf[i] - 48
        n += 1
        i += 1
    yy, mm = digits[0] * 10 + digits[1], digits[2] * 10 + digits[3]
    dd, hh = digits[4] * 10 + digits[5], digits[6] * 10 + digits[7]
    if n != 8 or not (1 <= mm <= 12 and 1 <= dd <= 31 and hh <= 23):
        return BAD_HOUR, start - pos, 0
    indices[nnz] = feature_key(_HOUR_OF_DAY, hh)
    indices[nnz + 1] = feature_key(_WEEKDAY, weekday(yy, mm, dd))
    values[nnz] = 1.0
    values[nnz + 1] = 1.0
    k = 2
    for column in range(3, COLUMNS):
        if i >= end:
            return FIELD_COUNT, i - pos, 0
        i += 1   # the comma
        a = i
        while i < end and buf[i] != _COMMA:
            i += 1
        if i > a:
            indices[nnz + k] = feature_key(column - 1, _bytes_hash(buf, a, i))
            values[nnz + k] = 1.0
            k += 1
    if i != end:
        return FIELD_COUNT, i - pos, 0
    return OK, 0, k
