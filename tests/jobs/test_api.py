"""The Python API (mpips.api): a trained model, a checkpoint, predictions in one process; and
a job started from a script under mpiexec with mpips.train."""
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from support import mpiexec_path, read_summary, run_job

import mpips
from mpips.storage.checkpoint import all_checkpoints
from mpips.models.evaluate import read_rows
from mpips.kernels.logistic import mean_logloss

ARGS = ("--servers", 2, "--epochs", 2, "--batch-size", 200, "--checkpoint-every", 40)


@pytest.fixture(scope="module")
def run(small_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "run"
    job = run_job(4, "train", "--train", small_data[0], "--test", small_data[1], "--out", out,
                  *ARGS)
    assert job.returncode == 0, job.output
    return out


def logloss(p: np.ndarray, labels: np.ndarray) -> float:
    return float(mean_logloss(np.log(p) - np.log1p(-p), labels))


def test_a_loaded_model_predicts_what_the_job_scored(run, small_data):
    model = mpips.load(run)
    rows = read_rows(small_data[1])
    from_file = model.predict_proba(small_data[1])
    assert logloss(from_file, rows.labels) == pytest.approx(
        read_summary(run)["test_logloss"], rel=1e-5)
    keys, columns = np.unique(rows.indices, return_inverse=True)   # 64-bit hashed keys
    X = sp.csr_matrix((rows.values, columns, rows.indptr), shape=(len(rows), keys.shape[0]))
    np.testing.assert_array_equal(model.predict_proba(X, columns=keys), from_file)
    assert model.config["servers"] == 2 and model.model.width == 1
    some = np.array([model.keys[3], 12345678901234567], np.uint64)
    w = model.weights(some)
    assert w.shape == (2, 1) and w[1, 0] == 0 and w[0, 0] != 0
    with pytest.raises(TypeError, match="scipy sparse matrix or a file's path"):
        model.predict_proba([[1, 2]])
    # One key gives one row; what is not a feature key is named.
    np.testing.assert_array_equal(model.weights(int(model.keys[3])), w[:1])
    with pytest.raises(TypeError, match="keys must be integer feature keys"):
        model.weights([0.5])
    with pytest.raises(ValueError, match="-1 is negative"):
        model.weights([-1])


def test_the_last_checkpoint_holds_the_final_model(run):
    last = all_checkpoints(str(run / "checkpoints"))[0]
    from_ckpt, final = mpips.load(last), mpips.load(run / "model")
    np.testing.assert_array_equal(from_ckpt.keys, final.keys)
    np.testing.assert_array_equal(from_ckpt.weights(final.keys), final.weights(final.keys))


def test_load_names_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="no model .server-.*h5 files. and no checkpoint"):
        mpips.load(tmp_path)


SCRIPT = """
import mpips
from mpips import ConfigError
try:
    mpips.train(train={train!r}, servers=1, epochs=0)
except ConfigError as e:
    print("refused:", e)
try:
    mpips.train(train={train!r}, servers=1, print_schedule=True)
except ConfigError as e:
    print("refused:", e)
summary = mpips.train(train={train!r}, test={test!r}, out={out!r}, servers=1, epochs=2,
                      batch_size=200, overwrite=True, bias=True)
if summary is not None:
    print("logloss", summary["test_logloss"], summary["train_examples"])
"""


def test_a_script_under_mpiexec_trains_with_mpips_train(small_data, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(train=small_data[0], test=small_data[1],
                                    out=str(tmp_path / "out")))
    done = subprocess.run([mpiexec_path(), "-n", "3", sys.executable, str(script)],
                          capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("refused: --epochs must be at least 1, got 0") == 3, done.stdout
    assert done.stdout.count("refused: print_schedule is the command line's") == 3, done.stdout
    [line] = [x for x in done.stdout.splitlines() if x.startswith("logloss")]
    assert float(line.split()[1]) == read_summary(tmp_path / "out")["test_logloss"]
    assert int(line.split()[2]) == 2 * 20000
