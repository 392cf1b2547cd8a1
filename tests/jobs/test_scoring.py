"""Scoring the test file on every rank (testscoring), in whole jobs: each row scored once,
the same figures whoever scored it, bad lines counted once."""
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
from support import ctl_answers, fired, read_summary, run_here, run_job, run_mpips

from mpips.job.scoring import core_to_spare

ARGS = ("--batch-size", 100, "--epochs", 2)


def spare_core(ranks_on_node: int) -> bool:
    """Whether a server of a job of that many ranks on this machine takes chunks."""
    return core_to_spare(SimpleNamespace(ranks_on_node=lambda: ranks_on_node))


TEST_ROWS = 100_000


@pytest.fixture(scope="module")
def long_test(tmp_path_factory):
    """small_data's kind of rows, with a test file long enough (tens of milliseconds to
    score) that a worker scheduled late on a loaded machine still finds chunks left: with a
    spare core a server takes chunks too, and scored 10,000 rows alone once."""
    prefix = tmp_path_factory.mktemp("long_test") / "s"
    job = run_mpips("make-data", "--rows", 20000, "--test-rows", TEST_ROWS, "--features",
                    2000, "--nnz", 10, "--seed", 3, prefix)
    assert job.returncode == 0, job.output
    return f"{prefix}.train.svm", f"{prefix}.test.svm"


@pytest.mark.parametrize("servers, workers", [(1, 1), (2, 2)])
def test_every_row_is_scored_once_and_as_the_saved_model_scores_it(long_test, tmp_path,
                                                                   servers, workers):
    runs = []
    for attempt in range(2):
        run = tmp_path / f"run{attempt}"
        job = run_job(servers + workers, "train", "--train", long_test[0], "--test",
                      long_test[1], "--servers", servers, "--out", run, *ARGS)
        assert job.returncode == 0, job.output
        runs.append(read_summary(run))
    s = runs[0]
    by_rank = s["test_examples_by_rank"]
    assert len(by_rank) == servers + workers and sum(by_rank) == s["test_examples"] == TEST_ROWS
    # The chunks go to whoever asks: a rank scheduled late on a loaded machine may find none
    # left, so only that the rows were shared is asked (each rank's share is shown by
    # test_worker_failover, whose ranks wait for each other at a chunk).
    scorers = by_rank if spare_core(servers + workers) else by_rank[servers:]
    assert sum(n > 0 for n in scorers) >= min(2, len(scorers)), by_rank
    if not spare_core(servers + workers):
        assert by_rank[:servers] == [0] * servers, f"oversubscribed, servers do not: {by_rank}"
    # Whichever rank scored which chunk, the figures are the same bits (summed in one order).
    assert runs[1]["test_logloss"] == s["test_logloss"] and runs[1]["test_auc"] == s["test_auc"]
    offline = run_here("score", tmp_path / "run0", "--test", long_test[1], "--json",
                        tmp_path / "score.json")
    assert offline.returncode == 0, offline.output
    with open(tmp_path / "score.json") as f:
        scored = json.load(f)
    assert scored["logloss"] == s["test_logloss"] and scored["auc"] == s["test_auc"]   # bits


def test_bad_test_lines_are_skipped_and_counted_once(small_data, tmp_path):
    """Chunks of text are spans of bytes: a line is read by the chunk it starts in."""
    test = tmp_path / "test.svm"
    with open(small_data[1]) as f:
        lines = f.readlines()
    bad = {7, 2500, 5001, 9998}
    with open(test, "w") as f:
        for i, line in enumerate(lines):
            f.write("1 this:is:not a row\n" if i in bad else line)
    run = tmp_path / "run"
    job = run_job(2, "train", "--train", small_data[0], "--test", test, "--servers", 1,
                  "--out", run, "--skip-bad-lines", *ARGS)
    assert job.returncode == 0, job.output
    s = read_summary(run)
    assert s["test_examples"] == len(lines) - len(bad) and s["bad_lines"] == len(bad)


def test_a_damaged_test_file_is_named_and_the_trained_model_saved(small_data, tmp_path):
    data = tmp_path / "test.bin"
    assert run_job(2, "convert", small_data[1], data).returncode == 0
    path = data / "part-0001.indptr.npy"
    indptr = np.load(path, mmap_mode="r+")
    indptr[1234] = 10 ** 12
    indptr.flush()
    run = tmp_path / "run"
    job = run_job(2, "train", "--train", small_data[0], "--test", data, "--servers", 1,
                  "--out", run, *ARGS, timeout=120)
    assert job.returncode != 0
    assert f"{path}: row pointer 1234 is 1000000000000" in job.stderr
    assert "Traceback" not in job.output
    assert os.path.exists(run / "model" / "server-0000.h5"), "the trained model is kept"


def test_a_stopped_job_scores_nothing(small_data, tmp_path):
    """A worker that left (and so had finished) waits while the others train; when the job
    is stopped instead (a checkpoint holds the model), the lead hands out no chunk: nobody
    scores, and the job exits at once for its requeue. The lead asks worker 1 to leave at
    clock 10; worker 0 (rank 1), some 30 clocks after it has left, is signalled to stop as on
    Slurm's warning (SIGUSR1)."""
    run = tmp_path / "run"
    leave, stop = "ctl remove-worker 1 at clock 10", "stop rank 1 at clock 40"
    # 100 clocks an epoch per worker: worker 0 trains on well past clock 40.
    stopped = run_job(3, "train", "--train", small_data[0], "--test", small_data[1],
                      "--servers", 1, "--out", run, "--epochs", 2, "--batch-size", 100,
                      "--test-event", leave, "--test-event", stop)
    assert stopped.returncode == 75, stopped.output[-3000:]
    fired(stopped, leave)
    fired(stopped, stop)
    for event, clock in ((leave, 10), (stop, 40)):   # exactly there
        assert f"test event: {event} (reached clock {clock})" in stopped.output
    [left] = ctl_answers(run)
    assert left["ok"] and left["command"] == "remove-worker" and left["target"] == 1, left
    assert left["clock"] < 40, left
    s = read_summary(run)
    assert s["status"] == "stopped" and s["test_examples"] == 0, s["test_examples_by_rank"]
    assert s["test_logloss"] is None
