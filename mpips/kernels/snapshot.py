"""A table's rows copied as they were at a moment while the table goes on changing: the
copy made a span at a time, and a row about to change logged first. Pure numba.

`copied[r]` is set for a row logged out of its turn (its old value, or empty, in the log);
rows below the copy's mark `at` are all copied or logged. The log is written into the copy
once every span is: the copy's pages are then first touched in order, a span at a time,
not at random by the rows a push changes (a fresh page's first touch zeroes it, and a
huge page's 2 MB at once).
"""
import numpy as np

from .jit import njit
from .prefetch import UPDATE_AHEAD, prefetch

_ONES = np.uint32(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def copy_span(src, dst, copied, start, stop):
    """Rows [start, stop) of `src` into `dst`, but those logged: each run of rows between
    two logged ones in one flat copy (a row at a time was 7x slower)."""
    flat_src, flat_dst, words = src.reshape(-1), dst.reshape(-1), src.shape[1]
    run = start
    for r in range(start, stop):
        if copied[r]:
            if r > run:
                flat_dst[run * words:r * words] = flat_src[run * words:r * words]
            run = r + 1
    if stop > run:
        flat_dst[run * words:stop * words] = flat_src[run * words:stop * words]


@njit(cache=True, nogil=True)
def log_before_write(src, copied, at, rows, log_rows, log_values, n):
    """Rows `rows` of `src` (-1: none) about to change, not yet copied or logged: appended
    to the log at n (room for len(rows) more). Returns the log's new length."""
    # A push's rows are anywhere in the table: each one's flag and row asked for ahead, as an
    # update asks for its rows (20,000 rows of a 20M-row table: 1.5-2.4 ms, 0.9-1.1 so).
    m = rows.shape[0]
    for i in range(m):
        if i + UPDATE_AHEAD < m and rows[i + UPDATE_AHEAD] >= at:
            prefetch(copied, rows[i + UPDATE_AHEAD])
            prefetch(src, rows[i + UPDATE_AHEAD])
        r = rows[i]
        if r >= at and not copied[r]:
            log_rows[n] = r
            log_values[n] = src[r]
            copied[r] = 1
            n += 1
    return n


@njit(cache=True, nogil=True)
def log_empty(copied, at, rows, fresh, log_rows, log_values, n):
    """Rows rows[i] with fresh[i] set were empty until now (a key was just stored there):
    logged as empty (key words all ones), if not yet copied or logged. Returns the log's
    new length."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if fresh[i] and r >= at and not copied[r]:
            log_rows[n] = r
            log_values[n, :] = 0
            log_values[n, 0] = _ONES
            log_values[n, 1] = _ONES
            copied[r] = 1
            n += 1
    return n


@njit(cache=True, nogil=True)
def apply_log(dst, log_rows, log_values, start, stop):
    """Entries [start, stop) of the log written into `dst`."""
    for i in range(start, stop):
        dst[log_rows[i]] = log_values[i]
