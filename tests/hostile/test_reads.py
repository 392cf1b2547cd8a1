"""Reads that must not lie: a model or checkpoint whose files fail their checksums, a
full-batch model, test data of another format than the training data's or of keys the model
never saw. Each is refused with a message naming the file, scored properly, or warned of,
by `mpips.load`, `mpips score`, `mpips inspect` and `train --test` alike.

Real jobs train the models; the damage is done to their files as a disk or a careless copy
would (a weight overwritten in place, checksums stripped as in a model written before mpips
kept them).
"""
import json
import logging
import shutil

import h5py
import numpy as np
import pytest
from support import read_summary, run_job, run_mpips

import mpips
from mpips.storage.checkpoint import all_checkpoints
from mpips.models.evaluate import read_rows
from mpips.kernels.logistic import mean_logloss

QUICK = ("--batch-size", 200, "--epochs", 1)
HUGE = np.float32(1.9e37)   # what the damaged weight of issue 30 read


@pytest.fixture(scope="module")
def run(small_data, tmp_path_factory):
    """A minibatch model of svmlight data, 2 servers, with checkpoints."""
    out = tmp_path_factory.mktemp("reads") / "run"
    job = run_job(4, "train", "--train", small_data[0], "--test", small_data[1], "--out", out,
                  "--servers", 2, "--checkpoint-every", 20, *QUICK)
    assert job.returncode == 0, job.output
    return out


@pytest.fixture(scope="module")
def lbfgs_run(small_data, tmp_path_factory):
    """A full-batch model (--solver lbfgs), with a checkpoint."""
    out = tmp_path_factory.mktemp("reads") / "lbfgs"
    job = run_job(4, "train", "--train", small_data[0], "--test", small_data[1], "--out", out,
                  "--servers", 2, "--solver", "lbfgs", "--dim", 4096, "--l2", 1e-3,
                  "--max-iter", 15, "--tol", 0, "--checkpoint-every", 5)
    assert job.returncode == 0, job.output
    return out


def overwrite_first_value(path, dataset: str, value: np.ndarray) -> None:
    """Write `value`'s bytes over the first element of `dataset` in the file itself, as a
    bad disk or a stray write would: HDF5 still reads the file."""
    with h5py.File(path, "r") as f:
        offset = f[dataset].id.get_offset()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(value.tobytes())


def logloss(p: np.ndarray, labels: np.ndarray) -> float:
    return float(mean_logloss(np.log(p) - np.log1p(-p), labels))


def no_traceback(job) -> None:
    assert "Traceback" not in job.output, job.output


def test_a_model_file_that_fails_its_checksum_is_read_by_nothing(run, small_data, tmp_path):
    sound = run_mpips("inspect", run)
    assert sound.returncode == 0, sound.output
    assert sound.stdout.count("checksums match") == 2 and "trained on svmlight" in sound.stdout
    damaged = tmp_path / "model"
    shutil.copytree(run / "model", damaged)
    overwrite_first_value(damaged / "server-0001.h5", "weights", HUGE)
    why = "server-0001.h5: dataset weights does not match its checksum"
    with pytest.raises(ValueError, match=why):
        mpips.load(damaged)
    job = run_mpips("score", damaged, "--test", small_data[1])
    assert job.returncode == 2 and why in job.stderr, job.output
    no_traceback(job)
    job = run_mpips("inspect", damaged)
    assert job.returncode == 1, job.output
    assert f"NOT USABLE: {damaged}/{why}" in job.stdout, job.stdout
    assert "server-0000.h5: checksums match" in job.stdout, "the sound file is told apart"


def test_a_checkpoint_that_fails_its_checksum_is_not_loaded(run, tmp_path):
    last = all_checkpoints(str(run / "checkpoints"))[0]
    damaged = tmp_path / "clock"
    shutil.copytree(last, damaged)
    overwrite_first_value(damaged / "server-0000.h5", "state", HUGE)
    with pytest.raises(ValueError, match="server-0000.h5: dataset state does not match its "
                                         "checksum"):
        mpips.load(damaged)
    mpips.load(last)   # the sound one


def test_a_model_without_checksums_is_read_with_a_warning(run, small_data, tmp_path):
    """As a model written before mpips kept checksums: read, and said to be unverified."""
    old = tmp_path / "model"
    shutil.copytree(run / "model", old)
    for path in old.glob("server-*.h5"):
        with h5py.File(path, "r+") as f:
            del f.attrs["sha256"]
    ours, theirs = mpips.load(old), mpips.load(run)
    np.testing.assert_array_equal(ours.weights(theirs.keys), theirs.weights(theirs.keys))
    job = run_mpips("score", old, "--test", small_data[1])
    assert job.returncode == 0, job.output
    assert ("server-0000.h5, server-0001.h5 carry no checksums (written before mpips kept "
            "them): read without verifying") in job.stderr, job.stderr
    assert f"logloss {read_summary(run)['test_logloss']:.4f}" in job.stdout
    job = run_mpips("inspect", old)
    assert job.returncode == 0 and job.stdout.count("no checksums") == 2, job.output


def test_a_full_batch_model_scores_as_its_job_did(lbfgs_run, small_data, tmp_path):
    summary = read_summary(lbfgs_run)
    job = run_mpips("score", lbfgs_run, "--test", small_data[1], "--json", tmp_path / "s.json")
    assert job.returncode == 0, job.output
    scored = json.loads((tmp_path / "s.json").read_text())
    assert scored["logloss"] == pytest.approx(summary["test_logloss"], rel=1e-12)
    assert scored["auc"] == pytest.approx(summary["test_auc"], rel=1e-12)
    assert scored["logloss"] < 0.69, "not a constant model"
    model = mpips.load(lbfgs_run)
    labels = read_rows(small_data[1]).labels
    assert logloss(model.predict_proba(small_data[1]), labels) == pytest.approx(
        summary["test_logloss"], rel=1e-9)
    # Its last checkpoint (iteration 15) holds the same weights.
    last = mpips.load(all_checkpoints(str(lbfgs_run / "checkpoints"))[0])
    np.testing.assert_array_equal(last.w, model.w)
    key = np.uint64(4096 * 7 + 5)
    assert model.weights(key)[0, 0] == model.w[5]


def test_train_refuses_test_data_of_another_format(criteo, small_data, tmp_path):
    for train, test, trained, found in ((criteo[0], small_data[1], "criteo", "svmlight"),
                                        (small_data[0], criteo[1], "svmlight", "criteo")):
        job = run_job(3, "train", "--train", train, "--test", test, "--out", tmp_path / found,
                      *QUICK)
        assert job.returncode == 2, job.output
        assert (f"--test {test} is {found} data, but the model (--train {train}) was trained "
                f"on {trained} data") in job.stderr, job.stderr
        assert job.stderr.count("is criteo data") + job.stderr.count("is svmlight data") == 1
    converted = tmp_path / "criteo.bin"
    assert run_job(2, "convert", criteo[0], converted).returncode == 0
    job = run_job(3, "train", "--train", converted, "--test", small_data[1], "--out",
                  tmp_path / "bin", *QUICK)
    assert job.returncode == 2, job.output
    assert f"(--train {converted}) was trained on criteo data" in job.stderr, job.stderr


def test_score_and_predict_refuse_test_data_of_another_format(run, criteo):
    why = f"{criteo[1]} is criteo data, but the model in {run}/model was trained on svmlight"
    job = run_mpips("score", run, "--test", criteo[1])
    assert job.returncode == 2 and why in job.stderr, job.output
    no_traceback(job)
    with pytest.raises(ValueError, match=f"{criteo[1]} is criteo data, but the model from "
                                         f"{run}/model was trained on svmlight data"):
        mpips.load(run).predict_proba(criteo[1])


def shifted(path: str, out) -> str:
    """The rows of svmlight file `path` with every feature index moved far past the
    training data's: the same format, keys the model never saw."""
    lines = []
    for line in open(path):
        label, *features = line.split()
        moved = [f"{int(i) + 10**12}:{v}" for i, v in (f.split(":") for f in features)]
        lines.append(" ".join([label, *moved]))
    out.write_text("\n".join(lines) + "\n")
    return str(out)


def test_test_data_of_unknown_keys_is_warned_of(run, small_data, tmp_path, caplog):
    unknown = shifted(small_data[1], tmp_path / "unknown.svm")
    warning = "knows only 0.00% of the distinct feature keys of " + unknown
    job = run_mpips("score", run, "--test", unknown)
    assert job.returncode == 0 and warning in job.stderr, job.output
    with caplog.at_level(logging.WARNING, logger="mpips"):
        mpips.load(run).predict_proba(unknown)
    assert warning in caplog.text
    sound = run_mpips("score", run, "--test", small_data[1])
    assert "knows only" not in sound.output, "the test data of the run is not warned of"
    assert read_summary(run)["test_keys_known"] > 0.9
    job = run_job(3, "train", "--train", small_data[0], "--test", unknown, "--out",
                  tmp_path / "run", *QUICK)
    assert job.returncode == 0, job.output
    known = read_summary(tmp_path / "run")["test_keys_known"]
    assert known < 0.01, known
    assert f"knows only {100 * known:.2f}% of the distinct feature keys of {unknown}" in \
        job.stderr, job.stderr
