"""Damaged, changed and shrinking data: a clear error naming the file, at once, never a hang
or a crash; a resume never trains silently on data that changed under it.

To add a case: damage a copy of a dataset the way a disk, a copy or a user would, and assert
the job's exit status, that it ends well within its --timeout, and what it names.
"""
import gzip
import json
import os
import shutil
import time

import h5py
import numpy as np
import pytest
from support import read_summary, refusal, run_here, run_job

from mpips.data import textfile as data
from mpips.storage.checkpoint import read_manifest
from mpips.data.shards import check_examples, spans
from mpips.data.textfile import TextShard
from mpips.base.errors import ConfigError, InputError

# 1 server and 2 workers (each worker reads its own part of the data: what these tests
# damage); the test of the servers' tables launches 2 servers.
ARGS = ("--batch-size", 200, "--epochs", 4, "--checkpoint-every", 15, "--servers", 1)


@pytest.fixture(scope="module")
def converted(small_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("bin") / "train.bin"
    job = run_job(2, "convert", small_data[0], out)
    assert job.returncode == 0, job.output
    return out


@pytest.fixture(scope="module")
def trained(small_data, tmp_path_factory):
    """A run trained on the sound text, for the tests that score damaged data with it."""
    run = tmp_path_factory.mktemp("trained") / "run"
    job = run_job(3, "train", "--train", small_data[0], "--out", run, "--batch-size", 200)
    assert job.returncode == 0, job.output
    return run


def copy_of(converted, tmp_path):
    dst = tmp_path / "train.bin"
    shutil.copytree(converted, dst)
    return dst


def train(source, run, *extra, timeout=60, ranks=3):
    """A job that would wait 600 s for a missing rank; the tests give it 60 to fail."""
    started = time.monotonic()
    job = run_job(ranks, "train", "--train", source, "--out", run, *ARGS, *extra,
                  timeout=timeout)
    job.seconds = time.monotonic() - started
    return job


@pytest.mark.parametrize("damage", ["truncated", "missing", "wrong-type"])
def test_a_damaged_part_is_named_before_any_rank_waits(converted, tmp_path, damage):
    """The check every rank makes of --train before it waits for any other (check_input, in
    `config_checks.check`). A truncated part is launched under mpiexec: the job stops at once,
    saying it once; the other damages are found by the same check, here in this process."""
    dataset = copy_of(converted, tmp_path)
    victim = dataset / "part-0001.indices.npy"
    if damage == "truncated":
        os.truncate(victim, os.path.getsize(victim) - 1000)
    elif damage == "missing":
        os.remove(victim)
    else:
        np.save(victim, np.load(victim).astype(np.int64))
    expected = {"truncated": "bytes, where its header makes it", "missing": "missing from the "
                "dataset", "wrong-type": "holds int64"}[damage]
    if damage != "truncated":
        status, said = refusal(["--train", dataset, "--out", tmp_path / "run", *ARGS], 3)
        assert status == 2 and f"{victim}: " in said and expected in said, said
        return
    job = train(dataset, tmp_path / "run")
    assert job.returncode == 2, job.output
    assert f"{victim}: " in job.stderr and expected in job.stderr
    assert job.stderr.count("mpips train: error:") == 1
    assert job.seconds < 30, "not held in a barrier until --timeout"


def corrupt_indptr(dataset, row: int, value: int) -> str:
    path = dataset / "part-0000.indptr.npy"
    indptr = np.load(path, mmap_mode="r+")
    indptr[row] = value
    indptr.flush()
    return str(path)


def test_a_corrupt_row_pointer_is_an_error_not_a_segfault(converted, small_data, tmp_path):
    dataset = copy_of(converted, tmp_path)
    path = corrupt_indptr(dataset, 5000, 10**12)
    job = train(dataset, tmp_path / "run")
    assert job.returncode == 2, job.output
    assert f"{path}: row pointer 5000 is 1000000000000, out of order" in job.stderr
    scored = run_here("score", tmp_path / "run", "--test", dataset)
    assert scored.returncode == 2 and "Traceback" not in scored.output


def test_score_on_a_corrupt_shard_says_which_file(converted, trained, tmp_path):
    dataset = copy_of(converted, tmp_path)
    path = corrupt_indptr(dataset, 10, -7)
    scored = run_here("score", trained, "--test", dataset)
    assert scored.returncode == 2, scored.output
    assert f"mpips: error: {path}: row pointer 10 is -7" in scored.stderr
    assert "Traceback" not in scored.output


def test_a_label_that_is_not_0_or_1_in_a_shard_is_named(converted, tmp_path):
    dataset = copy_of(converted, tmp_path)
    labels = np.load(dataset / "part-0001.labels.npy", mmap_mode="r+")
    labels[3] = 7.0
    labels.flush()
    job = train(dataset, tmp_path / "run")
    assert job.returncode == 2
    assert "part-0001.labels.npy: label of row 3 is 7.0, not 0 or 1" in job.stderr


def test_a_forged_count_of_distinct_keys_sizes_no_table_past_the_data(converted, tmp_path):
    """Servers size their tables by meta.json's estimate: one edited to 10^15 keys (16 PB of
    table) is held to the keys the parts hold, and the job trains as before."""
    dataset = copy_of(converted, tmp_path)
    meta = json.loads((dataset / "meta.json").read_text())
    servers = ("--servers", 2)   # each sizes its part of the table
    job = train(dataset, tmp_path / "run", *servers, ranks=4)
    assert job.returncode == 0, job.output
    (dataset / "meta.json").write_text(json.dumps({**meta, "distinct_keys": 10**15}))
    forged = train(dataset, tmp_path / "forged", *servers, ranks=4)
    assert forged.returncode == 0, forged.output
    run, forged = read_summary(tmp_path / "run"), read_summary(tmp_path / "forged")
    for figure in ("train_logloss", "keys_stored"):
        assert forged[figure] == run[figure]
    assert run["server_bytes"] < forged["server_bytes"] < meta["nnz"] * 1.1 / 0.9 * 24 + 4096


def test_a_value_that_is_not_finite_stops_training_naming_the_clock(converted, tmp_path):
    dataset = copy_of(converted, tmp_path)
    values = np.load(dataset / "part-0001.values.npy", mmap_mode="r+")
    values[500] = np.nan
    values.flush()
    run = tmp_path / "run"
    job = train(dataset, run, "--epochs", 1)
    assert job.returncode != 0
    assert "the training loss became nan at clock" in job.stderr
    assert f"of {dataset}); nothing of it was pushed" in job.stderr
    with h5py.File(run / "model" / "server-0000.h5") as f:
        assert np.isfinite(f["weights"][:]).all(), "the model kept is finite"


def edit_labels_in_place(path):
    """Flip every label: the file keeps its size."""
    text = open(path).read().splitlines()
    flipped = [("0" if line[0] == "1" else "1") + line[1:] for line in text]
    stat = os.stat(path)
    with open(path, "w") as f:
        f.write("\n".join(flipped) + "\n")
    assert os.path.getsize(path) == stat.st_size


def test_resuming_on_edited_data_is_refused_unless_allowed(small_data, tmp_path):
    source = tmp_path / "train.svm"
    shutil.copy(small_data[0], source)
    run = tmp_path / "run"
    assert train(source, run).returncode == 0
    edit_labels_in_place(source)
    refused = train(source, run, "--resume", run / "checkpoints")
    assert refused.returncode == 2, refused.output
    assert f"--train {source} changed since" in refused.stderr
    assert "its first or last MiB differ" in refused.stderr and "modified" in refused.stderr
    allowed = train(source, run, "--resume", run / "checkpoints", "--allow-changed-data",
                    "--epochs", 6)
    assert allowed.returncode == 0, allowed.output


def test_resuming_on_a_shortened_file_if_allowed_goes_on_from_valid_places(small_data,
                                                                            tmp_path):
    """A third cut off the end, mid-line: each worker goes on from the place its checkpoint
    recorded (a row start still: the bytes before the cut did not change) and trains exactly
    the rows that start from there to the end of its part of the shortened file; the cut line
    is the one bad line, or a row."""
    source = tmp_path / "train.svm"
    shutil.copy(small_data[0], source)
    run = tmp_path / "run"
    args = ("--epochs", 1, "--checkpoint-every", 10, "--keep-checkpoints", 100)
    whole = train(source, run, *args)
    assert whole.returncode == 0
    mid = run / "checkpoints" / f"clock-{10:012d}"   # a fifth into the epoch: byte offsets
    ckpt = tmp_path / "ckpt"
    shutil.copytree(mid, ckpt / mid.name)
    os.truncate(source, os.path.getsize(source) * 2 // 3 + 17)   # and mid-line
    refused = train(source, tmp_path / "again", *args, "--resume", ckpt)
    assert refused.returncode == 2 and "size" in refused.stderr
    allowed = train(source, tmp_path / "again", *args, "--resume", ckpt,
                    "--allow-changed-data", "--skip-bad-lines")
    assert allowed.returncode == 0, allowed.output
    assert "Traceback" not in allowed.output
    text = source.read_bytes()
    assert not text.endswith(b"\n"), "the cut is mid-line"
    positions = read_manifest(ckpt / mid.name)["positions"]
    rows_left = 0
    for worker, (lo, hi) in enumerate(spans(str(source), 2)):
        place = positions[str(worker)]["offset"]
        assert lo < place < hi and text[place - 1:place] == b"\n", \
            f"worker {worker}'s place {place} is a row start of its part [{lo}, {hi})"
        rows_left += text.count(b"\n", place - 1, hi - 1)   # rows that start in [place, hi)
    s = read_summary(tmp_path / "again")
    assert s["train_examples_this_launch"] > 0
    assert s["train_examples_this_launch"] + s["bad_lines"] == rows_left, \
        "each worker trained the rows from its place to the end of its part, once"
    assert s["bad_lines"] <= 1


@pytest.mark.parametrize("text, extra, says", [
    ("# nothing\n\n   \n# here\n", (), "no examples, only blank lines and comments"),
    ("id,click,hour,C1,banner_pos\n", (), "no examples, only blank lines and comments"),
    ("2 1:1\n\nx\n", ("--skip-bad-lines",), "no examples: its 2 line(s) are all bad"),
    ("2 1:1\n\nx\n", (), ":1: label must be one of -1, 0, +1, 1"),
], ids=["comments", "avazu-header", "bad-lines-skipped", "bad-lines"])
def test_a_file_without_examples_is_refused_before_anything_is_written(tmp_path, text, extra,
                                                                        says):
    """The last rank reads up to the first example before any work (check_examples): each
    way a file can hold none is found by it here in this process, and the first is also
    launched under mpiexec (every rank stops, the message said once, nothing written)."""
    empty, run = tmp_path / "empty.txt", tmp_path / "run"
    empty.write_text(text)
    try:
        check_examples(str(empty), "--train", "--skip-bad-lines" in extra)
    except ConfigError as e:
        assert f"{empty}" in str(e) and says in str(e), str(e)
    else:
        pytest.fail(f"{text!r} was taken for data with examples")
    if text != "# nothing\n\n   \n# here\n":
        return
    job = run_job(3, "train", "--train", empty, "--out", run, *extra, timeout=60)
    assert job.returncode == 2, job.output
    assert f"{empty}" in job.stderr and says in job.stderr, job.output
    assert job.stderr.count("mpips train: error:") == 1 and "Traceback" not in job.output
    assert not run.exists(), "nothing written to --out"


def test_workers_whose_parts_hold_no_examples_are_no_error(tmp_path):
    few = tmp_path / "few.svm"
    few.write_text("# two examples, for three workers\n1 1:1\n" + "#\n" * 200 + "0 2:1\n")
    job = run_job(4, "train", "--train", few, "--out", tmp_path / "run", timeout=60)
    assert job.returncode == 0, job.output
    assert read_summary(tmp_path / "run")["train_examples"] == 2


def test_a_file_that_shrinks_while_read_is_an_error(tmp_path):
    path = tmp_path / "shrinks.svm"
    path.write_text("1 1:1 2:1\n" * 200000)
    shard = TextShard(str(path), chunk_bytes=1 << 16)
    rows = shard.rows()
    next(rows)
    os.truncate(path, 100000)
    with pytest.raises(InputError, match=r"shrinks\.svm: ends at byte .* but was 2,000,000 "
                                         r"bytes long when the job opened it"):
        for _ in rows:
            pass


def test_a_line_longer_than_the_bound_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "MAX_LINE_BYTES", 1 << 20)
    path = tmp_path / "long.svm"
    path.write_text("1 1:1\n0 2:1\n1 " + "3:1 " * 400000 + "\n")
    with pytest.raises(InputError, match=r"long\.svm:3: a line longer than 1 MiB"):
        list(TextShard(str(path), chunk_bytes=1 << 16).rows())


def test_score_with_a_malformed_test_file_or_a_directory_says_so(trained, tmp_path):
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:1\n1 oops\n")
    for test, says in ((bad, f"{bad}:2: feature index is not a non-negative integer"),
                       (tmp_path, "not a converted dataset"),
                       (tmp_path / "nothing.svm", "no such file")):
        scored = run_here("score", trained, "--test", test)
        assert scored.returncode == 2, scored.output
        assert says in scored.stderr and "Traceback" not in scored.output


@pytest.mark.parametrize("command", ["train", "convert", "score"])
def test_compressed_input_is_refused_saying_how_to_read_it(small_data, tmp_path, command,
                                                            request):
    packed = tmp_path / "train.svm.gz"
    with open(small_data[0], "rb") as src, gzip.open(packed, "wb") as dst:
        shutil.copyfileobj(src, dst)
    if command == "train":
        job = run_job(3, "train", "--train", packed, "--out", tmp_path / "run", timeout=60)
    elif command == "convert":
        job = run_job(2, "convert", packed, tmp_path / "bin", timeout=60)
    else:
        job = run_here("score", request.getfixturevalue("trained"), "--test", packed)
    assert job.returncode == 2, job.output
    assert f"{packed}: gzip-compressed" in job.stderr and f"gunzip -k {packed}" in job.stderr
    assert "Traceback" not in job.output
