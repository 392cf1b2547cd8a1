"""svmlight/libsvm text parsing into CSR. Pure numba over a uint8 buffer.

Line grammar: `label idx:val idx:val ... [# comment]`, label in {-1, 0, +1, 1}
(also written as floats, e.g. 1.0), idx a decimal uint64 (0 to 2^64-1), val a
decimal float. `qid:N` tokens are ignored; blank and comment-only lines are skipped.
libffm lines are the same with `field:idx:val` features, field 0 to 254 and idx below 2^56:
the key is hashing.field_key(field, idx).
"""
import numpy as np
from numba import njit

from .avazu import parse_line as avazu_line
from .criteo import parse_line as criteo_line
from .hashing import LOW_BITS, MAX_FIELDS, field_key

# Error codes returned by parse_svmlight; ERROR_TEXT gives the message.
(OK, BAD_LABEL, LABEL_NOT_BINARY, BAD_INDEX, INDEX_OVERFLOW, MISSING_COLON, BAD_VALUE,
 BAD_FIELD, FFM_INDEX_OVERFLOW) = range(9)
ERROR_TEXT = {
    BAD_LABEL: "label is not a number",
    LABEL_NOT_BINARY: "label must be one of -1, 0, +1, 1",
    BAD_INDEX: "feature index is not a non-negative integer",
    INDEX_OVERFLOW: "feature index exceeds 2^64-1",
    MISSING_COLON: "expected idx:value",
    BAD_VALUE: "feature value is not a decimal number within float32 range",
}
LIBFFM_ERROR_TEXT = {
    **ERROR_TEXT,
    MISSING_COLON: "expected field:idx:value",
    BAD_FIELD: f"field is not an integer from 0 to {MAX_FIELDS - 1}",
    FFM_INDEX_OVERFLOW: "feature index exceeds 2^56-1 (a key keeps its field in its top byte)",
}
_BLANK = -1

_NL, _CR, _SP, _TAB, _COLON, _HASH = 10, 13, 32, 9, 58, 35
_PLUS, _MINUS, _DOT, _ZERO = 43, 45, 46, 48
_U10 = np.uint64(10)
_UMAX_DIV10 = np.uint64(1844674407370955161)  # (2^64 - 1) // 10; last digit of 2^64-1 is 5
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_POW10 = np.array([10.0**i for i in range(23)])  # exactly representable in float64


@njit(cache=True, nogil=True, inline="always")
def _is_space(c):
    return c == _SP or c == _TAB


@njit(cache=True, nogil=True)
def _parse_float(buf, i, end):
    """Decimal float at buf[i:]: (value, index after it, ok). Stops at space/tab or `end`."""
    neg = False
    if i < end and (buf[i] == _PLUS or buf[i] == _MINUS):
        neg = buf[i] == _MINUS
        i += 1
    mant = np.uint64(0)
    exp10 = 0
    digits = 0
    while i < end and 48 <= buf[i] <= 57:
        if mant < _UMAX_DIV10:
            mant = mant * _U10 + np.uint64(buf[i] - _ZERO)
        else:
            exp10 += 1
        digits += 1
        i += 1
    if i < end and buf[i] == _DOT:
        i += 1
        while i < end and 48 <= buf[i] <= 57:
            if mant < _UMAX_DIV10:
                mant = mant * _U10 + np.uint64(buf[i] - _ZERO)
                exp10 -= 1
            digits += 1
            i += 1
    if digits == 0:
        return 0.0, i, False
    if i < end and (buf[i] == 101 or buf[i] == 69):  # e or E
        i += 1
        eneg = False
        if i < end and (buf[i] == _PLUS or buf[i] == _MINUS):
            eneg = buf[i] == _MINUS
            i += 1
        e = 0
        edigits = 0
        while i < end and 48 <= buf[i] <= 57:
            if e < 100000:
                e = e * 10 + (buf[i] - _ZERO)
            edigits += 1
            i += 1
        if edigits == 0:
            return 0.0, i, False
        exp10 += -e if eneg else e
    if i < end and not _is_space(buf[i]):
        return 0.0, i, False
    v = np.float64(mant)
    if 0 <= exp10 <= 22:
        v = v * _POW10[exp10]
    elif -22 <= exp10 < 0:
        v = v / _POW10[-exp10]
    else:
        v = v * 10.0**exp10
    if not abs(v) <= _FLOAT32_MAX:   # also rejects inf and nan: values are stored as float32
        return 0.0, i, False
    return -v if neg else v, i, True


@njit(cache=True, nogil=True)
def _parse_line(buf, pos, end, labels, indices, values, row, nnz, ffm):
    """Parse one line (without its newline) into row `row` starting at entry `nnz`; with
    `ffm`, features are field:idx:val (libffm).

    Returns (code, byte offset in line of the problem, number of entries written).
    """
    i = pos
    while i < end and _is_space(buf[i]):
        i += 1
    if i == end or buf[i] == _HASH:
        return _BLANK, 0, 0
    start = i
    y, i, ok = _parse_float(buf, i, end)
    if not ok:
        return BAD_LABEL, start - pos, 0
    if y == 1.0:
        labels[row] = 1.0
    elif y == 0.0 or y == -1.0:
        labels[row] = 0.0
    else:
        return LABEL_NOT_BINARY, start - pos, 0
    k = 0
    while True:
        while i < end and _is_space(buf[i]):
            i += 1
        if i == end or buf[i] == _HASH:
            return OK, 0, k
        tok = i
        # qid:N is a ranking annotation, not a feature.
        if (end - i > 4 and buf[i] == 113 and buf[i + 1] == 105 and buf[i + 2] == 100
                and buf[i + 3] == _COLON):
            i += 4
            while i < end and not _is_space(buf[i]):
                i += 1
            continue
        field = 0
        if ffm:
            n_digits = 0
            while i < end and 48 <= buf[i] <= 57 and n_digits < 4:
                field = field * 10 + (buf[i] - _ZERO)
                n_digits += 1
                i += 1
            if n_digits == 0 or field >= MAX_FIELDS or i == end or buf[i] != _COLON:
                if n_digits > 0 and field < MAX_FIELDS and (i == end or _is_space(buf[i])):
                    return MISSING_COLON, tok - pos, 0
                return BAD_FIELD, tok - pos, 0
            i += 1
        idx = np.uint64(0)
        n_digits = 0
        while i < end and 48 <= buf[i] <= 57:
            d = np.uint64(buf[i] - _ZERO)
            if idx > _UMAX_DIV10 or (idx == _UMAX_DIV10 and d > np.uint64(5)):
                return INDEX_OVERFLOW, tok - pos, 0
            idx = idx * _U10 + d
            n_digits += 1
            i += 1
        if n_digits == 0:
            return BAD_INDEX, tok - pos, 0
        if i == end or buf[i] != _COLON:
            if i < end and not _is_space(buf[i]):
                return BAD_INDEX, tok - pos, 0
            return MISSING_COLON, tok - pos, 0
        i += 1
        v, i, ok = _parse_float(buf, i, end)
        if not ok:
            return BAD_VALUE, tok - pos, 0
        if ffm:
            if idx > LOW_BITS:
                return FFM_INDEX_OVERFLOW, tok - pos, 0
            idx = field_key(field, idx)
        indices[nnz + k] = idx
        values[nnz + k] = v
        k += 1


@njit(cache=True, nogil=True)
def count_byte(buf, byte):
    n = 0
    for i in range(buf.shape[0]):
        if buf[i] == byte:
            n += 1
    return n


SVMLIGHT, CRITEO, AVAZU, LIBFFM = 0, 1, 2, 3   # the line formats parse_lines knows


@njit(cache=True, nogil=True)
def parse_svmlight(buf, final, skip_bad, labels, indptr, indices, values, starts):
    """svmlight lines into CSR: parse_lines with one feature per ':' byte of capacity."""
    return parse_lines(buf, final, skip_bad, labels, indptr, indices, values, starts,
                       SVMLIGHT)


@njit(cache=True, nogil=True)
def parse_lines(buf, final, skip_bad, labels, indptr, indices, values, starts, fmt):
    """Parse the complete lines of `buf` in format `fmt` (SVMLIGHT or LIBFFM, or CRITEO or
    AVAZU: see kernels.criteo and kernels.avazu) into preallocated CSR arrays, and the byte offset in `buf` where each
    row's line starts into `starts`.

    Capacity: labels, starts and indptr[1:] need one entry per newline (+1 if `final`),
    indices and values one per feature the format allows (svmlight: one per ':' byte). Only
    complete lines are parsed unless `final`, in which case a last line without newline
    counts too.

    Returns (rows, nnz, bytes consumed, lines seen, bad lines skipped,
    first bad line's index among lines seen or -1, its error code, its byte offset in the line).
    With skip_bad False, parsing stops before the first bad line.
    """
    n = buf.shape[0]
    row = 0
    nnz = 0
    line = 0
    pos = 0
    n_bad = 0
    bad_line = -1
    bad_code = 0
    bad_col = 0
    indptr[0] = 0
    while pos < n:
        eol = pos
        while eol < n and buf[eol] != _NL:
            eol += 1
        if eol == n and not final:
            break
        end = eol
        if end > pos and buf[end - 1] == _CR:
            end -= 1
        if fmt == CRITEO:
            code, col, k = criteo_line(buf, pos, end, labels, indices, values, row, nnz)
        elif fmt == AVAZU:
            code, col, k = avazu_line(buf, pos, end, labels, indices, values, row, nnz)
        else:
            code, col, k = _parse_line(buf, pos, end, labels, indices, values, row, nnz,
                                       fmt == LIBFFM)
        if code == OK:
            starts[row] = pos
            nnz += k
            row += 1
            indptr[row] = nnz
        elif code != _BLANK:
            if bad_line < 0:
                bad_line = line
                bad_code = code
                bad_col = col
            if not skip_bad:
                return row, nnz, pos, line, n_bad, bad_line, bad_code, bad_col
            n_bad += 1
        line += 1
        pos = min(eol + 1, n)
    return row, nnz, pos, line, n_bad, bad_line, bad_code, bad_col
