"""Servers join and leave a running job (`mpips ctl`): a spare takes key ranges, a server
hands its ranges on and becomes a spare, and training goes on. Under BSP the model is bit for
bit that of an uninterrupted run; under SSP and ASP its held-out logloss is within 0.5%."""
import contextlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from support import ULFM, read_summary, run_job
from watch import WatchedJob, pid_of_rank

from mpips.model_io import load_model

# 2 servers, a spare (server 2) and 2 workers; 50 clocks an epoch per worker.
ARGS = ("--servers", 2, "--spares", 1, "--vnodes", 8, "--epochs", 40, "--batch-size", 200,
        "--log-every", 0.2, "--timeout", 60)


def ctl(run, *command, wait=True):
    """`mpips ctl RUN *COMMAND`, completed (or running, to be completed with `done`)."""
    proc = subprocess.Popen([sys.executable, "-m", "mpips", "ctl", str(run),
                             *map(str, command)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return done(proc) if wait else proc


def done(proc) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def train(small_data, run, consistency, watched=False, *extra):
    args = ("train", "--train", small_data[0], "--test", small_data[1], "--out", run, *ARGS,
            "--consistency", consistency, *(("--staleness", 2) if consistency == "ssp" else ()),
            *extra)
    return WatchedJob(5, *args) if watched else run_job(5, *args)


def same_model(a, b) -> None:
    ours, theirs = load_model(a / "model"), load_model(b / "model")
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])   # bit for bit


@pytest.fixture(scope="module", params=["bsp", "ssp", "asp"])
def runs(request, small_data, tmp_path_factory):
    """(uninterrupted run, run with a join then a leave, ctl's answers) of one consistency."""
    base = tmp_path_factory.mktemp(request.param)
    whole = train(small_data, base / "whole", request.param)
    assert whole.returncode == 0, whole.output
    moved = base / "moved"
    # BSP: worker 1 slowed down (the model does not depend on it), so that the job is still
    # training when the refusals and the leave come, however fast the machine.
    job = train(small_data, moved, request.param, True,
                *(("--straggler", "1:8") if request.param == "bsp" else ()))
    job.wait_for("training: epoch")
    joined = ctl(moved, "add-server")
    refused = {}
    if request.param == "bsp":
        with open(moved / "control" / "request-0-damaged.json", "w") as f:
            f.write('{"command": "add-server", "target": "one"}')
        asked = {"no spare": ("add-server",), "no such": ("remove-server", 7),
                 "a spare": ("add-server", 1), "worker": ("add-worker",)}
        running = {case: ctl(moved, *command, wait=False) for case, command in asked.items()}
        refused = {case: done(proc) for case, proc in running.items()}
    left = ctl(moved, "remove-server", 0, "--json")
    ended = job.finish(timeout=180)
    assert ended.returncode == 0, ended.output
    return request.param, base / "whole", moved, joined, left, ended, refused


def test_a_join_and_a_leave_move_about_a_share_each_and_lose_nothing(runs):
    consistency, whole, moved, joined, left, ended, _ = runs
    assert joined.returncode == 0, joined.stdout + joined.stderr + ended.output
    assert left.returncode == 0, left.stdout + left.stderr + ended.output
    # ctl says what moved, in words and (--json) in figures.
    assert "add-server done at clock" in joined.stdout and "training waited" in joined.stdout
    answer = json.loads(left.stdout)
    assert answer["ok"] and answer["command"] == "remove-server" and answer["target"] == 0
    moves = read_summary(moved)["moves"]
    assert [m["command"] for m in moves] == ["add-server", "remove-server"]
    for m, servers in zip(moves, (3, 3)):   # 3 owners after the join, 3 before the leave
        assert 0 < m["fraction_moved"] <= 1.5 / servers, m
        assert m["keys_moved"] > 0
        assert m["clock"] > m["copy_clock"], "training went on while the ranges were copied"
    assert moves[0]["ranges_after"] == {"0": 5, "1": 6, "2": 5}, "the spare took its share"
    assert moves[1]["ranges_after"]["0"] == 0 and moves[1]["spares"] == [0], "0 left"
    s = read_summary(moved)
    assert s["train_examples"] == read_summary(whole)["train_examples"], "no example lost"
    assert s["server_keys"][0] == 0, "the server that left holds nothing at the end"


def test_the_model_after_the_moves_is_the_uninterrupted_runs(runs):
    consistency, whole, moved, *_ = runs
    if consistency == "bsp":
        same_model(moved, whole)
        return
    ours, theirs = read_summary(moved)["test_logloss"], read_summary(whole)["test_logloss"]
    assert abs(ours - theirs) <= 0.005 * theirs, (ours, theirs)


def test_ctl_refuses_what_cannot_be_done_and_says_why(runs):
    consistency, whole, moved, *_, refused = runs
    if consistency != "bsp":
        pytest.skip("once is enough")
    says = {"no spare": "no spare server to add: start the job with --spares K",
            "no such": "there is no server 7: the job has 3 (0-2)",
            "a spare": "server 1 owns key ranges already",
            "worker": "no worker is idle to join"}
    for case, text in says.items():
        done = refused[case]
        assert done.returncode == 1 and f"refused: {text}" in done.stdout, (case, done.stdout,
                                                                           done.stderr)
    with open(moved / "control" / "answer-0-damaged.json") as f:
        damaged = json.load(f)
    assert not damaged["ok"] and "request-0-damaged.json: field 'target' is 'one'" in \
        damaged["error"], damaged
    gone = ctl(moved, "add-server")
    assert gone.returncode == 2 and "no job is training into" in gone.stderr, gone.stderr


def test_with_two_copies_of_each_key_a_join_and_a_leave_end_on_the_same_bits(small_data,
                                                                            tmp_path):
    """--replicas 2: a range's new holders (a new owner, a new backup) receive their copies
    while training goes on, beside the copies already kept; under BSP the model is the
    uninterrupted run's, bit for bit."""
    whole = train(small_data, tmp_path / "whole", "bsp", False, "--replicas", 2)
    assert whole.returncode == 0, whole.output
    moved = tmp_path / "moved"
    job = train(small_data, moved, "bsp", True, "--replicas", 2)
    job.wait_for("training: epoch")
    answers = [ctl(moved, "add-server", "--json"), ctl(moved, "remove-server", 1, "--json")]
    ended = job.finish(timeout=180)
    assert ended.returncode == 0, ended.output
    for answered in answers:
        assert answered.returncode == 0, answered.stdout + answered.stderr + ended.output
        answer = json.loads(answered.stdout)
        assert answer["keys_moved"] > 0 and answer["clock"] > answer["copy_clock"], answer
    same_model(moved, tmp_path / "whole")


def test_a_server_that_freezes_while_a_move_is_agreed_stops_the_job_resumably(small_data,
                                                                               tmp_path):
    """Under ULFM: server 1 frozen, then `ctl add-server`: server 1 never says its clock, the
    failure detector takes it for dead, and a death during a move is one the job cannot go on
    from: every rank stops with exit 75 (the requeue template resumes it) and ctl says the
    job ended before answering."""
    run = tmp_path / "run"
    job = WatchedJob(5, "train", "--train", small_data[0], "--test", small_data[1], "--out", run,
                     *ARGS, "--replicas", 2, "--epochs", 400, launcher=ULFM)
    job.wait_for("training: epoch")
    pid = pid_of_rank(run, 1)
    os.kill(pid, signal.SIGSTOP)
    try:
        asked = ctl(run, "add-server", wait=False)
        job.wait_for("a server died while key ranges moved", timeout=120)
        answered = done(asked)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    ended = job.finish(timeout=120)
    assert ended.returncode == 75, ended.output
    assert "the job cannot go on; resume from the last checkpoint" in ended.output
    assert answered.returncode == 2 and "ended before answering" in answered.stderr, \
        answered.stderr


# Workers leaving and joining: 2 servers and 3 workers, 33 clocks an epoch per worker.
LEAVE_ARGS = ("--servers", 2, "--epochs", 40, "--batch-size", 200, "--log-every", 0.2,
              "--timeout", 60)


@pytest.fixture(scope="module")
def leaving(small_data, tmp_path_factory):
    """(uninterrupted run, run in which worker 1 left and joined again, ctl's answers to the
    leave and the join, ctl's refusals) under BSP."""
    base = tmp_path_factory.mktemp("leave")
    data = ("train", "--train", small_data[0], "--test", small_data[1])
    whole = run_job(5, *data, "--out", base / "whole", *LEAVE_ARGS)
    assert whole.returncode == 0, whole.output
    run = base / "changed"
    # Worker 2 slowed down (BSP: the model does not depend on it), so that the job is still
    # training when ctl's requests come.
    job = WatchedJob(5, *data, "--out", run, *LEAVE_ARGS, "--straggler", "2:8")
    job.wait_for("training: epoch")
    asked = {"nobody idle": ("add-worker",), "busy": ("add-worker", 0),
             "no such": ("remove-worker", 7), "whom": ("remove-worker",)}
    running = {case: ctl(run, *command, wait=False) for case, command in asked.items()}
    refused = {case: done(proc) for case, proc in running.items()}
    left = ctl(run, "remove-worker", 1, "--json")
    joined = ctl(run, "add-worker", "--json")
    ended = job.finish(timeout=180)
    assert ended.returncode == 0, ended.output
    return base / "whole", run, left, joined, refused, ended


def test_a_worker_leaves_and_joins_again_and_every_row_is_trained_once(leaving):
    whole, run, left, joined, _, ended = leaving
    for answered in (left, joined):
        assert answered.returncode == 0, answered.stdout + answered.stderr + ended.output
    left, joined = json.loads(left.stdout), json.loads(joined.stdout)
    assert left["command"] == "remove-worker" and left["target"] == 1, left
    assert left["handed_to"] == [0, 2] and 0 <= left["from_epoch"] < 40, left
    assert joined["command"] == "add-worker" and joined["target"] == 1, joined
    assert sorted(joined["from"]) == [0, 2] and joined["clock"] > left["clock"], joined
    s, w = read_summary(run), read_summary(whole)
    assert [m["command"] for m in s["moves"]] == ["remove-worker", "add-worker"]
    # Every row once per epoch: what worker 1 had left went to 0 and 2, who gave it a third
    # of what they had left when it joined again.
    assert s["train_examples"] == w["train_examples"] == 40 * 20000
    assert sum(s["worker_examples"]) == 40 * 20000, s["worker_examples"]
    assert s["test_examples"] == 10000, "every test row was scored"
    gap = abs(s["test_logloss"] - w["test_logloss"]) / w["test_logloss"]
    assert gap <= 0.005, (s["test_logloss"], w["test_logloss"])
    for said in ("leaving at clock", "worker 1 left", "joining again at clock",
                 "ctl add-worker 1 done"):
        assert said in ended.output, said


def test_ctl_refuses_a_worker_change_that_cannot_be_made(leaving):
    *_, refused, _ = leaving
    says = {"nobody idle": "refused: no worker is idle to join",
            "busy": "refused: worker 0 is training",
            "no such": "refused: there is no worker 7: the job has 3 (0-2)",
            "whom": "remove-worker needs the number of the worker to remove"}
    for case, text in says.items():
        done = refused[case]
        assert done.returncode in (1, 2) and text in done.stdout + done.stderr, \
            (case, done.stdout, done.stderr)


def test_a_worker_frozen_while_another_joins_is_taken_for_dead_and_the_join_goes_on(
        small_data, tmp_path):
    """Under ULFM: worker 1 leaves, then worker 2 (rank 4) freezes and worker 1 is asked to
    join: worker 2 never splits its rows; the failure detector takes it for dead, its rows go
    to worker 0, and worker 1 joins with worker 0's share alone. Every row is still trained
    once per epoch, and the whole test file scored."""
    run = tmp_path / "run"
    job = WatchedJob(5, "train", "--train", small_data[0], "--test", small_data[1], "--out",
                     run, *LEAVE_ARGS, "--straggler", "0:4", launcher=ULFM)
    job.wait_for("training: epoch")
    left = ctl(run, "remove-worker", 1)
    assert left.returncode == 0, left.stdout + left.stderr
    pid = pid_of_rank(run, 4)
    os.kill(pid, signal.SIGSTOP)
    try:
        joined = ctl(run, "add-worker", "--json")
        job.wait_for("summary: ", timeout=180)
    finally:
        os.kill(pid, signal.SIGKILL)
    ended = job.finish(timeout=60)
    assert ended.returncode == 0, ended.output
    assert joined.returncode == 0, joined.stdout + joined.stderr + ended.output
    answer = json.loads(joined.stdout)
    assert answer["target"] == 1 and answer["from"] == [0], answer
    s = read_summary(run)
    assert [f["worker"] for f in s["failures"]] == [2]
    assert s["train_examples"] == 40 * 20000, "every row once per epoch"
    assert s["test_examples"] == 10000
