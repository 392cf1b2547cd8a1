"""Hot failover: a server of a job launched with ULFM dies (SIGKILL) or freezes (SIGSTOP)
mid-run; the living copies of its keys take over and the job finishes, exit 0. Under BSP
the model is bit for bit that of an uninterrupted run."""
import os
import shutil
import signal
import time

import numpy as np
import pytest
from support import ULFM, read_summary, run_job
from watch import WatchedJob, complete_checkpoints, frozen_to_the_end, pid_of_rank

from mpips.checkpoint import read_manifest
from mpips.config import TrainConfig
from mpips.model_io import load_model
from mpips.placement import Placement, describe_ranges

# 3 servers + 2 workers, every key on 2 servers; 2 x 50 clocks an epoch.
ARGS = ("--servers", 3, "--replicas", 2, "--epochs", 16, "--batch-size", 200,
        "--checkpoint-every", 100, "--log-every", 0.2, "--timeout", 60)
ROWS = 20000
# The key ranges server 1 answers for, as the jobs place them (3 servers, 2 copies).
SERVER_1_RANGES = describe_ranges(np.flatnonzero(
    Placement(3, 2, vnodes=TrainConfig.vnodes).primary_ranges(1)))


def launch(small_data, run, *extra):
    return WatchedJob(5, "train", "--train", small_data[0], "--test", small_data[1],
                      "--out", run, *ARGS, *extra, launcher=ULFM)


@pytest.fixture(scope="module")
def uninterrupted(small_data, tmp_path_factory):
    runs = {}
    for name, more in (("bsp", ()), ("asp", ("--consistency", "asp"))):
        run = tmp_path_factory.mktemp("whole") / name
        job = run_job(5, "train", "--train", small_data[0], "--test", small_data[1],
                      "--out", run, *ARGS, *more)
        assert job.returncode == 0, job.output
        runs[name] = run
    return runs


def same_model(a, b) -> None:
    ours, theirs = load_model(a / "model"), load_model(b / "model")
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])   # bit for bit


def kill_server_1(job, run) -> float:
    job.wait_for("training: epoch")
    killed = time.time()
    os.kill(pid_of_rank(run, 1), signal.SIGKILL)
    return killed


@pytest.fixture(scope="module")
def failed_over(small_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("failover") / "run"
    job = launch(small_data, run)
    killed = kill_server_1(job, run)
    return run, job.finish(timeout=120), killed


def test_a_killed_server_is_replaced_by_its_copies_bitwise(failed_over, uninterrupted):
    run, ended, killed = failed_over
    assert ended.returncode == 0, ended.output
    assert "hot failover is on" in ended.output
    assert ("server 1 (rank 1) died; the living copies of its keys take over (placement "
            f"version 1): this server now answers key range(s) {SERVER_1_RANGES}"
            ) in ended.output
    s = read_summary(run)
    # First what happened (a rank the detector took for dead would show here), then the bits.
    assert [(f["role"], f["rank"]) for f in s["failures"]] == [("server 1", 1)], s["failures"]
    assert s["train_examples"] == 16 * ROWS and s["servers"] == 2, "the survivors finished"
    assert s["pushes_applied"] == [s["pushes_sent"]] * 2 and s["pushes_sent"] > 0, \
        "every push a worker sent is in each living server's store"
    same_model(run, uninterrupted["bsp"])
    [failure] = s["failures"]
    assert failure["server"] == 1 and failure["rank"] == 1
    print(f"server 1 killed; server 0 learned of it {failure['learned_at'] - killed:.3f} s "
          f"later and failed over in {failure['failover_s'] * 1000:.2f} ms")
    assert sorted(os.listdir(run / "model")) == ["server-0000.h5", "server-0002.h5"]


def test_a_checkpoint_written_after_the_failover_resumes_bitwise(failed_over, uninterrupted,
                                                                  tmp_path, small_data):
    run, ended, _ = failed_over
    after = [os.path.dirname(p) for p in complete_checkpoints(run / "checkpoints")
             if read_manifest(os.path.dirname(p))["placement"].get("dead") == [1]]
    assert after, "checkpoints went on after the failover"
    mid = next(d for d in after if read_manifest(d)["positions"]["0"]["epoch"] < 16)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(mid, ckpt / os.path.basename(mid))
    job = run_job(4, "train", "--train", small_data[0], "--test", small_data[1], "--out",
                  tmp_path / "again", "--servers", 2, *ARGS[4:], "--resume", ckpt)
    assert job.returncode == 0, job.output
    same_model(tmp_path / "again", uninterrupted["bsp"])


def test_a_frozen_server_counts_as_dead_and_its_copies_take_over(small_data, uninterrupted,
                                                                 tmp_path):
    run = tmp_path / "run"
    job = launch(small_data, run)
    job.wait_for("training: epoch")
    ended = frozen_to_the_end(job, pid_of_rank(run, 1), timeout=120)
    assert ended.returncode == 0, ended.output
    assert "server 1 (rank 1) died" in ended.output
    same_model(run, uninterrupted["bsp"])


def test_under_asp_a_killed_server_loses_no_example_and_no_push(small_data, uninterrupted,
                                                                tmp_path):
    run = tmp_path / "run"
    job = launch(small_data, run, "--consistency", "asp")
    kill_server_1(job, run)
    ended = job.finish(timeout=120)
    assert ended.returncode == 0, ended.output
    ours, theirs = read_summary(run), read_summary(uninterrupted["asp"])
    assert ours["train_examples"] == 16 * ROWS
    assert ours["pushes_applied"] == [ours["pushes_sent"]] * 2, "no acknowledged push lost"
    assert abs(ours["test_logloss"] - theirs["test_logloss"]) / theirs["test_logloss"] < 0.005


def test_losing_every_copy_of_a_range_stops_for_a_resume(small_data, uninterrupted, tmp_path):
    """Servers 1 and 2, killed together, hold range 1's two copies: the job cannot go on. It
    says which keys are gone and exits 75, and the resume ends on the uninterrupted model."""
    run = tmp_path / "run"
    job = launch(small_data, run)
    job.wait_for("checkpoint at clock")
    for rank in (1, 2):
        os.kill(pid_of_rank(run, rank), signal.SIGKILL)
    ended = job.finish(timeout=120)
    assert ended.returncode == 75, ended.output
    assert (f"every whole copy of key range(s) {SERVER_1_RANGES} died with server(s) [1, 2]"
            in ended.output)
    assert "continue from its last checkpoint with --resume" in ended.output
    resumed = run_job(5, "train", "--train", small_data[0], "--test", small_data[1],
                      "--out", run, *ARGS, "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    same_model(run, uninterrupted["bsp"])


def test_once_the_copies_are_rebuilt_a_second_death_is_survived(small_data, uninterrupted,
                                                                 tmp_path):
    """4 servers, 2 copies of each range. Server 1 dies: the copies it held are rebuilt on
    the next servers; then server 2, which held server 1's ranges with it, dies too: they
    live on in their rebuilt copies, bit for bit."""
    run = tmp_path / "run"
    job = WatchedJob(6, "train", "--train", small_data[0], "--test", small_data[1],
                     "--out", run, "--servers", 4, *ARGS[2:], launcher=ULFM)
    kill_server_1(job, run)
    job.wait_for("rank 2 (server 2): WARNING key range(s)")   # server 0's ranges' new backup
    job.wait_for("rank 3 (server 3): WARNING key range(s)")   # server 1's ranges' new backup
    os.kill(pid_of_rank(run, 2), signal.SIGKILL)
    ended = job.finish(timeout=120)
    assert ended.returncode == 0, ended.output
    assert "server 2 (rank 2) died" in ended.output
    same_model(run, uninterrupted["bsp"])
    failures = read_summary(run)["failures"]
    assert [f["server"] for f in failures] == [1, 2]
    print("rebuilt:", [r for f in failures for r in f.get("rebuilt", [])])


def test_a_killed_lead_is_replaced_by_the_next_server(small_data, uninterrupted, tmp_path):
    """Server 0 leads (checkpoints, progress, stopping): server 1 takes that over too."""
    run = tmp_path / "run"
    job = launch(small_data, run)
    job.wait_for("training: epoch")
    os.kill(pid_of_rank(run, 0), signal.SIGKILL)
    ended = job.finish(timeout=120)
    assert ended.returncode == 0, ended.output
    assert "server 1 leads from now on" in ended.output
    same_model(run, uninterrupted["bsp"])
    s = read_summary(run)
    assert [f["server"] for f in s["failures"]] == [0] and s["train_examples"] == 16 * ROWS
    assert "training: epoch" in ended.output.split("server 1 leads from now on")[1], \
        "the new lead says the progress"


def test_a_spare_stands_in_for_a_killed_server_and_the_survivors_take_on_no_copies(
        small_data, uninterrupted, tmp_path):
    """3 servers and a spare (server 3, rank 3): server 1 is killed; the spare receives a
    copy of every key range server 1 held, no survivor receives any, and the model is the
    uninterrupted run's, bit for bit."""
    run = tmp_path / "run"
    job = WatchedJob(6, "train", "--train", small_data[0], "--test", small_data[1],
                     "--out", run, *ARGS, "--spares", 1, launcher=ULFM)
    job.wait_for("1 spare(s) (server(s) 3-3)")
    kill_server_1(job, run)
    job.wait_for("rank 3 (server 3): WARNING key range(s)")
    ended = job.finish(timeout=120)
    assert ended.returncode == 0, ended.output
    held = Placement(3, 2, vnodes=TrainConfig.vnodes).held_ranges(1)
    assert (f"rank 3 (server 3): WARNING key range(s) {describe_ranges(np.flatnonzero(held))} "
            f"have their copies again") in ended.output
    for rank in (0, 2):
        assert f"rank {rank} (server {rank}): WARNING key range(s)" not in ended.output
    s = read_summary(run)
    assert [(f["role"], f["rank"]) for f in s["failures"]] == [("server 1", 1)]
    assert s["servers"] == 3 and s["server_keys"][-1] == 0, \
        "the survivors finished; the spare (the last) answers no read: the living copies do"
    same_model(run, uninterrupted["bsp"])
