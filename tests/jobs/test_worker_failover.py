"""Hot failover of workers: a worker of a job launched with ULFM dies (SIGKILL) or freezes
(SIGSTOP) mid-run, at a clock the test names (--test-event); the servers agree on the clocks
of it they all hold, its rows left go to the other workers, and the job finishes, exit 0,
having trained every example once per epoch and scored the whole test file."""
import json
import os
import shutil

import pytest
from support import ULFM, fired, read_summary, run_job, run_mpips
from watch import WatchedJob, complete_checkpoints, frozen_by_event_to_the_end, wait_for_file

from mpips.storage.checkpoint import read_manifest
from mpips.ranks.exits import NOT_SCORED
from mpips.run.testevents import record

# 2 servers + 3 workers (ranks 2, 3, 4); 34 clocks an epoch each, a checkpoint every 25
# clocks (all kept). Worker 1 (rank 3) dies at its clock 40, in its second epoch: every push
# of it up to clock 40 was acknowledged by every server, none after was sent.
EPOCHS = 4
ARGS = ("--servers", 2, "--epochs", EPOCHS, "--batch-size", 200, "--checkpoint-every", 25,
        "--keep-checkpoints", 20, "--log-every", 0.2, "--timeout", 60)
ROWS, TEST_ROWS = 20000, 10000
DIES_AT = 40
KILL = f"kill rank 3 at clock {DIES_AT}"


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
    assert s["train_examples"] == EPOCHS * ROWS, "every example once per epoch"
    assert s["test_examples"] == TEST_ROWS, "the dead worker's share of the test file too"
    [failure] = s["failures"]
    assert failure["worker"] == 1
    assert failure["clocks_kept"] == failure["clocks_held"] == DIES_AT, failure
    assert failure["pushes_dropped"] == 0, "it sent no push after the clock it died at"
    gap = abs(s["test_logloss"] - uninterrupted["test_logloss"]) / uninterrupted["test_logloss"]
    assert gap < 0.005, (s["test_logloss"], uninterrupted["test_logloss"])
    return s


@pytest.fixture(scope="module")
def handed_on(small_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("killed") / "run"
    return run, launch(small_data, run, "--test-event", KILL).finish(timeout=300)


def test_a_killed_workers_rows_go_to_the_others(handed_on, uninterrupted):
    run, ended = handed_on
    fired(ended, KILL)
    s = check_handed_on(run, ended, uninterrupted)
    print(f"worker 1 killed at clock {s['failures'][0]['clocks_kept']}; "
          f"{s['failures'][0]['pushes_dropped']} of its pushes dropped")


def test_a_checkpoint_written_after_a_workers_death_resumes_with_its_rows_handed_on(
        handed_on, small_data, tmp_path):
    """The manifest records the death; resumed with every rank again, the worker that died
    trains nothing more (its rows are the others'), and every example is trained once."""
    run, _ = handed_on
    kept = [os.path.dirname(p) for p in complete_checkpoints(run / "checkpoints")]
    deaths = {int(os.path.basename(d)[len("clock-"):]): read_manifest(d).get("deaths")
              for d in kept}
    # It died at clock 40: the checkpoint at 25 was before, the one at 50 the first after.
    assert sorted(deaths)[:2] == [25, 50] and not deaths[25], deaths
    after = [d for d in kept if read_manifest(d).get("deaths")]
    assert os.path.basename(after[0]) == f"clock-{50:012d}", "checkpoints after the death " \
                                                             "record it"
    manifest = read_manifest(after[0])
    assert manifest["positions"]["1"]["lost"] and manifest["deaths"][0]["worker"] == 1
    assert manifest["positions"]["1"]["clock"] == DIES_AT
    ckpt = tmp_path / "ckpt"
    shutil.copytree(after[0], ckpt / os.path.basename(after[0]))
    again = tmp_path / "again"
    job = run_job(5, "train", "--train", small_data[0], "--test", small_data[1], "--out",
                  again, *ARGS, "--resume", ckpt)
    assert job.returncode == 0, job.output
    s = read_summary(again)
    assert s["train_examples"] == EPOCHS * ROWS and s["test_examples"] == TEST_ROWS
    assert s["worker_examples"][1] == manifest["positions"]["1"]["examples"], \
        "the worker that had died trained nothing more"


def test_under_asp_a_killed_workers_rows_go_to_the_others(small_data, uninterrupted,
                                                          tmp_path):
    """Workers 0 and 2 (ranks 2, 4) pause at their clock 50 until worker 1 has died at its
    clock 40: under ASP nothing else keeps them from finishing their rows first on a loaded
    machine, which leaves worker 1's rows to nobody (the last test here)."""
    run, go = tmp_path / "run", tmp_path / "go"
    others = [f"pause rank {r} until {go} at clock 50" for r in (2, 4)]
    job = launch(small_data, run, "--consistency", "asp",
                 *(a for e in [KILL, *others] for a in ("--test-event", e)))
    wait_for_file(job, record(run, KILL))   # the kill fired: the others go on
    go.touch()
    ended = job.finish(timeout=300)
    assert ended.returncode == 0, ended.output
    for event in (KILL, *others):
        fired(ended, event)
    s = read_summary(run)
    assert [f["worker"] for f in s["failures"]] == [1]
    assert s["train_examples"] == EPOCHS * ROWS and s["test_examples"] == TEST_ROWS


def test_a_frozen_worker_counts_as_dead_and_its_rows_go_to_the_others(small_data,
                                                                     uninterrupted, tmp_path):
    run = tmp_path / "run"
    freeze = f"freeze rank 3 at clock {DIES_AT}"
    job = launch(small_data, run, "--test-event", freeze)
    ended = frozen_by_event_to_the_end(job, run, 3, freeze)
    fired(ended, freeze)
    check_handed_on(run, ended, uninterrupted)


@pytest.mark.parametrize("event", ["kill rank 3 at scoring", "kill rank 3 at chunk 2",
                                   "freeze rank 3 at scoring"])
def test_a_worker_dead_while_scoring_leaves_its_chunks_to_the_others(small_data, uninterrupted,
                                                                     tmp_path, event):
    """The model is whole: the living workers score the whole test file, the dead worker's
    chunks too (at chunk 2 it dies holding the scores of two), with the same figures, bit
    for bit, as the uninterrupted run's. For `chunk 2`, the other workers pause at their own
    second chunk until worker 1 has died: worker 1 (rank 3) is sure to be handed a second."""
    run = tmp_path / "run"
    go = tmp_path / "go"
    others = [f"pause rank {r} until {go} at chunk 2" for r in (2, 4)] \
        if event.endswith("chunk 2") else []
    job = launch(small_data, run, *(a for e in [event, *others] for a in ("--test-event", e)))
    if others:
        wait_for_file(job, record(run, event))   # the kill fired: the others go on
        go.touch()
    ended = (frozen_by_event_to_the_end(job, run, 3, event) if event.startswith("freeze")
             else job.finish(timeout=300))
    assert ended.returncode == 0, ended.output
    fired(ended, event)
    if others:
        assert "worker 1 died holding the scores of 2 chunk(s) of the test file" in ended.output
    s = read_summary(run)
    assert s["status"] == "complete" and s["test_examples"] == TEST_ROWS
    assert s["train_examples"] == EPOCHS * ROWS
    assert (s["test_logloss"], s["test_auc"]) == (uninterrupted["test_logloss"],
                                                  uninterrupted["test_auc"])


def scores_as_uninterrupted(run, test, uninterrupted, tmp_path) -> None:
    """`mpips score RUN --test TEST` gives the uninterrupted run's figures, bit for bit."""
    scored = run_mpips("score", run, "--test", test, "--json", tmp_path / "score.json")
    assert scored.returncode == 0, scored.output
    with open(tmp_path / "score.json") as f:
        figures = json.load(f)
    assert (figures["logloss"], figures["auc"]) == (uninterrupted["test_logloss"],
                                                    uninterrupted["test_auc"])


def test_scores_lost_with_the_lead_end_the_job_trained_not_scored(small_data, uninterrupted,
                                                                  tmp_path):
    """The lead dies as training ends (--replicas 2: its keys live on): the next lead does
    not know what it handed out, so the job says that the model is whole and how to score it,
    and exits 76; scoring it so gives the uninterrupted run's figures, bit for bit."""
    run = tmp_path / "run"
    kill = "kill rank 0 at scoring"
    ended = launch(small_data, run, "--replicas", 2, "--test-event", kill).finish(timeout=300)
    assert ended.returncode == NOT_SCORED, ended.output
    fired(ended, kill)
    advice = f"score it with `python -m mpips score {run} --test {small_data[1]}`"
    assert advice in ended.output and "Traceback" not in ended.output
    s = read_summary(run)
    assert s["status"] == "not scored" and s["test_logloss"] is None
    assert s["train_examples"] == EPOCHS * ROWS
    scores_as_uninterrupted(run, small_data[1], uninterrupted, tmp_path)


def test_the_rank_that_writes_the_summary_dies_and_the_launch_says_what_is_saved(
        small_data, uninterrupted, tmp_path):
    """Rank 0 dies with every figure and test score gathered to it, before it writes
    summary.json: the others, done, find it dead in their last wait. The launch does not end
    0 without a summary: it exits 76, saying once that the model is saved whole and how to
    score it; scoring it gives the uninterrupted run's figures."""
    run = tmp_path / "run"
    kill = "kill rank 0 at summary"
    ended = launch(small_data, run, "--test-event", kill).finish(timeout=300)
    assert ended.returncode == NOT_SCORED, ended.output
    fired(ended, kill)
    said = [line for line in ended.output.splitlines() if "which writes summary.json" in line]
    assert len(said) == 1, ended.output
    assert f"died at the job's end before it wrote {run / 'summary.json'}" in said[0]
    assert f"score it with `python -m mpips score {run} --test {small_data[1]}`" in said[0]
    assert "Traceback" not in ended.output
    assert not (run / "summary.json").exists()
    scores_as_uninterrupted(run, small_data[1], uninterrupted, tmp_path)


def test_a_worker_dead_with_rows_nobody_left_can_take_stops_every_rank(small_data, tmp_path):
    """Under ASP the others finish their rows before a frozen worker counts as dead: its
    rows left can go to nobody. Only the lead sees that; the job ends as usual, and then
    every rank stops for a resume (no summary of a model short of those rows)."""
    run = tmp_path / "run"
    freeze = f"freeze rank 3 at clock {EPOCHS * 34 - 4}"
    ended = launch(small_data, run, "--consistency", "asp", "--test-event", freeze)
    ended = frozen_by_event_to_the_end(ended, run, 3, freeze)
    assert ended.returncode == 75, ended.output
    assert "worker 1 died with rows left to train" in ended.output
    assert "could go to no living worker (see above): the model lacks them" in ended.output
    assert "continue from its last checkpoint with --resume" in ended.output
    assert not os.path.exists(run / "summary.json"), "no rank went on to a summary"
    resumed = run_job(5, "train", "--train", small_data[0], "--test", small_data[1], "--out",
                      run, *ARGS, "--consistency", "asp", "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    assert read_summary(run)["test_examples"] == TEST_ROWS
