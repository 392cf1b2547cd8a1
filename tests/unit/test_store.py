"""The server's hash table: agrees with a dict, grows, and stores only touched keys."""
import numpy as np

from mpips.kernels.table import EMPTY
from mpips.optimizer import Optimizer
from mpips.store import KVStore


def test_matches_a_dict_through_growth():
    store = KVStore(width=2, optimizer=Optimizer("sgd", lr=1.0), capacity=16)
    reference = {}
    rng = np.random.default_rng(0)
    for step in range(40):
        keys = np.unique(np.concatenate([
            rng.integers(0, 2**64 - 1, 300, dtype=np.uint64, endpoint=True),
            rng.integers(0, 50, 20).astype(np.uint64),       # repeats
            [EMPTY] if step % 7 == 0 else []]).astype(np.uint64))
        grads = rng.normal(size=(keys.shape[0], 2)).astype(np.float32)
        store.push(keys, grads)
        for k, g in zip(keys.tolist(), grads):
            reference[k] = reference.get(k, np.zeros(2, np.float32)) - g
    assert len(store) == len(reference)
    assert store.capacity > 16
    keys = np.array(sorted(reference), np.uint64)
    out = store.pull(keys, np.empty((keys.shape[0], 2), np.float32))
    np.testing.assert_allclose(out, np.array([reference[k] for k in keys.tolist()]), rtol=1e-5)
    stored, state = store.items()
    assert sorted(stored.tolist()) == keys.tolist()


def test_read_only_pull_stores_nothing():
    store = KVStore(width=1, optimizer=Optimizer())
    keys = np.array([1, 2, 2**64 - 1], np.uint64)
    out = store.pull(keys, np.full((3, 1), 7, np.float32), insert=False)
    assert (out == 0).all() and len(store) == 0
    store.pull(keys, out)
    assert len(store) == 3


def test_bytes_per_key_at_scale():
    store = KVStore(width=1, optimizer=Optimizer("sgd"))
    keys = np.arange(1_000_000, dtype=np.uint64)
    store.pull(keys, np.empty((keys.shape[0], 1), np.float32))
    # 8 bytes of key + 4 of weight per slot, at a load factor between 0.375 and 0.75.
    assert 16 <= store.nbytes / len(store) <= 32
