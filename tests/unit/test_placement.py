"""Key placement: hashed ranges balance sequential and skewed ids."""
import numpy as np
import pytest

from mpips.placement import Placement


@pytest.mark.parametrize("n_servers", [2, 3, 4, 7])
@pytest.mark.parametrize("pattern", ["sequential", "strided", "high_bits", "clustered"])
def test_balanced(n_servers, pattern):
    n = 200_000
    i = np.arange(n, dtype=np.uint64)
    keys = {
        "sequential": i,
        "strided": i * np.uint64(1024),                       # ids that share low bits
        "high_bits": i << np.uint64(40),                      # ids that differ only high up
        "clustered": np.uint64(2**64 - 1) - i,                # the top of the key space
    }[pattern]
    counts = np.bincount(Placement(n_servers).owners(keys), minlength=n_servers)
    assert counts.sum() == n
    assert np.abs(counts / n - 1 / n_servers).max() < 0.01, counts


def test_split_groups_keys_by_owner_in_order():
    keys = np.unique(np.random.default_rng(1).integers(0, 2**63, 5000, dtype=np.uint64))
    p = Placement(3)
    perm, offsets = p.split(keys)
    owner = p.owners(keys)
    assert sorted(perm.tolist()) == list(range(keys.shape[0]))
    for s in range(3):
        part = perm[offsets[s]:offsets[s + 1]]
        assert (owner[part] == s).all()
        assert (np.diff(part) > 0).all(), "stable: each server's keys stay sorted"


def test_one_server_needs_no_permutation():
    keys = np.arange(10, dtype=np.uint64)
    perm, offsets = Placement(1).split(keys)
    assert perm is None and offsets.tolist() == [0, 10]
