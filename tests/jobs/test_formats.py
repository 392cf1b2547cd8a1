"""Criteo-format input as whole jobs: make-data writes it, convert takes it in parallel, and
a job trains on it (text or converted) to a model that has learned the planted one."""
import numpy as np
import pytest
from conftest import read_summary, run_job, run_mpips

from mpips.evaluate import read_rows
from mpips.model_io import load_model


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("criteo") / "c"
    job = run_mpips("make-data", "--format", "criteo", "--rows", 20000, "--test-rows", 5000,
                    "--features", 20000, "--seed", 4, prefix)
    assert job.returncode == 0, job.output
    return f"{prefix}.train.tsv", f"{prefix}.test.tsv"


def test_a_job_learns_from_criteo_text_and_its_conversion_alike(criteo, tmp_path):
    converted = tmp_path / "train.bin"
    job = run_job(3, "convert", criteo[0], converted)
    assert job.returncode == 0, job.output
    text = read_rows(criteo[0])
    binary = read_rows(converted)
    for field in ("labels", "indptr", "indices", "values"):
        np.testing.assert_array_equal(getattr(binary, field), getattr(text, field))
    models = []
    for name, source in (("text", criteo[0]), ("binary", converted)):
        run = tmp_path / name
        job = run_job(2, "train", "--train", source, "--test", criteo[1], "--format", "criteo",
                      "--out", run, "--epochs", 3, "--lr", 0.06)   # (a text sample's estimate
        # of the features per row would set a rate a little apart from the exact count's)
        assert job.returncode == 0, job.output
        models.append(load_model(run / "model"))
    np.testing.assert_array_equal(models[0][1], models[1][1])   # one worker, same rows
    s = read_summary(tmp_path / "text")
    base = np.mean(read_rows(criteo[1]).labels)
    entropy = -(base * np.log(base) + (1 - base) * np.log(1 - base))
    print(f"criteo-format test logloss {s['test_logloss']:.4f}, base rate {entropy:.4f}")
    assert s["test_logloss"] < 0.9 * entropy and s["test_auc"] > 0.7
