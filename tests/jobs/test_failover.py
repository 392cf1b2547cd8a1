"""Hot failover: a server of a job launched with ULFM dies (SIGKILL) or freezes (SIGSTOP)
mid-run, at a clock the test names (--test-event); the living copies of its keys take over
and the job finishes, exit 0. Under BSP the model is bit for bit that of an uninterrupted
run."""
import os
import shutil
import time

import numpy as np
import pytest
from support import (ASP_LOGLOSS_SLACK, ULFM, close_logloss, fired, read_summary, run_job,
                     run_mpips, same_model)
from watch import (WatchedJob, complete_checkpoints, frozen_by_event_to_the_end, wait_fired,
                   wait_for_file)

from mpips.storage.checkpoint import read_manifest
from mpips.run.config import LayoutConfig
from mpips.wire.placement import Placement, describe_ranges

# 3 servers + 2 workers, every key on 2 servers; about 50 clocks an epoch, a checkpoint every
# 50 clocks (all kept). The deaths come at clock 60: a checkpoint before (50), several after.
EPOCHS = 4
ARGS = ("--servers", 3, "--replicas", 2, "--epochs", EPOCHS, "--batch-size", 200,
        "--checkpoint-every", 50, "--keep-checkpoints", 10, "--log-every", 0.2, "--timeout", 60)
ROWS = 20000
KILL_1 = "kill rank 1 at clock 60"
WORKER_RANKS = (3, 4)   # after the 3 servers
# The key ranges server 1 answers for, as the jobs place them (3 servers, 2 copies).
SERVER_1_RANGES = describe_ranges(np.flatnonzero(
    Placement(3, 2, vnodes=LayoutConfig.vnodes).primary_ranges(1)))


def launch(small_data, run, *extra, ranks: int = 5):
    return WatchedJob(ranks, "train", "--train", small_data[0], "--test", small_data[1],
                      "--out", run, *ARGS, *extra, launcher=ULFM)


def events(*texts) -> list:
    return [arg for text in texts for arg in ("--test-event", text)]


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


@pytest.fixture(scope="module")
def failed_over(small_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("failover") / "run"
    job = launch(small_data, run, *events(KILL_1))
    wait_fired(job, KILL_1)
    seen = time.time()   # (a little after the kill: for the print below only)
    return run, job.finish(timeout=300), seen


def test_a_killed_server_is_replaced_by_its_copies_bitwise(failed_over, uninterrupted):
    run, ended, seen = failed_over
    assert ended.returncode == 0, ended.output
    fired(ended, KILL_1)
    assert "hot failover is on" in ended.output
    assert ("server 1 (rank 1) died; the living copies of its keys take over (placement "
            f"version 1): this server now answers key range(s) {SERVER_1_RANGES}"
            ) in ended.output
    s = read_summary(run)
    # First what happened (a rank the detector took for dead would show here), then the bits.
    assert [(f["role"], f["rank"]) for f in s["failures"]] == [("server 1", 1)], s["failures"]
    assert s["train_examples"] == EPOCHS * ROWS and s["servers"] == 2, "the survivors finished"
    assert s["pushes_applied"] == [s["pushes_sent"]] * 2 and s["pushes_sent"] > 0, \
        "every push a worker sent is in each living server's store"
    same_model(run, uninterrupted["bsp"])
    [failure] = s["failures"]
    assert failure["server"] == 1 and failure["rank"] == 1
    print(f"server 1 killed; server 0 learned of it {failure['learned_at'] - seen:.3f} s after "
          f"the test saw the kill, and failed over in {failure['failover_s'] * 1000:.2f} ms")
    assert sorted(os.listdir(run / "model")) == ["server-0000.h5", "server-0002.h5"]


def test_a_checkpoint_written_after_the_failover_resumes_bitwise(failed_over, uninterrupted,
                                                                  tmp_path, small_data):
    run, ended, _ = failed_over
    kept = [os.path.dirname(p) for p in complete_checkpoints(run / "checkpoints")]
    dead = {int(os.path.basename(d)[len("clock-"):]): read_manifest(d)["placement"].get("dead")
            for d in kept}
    # Killed at clock 60: the checkpoint at clock 50 was written before the failover, every
    # one from clock 100 on after it, without server 1 (the oldest kept is 50, or 100 if the
    # final one, at the end, was complete too and pruned it).
    assert {100, 150, 200} <= set(dead) <= {50, 100, 150, 200, 204}, dead
    # (A manifest says the placement as the lead writes it: on a loaded machine clock 50's
    # files can come in after the failover, and its manifest then names server 1 too.)
    assert all(dead[c] in ([], None, [1]) if c < 60 else dead[c] == [1] for c in dead), dead
    mid = next(d for d in kept if d.endswith("clock-000000000100"))
    assert read_manifest(mid)["positions"]["0"]["epoch"] < EPOCHS
    ckpt = tmp_path / "ckpt"
    shutil.copytree(mid, ckpt / os.path.basename(mid))
    job = run_job(4, "train", "--train", small_data[0], "--test", small_data[1], "--out",
                  tmp_path / "again", "--servers", 2, *ARGS[4:], "--resume", ckpt)
    assert job.returncode == 0, job.output
    assert "resumed from checkpoint clock 100" in job.output
    same_model(tmp_path / "again", uninterrupted["bsp"])


def test_a_frozen_server_counts_as_dead_and_its_copies_take_over(small_data, uninterrupted,
                                                                 tmp_path):
    run = tmp_path / "run"
    freeze = "freeze rank 1 at clock 60"
    job = launch(small_data, run, *events(freeze))
    ended = frozen_by_event_to_the_end(job, run, 1, freeze)
    assert ended.returncode == 0, ended.output
    fired(ended, freeze)
    assert "server 1 (rank 1) died" in ended.output
    assert [f["server"] for f in read_summary(run)["failures"]] == [1]
    same_model(run, uninterrupted["bsp"])


def test_a_server_frozen_at_the_last_clock_is_ended_and_the_launch_ends(small_data,
                                                                         uninterrupted,
                                                                         tmp_path):
    """Frozen after the last push it applied: the others learn of it only as they finish.
    Its node's ranks end it, or the launcher would wait for it forever."""
    run = tmp_path / "run"
    freeze = f"freeze rank 1 at clock {EPOCHS * 50}"
    ended = frozen_by_event_to_the_end(launch(small_data, run, *events(freeze)), run, 1, freeze)
    assert ended.returncode == 0, ended.output
    fired(ended, freeze)
    assert os.path.exists(run / "summary.json")
    same_model(run, uninterrupted["bsp"])


def test_under_asp_a_killed_server_loses_no_example_and_no_push(small_data, uninterrupted,
                                                                tmp_path):
    run = tmp_path / "run"
    ended = launch(small_data, run, "--consistency", "asp", *events(KILL_1)).finish(timeout=300)
    assert ended.returncode == 0, ended.output
    fired(ended, KILL_1)
    ours, theirs = read_summary(run), read_summary(uninterrupted["asp"])
    assert [f["server"] for f in ours["failures"]] == [1]
    assert ours["train_examples"] == EPOCHS * ROWS
    assert ours["pushes_applied"] == [ours["pushes_sent"]] * 2, "no acknowledged push lost"
    close_logloss(ours["test_logloss"], theirs["test_logloss"], ASP_LOGLOSS_SLACK)


def test_losing_every_copy_of_a_range_stops_for_a_resume(small_data, uninterrupted, tmp_path):
    """Servers 1 and 2, killed together as the first of them has written its file of the
    checkpoint at clock 100, hold range 1's two copies: the job cannot go on. It says which keys are gone
    and exits 75; the newest complete checkpoint is clock 50's, and the resume from it ends
    on the uninterrupted model."""
    run = tmp_path / "run"
    # Both at once, by whichever reaches the point first: apart, the copies of the first's
    # ranges could be rebuilt before the second dies (a forked writer takes its own time).
    kill = "kill ranks 1,2 at checkpoint 2"
    ended = launch(small_data, run, *events(kill)).finish(timeout=300)
    assert ended.returncode == 75, ended.output
    fired(ended, kill)
    assert (f"every whole copy of key range(s) {SERVER_1_RANGES} died with server(s) [1, 2]"
            in ended.output)
    assert "continue from its last checkpoint with --resume" in ended.output
    # The workers stop at once: told by server 0 (it revokes the job's communicator) or, if
    # MPI tells it of the deaths first, by its own failover finding no copy left; never by a
    # detector's timeout after server 0 left (which would count rank 0 dead). Not every
    # worker need speak: once a second rank exits with an error, mpiexec ends the rest.
    said = [line for line in ended.output.splitlines()
            if any(f"mpips rank {rank} (worker {worker}): ERROR" in line
                   for worker, rank in enumerate(WORKER_RANKS))]
    assert any("another rank stopped the job, which cannot go on" in line
               or "died with server(s) [1, 2]" in line for line in said), ended.output
    assert "rank(s) [0" not in ended.output
    assert [os.path.basename(os.path.dirname(p)) for p in
            complete_checkpoints(run / "checkpoints")] == ["clock-000000000050"], \
        "clock 100's checkpoint never completed"
    resumed = run_job(5, "train", "--train", small_data[0], "--test", small_data[1],
                      "--out", run, *ARGS, "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    assert "resumed from checkpoint clock 50" in resumed.output
    same_model(run, uninterrupted["bsp"])


def test_once_the_copies_are_rebuilt_a_second_death_is_survived(small_data, uninterrupted,
                                                                 tmp_path):
    """4 servers, 2 copies of each range. Server 1 dies at clock 60: the copies it held are
    rebuilt on the next servers. Worker 0 (rank 4) waits at clock 80 until both rebuilt
    copies are said to be whole; then server 2, which held server 1's ranges with it, dies at
    clock 81: they live on in their rebuilt copies, bit for bit."""
    run = tmp_path / "run"
    go = tmp_path / "go"
    pause = f"pause rank 4 until {go} at clock 80"
    kills = ("kill rank 1 at clock 60", "kill rank 2 at clock 81")
    job = WatchedJob(6, "train", "--train", small_data[0], "--test", small_data[1],
                     "--out", run, "--servers", 4, *ARGS[2:], *events(kills[0], pause, kills[1]),
                     launcher=ULFM)
    wait_for_file(job, f"{go}.reached")
    job.wait_for("rank 2 (server 2): WARNING key range(s)")   # server 0's ranges' new backup
    job.wait_for("rank 3 (server 3): WARNING key range(s)")   # server 1's ranges' new backup
    assert "server 2 (rank 2) died" not in job.output
    go.write_text("")
    ended = job.finish(timeout=300)
    assert ended.returncode == 0, ended.output
    for event in (*kills, pause):
        fired(ended, event)
    assert "server 2 (rank 2) died" in ended.output
    same_model(run, uninterrupted["bsp"])
    failures = read_summary(run)["failures"]
    assert [f["server"] for f in failures] == [1, 2]
    print("rebuilt:", [r for f in failures for r in f.get("rebuilt", [])])


@pytest.fixture(scope="module")
def lead_killed(small_data, tmp_path_factory):
    """Server 0 took the lock of --out and is killed at clock 60; worker 0 (rank 3) then
    pauses at clock 70, once server 1 leads: the job certainly trains on. Meanwhile `mpips
    ctl status` asks the job, and a second job is started on the same --out (with
    --overwrite, which would have removed the first job's files); then the pause ends.
    Returns (run, the ended job, ctl's answer, the second job, kill, pause)."""
    base = tmp_path_factory.mktemp("lead")
    run, go = base / "run", base / "go"
    kill, pause = "kill rank 0 at clock 60", f"pause rank 3 until {go} at clock 70"
    job = launch(small_data, run, *events(kill, pause))
    wait_for_file(job, f"{go}.reached")
    job.wait_for("server 1 leads from now on")
    status = run_mpips("ctl", run, "status", "--wait", 120, timeout=180)
    second = run_job(2, "train", "--train", small_data[0], "--out", run, "--overwrite",
                     "--epochs", 1, timeout=180)
    go.write_text("")
    return run, job.finish(timeout=300), status, second, kill, pause


def test_a_killed_lead_is_replaced_by_the_next_server(lead_killed, uninterrupted):
    """Server 0 leads (checkpoints, progress, stopping): server 1 takes that over too. (The
    job of `lead_killed`: its pause and its visitors come after the kill.)"""
    run, ended, _, _, kill, _ = lead_killed
    assert ended.returncode == 0, ended.output
    fired(ended, kill)
    assert "server 1 leads from now on" in ended.output
    same_model(run, uninterrupted["bsp"])
    s = read_summary(run)
    assert [f["server"] for f in s["failures"]] == [0] and s["train_examples"] == EPOCHS * ROWS
    assert "training: epoch" in ended.output.split("server 1 leads from now on")[1], \
        "the new lead says the progress"


def test_the_run_lock_and_ctl_move_to_the_new_lead(lead_killed, uninterrupted):
    """`mpips ctl status` is answered by server 1, and the second job on the same --out is
    refused (with --overwrite too), naming the run. Released, the first job ends on the
    uninterrupted run's model and writes the summary."""
    run, ended, status, second, kill, pause = lead_killed
    assert ended.returncode == 0, ended.output
    for event in (kill, pause):
        fired(ended, event)
    name = read_summary(run)["run_id"]
    assert status.returncode == 0, status.stdout + status.stderr
    assert "server 0 (rank 0): dead" in status.stdout and "server 1 leads" in status.stdout, \
        status.stdout
    assert second.returncode == 2, second.output
    assert f"--out {run} is in use by run {name}" in second.stderr, second.stderr
    assert "Traceback" not in second.output
    assert "rank 1 (server 1): WARNING took over the lock" in ended.output
    same_model(run, uninterrupted["bsp"])
    assert not (run / "mpips.lock").exists(), "released by the new lead as the job ended"


def test_a_spare_stands_in_for_a_killed_server_and_the_survivors_take_on_no_copies(
        small_data, uninterrupted, tmp_path):
    """3 servers and a spare (server 3, rank 3): server 1 is killed; the spare receives a
    copy of every key range server 1 held, no survivor receives any, and the model is the
    uninterrupted run's, bit for bit."""
    run = tmp_path / "run"
    ended = launch(small_data, run, "--spares", 1, *events(KILL_1), ranks=6).finish(timeout=300)
    assert ended.returncode == 0, ended.output
    fired(ended, KILL_1)
    assert "1 spare(s) (server(s) 3-3)" in ended.output
    held = Placement(3, 2, vnodes=LayoutConfig.vnodes).held_ranges(1)
    assert (f"rank 3 (server 3): WARNING key range(s) {describe_ranges(np.flatnonzero(held))} "
            f"have their copies again") in ended.output
    for rank in (0, 2):
        assert f"rank {rank} (server {rank}): WARNING key range(s)" not in ended.output
    s = read_summary(run)
    assert [(f["role"], f["rank"]) for f in s["failures"]] == [("server 1", 1)]
    assert s["servers"] == 3 and s["server_keys"][-1] == 0, \
        "the survivors finished; the spare (the last) answers no read: the living copies do"
    same_model(run, uninterrupted["bsp"])


def test_a_server_killed_as_it_saves_the_model_leaves_its_ranges_to_their_copies(
        small_data, uninterrupted, tmp_path):
    """Server 1 dies once training and scoring are over, before it writes its part of the
    model: the living copies of its key ranges are written in its stead, and the model is
    whole, bit for bit the uninterrupted run's."""
    run = tmp_path / "run"
    kill = "kill rank 1 at saving"
    ended = launch(small_data, run, *events(kill)).finish(timeout=300)
    assert ended.returncode == 0, ended.output
    fired(ended, kill)
    # The others learn of it as they save, or, if one is still in its loop (its last
    # checkpoint file, the others' BYE), there: either way the copies answer for it.
    assert ("server(s) [1] died before writing their part of the model: key range(s) "
            in ended.output or "server 1 (rank 1) died; the living copies of its keys take over"
            in ended.output), ended.output
    same_model(run, uninterrupted["bsp"])
    assert read_summary(run)["keys_stored"] == read_summary(uninterrupted["bsp"])["keys_stored"]
    assert sorted(os.listdir(run / "model")) == ["server-0000.h5", "server-0002.h5"]


def test_a_server_killed_as_it_saves_its_only_copy_stops_for_a_resume(
        small_data, uninterrupted, tmp_path):
    """One copy of each key range: server 1's die with it before it writes its part of the
    model. The job says so and exits 75 instead of ending with a model short of them; its
    last complete checkpoint holds the model as of its clock, and the resume ends on the
    uninterrupted model."""
    run = tmp_path / "run"
    kill = "kill rank 1 at saving"
    ended = launch(small_data, run, "--replicas", 1, *events(kill)).finish(timeout=300)
    assert ended.returncode == 75, ended.output
    fired(ended, kill)
    # Said by the lead as it saves; or, if a server is still in its loop (waiting for its
    # last checkpoint file: server 1's loop can end first), by that server as of any death
    # of a rank whose keys have no other copy (--replicas 1: no takeover).
    assert (f"every copy of key range(s) {SERVER_1_RANGES} died with server(s) [1]"
            in ended.output or "rank(s) [1] died" in ended.output), ended.output
    assert "continue from its last checkpoint with --resume" in ended.output
    assert not os.path.exists(run / "summary.json"), "no summary of a model short of keys"
    resumed = run_job(5, "train", "--train", small_data[0], "--out", run, *ARGS,
                      "--replicas", 1, "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    # The last clock's checkpoint, or the one before if a server's file of the last was still
    # being written (by its forked writer) when server 1 died.
    assert ("nothing is left to train" in resumed.output
            or "resumed from checkpoint clock 200" in resumed.output), resumed.output
    same_model(run, uninterrupted["bsp"])
