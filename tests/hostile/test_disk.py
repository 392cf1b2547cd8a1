"""Full disks, for real: small tmpfs file systems filled with a ballast file. What was trained
is kept, nothing half-written is left behind, and the job says in one line what it needed.

To add a case: mount a tmpfs, `fill` it to the space you want, and watch what the job says.
"""
import glob
import os

import h5py
import numpy as np
import pytest
from support import read_summary, run_job
from mounts import fill, tmpfs
from watch import WatchedJob, complete_checkpoints, wait_for_lines

from mpips.storage.model_files import load_model

# 2 servers and 1 worker: 100 clocks (2 epochs of 20,000 rows in minibatches of 400).
ARGS = ("--servers", 2, "--batch-size", 400, "--epochs", 2)


@pytest.fixture(scope="module")
def reference(small_data, tmp_path_factory):
    """The same job on a disk with room: the model every case must end with."""
    run = tmp_path_factory.mktemp("reference") / "run"
    job = run_job(3, "train", "--train", small_data[0], "--out", run, *ARGS)
    assert job.returncode == 0, job.output
    return load_model(run / "model")


def temporary_files(directory) -> list:
    return glob.glob(os.path.join(directory, "**", "*.tmp*"), recursive=True)


def assert_same_model(run, reference):
    keys, weights = load_model(run / "model")
    np.testing.assert_array_equal(keys, reference[0])
    np.testing.assert_array_equal(weights, reference[1])


def test_a_full_out_keeps_the_model_until_space_is_freed(small_data, reference, tmp_path):
    """Each server fails to write its part of the model, says so and waits for space (up to
    --disk-wait): once both are parked there, the user frees space."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        run = disk / "run"
        ballast = fill(disk, leave=16 << 10)    # room for the lock and the summary only
        job = WatchedJob(3, "train", "--train", small_data[0], "--out", run, *ARGS,
                         "--disk-wait", 120)
        for line in wait_for_lines(job, "is kept in memory", 2):   # server 0 and server 1
            assert "No space left on device (it needs about" in line and "free in" in line
        assert not temporary_files(run), "the failed attempts left nothing behind"
        os.remove(ballast)                      # the user frees space
        ended = job.finish()
        assert ended.returncode == 0, ended.output
        assert "wrote the trained model after all" in ended.output
        assert "Traceback" not in ended.output
        assert_same_model(run, reference)
        assert read_summary(run)["train_examples"] == 2 * 20000


def test_a_full_out_that_stays_full_says_so_in_one_line(small_data, tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        run = disk / "run"
        fill(disk, leave=16 << 10)
        job = run_job(3, "train", "--train", small_data[0], "--out", run, *ARGS,
                      "--checkpoint-dir", tmp_path / "ckpt", "--checkpoint-every", 20,
                      "--disk-wait", 1, timeout=120)
        assert job.returncode != 0
        assert "could not be saved: cannot write" in job.output
        assert "gave up after waiting 1 s for space" in job.output
        assert f"the newest checkpoint, {tmp_path / 'ckpt'}/clock-" in job.output
        assert "Traceback" not in job.output and "h5py" not in job.output
        assert not temporary_files(run)


def test_failed_checkpoints_do_not_stop_training(small_data, reference, tmp_path):
    """Two checkpoints (clock 60 and the final one at 100) on a full disk: fewer than three
    in a row, so the job trains on and ends with the model it would have had."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        fill(disk, leave=8 << 10)
        run = tmp_path / "run"
        job = run_job(3, "train", "--train", small_data[0], "--out", run, *ARGS,
                      "--checkpoint-dir", disk / "ckpt", "--checkpoint-every", 60)
        assert job.returncode == 0, job.output
        assert job.output.count("was not written") == 2
        assert "training goes on, and stops if 3 in a row fail" in job.output
        assert not temporary_files(disk / "ckpt") and not complete_checkpoints(disk / "ckpt")
        assert_same_model(run, reference)


def test_checkpoints_failing_in_a_row_stop_the_job_and_keep_the_model(small_data, tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        fill(disk, leave=8 << 10)
        run = tmp_path / "run"
        job = run_job(3, "train", "--train", small_data[0], "--out", run, *ARGS,
                      "--checkpoint-dir", disk / "ckpt", "--checkpoint-every", 10,
                      timeout=120)
        assert job.returncode != 0
        assert "3 checkpoints in a row could not be written" in job.output
        assert "No space left on device" in job.output
        assert not temporary_files(disk / "ckpt")
        for server in (0, 1):
            with h5py.File(run / "model" / f"server-{server:04d}.h5") as f:
                assert not f.attrs["complete"] and "checkpoints in a row" in f.attrs["note"]
                assert f["keys"].shape[0] > 0


def test_checkpoints_failing_in_a_row_keep_the_model_until_space_is_freed(small_data, tmp_path):
    """--out, its checkpoints with it, on a full disk: three checkpoints fail in a row and the
    job stops. What it trained waits for space (--disk-wait) as a finished model does: once
    server 0 says so, the user frees space, and every server's part is written."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        run = disk / "run"
        ballast = fill(disk, leave=16 << 10)    # room for the lock only
        job = WatchedJob(3, "train", "--train", small_data[0], "--out", run, *ARGS,
                         "--checkpoint-every", 10, "--disk-wait", 120)
        line = job.wait_for("the model trained so far is kept in memory")
        assert "No space left on device (it needs about" in line
        os.remove(ballast)                      # the user frees space
        ended = job.finish()
        # (checked once the job has ended: another server's writer of the last failed
        # checkpoint may still be at work when the lead says the third failed)
        assert not temporary_files(run), "the failed attempts left nothing behind"
        assert ended.returncode != 0, ended.output
        assert "3 checkpoints in a row could not be written" in ended.output
        assert "wrote the model trained so far after all" in ended.output
        assert "could not save" not in ended.output and "Traceback" not in ended.output
        keys, weights = load_model(run / "model", allow_partial=True)   # every key range
        assert keys.shape[0] > 0 and np.isfinite(weights).all()
        for server in (0, 1):
            with h5py.File(run / "model" / f"server-{server:04d}.h5") as f:
                assert not f.attrs["complete"] and "checkpoints in a row" in f.attrs["note"]
