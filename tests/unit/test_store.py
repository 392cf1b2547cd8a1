"""The server's hash table: agrees with a dict, grows, and stores only touched keys."""
import numpy as np
import pytest

from mpips.kernels.table import EMPTY
from mpips.models.optimizer import Optimizer
from mpips.server.store import KVStore


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
        store.push(keys, grads, 0)
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
    store = KVStore(width=1, optimizer=Optimizer(lr=0.1))
    keys = np.array([1, 2, 2**64 - 1], np.uint64)
    out = store.pull(keys, np.full((3, 1), 7, np.float32), insert=False)
    assert (out == 0).all() and len(store) == 0
    store.pull(keys, out)
    assert len(store) == 3


@pytest.mark.parametrize("n_keys", [2_000_000, 3_000_000])
def test_a_large_table_stays_72_to_90_percent_full(n_keys):
    store = KVStore(width=1, optimizer=Optimizer("sgd", lr=1.0))
    keys = np.arange(n_keys, dtype=np.uint64)
    for part in np.array_split(keys, 10):   # grows step by step, as a server's table does
        store.pull(part, np.empty((part.shape[0], 1), np.float32))
    # 8 bytes of key + 4 of weight per row, at a load between 0.9 / 1.25 and 0.9.
    assert 12 / 0.9 <= store.nbytes / len(store) <= 12 * 1.25 / 0.9 + 0.01


def test_rows_stay_valid_until_the_table_grows():
    store = KVStore(width=1, optimizer=Optimizer("sgd", lr=1.0), capacity=1000)
    first = np.arange(100, dtype=np.uint64)
    slots = store.find(first)
    store.find(np.arange(100, 200, dtype=np.uint64))   # inserts, without growing
    assert store.generation == 0
    store.update(slots, np.ones((100, 1), np.float32), 0)
    out = store.pull(first, np.empty((100, 1), np.float32))
    assert (out == -1).all()
    store.find(np.arange(200, 5000, dtype=np.uint64))  # grows: rows are renumbered
    assert store.generation > 0
    assert (store.pull(first, np.empty((100, 1), np.float32)) == -1).all()


def test_reading_stored_keys_never_grows_the_table():
    store = KVStore(width=1, optimizer=Optimizer("sgd", lr=1.0))
    keys = np.arange(100_000, dtype=np.uint64)
    store.find(keys)
    capacity, generation = store.capacity, store.generation
    for _ in range(3):
        store.find(keys)
    assert (store.capacity, store.generation) == (capacity, generation)
    assert len(store) / store.capacity > 0.7


def test_a_table_grown_for_a_batch_is_left_as_full_as_a_growth_leaves_it():
    """Not as full as it may be: its probes would be their longest, and the next new key would
    grow it again."""
    store = KVStore(width=1, optimizer=Optimizer("sgd", lr=1.0))
    store.find(np.arange(50_000, dtype=np.uint64))
    assert store.max_load / store.growth - 0.01 <= len(store) / store.capacity
    assert len(store) / store.capacity <= store.max_load / store.growth
    capacity = store.capacity
    store.find(np.arange(50_000, 50_100, dtype=np.uint64))
    assert store.capacity == capacity


def test_reserve_makes_room_for_the_keys_said_and_no_more():
    store = KVStore(width=1, optimizer=Optimizer("sgd", lr=1.0))
    store.reserve(50_000)
    assert store.capacity == int(50_000 / store.max_load) + 1


def test_load_puts_back_exactly_what_items_gave():
    store = KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.1))
    rng = np.random.default_rng(4)
    keys = np.unique(rng.integers(0, 2**64 - 1, 5000, dtype=np.uint64, endpoint=True))
    store.push(keys, rng.normal(size=(keys.shape[0], 1)).astype(np.float32), 0)
    saved_keys, saved_state = store.items()
    copy = KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.1))
    copy.load(saved_keys, saved_state)
    again_keys, again_state = copy.items()
    order, again = np.argsort(saved_keys), np.argsort(again_keys)
    np.testing.assert_array_equal(saved_keys[order], again_keys[again])
    np.testing.assert_array_equal(saved_state[order], again_state[again])
    with pytest.raises(ValueError, match="keeps 2 columns"):
        copy.load(saved_keys, saved_state[:, :1])


def test_a_large_batch_of_new_keys_rebuilds_the_table_once():
    store = KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.1))   # 1,024 rows to start
    keys = np.arange(300_000, dtype=np.uint64) * np.uint64(2654435761)
    state = np.ones((keys.shape[0], store.columns), np.float32)
    store.load(keys, state)        # as a resume does with a whole checkpoint
    assert store.generation == 1 and len(store) == keys.shape[0]
    np.testing.assert_array_equal(store.pull(keys, np.empty((keys.shape[0], 1), np.float32)),
                                  np.ones((keys.shape[0], 1), np.float32))


def test_keep_drops_the_other_rows_and_renumbers():
    s = KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.5))
    keys = np.arange(1, 5001, dtype=np.uint64)
    s.push(keys, np.ones((keys.shape[0], 1), np.float32), 0)
    before = s.generation
    stored, state = s.items()
    kept = stored % 3 == 0
    s.keep(kept)
    assert len(s) == int(kept.sum()) and s.generation > before
    after, after_state = s.items()
    order, expected = np.argsort(after), np.argsort(stored[kept])
    np.testing.assert_array_equal(after[order], stored[kept][expected])
    np.testing.assert_array_equal(after_state[order], state[kept][expected])
    out = np.empty((3, 1), np.float32)
    assert (s.find(np.array([1, 2, 4], np.uint64), insert=False, out=out) < 0).all(), "dropped"


@pytest.mark.parametrize("full", [0.3, 0.89])
def test_removing_keys_in_place_leaves_the_table_as_if_they_had_never_been_stored(full):
    """Backward-shift deletion at 30% and 89% full (long probe runs that wrap round the
    table's end): every key left is found with its state, every removed one is gone, and
    a key stored afterwards starts from zero."""
    rng = np.random.default_rng(1)
    s = KVStore(width=2, optimizer=Optimizer("sgd", lr=1.0), capacity=4096)
    keys = np.unique(np.concatenate([rng.integers(0, 2**64 - 1, int(full * 4096 * 1.02),
                                                  dtype=np.uint64, endpoint=True), [EMPTY]]))
    keys = keys[:int(full * s.capacity)].astype(np.uint64)
    grads = rng.normal(size=(keys.shape[0], 2)).astype(np.float32)
    s.push(keys, grads, 0)
    capacity, generation = s.capacity, s.generation
    gone = rng.random(keys.shape[0]) < 0.4
    gone[-1] = True   # (EMPTY, the largest key, among them)
    s.remove(np.concatenate([keys[gone], np.array([12345], np.uint64)]))   # one never stored
    assert len(s) == int((~gone).sum()) and s.capacity == capacity and s.generation > generation
    out = np.empty((keys.shape[0], 2), np.float32)
    rows = s.find(keys, insert=False, out=out)
    assert (rows[gone] < 0).all() and (rows[~gone] >= 0).all()
    np.testing.assert_array_equal(out[~gone], -grads[~gone])
    stored, _ = s.items()
    assert sorted(stored.tolist()) == sorted(keys[~gone].tolist())
    again = keys[gone][:5]
    np.testing.assert_array_equal(s.pull(again, np.empty((5, 2), np.float32)), 0)


def test_reserve_makes_room_once():
    s = KVStore(width=1, optimizer=Optimizer("sgd", lr=0.5))
    s.reserve(100_000)
    generation = s.generation
    s.push(np.arange(100_000, dtype=np.uint64), np.ones((100_000, 1), np.float32), 0)
    assert s.generation == generation, "no growth on the way"


@pytest.mark.parametrize("rows", [1, 7, 64, 1 << 18])
def test_blocks_give_what_items_gives_in_the_same_order(rows):
    """A table written a block at a time (a checkpoint's shard) holds what items() gives:
    every stored key once, the EMPTY-valued one too, with its state row, in row order."""
    store = KVStore(width=2, optimizer=Optimizer("adagrad", lr=0.1), capacity=64)
    rng = np.random.default_rng(3)
    keys = np.unique(np.concatenate([rng.integers(0, 2**64 - 1, 500, dtype=np.uint64,
                                                  endpoint=True), [EMPTY]]).astype(np.uint64))
    store.push(keys, rng.normal(size=(keys.shape[0], 2)).astype(np.float32), 0)
    stored, state = store.items()
    blocks = list(store.blocks(rows))
    assert np.array_equal(np.concatenate([k for k, _ in blocks]), stored)
    assert np.array_equal(np.concatenate([s for _, s in blocks]).view(np.uint32),
                          state.view(np.uint32))
    assert all(s is None for _, s in store.blocks(rows, state=False))
