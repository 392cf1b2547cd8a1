"""64-bit mixing and key-to-server grouping. Pure numba, no MPI."""
import numpy as np
from numba import njit

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


@njit(cache=True, nogil=True, inline="always")
def mix64(x):
    """splitmix64's finalizer: a bijection on uint64 that spreads sequential ids."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


@njit(cache=True, nogil=True)
def owners(keys, bounds, salt):
    """Server index of each key: the range of `bounds` holding mix64(key ^ salt).

    `bounds` is sorted uint64 of length n_servers; server s owns hashes in
    [bounds[s], bounds[s+1]) and the last one owns up to 2^64-1.
    """
    out = np.empty(keys.shape[0], np.int32)
    nb = bounds.shape[0]
    for i in range(keys.shape[0]):
        h = mix64(keys[i] ^ salt)
        lo, hi = 0, nb
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if bounds[mid] <= h:
                lo = mid
            else:
                hi = mid
        out[i] = lo
    return out


@njit(cache=True, nogil=True)
def group_by_owner(owner, n_groups):
    """Stable counting sort: (perm, offsets) so keys[perm[offsets[s]:offsets[s+1]]] go to s."""
    offsets = np.zeros(n_groups + 1, np.int64)
    for i in range(owner.shape[0]):
        offsets[owner[i] + 1] += 1
    for s in range(n_groups):
        offsets[s + 1] += offsets[s]
    fill = offsets[:-1].copy()
    perm = np.empty(owner.shape[0], np.int64)
    for i in range(owner.shape[0]):
        s = owner[i]
        perm[fill[s]] = i
        fill[s] += 1
    return perm, offsets


@njit(cache=True, nogil=True)
def is_sorted_unique(keys):
    """True if keys are strictly increasing."""
    for i in range(1, keys.shape[0]):
        if keys[i] <= keys[i - 1]:
            return False
    return True


@njit(cache=True, nogil=True)
def first_misplaced(keys, bounds, salt, owner):
    """(index, why) of the first key that does not follow the one before in strictly
    increasing order (why 1), or that server `owner` does not own (why 2); (-1, 0) if none."""
    nb = bounds.shape[0]
    lo = bounds[owner]
    for i in range(keys.shape[0]):
        if i > 0 and keys[i] <= keys[i - 1]:
            return i, 1
        h = mix64(keys[i] ^ salt)
        if h < lo or (owner + 1 < nb and h >= bounds[owner + 1]):
            return i, 2
    return -1, 0
