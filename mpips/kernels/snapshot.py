"""A table's rows copied as they were at a moment while the table goes on changing: the
copy made a span at a time, and a row about to change copied first. Pure numba.

`copied[r]` is set for a row copied out of its turn (before a write, or marked empty as it
was); rows below the copy's mark `at` are all copied. See server.table_snapshot.
"""
import numpy as np
from numba import njit

_ONES = np.uint32(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def copy_span(src, dst, copied, start, stop):
    """Rows [start, stop) of `src` into `dst`, but those already copied."""
    for r in range(start, stop):
        if not copied[r]:
            dst[r] = src[r]


@njit(cache=True, nogil=True)
def copy_before_write(src, dst, copied, at, rows):
    """Rows `rows` of `src` (-1: none) that are about to change, into `dst` if not yet
    copied."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if r >= at and not copied[r]:
            dst[r] = src[r]
            copied[r] = 1


@njit(cache=True, nogil=True)
def mark_empty(dst, copied, at, rows, fresh):
    """Rows rows[i] with fresh[i] set were empty until now (a key was just stored there):
    empty in `dst` (key words all ones), if not yet copied."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if fresh[i] and r >= at and not copied[r]:
            dst[r, 0] = _ONES
            dst[r, 1] = _ONES
            copied[r] = 1
