"""The synthetic dataset: deterministic, valid svmlight, CTR-like."""
import filecmp

import numpy as np
import pytest

from mpips.data.textfile import TextShard
from mpips.base.errors import ConfigError
from mpips.data.synthetic import make_data


def test_same_arguments_same_files(tmp_path):
    a = make_data(str(tmp_path / "a"), rows=3000, features=500, nnz=8, seed=5)
    b = make_data(str(tmp_path / "b"), rows=3000, features=500, nnz=8, seed=5)
    c = make_data(str(tmp_path / "c"), rows=3000, features=500, nnz=8, seed=6)
    assert filecmp.cmp(a["train"]["path"], b["train"]["path"], shallow=False)
    assert not filecmp.cmp(a["train"]["path"], c["train"]["path"], shallow=False)


def test_rows_parse_with_the_requested_shape(tmp_path):
    files = make_data(str(tmp_path / "d"), rows=5000, features=1000, nnz=12, seed=1, test_rows=700)
    for name, n in (("train", 5000), ("test", 700)):
        rows = list(TextShard(files[name]["path"]).rows())
        assert sum(len(r) for r in rows) == n
        assert all((np.diff(r.indptr) == 12).all() for r in rows)
    rate = files["train"]["positive_rate"]
    assert 0.1 < rate < 0.5, rate
    keys = np.concatenate([r.indices for r in TextShard(files["train"]["path"]).rows()])
    assert keys.max() > 2**63, "keys are hashed over the whole 64-bit range"
    counts = np.unique(keys, return_counts=True)[1]
    assert counts.max() > 50 * np.median(counts), "feature frequencies are skewed"


def test_interactions_keep_the_features_and_move_the_labels(tmp_path):
    """--interactions plants a pairwise term: the same rows and keys, other labels; without it
    the files are those of before (the term adds nothing)."""
    plain = make_data(str(tmp_path / "p"), rows=4000, features=400, nnz=6, seed=2)
    paired = make_data(str(tmp_path / "i"), rows=4000, features=400, nnz=6, seed=2,
                       interactions=4)
    a = TextShard(plain["train"]["path"]).rows()
    b = TextShard(paired["train"]["path"]).rows()
    a, b = next(a), next(b)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.values, b.values)
    changed = (a.labels != b.labels).mean()
    assert 0.05 < changed < 0.6, changed
    with pytest.raises(ConfigError, match="--interactions shapes --kind ctr only"):
        make_data(str(tmp_path / "c"), rows=10, kind="census", interactions=2)
