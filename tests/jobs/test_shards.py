"""Binary CSR shards: converting in parallel, splitting by rows, training from them."""
import shutil

import numpy as np
import pytest
from support import read_summary, run_job

from mpips.models.evaluate import read_rows
from mpips.storage.model_files import load_model
from mpips.data.samples import features_per_row
from mpips.data.shards import CsrShard


@pytest.fixture(scope="module")
def converted(small_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("bin") / "train.bin"
    job = run_job(3, "convert", small_data[0], out)   # 3 ranks, 3 parts
    assert job.returncode == 0, job.output
    return out


def test_parallel_conversion_keeps_every_row_in_order(small_data, converted):
    text, binary = read_rows(small_data[0]), CsrShard(converted)
    assert len(binary.parts) == 3 and all(len(p) > 0 for p in binary.parts)
    rows = read_rows(converted)
    for field in ("labels", "indptr", "indices", "values"):
        np.testing.assert_array_equal(getattr(rows, field), getattr(text, field))
    assert features_per_row(str(converted)) == pytest.approx(10.0)


@pytest.mark.parametrize("nparts", [1, 2, 4, 7])
def test_workers_split_the_rows_between_them(converted, nparts):
    pieces = [CsrShard(converted, part, nparts) for part in range(nparts)]
    labels = []
    for piece in pieces:
        for batch in piece.minibatches(333):
            labels.append(batch.labels)
        assert piece.fraction_done == 1.0
    np.testing.assert_array_equal(np.concatenate(labels), read_rows(converted).labels)


def test_training_from_shards_equals_training_from_text(small_data, converted, tmp_path):
    models = []
    for name, source in (("text", small_data[0]), ("binary", converted)):
        job = run_job(2, "train", "--train", source, "--out", tmp_path / name, "--epochs", 2)
        assert job.returncode == 0, job.output
        models.append(load_model(tmp_path / name / "model"))
    # One worker reads the same rows in the same order either way: the same model, bit for bit.
    np.testing.assert_array_equal(models[0][0], models[1][0])
    np.testing.assert_array_equal(models[0][1], models[1][1])
    assert read_summary(tmp_path / "binary")["train_examples"] == 2 * 20000


def test_convert_refuses_to_overwrite_on_every_rank(small_data, converted):
    job = run_job(2, "convert", small_data[0], converted, timeout=60)
    assert job.returncode == 2 and job.stderr.count("exists; choose another output") == 1


def test_overwrite_of_a_converted_dataset_removes_only_what_convert_wrote(small_data, converted,
                                                                        tmp_path):
    """A user's files beside a converted dataset (a raw file, a folder of notes) stay when
    --overwrite replaces it, and are named; the parts of the old conversion go. (The old
    conversion: a copy of `converted`, 3 ranks' parts.)"""
    out = tmp_path / "bin"
    shutil.copytree(converted, out)
    (out / "raw.csv").write_text("a,b\n")
    (out / "sub").mkdir()
    (out / "sub" / "keep.txt").write_text("keep me")
    job = run_job(2, "convert", small_data[0], out, "--overwrite", timeout=60)
    assert job.returncode == 0, job.output
    assert (out / "raw.csv").read_text() == "a,b\n" and (out / "sub" / "keep.txt").exists()
    assert "not written by mpips: raw.csv, sub" in job.output, job.output
    assert sorted(p.name for p in out.glob("part-*")) == sorted(
        f"part-{r:04d}.{a}.npy" for r in range(2) for a in ("labels", "indptr", "indices",
                                                             "values")), "rank 2's part is gone"


def test_overwrite_replaces_only_a_converted_dataset(small_data, tmp_path):
    precious = tmp_path / "results"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    job = run_job(2, "convert", small_data[0], precious, "--overwrite", timeout=60)
    assert job.returncode == 2 and "is not a converted dataset" in job.stderr
    assert (precious / "notes.txt").read_text() == "keep me"
