"""64-bit mixing and key-to-range grouping. Pure numba, no MPI."""
import numpy as np

from .jit import njit
from .shapes import FIELD_SHIFT, LOW_BITS

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S32 = np.uint64(32)
_LOW = np.uint64(0xFFFFFFFF)
# The hash of a key is mix64(key ^ PLACEMENT_SALT): its top bits choose the key's range (and so
# its server, see wire.placement), its low bits the key's home row in that server's table
# (kernels.table): one hash for both, independent of each other.
PLACEMENT_SALT = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True, inline="always")
def mix64(x):
    """splitmix64's finalizer: a bijection on uint64 that spreads sequential ids."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


@njit(cache=True, nogil=True, inline="always")
def key_range(h, bounds):
    """The last r with bounds[r] <= h, for the bounds of n equal slices of the hash that
    placement makes (bounds[r] = floor(r 2^64 / n), n < 2^32): floor((h n + n - 1) / 2^64),
    the high word of a 128-bit product made of 64-bit halves. No search: a step back and
    forth around an estimate (its branches mispredicted) was most of a pull's checks."""
    n = np.uint64(bounds.shape[0])
    low = (h & _LOW) * n + (n - np.uint64(1))
    return np.int64(((h >> _S32) * n + (low >> _S32)) >> _S32)


@njit(cache=True, nogil=True)
def ranges_of(keys, bounds, salt):
    """Range index of each key: the range of `bounds` holding mix64(key ^ salt).

    `bounds` is sorted uint64 of length n_ranges; range r holds hashes in
    [bounds[r], bounds[r+1]) and the last one up to 2^64-1.
    """
    out = np.empty(keys.shape[0], np.int32)
    for i in range(keys.shape[0]):
        out[i] = key_range(mix64(keys[i] ^ salt), bounds)
    return out


@njit(cache=True, nogil=True)
def group_by_owner(owner, n_groups):
    """Stable counting sort: (perm, offsets) so keys[perm[offsets[s]:offsets[s+1]]] go to s."""
    if n_groups == 2:
        return _two_groups(owner)
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
def _two_groups(owner):
    """group_by_owner for 2 groups, a pass per group with no store waiting on the one before
    (a counting sort's counters are read back as they are written): 1.4 ns a key against
    2.9 (18,335 random owners)."""
    n = owner.shape[0]
    perm = np.empty(n + 1, np.int64)   # (each pass writes one slot past what it keeps)
    offsets = np.zeros(3, np.int64)
    at = 0
    for group in range(2):
        for i in range(n):
            perm[at] = i
            at += owner[i] == group
        offsets[group + 1] = at
    return perm[:n], offsets


@njit(cache=True, nogil=True)
def split_by_owner(keys, bounds, salt, owner_of_range, n_groups):
    """group_by_owner of the keys' owners, owner_of_range[the range of each key (of `bounds`,
    hashed with `salt`)], in one call: 10 keys split in 1.5 us, against 2.9 for ranges_of,
    an index and group_by_owner from Python."""
    owner = np.empty(keys.shape[0], np.int32)
    for i in range(keys.shape[0]):   # (no count here: this pass vectorizes)
        owner[i] = owner_of_range[key_range(mix64(keys[i] ^ salt), bounds)]
    return group_by_owner(owner, n_groups)


@njit(cache=True, nogil=True)
def is_sorted_unique(keys):
    """True if keys are strictly increasing."""
    for i in range(1, keys.shape[0]):
        if keys[i] <= keys[i - 1]:
            return False
    return True


@njit(cache=True, nogil=True)
def first_misplaced(keys, bounds, salt, allowed, counts):
    """(index, why) of the first key that does not follow the one before in strictly
    increasing order (why 1), or whose range r (of `bounds`) has allowed[r] false (why 2);
    (-1, 0) if none. Each key's range is counted in `counts` (if not empty)."""
    count = counts.shape[0] > 0
    for i in range(keys.shape[0]):
        if i > 0 and keys[i] <= keys[i - 1]:
            return i, 1
        r = key_range(mix64(keys[i] ^ salt), bounds)
        if not allowed[r]:
            return i, 2
        if count:
            counts[r] += 1
    return -1, 0


@njit(cache=True, nogil=True, inline="always")
def field_key(field, low):
    """The key of a feature in `field` (0..254) whose value is identified by `low` (its low
    56 bits are kept): a model can concatenate per field what it learns of the row."""
    return np.uint64(field) << FIELD_SHIFT | (np.uint64(low) & LOW_BITS)
