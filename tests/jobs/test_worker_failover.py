"""Hot failover of workers: a worker of a job launched with ULFM dies (SIGKILL) or freezes
(SIGSTOP) mid-run; the servers agree on the clocks of it they all hold, its rows left go to
the other workers, and the job finishes, exit 0, having trained every example once per epoch
and scored the whole test file."""
import os
import shutil
import signal

import pytest
from support import ULFM, read_summary, run_job
from watch import WatchedJob, complete_checkpoints, frozen_to_the_end, pid_of_rank

from mpips.checkpoint import read_manifest

# 2 servers + 3 workers (ranks 2, 3, 4); about 33 clocks an epoch each.
ARGS = ("--servers", 2, "--epochs", 16, "--batch-size", 200, "--checkpoint-every", 100,
        "--log-every", 0.2, "--timeout", 60)
ROWS, TEST_ROWS = 20000, 10000


def launch(small_data, run, *extra):
    return WatchedJob(5, "train", "--train", small_data[0], "--test", small_data[1],
                      "--out", run, *ARGS, *extra, launcher=ULFM)


@pytest.fixture(scope="module")
def uninterrupted(small_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("whole") / "run"
    job = run_job(5, "train", "--train", small_data[0], "--test", small_data[1], "--out", run,
                  *ARGS)
    assert job.returncode == 0, job.output
    return read_summary(run)


def check_handed_on(run, ended, uninterrupted) -> dict:
    assert ended.returncode == 0, ended.output
    assert "worker 1 (rank 3) died" in ended.output
    assert "worker 1's rows left" in ended.output and "go to worker(s) [0, 2]" in ended.output
    s = read_summary(run)
    assert s["train_examples"] == 16 * ROWS, "every example once per epoch"
    assert s["test_examples"] == TEST_ROWS, "the dead worker's share of the test file too"
    [failure] = s["failures"]
    assert failure["worker"] == 1 and failure["clocks_kept"] <= failure["clocks_held"]
    gap = abs(s["test_logloss"] - uninterrupted["test_logloss"]) / uninterrupted["test_logloss"]
    assert gap < 0.005, (s["test_logloss"], uninterrupted["test_logloss"])
    return s


@pytest.fixture(scope="module")
def handed_on(small_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("killed") / "run"
    job = launch(small_data, run)
    job.wait_for("checkpoint at clock 100")
    os.kill(pid_of_rank(run, 3), signal.SIGKILL)
    return run, job.finish(timeout=180)


def test_a_killed_workers_rows_go_to_the_others(handed_on, uninterrupted):
    run, ended = handed_on
    s = check_handed_on(run, ended, uninterrupted)
    print(f"worker 1 killed at clock {s['failures'][0]['clocks_kept']}; "
          f"{s['failures'][0]['pushes_dropped']} of its pushes dropped")


def test_a_checkpoint_written_after_a_workers_death_resumes_with_its_rows_handed_on(
        handed_on, small_data, tmp_path):
    """The manifest records the death; resumed with every rank again, the worker that died
    trains nothing more (its rows are the others'), and every example is trained once."""
    run, _ = handed_on
    after = [os.path.dirname(p) for p in complete_checkpoints(run / "checkpoints")
             if read_manifest(os.path.dirname(p)).get("deaths")]
    assert after, "checkpoints after the death record it"
    manifest = read_manifest(after[0])
    assert manifest["positions"]["1"]["lost"] and manifest["deaths"][0]["worker"] == 1
    ckpt = tmp_path / "ckpt"
    shutil.copytree(after[0], ckpt / os.path.basename(after[0]))
    again = tmp_path / "again"
    job = run_job(5, "train", "--train", small_data[0], "--test", small_data[1], "--out",
                  again, *ARGS, "--resume", ckpt)
    assert job.returncode == 0, job.output
    s = read_summary(again)
    assert s["train_examples"] == 16 * ROWS and s["test_examples"] == TEST_ROWS
    assert s["worker_examples"][1] == manifest["positions"]["1"]["examples"], \
        "the worker that had died trained nothing more"


def test_under_asp_a_killed_workers_rows_go_to_the_others(small_data, uninterrupted,
                                                          tmp_path):
    run = tmp_path / "run"
    job = launch(small_data, run, "--consistency", "asp")
    job.wait_for("checkpoint at clock 100")
    os.kill(pid_of_rank(run, 3), signal.SIGKILL)
    ended = job.finish(timeout=180)
    assert ended.returncode == 0, ended.output
    s = read_summary(run)
    assert s["train_examples"] == 16 * ROWS and s["test_examples"] == TEST_ROWS


def test_a_frozen_worker_counts_as_dead_and_its_rows_go_to_the_others(small_data,
                                                                     uninterrupted, tmp_path):
    run = tmp_path / "run"
    job = launch(small_data, run)
    job.wait_for("checkpoint at clock 100")
    check_handed_on(run, frozen_to_the_end(job, pid_of_rank(run, 3)), uninterrupted)
