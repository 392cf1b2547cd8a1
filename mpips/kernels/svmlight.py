"""svmlight/libsvm text parsing into CSR. Pure numba over a uint8 buffer.

Line grammar: `label idx:val idx:val ... [# comment]`, label in {-1, 0, +1, 1}
(also written as floats, e.g. 1.0), idx a decimal uint64 (0 to 2^64-1), val a
decimal float. `qid:N` tokens are ignored; blank and comment-only lines are skipped.
libffm lines are the same with `field:idx:val` features, field 0 to 254 and idx below 2^56:
the key is hashing.field_key(field, idx).
"""
import numpy as np

from .avazu import parse_line as avazu_line
from .criteo import parse_line as criteo_line
from .hashing import field_key
from .jit import njit
from .shapes import AVAZU_FEATURES, CRITEO_FIELDS, LOW_BITS, MAX_FIELDS
from .text import ZEROS, eight_digits, ends_line, first_set_byte, leading_digits, load8, non_digits

# Error codes returned by parse_lines; ERROR_TEXT gives the message.
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
_FAST_OK, _SLOW = -1, -2   # more statuses of _index_digits

_NL, _CR, _SP, _TAB, _COLON, _HASH = 10, 13, 32, 9, 58, 35
_PLUS, _MINUS, _DOT, _ZERO = 43, 45, 46, 48
_U1, _U5, _U9, _U10, _U48 = (np.uint64(v) for v in (1, 5, 9, 10, 48))
_POW10U = np.array([10**i for i in range(9)], np.uint64)
_UMAX_DIV10 = np.uint64(1844674407370955161)  # (2^64 - 1) // 10; last digit of 2^64-1 is 5
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_POW10 = np.array([10.0**i for i in range(23)])  # exactly representable in float64


@njit(cache=True, nogil=True, inline="always")
def _is_space(c):
    return c == _SP or c == _TAB


@njit(cache=True, nogil=True, inline="always")
def _token_ends(buf, i, n):
    """Whether a token ends at byte i: a space, a tab or the line's end."""
    return i >= n or _is_space(buf[i]) or ends_line(buf, i, n)


@njit(cache=True, nogil=True)
def _parse_float(buf, i, n):
    """Decimal float at buf[i:n]: (value, index after it, ok). The token must end there."""
    neg = False
    if i < n and (buf[i] == _PLUS or buf[i] == _MINUS):
        neg = buf[i] == _MINUS
        i += 1
    mant = np.uint64(0)
    exp10 = 0
    digits = 0
    while i < n and 48 <= buf[i] <= 57:
        if mant < _UMAX_DIV10:
            mant = mant * _U10 + np.uint64(buf[i] - _ZERO)
        else:
            exp10 += 1
        digits += 1
        i += 1
    if i < n and buf[i] == _DOT:
        i += 1
        while i < n and 48 <= buf[i] <= 57:
            if mant < _UMAX_DIV10:
                mant = mant * _U10 + np.uint64(buf[i] - _ZERO)
                exp10 -= 1
            digits += 1
            i += 1
    if digits == 0:
        return 0.0, i, False
    if i < n and (buf[i] == 101 or buf[i] == 69):  # e or E
        i += 1
        eneg = False
        if i < n and (buf[i] == _PLUS or buf[i] == _MINUS):
            eneg = buf[i] == _MINUS
            i += 1
        e = 0
        edigits = 0
        while i < n and 48 <= buf[i] <= 57:
            if e < 100000:
                e = e * 10 + (buf[i] - _ZERO)
            edigits += 1
            i += 1
        if edigits == 0:
            return 0.0, i, False
        exp10 += -e if eneg else e
    if not _token_ends(buf, i, n):
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


@njit(cache=True, nogil=True, inline="always")
def _index_digits(x0, x1, x2):
    """The decimal uint64 that starts 24 bytes of text (three words, each ^ ZEROS):
    (value, digits, status): _FAST_OK, INDEX_OVERFLOW, or _SLOW past 20 digits (leading
    zeros, or an overflow: for _parse_index)."""
    r = first_set_byte(non_digits(x0))
    if r < 8:
        return leading_digits(x0, r), r, _FAST_OK
    r = first_set_byte(non_digits(x1))
    if r < 8:
        return eight_digits(x0) * _POW10U[r] + leading_digits(x1, r), 8 + r, _FAST_OK
    r = first_set_byte(non_digits(x2))
    if r > 4:
        return np.uint64(0), 16 + r, _SLOW
    # 16 to 20 digits without a branch on which: the count is a coin toss for hashed keys
    head = min(r, 3)
    idx = ((eight_digits(x0) * _POW10U[8] + eight_digits(x1)) * _POW10U[head]
           + leading_digits(x2, head))
    last = np.uint64(r == 4)
    d = (x2 >> np.uint64(24)) & np.uint64(255) & (np.uint64(0) - last)
    if (r == 4) & ((idx > _UMAX_DIV10) | ((idx == _UMAX_DIV10) & (d > _U5))):
        return idx, 20, INDEX_OVERFLOW
    return idx * (_U1 + _U9 * last) + d, 16 + r, _FAST_OK


@njit(cache=True, nogil=True)
def _parse_index(buf, i, n):
    """Decimal uint64 at buf[i:n], a digit at a time: (value, digits, status), status
    _FAST_OK or INDEX_OVERFLOW."""
    start = i
    idx = np.uint64(0)
    while i < n:
        d = np.uint64(buf[i]) - _U48
        if d >= _U10:
            break
        if idx > _UMAX_DIV10 or (idx == _UMAX_DIV10 and d > _U5):
            return idx, i - start, INDEX_OVERFLOW
        idx = idx * _U10 + d
        i += 1
    return idx, i - start, _FAST_OK


@njit(cache=True, nogil=True, inline="always")
def _is_gap(c):
    """Whether byte c ends a token in the common case: a space, a tab or a newline."""
    return c == _SP or c == _TAB or c == _NL


@njit(cache=True, nogil=True)
def _parse_line(buf, pos, n, labels, indices, values, row, nnz, ffm):
    """Parse the line of buf[:n] that starts at `pos` into row `row` starting at entry
    `nnz`; with `ffm`, features are field:idx:val (libffm).

    Returns (code, byte offset in line of the problem, number of entries written, where it
    stopped: the line's end if OK or blank, else the problem). A feature `idx:1` calls no
    function that takes `buf`: numba counts references at each such call.
    """
    i = pos
    while i < n and _is_space(buf[i]):
        i += 1
    if ends_line(buf, i, n) or buf[i] == _HASH:
        return _BLANK, 0, 0, i
    start = i
    c = buf[i]
    if (c == 48 or c == 49) and i + 1 < n and _is_gap(buf[i + 1]):
        labels[row] = np.float32(c - 48)
        i += 1
    else:
        y, i, ok = _parse_float(buf, i, n)
        if not ok:
            return BAD_LABEL, start - pos, 0, i
        if y == 1.0:
            labels[row] = 1.0
        elif y == 0.0 or y == -1.0:
            labels[row] = 0.0
        else:
            return LABEL_NOT_BINARY, start - pos, 0, i
    k = 0
    while True:
        while i < n and _is_space(buf[i]):
            i += 1
        if i == n:
            return OK, 0, k, i
        c = buf[i]
        if c == _NL or c == _HASH or (c == _CR and ends_line(buf, i, n)):
            return OK, 0, k, i
        tok = i
        # qid:N is a ranking annotation, not a feature.
        if (c == 113 and i + 4 < n and buf[i + 1] == 105 and buf[i + 2] == 100
                and buf[i + 3] == _COLON and not ends_line(buf, i + 4, n)):
            i += 4
            while not _token_ends(buf, i, n):
                i += 1
            continue
        field = 0
        if ffm:
            n_digits = 0
            while i < n and 48 <= buf[i] <= 57 and n_digits < 4:
                field = field * 10 + (buf[i] - _ZERO)
                n_digits += 1
                i += 1
            if n_digits == 0 or field >= MAX_FIELDS or i == n or buf[i] != _COLON:
                if n_digits > 0 and field < MAX_FIELDS and _token_ends(buf, i, n):
                    return MISSING_COLON, tok - pos, 0, i
                return BAD_FIELD, tok - pos, 0, i
            i += 1
        status = _SLOW
        if i + 24 <= n:
            idx, n_digits, status = _index_digits(load8(buf, i) ^ ZEROS, load8(buf, i + 8) ^ ZEROS,
                                                  load8(buf, i + 16) ^ ZEROS)
        if status == _SLOW:
            idx, n_digits, status = _parse_index(buf, i, n)
        i += n_digits
        if status == INDEX_OVERFLOW:
            return INDEX_OVERFLOW, tok - pos, 0, i
        if n_digits == 0:
            return BAD_INDEX, tok - pos, 0, i
        if i == n or buf[i] != _COLON:
            if not _token_ends(buf, i, n):
                return BAD_INDEX, tok - pos, 0, i
            return MISSING_COLON, tok - pos, 0, i
        i += 1
        if i + 1 < n and buf[i] == 49 and _is_gap(buf[i + 1]):   # the usual value 1
            v = 1.0
            i += 1
        else:
            v, i, ok = _parse_float(buf, i, n)
            if not ok:
                return BAD_VALUE, tok - pos, 0, i
        if ffm:
            if idx > LOW_BITS:
                return FFM_INDEX_OVERFLOW, tok - pos, 0, i
            idx = field_key(field, idx)
        indices[nnz + k] = idx
        values[nnz + k] = v
        k += 1


SVMLIGHT, CRITEO, AVAZU, LIBFFM = 0, 1, 2, 3   # the line formats parse_lines knows
# The fewest bytes of a line that becomes a row, with its newline (only the last line may
# lack it): svmlight's label; Criteo's label and 39 tabs; Avazu's click, hour and 23 commas.
_ROW_BYTES = {SVMLIGHT: 2, LIBFFM: 2, CRITEO: 41, AVAZU: 33}
_LINE_FEATURES = {CRITEO: CRITEO_FIELDS, AVAZU: AVAZU_FEATURES}


def capacity(n, fmt):
    """(rows, entries): room for parse_lines on any n bytes of format `fmt`, from the grammar
    alone, without a pass over them: a feature of svmlight takes at least 4 bytes (" 1:1"),
    the fixed-field formats write one entry per field of each line."""
    rows = (n + 1) // _ROW_BYTES[fmt] + 1   # + 1: the label of a line that turns out bad
    return rows, rows * _LINE_FEATURES[fmt] if fmt in _LINE_FEATURES else n // 4 + 1


@njit(cache=True, nogil=True)
def parse_lines(buf, final, skip_bad, labels, indptr, indices, values, starts, fmt):
    """Parse the complete lines of `buf` in format `fmt` (SVMLIGHT or LIBFFM, or CRITEO or
    AVAZU: see kernels.criteo and kernels.avazu) into preallocated CSR arrays, and the byte
    offset in `buf` where each row's line starts into `starts`.

    Capacity: `capacity` gives enough; so do one row per newline, + 1, in labels, starts and
    indptr[1:], and in indices and values one entry per feature the format allows
    (svmlight: one per ':' byte). Only complete lines are parsed unless `final`, in which
    case a last line without newline counts too. One pass: a line is parsed as it is
    found, and dropped if its newline is not in `buf`.

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
        if fmt == CRITEO:
            code, col, k, i = criteo_line(buf, pos, n, labels, indices, values, row, nnz)
        elif fmt == AVAZU:
            i = pos
            while i < n and buf[i] != _NL:
                i += 1
            end = i - 1 if i > pos and buf[i - 1] == _CR else i
            code, col, k = avazu_line(buf, pos, end, labels, indices, values, row, nnz)
        else:
            code, col, k, i = _parse_line(buf, pos, n, labels, indices, values, row, nnz,
                                          fmt == LIBFFM)
        while i < n and buf[i] != _NL:   # from the line's end or its problem
            i += 1
        if i == n and not final:
            break
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
        pos = min(i + 1, n)
    return row, nnz, pos, line, n_bad, bad_line, bad_code, bad_col
