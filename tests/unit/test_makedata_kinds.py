"""The census-like and dense generators: deterministic, valid svmlight, shaped as described."""
import filecmp

import numpy as np
import pytest
from support import run_mpips

from mpips.base.errors import ConfigError
from mpips.models.evaluate import read_rows
from mpips.data.synthetic import make_data


@pytest.mark.parametrize("kind", ["census", "dense"])
def test_same_arguments_same_files_and_any_row_range_alike(tmp_path, kind):
    a = make_data(str(tmp_path / "a"), rows=12000, test_rows=3000, seed=5, kind=kind)
    b = make_data(str(tmp_path / "b"), rows=12000, test_rows=3000, seed=5, kind=kind)
    c = make_data(str(tmp_path / "c"), rows=12000, test_rows=3000, seed=6, kind=kind)
    assert filecmp.cmp(a["train"]["path"], b["train"]["path"], shallow=False)
    assert not filecmp.cmp(a["train"]["path"], c["train"]["path"], shallow=False)
    # The test rows follow the training rows: rows 12000.. of a longer training set.
    longer = make_data(str(tmp_path / "d"), rows=15000, test_rows=1, seed=5, kind=kind)
    with open(longer["train"]["path"]) as f, open(a["test"]["path"]) as t:
        assert f.read().splitlines()[12000:] == t.read().splitlines()


def test_census_is_one_hot_frequent_and_correlated(tmp_path):
    files = make_data(str(tmp_path / "c"), rows=20000, test_rows=10, seed=1, kind="census")
    rows = read_rows(files["train"]["path"])
    per_row = np.diff(rows.indptr)
    assert 11 <= per_row.min() and per_row.max() == 14 and per_row.mean() > 13.8
    assert (rows.values == 1).all() and rows.indices.min() == 1 and rows.indices.max() <= 123
    assert np.unique(rows.indices).shape[0] > 110
    assert 0.21 < files["train"]["positive_rate"] < 0.27
    freq = np.bincount(rows.indices.astype(int), minlength=124)[1:] / len(rows)
    assert (freq > 0.8).sum() >= 4, "several fields have one value most rows share"
    x = np.zeros((len(rows), 123))
    x[np.repeat(np.arange(len(rows)), per_row), rows.indices.astype(int) - 1] = 1
    c = np.corrcoef(x[:, freq > 0.05].T)
    assert (np.abs(c[np.triu_indices_from(c, 1)]) > 0.1).sum() > 50, "values co-occur"


def test_dense_values_are_real_and_of_different_magnitudes(tmp_path):
    files = make_data(str(tmp_path / "d"), rows=10000, test_rows=10, seed=1, kind="dense")
    rows = read_rows(files["train"]["path"])
    assert (np.diff(rows.indptr) == 10).all()
    x = rows.values.reshape(-1, 10)
    spread = np.median(np.abs(x), axis=0)
    assert spread.max() / spread.min() > 10, spread
    assert (np.abs(x) > 10).any(axis=0).sum() >= 3, "some features reach the tens"
    assert (x < 0).any() and (x[:, 1] > 0).all()
    assert 0.26 < files["train"]["positive_rate"] < 0.34


def test_ctr_options_belong_to_ctr(tmp_path):
    with pytest.raises(ConfigError, match="--kind ctr only"):
        make_data(str(tmp_path / "x"), rows=10, features=5, kind="dense")
    job = run_mpips("make-data", "--rows", 100, "--kind", "census", "--nnz", 5, tmp_path / "y")
    assert job.returncode == 2 and "--kind ctr only" in job.stderr
