"""Open-addressing hash table over numpy arrays (linear probing). Pure numba.

A table is `keys: uint64[cap + 1]` (cap a power of two) plus a row of state per
slot in a separate `float32[cap + 1, row]` array. EMPTY marks a free slot; the
key that equals EMPTY itself lives in the extra slot `cap`. `meta[0]` counts
stored keys, `meta[1]` is 1 when the EMPTY-valued key is stored.
"""
import numpy as np
from numba import njit

from .hashing import mix64

EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)


@njit(cache=True, nogil=True)
def find_slots(tkeys, meta, keys, insert, slots):
    """Slot of each key in `slots`; missing keys are inserted, or get -1 if not `insert`.

    The caller guarantees room: meta[0] + len(keys) < capacity.
    Returns the number of keys inserted.
    """
    cap = tkeys.shape[0] - 1
    mask = np.uint64(cap - 1)
    inserted = 0
    for i in range(keys.shape[0]):
        k = keys[i]
        if k == EMPTY:
            if meta[1] == 0:
                if not insert:
                    slots[i] = -1
                    continue
                meta[1] = 1
                meta[0] += 1
                inserted += 1
            slots[i] = cap
            continue
        j = mix64(k) & mask
        while True:
            t = tkeys[j]
            if t == k:
                slots[i] = j
                break
            if t == EMPTY:
                if insert:
                    tkeys[j] = k
                    meta[0] += 1
                    inserted += 1
                    slots[i] = j
                else:
                    slots[i] = -1
                break
            j = (j + np.uint64(1)) & mask
    return inserted


@njit(cache=True, nogil=True)
def rehash(old_keys, old_state, new_keys, new_state):
    """Move every stored key and its state row into a larger, empty table."""
    old_cap = old_keys.shape[0] - 1
    new_cap = new_keys.shape[0] - 1
    mask = np.uint64(new_cap - 1)
    for i in range(old_cap):
        k = old_keys[i]
        if k == EMPTY:
            continue
        j = mix64(k) & mask
        while new_keys[j] != EMPTY:
            j = (j + np.uint64(1)) & mask
        new_keys[j] = k
        new_state[j, :] = old_state[i, :]
    new_state[new_cap, :] = old_state[old_cap, :]


@njit(cache=True, nogil=True)
def occupied_slots(tkeys, meta):
    """Slots that hold a key, in slot order (the EMPTY-valued key's slot last)."""
    cap = tkeys.shape[0] - 1
    out = np.empty(meta[0], np.int64)
    n = 0
    for i in range(cap):
        if tkeys[i] != EMPTY:
            out[n] = i
            n += 1
    if meta[1] == 1:
        out[n] = cap
    return out
