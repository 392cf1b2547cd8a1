"""The compiled checks of a pull's keys (kernels.requests.checked_homes) against the plain
rules they implement, over key counts that span its chunks: keys copied, home rows computed,
reads counted per range; a key out of order or of a range not allowed is found, whichever
chunk it is in, and then nothing is counted."""
import numpy as np
import pytest

from mpips.kernels.hashing import PLACEMENT_SALT
from mpips.kernels.requests import CHUNK, checked_homes
from mpips.wire.placement import Placement

SERVER = 1
PLACEMENT = Placement(3, vnodes=8)
CAP = 1_000_003
M64 = (1 << 64) - 1


def home_row(key: int, cap: int) -> int:
    """kernels.table's home row of a key, in Python integers: splitmix64's finalizer of the
    salted key, its low 32 bits scaled to the capacity."""
    x = key ^ int(PLACEMENT_SALT)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    x ^= x >> 31
    return ((x & 0xFFFFFFFF) * cap) >> 32


def own_keys(n: int, seed: int) -> np.ndarray:
    """n sorted keys of ranges SERVER holds as primary."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 2**64, 8 * n + 64, dtype=np.uint64))
    keys = keys[PLACEMENT.owners(keys) == SERVER]
    assert keys.shape[0] >= n
    return np.sort(rng.choice(keys, n, replace=False))


def check(keys: np.ndarray, homes: bool = True) -> tuple:
    """checked_homes of `keys` for SERVER: (its result, the keys copied, home rows, counts)."""
    bounds, allowed, _ = PLACEMENT.key_check(SERVER, True)
    counts = np.full(PLACEMENT.n_ranges, 7, np.int64)
    copies = np.zeros_like(keys)
    slots = np.full(keys.shape[0] if homes else 0, -1, np.int64)
    return checked_homes(keys, bounds, allowed, counts, CAP, copies, slots), copies, slots, counts


@pytest.mark.parametrize("n", [0, 1, 2, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17])
def test_keys_that_keep_the_rules_are_copied_counted_and_given_their_home_rows(n):
    keys = own_keys(n, seed=n)
    bad, copies, slots, counts = check(keys)
    assert bad == -1
    assert (copies == keys).all()
    assert slots.tolist() == [home_row(int(k), CAP) for k in keys]
    expected = 7 + np.bincount(PLACEMENT.ranges_of(keys), minlength=PLACEMENT.n_ranges)
    assert counts.tolist() == expected.tolist()
    assert check(keys, homes=False)[0] == -1


N = 3 * CHUNK + 17
FAULTS = [(at, fault) for fault in ("repeated", "smaller", "another server's")
          for at in (1, CHUNK - 1, CHUNK, CHUNK + 5, N - 4)] + [(0, "another server's")]


@pytest.mark.parametrize("at, fault", FAULTS)
@pytest.mark.parametrize("again", [False, True])
def test_the_first_key_that_breaks_a_rule_is_named_and_nothing_is_counted(at, fault, again):
    """`again`: a second fault follows; the first is the one named."""
    keys = own_keys(N, seed=at)
    if fault == "another server's":
        others = np.unique(np.random.default_rng(at).integers(0, 2**64, 4096, dtype=np.uint64))
        lo = keys[at - 1] if at else np.uint64(0)
        between = others[(others > lo) & (others < keys[at + 1])
                         & (PLACEMENT.owners(others) != SERVER)]
        keys[at] = between[0]
    else:
        keys[at] = keys[at - 1] if fault == "repeated" else keys[at - 1] - np.uint64(1)
    if again:
        keys[at + 3] = keys[at + 2]
    for homes in (True, False):
        bad, _, _, counts = check(keys, homes)
        assert bad == at
        assert (counts == 7).all()
