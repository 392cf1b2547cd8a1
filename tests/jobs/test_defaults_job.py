"""Defaults alone train well: each optimizer, with no --lr and no --batch-size, on a small
census-like set of one-hot features and on a small set of real-valued features of different
magnitudes. One epoch is held to Vowpal Wabbit's one pass, five to scikit-learn's optimum
(held-out logloss; bench/defaults.py prints the same figures)."""
import os

import numpy as np
import pytest
import scipy.sparse as sp
from support import cannot, read_summary, run_job, run_mpips
from sklearn.linear_model import LogisticRegression

from mpips.models.evaluate import read_rows
from mpips.kernels.logistic import mean_logloss

SETS = {"census": ("--rows", 30000, "--test-rows", 15000),
        "dense": ("--rows", 20000, "--test-rows", 10000)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """name -> (train, test, scikit-learn's held-out optimum, VW's one pass)."""
    out = {}
    for name, size in SETS.items():
        prefix = tmp_path_factory.mktemp(name) / name
        job = run_mpips("make-data", "--kind", name, *size, "--seed", 1, prefix)
        assert job.returncode == 0, job.output
        train, test = f"{prefix}.train.svm", f"{prefix}.test.svm"
        out[name] = (train, test, sklearn_optimum(train, test),
                     vw_one_pass(train, test, str(prefix)))
    return out


def sklearn_optimum(train_path: str, test_path: str) -> float:
    """Held-out logloss of a weakly regularized fit (C = 1e4: mpips' L2 is 0), to 1e-6 of
    the gradient (tighter moves it by about 1e-6, against the 1% the tests allow)."""
    train, test = read_rows(train_path), read_rows(test_path)
    keys = np.unique(np.concatenate([train.indices, test.indices]))

    def matrix(rows):
        return sp.csr_matrix((rows.values.astype(np.float64), np.searchsorted(keys, rows.indices),
                              rows.indptr), shape=(len(rows), keys.shape[0]))

    model = LogisticRegression(C=1e4, max_iter=5000, tol=1e-6).fit(matrix(train), train.labels)
    return float(mean_logloss(model.decision_function(matrix(test)), test.labels))


def vw_one_pass(train_path: str, test_path: str, prefix: str) -> float:
    """Held-out logloss of Vowpal Wabbit's one pass, logistic loss, its defaults."""
    try:
        import vowpalwabbit
    except ImportError as e:
        cannot(f"Vowpal Wabbit, the reference for one epoch, is not installed ({e}): "
               f"pip install vowpalwabbit (the test extra has it)")
    for path in (train_path, test_path):
        rows = read_rows(path)
        with open(path + ".vw", "w") as f:
            for r in range(len(rows)):
                a, b = rows.indptr[r], rows.indptr[r + 1]
                f.write(f"{1 if rows.labels[r] else -1} |f " + " ".join(
                    f"{k}:{v:.6g}" for k, v in zip(rows.indices[a:b].tolist(),
                                                   rows.values[a:b].tolist())) + "\n")
    model, preds = prefix + ".vwmodel", prefix + ".preds"
    for args in (f"--loss_function logistic -d {train_path}.vw -f {model}",
                 f"-t -i {model} --link logistic -d {test_path}.vw -p {preds}"):
        vw = vowpalwabbit.Workspace(f"--quiet {args}")
        vw.run_parser()
        vw.finish()
    p = np.clip(np.loadtxt(preds), 1e-15, 1 - 1e-15)
    return float(mean_logloss(np.log(p) - np.log1p(-p), read_rows(test_path).labels))


def train(data, name: str, optimizer: str, epochs: int, out, *args) -> tuple:
    job = run_job(2, "train", "--train", data[name][0], "--test", data[name][1], "--out", out,
                  "--optimizer", optimizer, "--epochs", epochs, *args)
    assert job.returncode == 0, job.output
    return read_summary(out), job


@pytest.mark.parametrize("name", list(SETS))
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "ftrl", "adam"])
def test_defaults_alone_train_well(data, tmp_path, optimizer, name):
    _, _, optimum, vw = data[name]
    one, job = train(data, name, optimizer, 1, tmp_path / "one")
    five, _ = train(data, name, optimizer, 5, tmp_path / "five")
    said = f"{name} {optimizer}: one epoch {one['test_logloss']:.4f} (VW {vw:.4f}), five " \
           f"{five['test_logloss']:.4f} (optimum {optimum:.4f})"
    assert one["test_logloss"] < vw * 1.03, said
    assert five["test_logloss"] < optimum * 1.01, said
    assert "(set --lr to change)" in job.output and "(set --batch-size to change)" in job.output
    assert one["config"]["batch_size"] < 100, "small data: small minibatches, many updates"


def test_a_batch_size_leaving_few_updates_is_warned_about_and_sgd_stays_stable(data, tmp_path):
    """The old defaults here: 1,000-row minibatches (10 updates per epoch for each of two
    workers) and SGD at 40 / features per row, which diverged."""
    run = tmp_path / "run"
    job = run_job(3, "train", "--train", data["census"][0], "--test", data["census"][1],
                  "--out", run, "--optimizer", "sgd", "--batch-size", 1000, "--epochs", 5)
    assert job.returncode == 0, job.output
    assert "--batch-size 1000 leaves the worker with the fewest rows (14,999) 15 update(s) " \
           "per epoch" in job.output
    s = read_summary(run)
    base = np.mean(read_rows(data["census"][0]).labels)
    entropy = -(base * np.log(base) + (1 - base) * np.log(1 - base))
    assert s["test_logloss"] < 0.8 * entropy, "trained, and no divergence"
    assert os.path.exists(run / "model")
