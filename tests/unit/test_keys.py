"""The sort of a minibatch's entries (kernels.keys.sorted_entries) against numpy's unique."""
import numpy as np
import pytest

from mpips.kernels.keys import sorted_entries


def _run(indices):
    m = indices.shape[0]
    keys, cols = np.empty(m + 1, np.uint64), np.empty(m, np.int64)
    n = sorted_entries(indices, keys, cols, np.empty(m + 1, np.int32), np.empty((m, 2), np.uint64))
    return n, keys[:max(n, 0)], cols


@pytest.mark.parametrize("kind", ["hashed", "hot keys", "one key", "two keys", "small ids",
                                  "sequential", "near 2^64"])
@pytest.mark.parametrize("m", [1, 2, 3, 1000, 40000])
def test_sorted_entries_equals_numpy_unique(kind, m):
    rng = np.random.default_rng(m)
    indices = {
        "hashed": lambda: rng.integers(0, 2**64 - 1, m, dtype=np.uint64, endpoint=True),
        # CTR data: a few values of each field are in most rows
        "hot keys": lambda: np.where(rng.random(m) < 0.3, rng.integers(0, 40, m).astype(np.uint64)
                                     * np.uint64(0x9E3779B97F4A7C15),
                                     rng.integers(0, 2**64 - 1, m, dtype=np.uint64)),
        "one key": lambda: np.full(m, 12345, np.uint64),
        "two keys": lambda: np.where(rng.random(m) < 0.5, np.uint64(7), np.uint64(2**64 - 1)),
        "small ids": lambda: rng.integers(0, 1 << 20, m, dtype=np.uint64),
        "sequential": lambda: np.arange(m, dtype=np.uint64)[::-1] * np.uint64(3),
        "near 2^64": lambda: np.uint64(2**64 - 1) - rng.integers(0, 5000, m, dtype=np.uint64),
    }[kind]()
    n, keys, cols = _run(indices)
    expect_keys, expect_cols = np.unique(indices, return_inverse=True)
    assert n == expect_keys.shape[0]
    np.testing.assert_array_equal(keys, expect_keys)
    np.testing.assert_array_equal(cols, expect_cols)


def test_no_entries_no_keys():
    assert _run(np.empty(0, np.uint64))[0] == 0


def test_keys_that_bunch_are_left_to_the_hash_pass():
    """Two bunches far apart share a bucket each: sorting them entry by entry would move each
    one past most of its bunch, so the kernel gives up."""
    rng = np.random.default_rng(3)
    m = 40000
    indices = np.where(rng.random(m) < 0.5, rng.integers(0, 1000, m, dtype=np.uint64),
                       rng.integers(2**63, 2**63 + 1000, m, dtype=np.uint64))
    assert _run(indices)[0] == -1
