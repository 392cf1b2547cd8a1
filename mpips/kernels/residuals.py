"""A worker's error feedback: what each key's pushes have not yet delivered (its residual),
and which rows of a push are sent now. Pure numba.

The residuals live in an open-addressing table: `keys` uint64[cap], `used` uint8[cap],
`values` float32[cap, width], cap a power of two, linear probing; `meta[0]` counts the keys.
A key is stored once its residual is not zero and stays (its residual may become zero).
`used` also says what a key's residual is: ROUNDING (its last push sent its row: what the
encoding rounded off, if anything) or HELD (its last push held its row back).
"""
import numpy as np

from .hashing import mix64
from .jit import njit

NEW = -1       # a key without a residual, with room for one
NO_ROOM = -2   # a key without a residual, and the table full: its row is sent whole
ROUNDING = 1   # `used`: a key whose last push sent its row
HELD = 2       # `used`: a key whose last push held its row back


@njit(cache=True, nogil=True)
def _find(keys, used, key):
    """The row of `key`, or -1 - the free row where it would go."""
    mask = np.uint64(keys.shape[0] - 1)
    j = mix64(key) & mask
    while used[j]:
        if keys[j] == key:
            return np.int64(j)
        j = (j + np.uint64(1)) & mask
    return -1 - np.int64(j)


@njit(cache=True, nogil=True)
def gather(keys, used, values, push_keys, grads, room, slots, out):
    """out[i] = grads[i] + the residual of push_keys[i]; slots[i]: its row, NEW, or NO_ROOM
    once `room` new keys have been counted."""
    width = grads.shape[1]
    for i in range(push_keys.shape[0]):
        s = _find(keys, used, push_keys[i])
        if s < 0:
            s = NEW if room > 0 else NO_ROOM
            room -= 1
        slots[i] = s
        for c in range(width):
            out[i, c] = grads[i, c] + (values[s, c] if s >= 0 else np.float32(0.0))


@njit(cache=True, nogil=True)
def keep(keys, used, values, meta, push_keys, slots, residuals, held):
    """Store each key's new residual (slots from `gather`, the table unchanged since); a NEW
    key only if its residual is not zero; held[i]: whether its row was held back (HELD), an
    empty `held` if none was. Returns the keys whose residual was not zero and found no room
    (NO_ROOM): lost."""
    width = residuals.shape[1]
    any_held = held.shape[0] == push_keys.shape[0]
    lost = 0
    for i in range(push_keys.shape[0]):
        s = slots[i]
        if s < 0:
            nonzero = False
            for c in range(width):
                nonzero = nonzero or residuals[i, c] != 0
            if not nonzero:
                continue
            if s == NO_ROOM:
                lost += 1
                continue
            s = -1 - _find(keys, used, push_keys[i])
            keys[s] = push_keys[i]
            meta[0] += 1
        used[s] = HELD if any_held and held[i] else ROUNDING
        for c in range(width):
            values[s, c] = residuals[i, c]
    return lost


@njit(cache=True, nogil=True)
def rehash(keys, used, values, new_keys, new_used, new_values):
    """Move every stored key and its residual into a larger, empty table."""
    for j in range(keys.shape[0]):
        if used[j]:
            s = -1 - _find(new_keys, new_used, keys[j])
            new_keys[s] = keys[j]
            new_used[s] = used[j]
            new_values[s, :] = values[j, :]


@njit(cache=True, nogil=True)
def select_rows(grads, weights, threshold, l1, slots, kept):
    """kept[i]: whether row i is sent now. It is when some |grads[i, c]| >= threshold, unless
    (l1 > 0, weights given: one row per grads row) every weights[i, c] is 0 and every
    |grads[i, c]| <= l1; and always when its residual could not be kept (NO_ROOM). Returns
    how many are."""
    n, width = grads.shape
    pulled = weights.shape[0] == n
    count = 0
    for i in range(n):
        send = slots[i] == NO_ROOM
        if not send:
            for c in range(width):
                if abs(grads[i, c]) >= threshold:
                    send = True
                    break
            if send and l1 > 0 and pulled:
                stays_zero = True
                for c in range(width):
                    if weights[i, c] != 0 or abs(grads[i, c]) > l1:
                        stays_zero = False
                        break
                send = not stays_zero
        kept[i] = send
        count += send
    return count
