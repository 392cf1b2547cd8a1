"""Signals to single ranks, frozen ranks and resumes with surprising options: every rank that
is asked to stop stops the job cleanly, nothing waits without a bound, and the figures a
resumed run reports are of what it did.

To add a case: name the point where a rank is signalled, frozen or killed with
`--test-event` (see mpips/run/testevents.py), assert with `fired` that it happened, and assert how
the job ends. A frozen rank stays frozen to the end of the job (the launcher ends it).
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from support import DETECTOR_S, ULFM, fired, mpiexec_path, read_summary, run_job
from watch import WatchedJob, complete_checkpoints, ended_with_a_frozen_rank

from mpips.ranks import ulfm
from mpips.storage.model_files import load_model

# 2 servers + 2 workers (ranks 2, 3): 100 clocks an epoch each, a checkpoint every 25.
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


def checkpoint_clocks(run) -> list:
    """The clocks of the complete checkpoints of `run`."""
    return [int(os.path.basename(os.path.dirname(p))[len("clock-"):])
            for p in complete_checkpoints(run / "checkpoints")]


@pytest.fixture(scope="module")
def stopped(small_data, tmp_path_factory):
    """stopped(event): (run, the stopped job, its summary, the clocks of its checkpoints, the
    resume, the resumed summary) of a job stopped by the signal of `event`, then resumed in
    place (once per event)."""
    runs = {}

    def stop_and_resume(event):
        if event not in runs:
            run = tmp_path_factory.mktemp("stopped") / "run"
            ended = launch(small_data, run, "--test-event", event).finish(timeout=300)
            before = read_summary(run) if ended.returncode == 75 else None
            clocks = checkpoint_clocks(run)
            resumed = run_job(4, "train", "--train", small_data[0], "--out", run, *ARGS,
                              "--resume", run / "checkpoints") if before else None
            runs[event] = (run, ended, before, clocks, resumed,
                           read_summary(run) if resumed and resumed.returncode == 0 else None)
        return runs[event]
    return stop_and_resume


TERM_WORKER_1 = "term rank 3 at clock 30"


@pytest.mark.parametrize("event", [TERM_WORKER_1, "stop rank 1 at clock 30"],
                         ids=["SIGTERM-to-worker-1", "SIGUSR1-to-server-1"])
def test_a_stop_signal_to_any_one_rank_stops_the_job_with_a_checkpoint(
        stopped, uninterrupted, event):
    run, ended, before, clocks, resumed, _ = stopped(event)
    assert ended.returncode == 75, ended.output
    fired(ended, event)
    # Server 0 names two clocks past the slowest worker it knows of, at least 29 then.
    stop = before["stopped_at_clock"]
    assert 31 <= stop < EPOCHS * 100, stop
    assert stop in clocks
    assert resumed.returncode == 0, resumed.output
    assert f"resumed from checkpoint clock {stop}" in resumed.output
    ours, theirs = load_model(run / "model"), load_model(uninterrupted / "model")
    np.testing.assert_array_equal(ours[1], theirs[1])


def test_a_resumed_run_reports_the_rate_of_its_own_launch(stopped):
    """The run stopped by SIGTERM to worker 1 above, resumed in place."""
    _, ended, before, _, resumed, s = stopped(TERM_WORKER_1)
    assert ended.returncode == 75, ended.output
    fired(ended, TERM_WORKER_1)
    before = before["train_examples"]
    assert 0 < before < EPOCHS * 20000
    assert resumed.returncode == 0, resumed.output
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
    freeze = "freeze rank 3 at clock 30"
    job = launch(small_data, run, "--timeout", 4, "--test-event", freeze)
    ended = ended_with_a_frozen_rank(job, run, freeze)
    assert ended.returncode != 0
    fired(ended, freeze)
    # Whichever notices first, the held worker or the servers, names the frozen one.
    assert "the slowest is worker 1 (rank 3)" in ended.output, ended.output
    assert "saved the" in ended.output and "keys trained so far" in ended.output


def test_a_frozen_server_fails_the_job_within_the_bound_naming_it(small_data, tmp_path):
    run = tmp_path / "run"
    freeze = "freeze rank 1 at clock 30"
    job = launch(small_data, run, "--timeout", 4, "--test-event", freeze)
    ended = ended_with_a_frozen_rank(job, run, freeze)
    assert ended.returncode != 0
    fired(ended, freeze)
    assert "no reply yet from server rank(s) [1]" in ended.output


def test_a_killed_server_with_copies_but_no_ulfm_falls_back_to_its_checkpoint(
        small_data, uninterrupted, tmp_path):
    """Copies alone do not keep a job alive: without ULFM a dead rank ends the launch, and the
    resume (with copies) still ends on the uninterrupted model, bit for bit. Server 1 dies
    having written its file of the second checkpoint (clock 50), which never completes: the
    resume starts from the first (clock 25)."""
    run = tmp_path / "run"
    kill = "kill rank 1 at checkpoint 2"
    ended = launch(small_data, run, "--replicas", 2, "--test-event", kill).finish(timeout=300)
    assert ended.returncode != 0
    fired(ended, kill)
    assert checkpoint_clocks(run) == [25]
    resumed = run_job(4, "train", "--train", small_data[0], "--out", run, *ARGS,
                      "--replicas", 2, "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    assert "resumed from checkpoint clock 25" in resumed.output
    ours, theirs = load_model(run / "model"), load_model(uninterrupted / "model")
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])


@pytest.mark.parametrize("rank, says", [
    (3, "the losses of worker(s) [1] at this point: they said nothing for --timeout 4 s"),
    (1, "no reply yet from server rank(s) [1]")], ids=["worker-1", "server-1"])
def test_a_frozen_rank_of_a_full_batch_job_fails_it_within_the_bound_naming_it(
        small_data, tmp_path, rank, says):
    """The driver (worker 0) freezes the rank as it finishes iteration 3; without the freeze
    the job would end after 20."""
    run = tmp_path / "run"
    freeze = f"freeze rank {rank} at iteration 3"
    job = WatchedJob(4, "train", "--train", small_data[0], "--out", run, "--servers", 2,
                     "--solver", "lbfgs", "--tol", 0, "--max-iter", 20, "--timeout", 4,
                     "--test-event", freeze)
    ended = ended_with_a_frozen_rank(job, run, freeze)
    assert ended.returncode != 0
    fired(ended, freeze)
    assert says in ended.output


# One pipeline of two stages (workers 0 and 1): 200 clocks an epoch, one epoch (after ARGS,
# whose --epochs it overrides).
PIPELINE_EPOCHS = 1
PIPELINE = ("--model", "widedeep", "--embedding-dim", 4, "--hidden", "16,8", "--stages", 2,
            "--epochs", PIPELINE_EPOCHS)


def test_a_frozen_stage_of_a_pipeline_fails_the_job_within_the_bound_naming_it(small_data,
                                                                                tmp_path):
    """Stage 1 (worker 1, rank 3) frozen: stage 0 waits for its gradients, the servers for
    its clock; whichever notices first names it."""
    run = tmp_path / "run"
    freeze = "freeze rank 3 at clock 30"
    job = launch(small_data, run, *PIPELINE, "--timeout", 4, "--test-event", freeze)
    ended = ended_with_a_frozen_rank(job, run, freeze)
    assert ended.returncode != 0
    fired(ended, freeze)
    assert ("from stage 1" in ended.output or
            "stage 1 of pipeline 0 (worker 1, rank 3)" in ended.output or
            "the slowest is worker 1 (rank 3)" in ended.output), ended.output


def test_a_stop_signal_to_a_later_stage_stops_the_pipeline_with_a_checkpoint(small_data,
                                                                             tmp_path):
    whole = tmp_path / "whole"
    job = run_job(4, "train", "--train", small_data[0], "--out", whole, *ARGS, *PIPELINE)
    assert job.returncode == 0, job.output
    run = tmp_path / "run"
    term = "term rank 3 at clock 30"
    ended = launch(small_data, run, *PIPELINE, "--test-event", term).finish(timeout=300)
    assert ended.returncode == 75, ended.output
    fired(ended, term)
    assert read_summary(run)["stopped_at_clock"] in checkpoint_clocks(run)
    resumed = run_job(4, "train", "--train", small_data[0], "--out", run, *ARGS, *PIPELINE,
                      "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    np.testing.assert_array_equal(load_model(run / "model")[1], load_model(whole / "model")[1])


def test_a_stop_under_asp_stops_every_stage_with_a_checkpoint(small_data, tmp_path):
    """Under ASP stage 0's read may be answered just before the servers stop and its later
    stages' refused: they run the step they are in, push nothing, and stop with it."""
    run = tmp_path / "run"
    term = "term rank 2 at clock 30"
    ended = launch(small_data, run, *PIPELINE, "--consistency", "asp", "--test-event",
                   term).finish(timeout=300)
    assert ended.returncode == 75, ended.output
    fired(ended, term)
    resumed = run_job(4, "train", "--train", small_data[0], "--out", run, *ARGS, *PIPELINE,
                      "--consistency", "asp", "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    assert read_summary(run)["train_examples"] == PIPELINE_EPOCHS * 20000


@pytest.mark.parametrize("checkpoints, advice", [
    ((), "checkpoints were off (--checkpoint-every): run it again from the start"),
    (("--checkpoint-every", 1000), "it died before its first checkpoint was complete (none in "),
], ids=["checkpoints off", "none complete yet"])
def test_a_death_before_any_checkpoint_does_not_advise_a_resume(small_data, tmp_path,
                                                                checkpoints, advice):
    """A server without copies killed at clock 5, under ULFM: the job stops (exit 75), and
    with no checkpoint to continue from it says to start again, not to --resume a directory
    that holds none."""
    run = tmp_path / "run"
    kill = "kill rank 1 at clock 5"
    ended = run_job(4, "train", "--train", small_data[0], "--out", run, "--servers", 2,
                    "--batch-size", 100, *checkpoints, "--test-event", kill, launcher=ULFM)
    assert ended.returncode == 75, ended.output
    fired(ended, kill)
    assert advice in ended.output, ended.output
    assert "--resume" not in ended.output, ended.output


def test_a_rank_busy_outside_mpi_past_the_detectors_bound_is_not_taken_for_dead(small_data,
                                                                               tmp_path):
    """ULFM's detector declares a rank silent for 6 s dead; a worker computes for 12 s
    without calling MPI, as a compile or the parse of a big chunk does. mpips's own thread
    answers the detector for it (failover.KeepAlive): no death. (The suite's detector: a
    shorter one could take a live rank of this loaded machine for dead.)"""
    run = tmp_path / "run"
    busy = f"busy rank 3 for {2 * DETECTOR_S} s at clock 30"
    job = run_job(4, "train", "--train", small_data[0], "--out", run, *ARGS, "--replicas", 2,
                  "--test-event", busy, launcher=ULFM)
    assert job.returncode == 0, job.output
    fired(job, busy)
    assert read_summary(run)["failures"] == [], job.output


LEAVING_RANKS = """
import os, sys
from mpi4py import MPI
from mpips.ranks import ulfm
from mpips.ranks.bounded import wait_until
ulfm.job_communicator(MPI.COMM_WORLD)
MPI.COMM_WORLD.Barrier()
# Every rank leaves, as after a death none survives, each learning of it only once the next
# rank on the node has (the reverse of their order, as a loaded node may spread them): the
# first ranks to leave must wait for those before them to arrive and go. An event, not a
# moment: each rank arrives once the next one's file says it has.
here = sys.argv[1]
local = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
if local + 1 < int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"]):
    wait_until(lambda: os.path.exists(f"{here}/arrived-{local + 1}"), 10,
               lambda: f"local rank {local + 1} to arrive")
open(f"{here}/arrived-{local}", "w").close()
ulfm.leave_after_failure(ulfm.LOST)
"""


def test_ranks_that_all_leave_after_a_failure_at_once_end_the_launch(tmp_path):
    """Open MPI's launcher under ULFM now and then waited forever once 5 ranks had all left
    with an error at the same moment (7 of 60 launches, before a node's ranks left 20 ms
    apart; with them learning of the failure in reverse order, which undid that spacing, 3
    of 120, before each waited for those before it to have left). Here they learn of it in
    reverse order, each once the next has. Each of 20 launches ends (in well under a
    second), with the job's status."""
    script = tmp_path / "leave.py"
    script.write_text(LEAVING_RANKS)
    for attempt in range(20):
        arrivals = tmp_path / f"launch-{attempt}"
        arrivals.mkdir()
        ended = subprocess.run([mpiexec_path(), *ULFM, "-n", "5", sys.executable, str(script),
                                str(arrivals)], capture_output=True, text=True, timeout=20)
        assert ended.returncode == ulfm.LOST, (attempt, ended.stdout + ended.stderr)
