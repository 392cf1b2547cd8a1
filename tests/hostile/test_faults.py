"""Signals to single ranks, frozen ranks and resumes with surprising options: every rank that
is asked to stop stops the job cleanly, nothing waits without a bound, and the figures a
resumed run reports are of what it did.

To add a case: launch a WatchedJob, act on one rank through `pid_of_rank` (SIGTERM, SIGSTOP,
SIGKILL) once the job says it is where you want it, and assert how the job ends.
"""
import os
import signal

import numpy as np
import pytest
from support import read_summary, run_job
from watch import WatchedJob, complete_checkpoints, frozen, pid_of_rank

from mpips.model_io import load_model

EPOCHS = 3
ARGS = ("--servers", 2, "--batch-size", 100, "--epochs", EPOCHS, "--checkpoint-every", 25)


@pytest.fixture(scope="module")
def uninterrupted(small_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("whole") / "run"
    job = run_job(4, "train", "--train", small_data[0], "--out", run, *ARGS)
    assert job.returncode == 0, job.output
    return run


def launch(small_data, run, *extra):
    return WatchedJob(4, "train", "--train", small_data[0], "--out", run, *ARGS, *extra)


@pytest.mark.parametrize("rank, signum", [(3, signal.SIGTERM), (1, signal.SIGUSR1)],
                         ids=["SIGTERM-to-worker-1", "SIGUSR1-to-server-1"])
def test_a_stop_signal_to_any_one_rank_stops_the_job_with_a_checkpoint(
        small_data, uninterrupted, tmp_path, rank, signum):
    run = tmp_path / "run"
    job = launch(small_data, run, "--straggler", "0:2")
    job.wait_for("checkpoint at clock")
    os.kill(pid_of_rank(run, rank), signum)
    ended = job.finish()
    assert ended.returncode == 75, ended.output
    stopped = read_summary(run)["stopped_at_clock"]
    assert any(f"clock-{stopped:012d}" in p for p in complete_checkpoints(run / "checkpoints"))
    resumed = run_job(4, "train", "--train", small_data[0], "--out", run, *ARGS,
                      "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    ours, theirs = load_model(run / "model"), load_model(uninterrupted / "model")
    np.testing.assert_array_equal(ours[1], theirs[1])


def test_a_resumed_run_reports_the_rate_of_its_own_launch(small_data, tmp_path):
    run = tmp_path / "run"
    job = launch(small_data, run)
    job.wait_for("checkpoint at clock")
    os.kill(job.proc.pid, signal.SIGUSR1)
    assert job.finish().returncode == 75
    before = read_summary(run)["train_examples"]
    resumed = run_job(4, "train", "--train", small_data[0], "--out", run, *ARGS,
                      "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    s = read_summary(run)
    assert s["train_examples"] == EPOCHS * 20000
    assert s["train_examples_this_launch"] == EPOCHS * 20000 - before
    assert s["examples_per_s"] == pytest.approx(s["train_examples_this_launch"] / s["train_s"])


def test_resuming_past_the_requested_epochs_says_so(small_data, uninterrupted, tmp_path):
    job = run_job(4, "train", "--train", small_data[0], "--out", tmp_path / "run",
                  *ARGS[:4], "--epochs", 2, "--resume", uninterrupted / "checkpoints")
    assert job.returncode == 0, job.output
    assert (f"has gone beyond --epochs 2 (its workers are at epoch {EPOCHS}): nothing is left "
            f"to train") in job.output
    assert read_summary(tmp_path / "run")["train_examples_this_launch"] == 0


def test_a_frozen_worker_fails_the_job_within_the_bound_naming_it(small_data, tmp_path):
    run = tmp_path / "run"
    job = launch(small_data, run, "--timeout", 4, "--epochs", 40)
    job.wait_for("training: epoch")
    with frozen(pid_of_rank(run, 3)):
        ended = job.finish(timeout=60)
    assert ended.returncode != 0
    # Whichever notices first, the held worker or the servers, names the frozen one.
    assert "the slowest is worker 1 (rank 3)" in ended.output, ended.output
    assert "saved the" in ended.output and "keys trained so far" in ended.output


def test_a_frozen_server_fails_the_job_within_the_bound_naming_it(small_data, tmp_path):
    run = tmp_path / "run"
    job = launch(small_data, run, "--timeout", 4, "--epochs", 40)
    job.wait_for("training: epoch")
    with frozen(pid_of_rank(run, 1)):
        ended = job.finish(timeout=60)
    assert ended.returncode != 0
    assert "no reply yet from server rank(s) [1]" in ended.output


def test_a_killed_server_with_copies_but_no_ulfm_falls_back_to_its_checkpoint(
        small_data, uninterrupted, tmp_path):
    """Copies alone do not keep a job alive: without ULFM a dead rank ends the launch, and the
    resume (with copies) still ends on the uninterrupted model, bit for bit."""
    run = tmp_path / "run"
    job = launch(small_data, run, "--replicas", 2)
    job.wait_for("checkpoint at clock")
    os.kill(pid_of_rank(run, 1), signal.SIGKILL)
    ended = job.finish(timeout=120)
    assert ended.returncode != 0
    resumed = run_job(4, "train", "--train", small_data[0], "--out", run, *ARGS,
                      "--replicas", 2, "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    ours, theirs = load_model(run / "model"), load_model(uninterrupted / "model")
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])


@pytest.mark.parametrize("rank, says", [
    (3, "the losses of worker(s) [1] at this point: they said nothing for --timeout 4 s"),
    (1, "no reply yet from server rank(s) [1]")], ids=["worker-1", "server-1"])
def test_a_frozen_rank_of_a_full_batch_job_fails_it_within_the_bound_naming_it(
        small_data, tmp_path, rank, says):
    run = tmp_path / "run"
    job = WatchedJob(4, "train", "--train", small_data[0], "--out", run, "--servers", 2,
                     "--solver", "lbfgs", "--tol", 0, "--max-iter", 100000, "--timeout", 4)
    job.wait_for("iteration 3:")
    with frozen(pid_of_rank(run, rank)):
        ended = job.finish(timeout=60)
    assert ended.returncode != 0
    assert says in ended.output


PIPELINE = ("--model", "widedeep", "--embedding-dim", 4, "--hidden", "16,8", "--stages", 2)


def test_a_frozen_stage_of_a_pipeline_fails_the_job_within_the_bound_naming_it(small_data,
                                                                                tmp_path):
    """Stage 1 (worker 1, rank 3) frozen: stage 0 waits for its gradients, the servers for
    its clock; whichever notices first names it."""
    run = tmp_path / "run"
    job = launch(small_data, run, *PIPELINE, "--timeout", 4, "--epochs", 40)
    job.wait_for("training: epoch")
    with frozen(pid_of_rank(run, 3)):
        ended = job.finish(timeout=60)
    assert ended.returncode != 0
    assert ("from stage 1" in ended.output or
            "stage 1 of pipeline 0 (worker 1, rank 3)" in ended.output or
            "the slowest is worker 1 (rank 3)" in ended.output), ended.output


def test_a_stop_signal_to_a_later_stage_stops_the_pipeline_with_a_checkpoint(small_data,
                                                                             tmp_path):
    whole = tmp_path / "whole"
    job = run_job(4, "train", "--train", small_data[0], "--out", whole, *ARGS, *PIPELINE)
    assert job.returncode == 0, job.output
    run = tmp_path / "run"
    job = launch(small_data, run, *PIPELINE)
    job.wait_for("checkpoint at clock")
    os.kill(pid_of_rank(run, 3), signal.SIGTERM)
    ended = job.finish()
    assert ended.returncode == 75, ended.output
    resumed = run_job(4, "train", "--train", small_data[0], "--out", run, *ARGS, *PIPELINE,
                      "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    np.testing.assert_array_equal(load_model(run / "model")[1], load_model(whole / "model")[1])


def test_a_stop_under_asp_stops_every_stage_with_a_checkpoint(small_data, tmp_path):
    """Under ASP stage 0's read may be answered just before the servers stop and its later
    stages' refused: they run the step they are in, push nothing, and stop with it."""
    run = tmp_path / "run"
    job = launch(small_data, run, *PIPELINE, "--consistency", "asp")
    job.wait_for("checkpoint at clock")
    os.kill(pid_of_rank(run, 2), signal.SIGTERM)
    ended = job.finish()
    assert ended.returncode == 75, ended.output
    resumed = run_job(4, "train", "--train", small_data[0], "--out", run, *ARGS, *PIPELINE,
                      "--consistency", "asp", "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    assert read_summary(run)["train_examples"] == EPOCHS * 20000
