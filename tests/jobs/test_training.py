"""Whole training jobs under mpiexec: model quality, summary, model files."""
import json

import numpy as np
import pytest
import scipy.sparse as sp
from support import read_summary, run_job, run_mpips
from sklearn.linear_model import LogisticRegression

from mpips.models.evaluate import read_rows
from mpips.kernels.logistic import mean_logloss
from mpips.storage.model_files import load_model

L2 = 1e-4
TRAIN_ARGS = ("--epochs", 10, "--batch-size", 100, "--lr", 0.05, "--l2", L2)


@pytest.fixture(scope="module")
def sklearn_logloss(small_data):
    """Held-out logloss of scikit-learn's LogisticRegression with the same L2.

    mpips minimises mean logloss + l2/2 |w|^2; scikit-learn minimises
    C * sum logloss + 1/2 |w|^2, the same objective with C = 1 / (l2 * n)."""
    train, test = read_rows(small_data[0]), read_rows(small_data[1])
    keys = np.unique(np.concatenate([train.indices, test.indices]))

    def matrix(rows):
        return sp.csr_matrix((rows.values.astype(np.float64), np.searchsorted(keys, rows.indices),
                              rows.indptr), shape=(len(rows), keys.shape[0]))

    model = LogisticRegression(C=1 / (L2 * len(train)), max_iter=5000, tol=1e-8)
    model.fit(matrix(train), train.labels)
    return float(mean_logloss(model.decision_function(matrix(test)), test.labels))


@pytest.mark.parametrize("servers, workers", [(1, 1), (2, 2)])
def test_matches_sklearn_within_one_percent(small_data, sklearn_logloss, tmp_path, servers, workers):
    run = tmp_path / "run"
    job = run_job(servers + workers, "train", "--train", small_data[0], "--test", small_data[1],
                  "--servers", servers, "--out", run, *TRAIN_ARGS)
    assert job.returncode == 0, job.output
    s = read_summary(run)
    assert s["servers"] == servers and s["workers"] == workers
    assert s["train_examples"] == 10 * 20000 and s["test_examples"] == 10000
    gap = abs(s["test_logloss"] - sklearn_logloss) / sklearn_logloss
    assert gap < 0.01, f"mpips {s['test_logloss']:.5f} vs scikit-learn {sklearn_logloss:.5f}"
    assert s["test_auc"] > 0.7


def test_summary_and_model_files(small_data, tmp_path):
    run = tmp_path / "run"
    job = run_job(4, "train", "--train", small_data[0], "--test", small_data[1], "--servers", 2,
                  "--out", run, "--log-every", 0.01, "--batch-size", 50)
    assert job.returncode == 0, job.output
    s = read_summary(run)
    for field in ("test_logloss", "test_auc", "examples_per_s", "wall_s", "keys_stored",
                  "server_bytes_per_key", "bytes_sent", "consistency", "max_clock_gap", "wait_s"):
        assert s[field] is not None, field
    assert s["consistency"] == "bsp" and s["max_clock_gap"] == 0
    assert s["late_compiles"] == 0, "warm-up compiled every kernel the job uses"
    assert len(s["wait_s"]) == 2
    # Where the time went: start-up (from the processes' start, so beyond the numba kernels'
    # loading), training, scoring the test file, saving; and all of it within the wall time.
    assert s["startup_s"] > s["compile_s"] > 0 and s["train_s"] > 0
    assert s["score_s"] > 0 and s["save_s"] > 0
    assert s["train_s"] + s["score_s"] + s["save_s"] < s["wall_s"]
    assert "s from the start of the processes to training" in job.stdout
    keys, weights = load_model(run / "model")
    data_keys = np.unique(read_rows(small_data[0]).indices)
    # Stored: every training key, plus the bias key; test-only keys were read, not stored.
    assert keys.tolist() == data_keys.tolist() + [2**64 - 1]
    assert s["keys_stored"] == keys.shape[0]
    assert np.abs(weights).max() > 0
    assert "training: epoch" in job.stdout, "progress lines while training"
    offline = run_mpips("score", run, "--test", small_data[1], "--json", tmp_path / "score.json")
    assert offline.returncode == 0, offline.output
    with open(tmp_path / "score.json") as f:
        assert json.load(f)["logloss"] == pytest.approx(s["test_logloss"], rel=1e-9)
    assert "done:" in job.stdout and "test logloss" in job.stdout


def test_snapshots_make_a_learning_curve(small_data, tmp_path):
    run = tmp_path / "run"
    job = run_job(3, "train", "--train", small_data[0], "--test", small_data[1], "--servers", 2,
                  "--out", run, "--epochs", 5, "--batch-size", 100, "--snapshot-every", 0.1,
                  "--lr", 0.05)   # a rate at which every epoch improves the held-out loss
    assert job.returncode == 0, job.output
    scored = run_mpips("score", run, "--test", small_data[1], "--snapshots",
                       "--json", tmp_path / "curve.json")
    assert scored.returncode == 0, scored.output
    with open(tmp_path / "curve.json") as f:
        curve = json.load(f)
    # About 5 snapshots here unloaded (0.5 s of training), more on a loaded machine.
    assert len(curve) >= 2, "snapshots every 0.1 s over 5 epochs"
    assert [c["elapsed_s"] for c in curve] == sorted(c["elapsed_s"] for c in curve)
    assert curve[0]["logloss"] > read_summary(run)["test_logloss"], "the model improved"
