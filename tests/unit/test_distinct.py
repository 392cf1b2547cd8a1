"""The estimate of a dataset's distinct keys (kernels.distinct), kept by `convert` in meta.json,
and a server's table sized by it before training (server_side._reserve)."""
import json
import logging

import numpy as np
import pytest
from mpi4py import MPI

from mpips.base.budget import Budget
from mpips.kernels import distinct
from mpips.models.optimizer import Optimizer
from mpips.job.server_part import _reserve
from mpips.data.convert import convert
from mpips.data.shards import distinct_keys
from mpips.server.store import KVStore


@pytest.mark.parametrize("n", [0, 1, 100, 5000, 40000, 300000])
def test_the_estimate_is_within_a_few_percent_and_repeats_do_not_count(n):
    rng = np.random.default_rng(n)
    keys = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    registers = distinct.sketch()
    distinct.add(registers, keys)
    distinct.add(registers, keys[: n // 2])
    assert abs(distinct.estimate(registers) - n) <= max(2, 0.03 * n)


@pytest.mark.parametrize("keys", ["sequential", "one field's", "small"])
def test_keys_that_are_not_hashed_count_as_well(keys):
    n = 100000
    keys = {"sequential": np.arange(n, dtype=np.uint64),
            "one field's": (np.uint64(7) << np.uint64(56)) | np.arange(n, dtype=np.uint64) * np.uint64(3),
            "small": np.arange(n, dtype=np.uint64) % np.uint64(1000)}[keys]
    registers = distinct.sketch()
    distinct.add(registers, keys)
    assert abs(distinct.estimate(registers) - np.unique(keys).size) <= 0.03 * np.unique(keys).size


def test_sketches_of_parts_merge_by_their_largest_register():
    rng = np.random.default_rng(1)
    a, b = (rng.integers(0, 2**63, 50000, dtype=np.uint64) for _ in range(2))
    both, part_a, part_b = distinct.sketch(), distinct.sketch(), distinct.sketch()
    distinct.add(both, np.concatenate([a, b]))
    distinct.add(part_a, a)
    distinct.add(part_b, np.concatenate([b, a[:100]]))   # a key in two parts counts once
    np.testing.assert_array_equal(np.maximum(part_a, part_b), both)


@pytest.fixture
def dataset(tmp_path):
    rng = np.random.default_rng(2)
    src = tmp_path / "d.svm"
    keys = rng.integers(0, 2**63, 3000, dtype=np.uint64)   # 3,000 distinct keys at most
    with open(src, "w") as f:
        for i in range(2000):
            f.write(f"{i % 2} " + " ".join(f"{k}:1" for k in rng.choice(keys, 20)) + "\n")
    meta = convert(str(src), str(tmp_path / "bin"), MPI.COMM_SELF)
    return tmp_path / "bin", meta, len(set(open(src).read().split()) - {"0", "1"})


def test_convert_keeps_the_estimate_and_a_server_sizes_its_table_by_its_share(dataset):
    path, meta, exact = dataset
    assert abs(meta["distinct_keys"] - exact) <= 0.03 * exact
    assert distinct_keys(str(path)) == meta["distinct_keys"]
    store = KVStore(1, Optimizer("adagrad", lr=0.1))
    _reserve(store, str(path), 0.5)
    assert store.capacity * store.max_load >= 0.5 * meta["distinct_keys"] * 1.1
    generation = store.generation
    store.find(np.arange(int(0.5 * meta["distinct_keys"] * 1.1), dtype=np.uint64))
    assert store.generation == generation, "the keys expected fit without the table growing"


def test_no_estimate_no_reservation(dataset, tmp_path):
    path, meta, _ = dataset
    (tmp_path / "t.svm").write_text("1 3:1\n")
    old = {k: v for k, v in meta.items() if k != "distinct_keys"}   # converted before it
    (path / "meta.json").write_text(json.dumps(old))
    for source in (str(tmp_path / "t.svm"), str(path), str(tmp_path / "nothing")):
        assert distinct_keys(source) is None
        store = KVStore(1, Optimizer("adagrad", lr=0.1))
        _reserve(store, source, 1.0)
        assert store.capacity < 2000


@pytest.mark.parametrize("forged", [10**15, -5, "many", 3.5, None])
def test_a_forged_estimate_asks_for_no_more_than_the_data_could_fill(dataset, forged):
    path, meta, _ = dataset
    (path / "meta.json").write_text(json.dumps({**meta, "distinct_keys": forged}))
    n = distinct_keys(str(path))
    assert n is None if not isinstance(forged, int) or forged < 0 else n == meta["nnz"]


def test_a_reservation_over_the_memory_limit_is_skipped_not_fatal(dataset, caplog):
    path, meta, _ = dataset
    store = KVStore(1, Optimizer("adagrad", lr=0.1), budget=Budget(40 << 10))
    with caplog.at_level(logging.INFO, logger="mpips"):
        _reserve(store, str(path), 1.0)
    assert store.capacity < 2000
    assert "not sized ahead" in caplog.text and "--max-rank-memory" in caplog.text


def test_a_table_too_large_for_the_machine_is_skipped_and_holds_nothing(dataset, monkeypatch):
    """Within --max-rank-memory (or without one) the allocation itself may fail: the budget
    counts nothing of it, and training goes on growing the table as before."""
    path, meta, _ = dataset
    budget = Budget(None)
    store = KVStore(1, Optimizer("adagrad", lr=0.1), budget=budget)
    held, peak = budget.held, budget.peak
    with pytest.raises(MemoryError):
        store.reserve(1 << 46)   # a petabyte of table
    assert (budget.held, budget.peak) == (held, peak) and store.capacity < 2000
    monkeypatch.setattr(store, "reserve", lambda keys: KVStore.reserve(store, 1 << 46))
    _reserve(store, str(path), 1.0)
    assert (budget.held, budget.peak) == (held, peak)
