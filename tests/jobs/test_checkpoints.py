"""Cold backup with real jobs: checkpoints, stopping on a signal, resuming (bitwise under BSP),
re-sharding, damaged checkpoints, and a rank killed outright.

Signals and kills come from the ranks themselves at a named point (`--test-event`, see
mpips/run/testevents.py), so the clock a job stops at, and its newest checkpoint, are known."""
import glob
import hashlib
import json
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest
import xxhash
from support import (ASP_LOGLOSS_SLACK, FSYNC_ON, close_logloss, fired, read_summary,
                     run_here, run_job)
from debian import H5DUMP, ensure
from watch import WatchedJob, complete_checkpoints, rank_pids, wait_for_file

from mpips.storage import checkpoint
from mpips.models import catalog as models
from mpips.storage.checkpoint import read_manifest
from mpips.run.config import LayoutConfig
from mpips.storage.model_files import load_model
from mpips.wire.placement import Placement

EPOCHS = 3
TRAIN = ("--epochs", EPOCHS, "--batch-size", 200, "--checkpoint-every", 15)
CLOCK_ROWS = 2 * 200    # the examples of one clock: 2 workers x 200 rows
# Asked to stop (a signal to the lead server, rank 0, when every worker has completed clock
# C), a job checkpoints and stops two clocks past it: no server can be more than one ahead.
STOP = "stop rank 0 at clock 40"
STOPPED_AT = 42


def clocks(ckpt) -> list:
    """The clocks of the complete checkpoints in `ckpt`, oldest first."""
    return sorted(read_manifest(os.path.dirname(p))["clock"] for p in complete_checkpoints(ckpt))


@pytest.fixture(scope="module")
def uninterrupted(small_data, tmp_path_factory):
    """2 servers + 2 workers, BSP, a checkpoint every 15 clocks and at the end."""
    run = tmp_path_factory.mktemp("whole") / "run"
    job = run_job(4, "train", "--train", small_data[0], "--test", small_data[1], "--servers", 2,
                  "--out", run, *TRAIN)
    assert job.returncode == 0, job.output
    return run


def test_a_stopped_and_resumed_run_ends_bitwise_equal(small_data, uninterrupted, tmp_path):
    """Stopped and resumed with every file fsynced, as a user's job (the suite's other jobs
    run with MPIPS_FSYNC=0, the uninterrupted one too)."""
    run = tmp_path / "run"
    # SIGUSR1, what Slurm's warning (forwarded by the job script) is, at clock 40.
    ended = run_job(4, "train", "--train", small_data[0], "--test", small_data[1],
                    "--servers", 2, "--out", run, *TRAIN, "--test-event", STOP, env=FSYNC_ON)
    assert ended.returncode == 75, ended.output
    fired(ended, STOP)
    assert "after writing a checkpoint: continue with --resume" in ended.output
    # rank 0's word of the stop, once, before any rank left (job.ending._raise_together)
    assert ended.output.count("after writing a checkpoint; continue with --resume") == 1, \
        ended.output
    stopped = read_summary(run)
    assert stopped["status"] == "stopped" and stopped["stopped_at_clock"] == STOPPED_AT
    assert stopped["train_examples"] == STOPPED_AT * CLOCK_ROWS < EPOCHS * 20000, \
        "it stopped before the end, every worker at the stop's clock"
    assert clocks(run / "checkpoints") == [15, 30, STOPPED_AT]
    with h5py.File(run / "model" / "server-0000.h5") as f:
        assert not f.attrs["complete"] and "resume" in f.attrs["note"]
    # Resumed with its files written in the servers' loops: the same bits at the same clocks
    # as the uninterrupted run's forked writers wrote.
    resumed = run_job(4, "train", "--train", small_data[0], "--test", small_data[1],
                      "--servers", 2, "--out", run, *TRAIN, "--resume", run / "checkpoints",
                      "--checkpoint-inline", env=FSYNC_ON)
    assert resumed.returncode == 0, resumed.output
    assert f"resumed from checkpoint clock {stopped['stopped_at_clock']}" in resumed.output
    ours, theirs = load_model(run / "model"), load_model(uninterrupted / "model")
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])   # bit for bit
    inline, forked = clocks(run / "checkpoints"), clocks(uninterrupted / "checkpoints")
    assert inline == forked and len(inline) == 3, (inline, forked)
    for clock in inline:
        for server in (0, 1):
            name = os.path.join(f"clock-{clock:012d}", f"server-{server:04d}.h5")
            with h5py.File(run / "checkpoints" / name) as a, \
                    h5py.File(uninterrupted / "checkpoints" / name) as b:
                # in key order: a resumed table holds its keys in other rows
                ours, theirs = np.argsort(a["keys"][()]), np.argsort(b["keys"][()])
                for dataset in ("keys", "state"):
                    assert a[dataset][()][ours].tobytes() == b[dataset][()][theirs].tobytes(), \
                        (name, dataset)
                assert a.attrs["run_id"] != b.attrs["run_id"], "two runs' files"
    assert read_summary(run)["train_examples"] == EPOCHS * 20000
    assert read_summary(run)["test_logloss"] == read_summary(uninterrupted)["test_logloss"]


@pytest.mark.parametrize("servers", [1, 3])
def test_a_checkpoint_of_two_servers_resumes_on_another_number(small_data, uninterrupted,
                                                               tmp_path, servers):
    """Mid-run: the keys move to their new owners, values unchanged, and training goes on to
    the same model bit for bit (each key's updates do not depend on who holds it)."""
    kept = complete_checkpoints(uninterrupted / "checkpoints")
    mid = os.path.dirname(kept[0])
    assert read_manifest(mid)["servers"] == 2
    final = read_manifest(os.path.dirname(kept[-1]))["clock"]
    assert read_manifest(mid)["clock"] < final, "a checkpoint from before the final one"
    positions = read_manifest(mid)["positions"]
    assert len(positions) == 2 and all(not p["finished"] and p["epoch"] < EPOCHS
                                       for p in positions.values()), \
        f"a checkpoint from mid-run: every worker still training ({positions})"
    ckpt = tmp_path / "ckpt"
    shutil.copytree(mid, ckpt / os.path.basename(mid))
    run = tmp_path / "run"
    job = run_job(servers + 2, "train", "--train", small_data[0], "--servers", servers,
                  "--out", run, *TRAIN, "--resume", ckpt)
    assert job.returncode == 0, job.output
    assert f"resumed from checkpoint clock {read_manifest(mid)['clock']}" in job.output
    ours, theirs = load_model(run / "model"), load_model(uninterrupted / "model")
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])
    owner = Placement(servers, vnodes=LayoutConfig.vnodes)   # the job's
    for s in range(servers):   # each key now lives with its new owner
        with h5py.File(run / "model" / f"server-{s:04d}.h5") as f:
            assert (owner.owners(f["keys"][:]) == s).all()


@pytest.mark.parametrize("optimizer, extra", [("sgd", ()),
                                              ("adam", ("--model", "fm", "--factors", 3)),
                                              ("adagrad", ("--model", "widedeep",
                                                           "--embedding-dim", 3,
                                                           "--hidden", "5"))],
                         ids=["averaged-sgd", "adam-fm", "widedeep"])
def test_optimizer_state_resumes_from_a_checkpoint_to_the_same_model(small_data, tmp_path,
                                                                     optimizer, extra):
    """The optimizer's state is in the checkpoint (averaged SGD: the running means and the
    clocks they cover; Adam: the moments and each key's count of pushes, here in a
    factorization machine's rows; Wide & Deep: the MLP's rows): a run resumed from the
    middle, on another number of servers, ends with the same model."""
    args = ("--train", small_data[0], "--optimizer", optimizer, *extra, *TRAIN,
            "--keep-checkpoints", 20)
    whole = tmp_path / "whole"
    job = run_job(4, "train", *args, "--servers", 2, "--out", whole)
    assert job.returncode == 0, job.output
    first = read_manifest(os.path.dirname(complete_checkpoints(whole / "checkpoints")[0]))
    first = first["config"]["optimizer"]["average_from"] or 0
    mid = next(os.path.dirname(m) for m in complete_checkpoints(whole / "checkpoints")
               if first < read_manifest(os.path.dirname(m))["clock"] < 4 * 50)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(mid, ckpt / os.path.basename(mid))
    with h5py.File(glob.glob(os.path.join(mid, "server-*.h5"))[0]) as f:
        state = f["state"][:]
    if optimizer == "sgd":
        mean, covered = state[:, 1], state[:, 2]
        assert covered.max() > 0 and not np.array_equal(mean, state[:, 0]), \
            "the checkpoint holds means that differ from the weights"
    elif optimizer == "adam":   # rows [w, v1..v3], their first and second moments, the count
        assert state.shape[1] == 3 * 4 + 1 and state[:, 12].max() > 1
        assert (state[:, 4:12] != 0).any() and (state[:, 1:4] != 0).any()
    else:   # Wide & Deep: the MLP's weights are rows too, in the servers' checkpoints
        mlp_rows = models.WideDeep(3, (5,)).reserved_keys()
        keys = []
        for path in glob.glob(os.path.join(mid, "server-*.h5")):
            with h5py.File(path) as f:
                keys.append(f["keys"][:])
        assert np.isin(mlp_rows, np.concatenate(keys)).all()
    run = tmp_path / "run"
    job = run_job(3, "train", *args, "--servers", 1, "--out", run, "--resume", ckpt)
    assert job.returncode == 0, job.output
    ours, theirs = load_model(run / "model"), load_model(whole / "model")
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])


@pytest.mark.parametrize("consistency", [("--consistency", "ssp", "--staleness", 2),
                                         ("--consistency", "asp")], ids=["ssp2", "asp"])
def test_ssp_and_asp_runs_stop_and_resume(small_data, uninterrupted, tmp_path, consistency):
    """Not bitwise (updates apply as they come), but every example is trained once and the
    model is as good."""
    run = tmp_path / "run"
    args = ("train", "--train", small_data[0], "--test", small_data[1], "--servers", 2,
            "--out", run, *TRAIN, *consistency)
    ended = run_job(4, *args, "--test-event", STOP)
    assert ended.returncode == 75, ended.output
    fired(ended, STOP)
    assert read_summary(run)["stopped_at_clock"] == STOPPED_AT
    assert clocks(run / "checkpoints")[-1] == STOPPED_AT
    resumed = run_job(4, *args, "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    result = read_summary(run)
    assert result["train_examples"] == EPOCHS * 20000
    assert result["pushes_applied"] == [result["pushes_sent"]] * 2, "no push lost"
    close_logloss(result["test_logloss"], read_summary(uninterrupted)["test_logloss"],
                  ASP_LOGLOSS_SLACK if "asp" in consistency else 0.01)


def test_timed_checkpoints_resume_to_the_same_model(small_data, uninterrupted, tmp_path):
    """--checkpoint-every in seconds: server 0 names the clock, every server writes there.
    Worker 0 (rank 2) is frozen for 1 s, 10 intervals, at clocks 30, 70 and 110: a timed
    checkpoint falls due during each, named two clocks past the slowest worker's. (Every
    0.1 s, not less: each is a forked writer per server, and a shorter interval only writes
    more of them between the freezes.)"""
    run = tmp_path / "run"
    freezes = [f"freeze rank 2 for 1 s at clock {c}" for c in (30, 70, 110)]
    job = run_job(4, "train", "--train", small_data[0], "--test", small_data[1], "--servers", 2,
                  "--out", run, *TRAIN[:4], "--checkpoint-every", "0.1s",
                  # all kept: a loaded machine's run of 10 s or more writes over 100
                  "--keep-checkpoints", 10000,
                  *[a for e in freezes for a in ("--test-event", e)])
    assert job.returncode == 0, job.output
    for event in freezes:
        fired(job, event)
    assert {32, 72, 112} <= set(clocks(run / "checkpoints")), clocks(run / "checkpoints")
    found = [os.path.dirname(p) for p in complete_checkpoints(run / "checkpoints")]
    assert len(found) >= 3, f"a run of several seconds wrote {len(found)} checkpoint(s)"
    for directory in found:
        assert checkpoint.verify(directory) is None
    earliest = tmp_path / "earliest"
    shutil.copytree(found[0], earliest / os.path.basename(found[0]))
    resumed = run_job(4, "train", "--train", small_data[0], "--test", small_data[1],
                      "--servers", 2, "--out", tmp_path / "again", *TRAIN[:4],
                      "--resume", earliest)
    assert resumed.returncode == 0, resumed.output
    ours, theirs = load_model(tmp_path / "again" / "model"), load_model(uninterrupted / "model")
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])


def test_a_damaged_checkpoint_is_passed_over(small_data, uninterrupted, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(uninterrupted / "checkpoints", ckpt)
    newest, previous = [os.path.dirname(p) for p in complete_checkpoints(ckpt)[::-1][:2]]
    shard = os.path.join(newest, "server-0001.h5")
    with h5py.File(shard) as f:
        where = f["state"].id.get_offset() + 40
    with open(shard, "r+b") as f:       # flip bytes inside the saved weights
        f.seek(where)
        data = bytearray(f.read(8))
        f.seek(where)
        f.write(bytes(b ^ 0xFF for b in data))
    report = run_here("inspect", ckpt, "--all")
    assert f"{os.path.basename(newest)}  NOT USABLE: server-0001.h5: dataset state does not " \
           f"match its checksum" in report.stdout
    usual = run_here("inspect", ckpt)     # what a user types after a crash
    assert usual.returncode == 0
    assert usual.stdout.index(f"{os.path.basename(newest)}  NOT USABLE") < usual.stdout.index(
        f"--resume {ckpt} takes:\n{os.path.basename(previous)}  complete, checksums match")
    assert os.path.basename(sorted(complete_checkpoints(ckpt))[0]) not in usual.stdout, \
        "older checkpoints than the one taken are not listed without --all"
    job = run_job(4, "train", "--train", small_data[0], "--servers", 2, "--out",
                  tmp_path / "run", *TRAIN, "--resume", ckpt)
    assert job.returncode == 0, job.output
    assert f"checkpoint {newest} is damaged or incomplete" in job.output
    assert f"resumed from checkpoint clock {read_manifest(previous)['clock']}" in job.output
    os.truncate(os.path.join(previous, "server-0000.h5"), 1000)   # and a truncated file
    report = run_here("inspect", ckpt, "--all")
    assert report.returncode == 0 and "server-0000.h5: cut short (1,000 of its" in report.stdout


def test_a_manifest_with_a_damaged_place_is_passed_over_naming_it(small_data, tmp_path,
                                                                   uninterrupted):
    """The newest manifest's record of where worker 1 stood, damaged (its offset a string):
    `inspect` and a resume name the worker and the field, and the resume takes the
    checkpoint before it, with no traceback."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(uninterrupted / "checkpoints", ckpt)
    newest, previous = [os.path.dirname(p) for p in complete_checkpoints(ckpt)[::-1][:2]]
    manifest = os.path.join(newest, "manifest.json")
    with open(manifest) as f:
        kept = json.load(f)
    kept["positions"]["1"]["offset"] = "1234"
    with open(manifest, "w") as f:
        json.dump(kept, f)
    said = "manifest.json: worker 1's position: a position's offset is '1234', not an integer"
    report = run_here("inspect", ckpt)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"{os.path.basename(newest)}  NOT USABLE: {said}" in report.stdout, report.stdout
    job = run_job(4, "train", "--train", small_data[0], "--servers", 2, "--out",
                  tmp_path / "run", *TRAIN, "--resume", ckpt)
    assert job.returncode == 0, job.output
    assert f"checkpoint {newest} is damaged or incomplete ({said}" in job.output
    assert f"resumed from checkpoint clock {read_manifest(previous)['clock']}" in job.output
    assert "Traceback" not in job.output


def test_a_killed_rank_then_resume_finishes_as_well(small_data, uninterrupted, tmp_path):
    run = tmp_path / "run"
    args = ("train", "--train", small_data[0], "--test", small_data[1], "--servers", 2,
            "--out", run, *TRAIN)
    # Worker 1 (rank 3) dies once its push of clock 55 is acknowledged: the servers never
    # reach clock 56, so checkpoint 60 never falls due; 45 is the newest. Worker 0 waits at
    # clock 50 until checkpoint 45 is complete (its file is written beside the serving, and
    # under load could still be on its way at clock 55); under BSP worker 1 waits with it.
    kill_clock, go = 55, tmp_path / "go"
    kill, pause = f"kill rank 3 at clock {kill_clock}", f"pause rank 2 until {go} at clock 50"
    job = WatchedJob(4, *args, "--test-event", pause, "--test-event", kill)
    wait_for_file(job, f"{go}.reached")
    job.wait_until(lambda: complete_checkpoints(run / "checkpoints")[-1:] ==
                   [str(run / "checkpoints" / "clock-000000000045" / "manifest.json")],
                   "checkpoint 45 to be complete", timeout=300, recheck=0.05)
    go.write_text("")
    killed = job.finish(timeout=300)
    assert killed.returncode != 0, "the launcher reports the failure"
    fired(killed, kill)
    fired(killed, pause)
    assert f"test event: {kill} (reached clock {kill_clock})" in killed.output
    assert rank_pids(run) == [], "no rank outlives the failed job"
    assert clocks(run / "checkpoints") == [15, 30, 45]
    newest = read_manifest(os.path.dirname(complete_checkpoints(run / "checkpoints")[-1]))
    resumed = run_job(4, *args, "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    assert f"resumed from checkpoint clock {newest['clock']}" in resumed.output
    # Updates lost: the clocks the servers had applied at the kill (55: worker 1 never
    # pushed clock 56) beyond those the checkpoint holds (each worker's place at its clock,
    # 45 x 200 rows of epoch 0); less than one interval, the next having never been written.
    assert [(p["clock"], p["examples"]) for p in newest["positions"].values()] == \
        [(newest["clock"], newest["clock"] * 200)] * 2, newest["positions"]
    lost = kill_clock - newest["clock"]
    print(f"updates lost beyond checkpoint clock {newest['clock']}: {lost} clocks "
          f"({lost * CLOCK_ROWS} examples)")
    assert lost == 10, "the 10 clocks since checkpoint 45 are lost, no more, no fewer"
    assert lost < 15, "less than one checkpoint interval is lost"
    ours = read_summary(run)["test_logloss"]
    theirs = read_summary(uninterrupted)["test_logloss"]
    print(f"held-out logloss: resumed {ours:.6f}, uninterrupted {theirs:.6f}")
    assert abs(ours - theirs) / theirs < 0.005


def test_a_killed_or_frozen_writer_fails_its_checkpoint_and_the_last_file_is_waited_for(
        small_data, uninterrupted, tmp_path):
    """Server 0's second writer is killed halfway through its file: checkpoint 30 is not
    complete, 15 stays the newest until 45, the job says so and trains on. Server 1's fourth
    writer is frozen before it reads the live table: the server logs the rows it changes
    until the writer's bound (--timeout / 10: 2 s here), then stops it, and checkpoint 60 is not
    complete either (two failures, not in a row). Server 1's last writer (the final
    checkpoint, its 11th: every 15 clocks and the last) is kept busy 2 s: the job ends only
    once it is in, the final checkpoint complete, the model as if nothing had failed."""
    run = tmp_path / "run"
    kill, freeze = "kill rank 0 at writing 2", "freeze rank 1 at reading 4"
    slow = "busy rank 1 for 2 s at writing 11"
    job = run_job(4, "train", "--train", small_data[0], "--servers", 2, "--out", run, *TRAIN,
                  "--keep-checkpoints", 100, "--timeout", 20, "--test-event", kill,
                  "--test-event", freeze, "--test-event", slow)
    assert job.returncode == 0, job.output
    for event in (kill, freeze, slow):
        fired(job, event)
    assert "checkpoint at clock 30 was not written (server 0: the writer of server-0000.h5 " \
           "(process " in job.output
    assert "was killed by signal 9 (SIGKILL) before it finished" in job.output
    assert ("had not read the table within 2 s while the server logged the rows it changed, "
            "and was stopped") in job.output
    assert "training goes on, and stops if 3 in a row fail" in job.output
    last = clocks(uninterrupted / "checkpoints")[-1]
    every = sorted({*range(15, last + 1, 15), last})
    assert len(every) == 11, "the final checkpoint is server 1's 11th"
    assert clocks(run / "checkpoints") == [c for c in every if c not in (30, 60)]
    failed = run / "checkpoints" / "clock-000000000030"
    assert not (failed / "manifest.json").exists()
    assert os.listdir(failed) == ["server-0001.h5"], "server 0's temporary file removed"
    assert os.listdir(run / "checkpoints" / "clock-000000000060") == ["server-0000.h5"]
    assert f"waiting for this server's file of checkpoint clock {last}" in job.output
    directory = run / "checkpoints" / f"clock-{last:012d}"
    assert checkpoint.verify(str(directory)) is None
    assert {s["table"] for s in read_manifest(str(directory))["shards"]} == {"read in place"}
    ours, theirs = load_model(run / "model"), load_model(uninterrupted / "model")
    np.testing.assert_array_equal(ours[1], theirs[1])


UNEVEN_EPOCHS = 6


@pytest.fixture(scope="module")
def uneven_data(tmp_path_factory):
    """Worker 0's half of the bytes holds 4,000 short rows, worker 1's 20 long ones: each
    epoch is 40 minibatches for worker 0 and one for worker 1."""
    path = tmp_path_factory.mktemp("uneven") / "uneven.svm"
    rng = np.random.default_rng(5)
    with open(path, "w") as f:
        for _ in range(4000):
            f.write(f"{rng.integers(2)} {rng.integers(1000, 9999)}:1\n")
        for _ in range(20):
            keys = rng.choice(np.arange(10000, 99999), 200, replace=False)
            f.write(f"{rng.integers(2)} " + " ".join(f"{k}:1" for k in keys) + "\n")
    return str(path)


def test_a_stop_after_a_worker_has_finished_still_checkpoints_and_resumes(uneven_data,
                                                                         tmp_path):
    args = ("train", "--train", uneven_data, "--servers", 1, "--batch-size", 100,
            "--epochs", UNEVEN_EPOCHS, "--checkpoint-every", 100, "--timeout", 60)
    whole = run_job(3, *args, "--out", tmp_path / "whole")
    assert whole.returncode == 0, whole.output
    run = tmp_path / "run"
    # Clock 100: worker 1 finished at clock 6 (one minibatch an epoch).
    stop = "stop rank 0 at clock 100"
    ended = run_job(3, *args, "--out", run, "--test-event", stop,
                    timeout=50)     # not held for --timeout by the finished worker
    assert ended.returncode == 75, ended.output
    fired(ended, stop)
    assert read_summary(run)["stopped_at_clock"] == 102
    assert clocks(run / "checkpoints") == [100, 102]
    resumed = run_job(3, *args, "--out", run, "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    ours, theirs = load_model(run / "model"), load_model(tmp_path / "whole" / "model")
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])
    assert read_summary(run)["train_examples"] == read_summary(tmp_path / "whole")[
        "train_examples"] == UNEVEN_EPOCHS * 4020


def test_a_new_run_keeps_out_of_old_checkpoints(small_data, uninterrupted, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(uninterrupted / "checkpoints", ckpt)
    args = ("train", "--train", small_data[0], "--out", tmp_path / "run", "--checkpoint-dir",
            ckpt, *TRAIN)
    refused = run_job(3, *args)
    assert refused.returncode == 2, refused.output
    assert f"--checkpoint-dir {ckpt} already holds checkpoints" in refused.stderr, refused.output
    replaced = run_job(3, *args, "--overwrite", "--epochs", 1, "--keep-checkpoints", 100)
    assert replaced.returncode == 0, replaced.output
    for directory in checkpoint.all_checkpoints(ckpt):   # only this run's checkpoints
        assert read_manifest(directory)["servers"] == 1


# SIGTERM to every rank, each at its clock 20, as srun delivers it (KillWait before SIGKILL):
# the job checkpoints and stops two clocks past it, at 22.
TERMS = [f"term rank {r} at clock 20" for r in range(3)]
TERMED_AT = 22


@pytest.fixture(scope="module")
def termed(small_data, tmp_path_factory):
    """1 server + 2 workers, 2 epochs, a checkpoint every 15 clocks and the newest 2 kept,
    stopped by SIGTERM (TERMS): (the run's arguments, the ended job, its summary and the
    clocks of its checkpoints as it left them; a test may resume it in place)."""
    run = tmp_path_factory.mktemp("termed") / "run"
    args = ("train", "--train", small_data[0], "--out", run, "--epochs", 2, "--batch-size", 200)
    ended = run_job(3, *args, "--checkpoint-every", 15, "--keep-checkpoints", 2,
                    *[a for e in TERMS for a in ("--test-event", e)])
    manifest = run / "checkpoints" / f"clock-{TERMED_AT:012d}" / "manifest.json"
    summary = read_summary(run) if os.path.exists(run / "summary.json") else None
    return args, ended, summary, clocks(run / "checkpoints"), os.path.exists(manifest)


def test_sigterm_to_the_ranks_checkpoints_and_stops(termed):
    """As srun delivers it: SIGTERM to every rank, KillWait before SIGKILL."""
    _, ended, summary, _, manifest = termed
    assert ended.returncode == 75, ended.output
    for event in TERMS:
        fired(ended, event)
    assert summary["stopped_at_clock"] == TERMED_AT
    assert manifest, "the checkpoint of the stop's clock is complete"


def test_a_resume_keeps_the_checkpoint_settings_of_its_run(termed):
    """The run of `termed`, stopped at clock 22, resumed in place without checkpoint options:
    it goes on with those of its run."""
    args, stopped, _, written, _ = termed
    run = args[args.index("--out") + 1]
    assert stopped.returncode == 75, stopped.output
    assert written == [15, 22]
    resumed = run_job(3, *args, "--resume", run / "checkpoints")   # no checkpoint options
    assert resumed.returncode == 0, resumed.output
    assert "checkpoints every 15 clocks, keeping the newest 2" in resumed.output
    assert clocks(run / "checkpoints") == [90, 102], \
        "every 15 clocks and the final one, the newest 2 kept"
    again = run_job(3, *args, "--resume", run / "checkpoints", "--epochs", 3,
                    "--keep-checkpoints", 5)
    assert again.returncode == 0 and "keeping the newest 5" in again.output


def test_checkpoint_files_are_plain_hdf5(uninterrupted):
    ensure(H5DUMP)
    shard = glob.glob(str(uninterrupted / "checkpoints" / "clock-*" / "server-0000.h5"))[0]
    header = subprocess.run(["h5dump", "-H", shard], capture_output=True, text=True)
    assert header.returncode == 0
    assert 'DATASET "keys"' in header.stdout and 'DATASET "state"' in header.stdout


def test_a_checkpoints_checksums_are_the_reference_xxh64_and_older_sha256_ones_still_verify(
        uninterrupted, tmp_path):
    """A checkpoint's datasets carry XXH64 digests any xxHash tool computes from the dataset's
    bytes (version 2); one of version 1, with SHA-256 digests, still verifies and is still
    refused when a dataset changes; a manifest of a version this mpips does not know is
    refused, naming it."""
    newest = os.path.dirname(complete_checkpoints(uninterrupted / "checkpoints")[-1])
    manifest = read_manifest(newest)
    assert manifest["version"] == 2
    for shard in manifest["shards"]:
        assert "sha256" not in shard
        with h5py.File(os.path.join(newest, shard["file"])) as f:
            assert shard["xxh64"] == {name: xxhash.xxh64(f[name][()].tobytes()).hexdigest()
                                      for name in ("keys", "state")}
    old = tmp_path / "old"
    shutil.copytree(newest, old)
    for shard in manifest["shards"]:
        with h5py.File(old / shard["file"]) as f:
            shard["sha256"] = {name: hashlib.sha256(f[name][()].tobytes()).hexdigest()
                               for name in shard.pop("xxh64")}
    with open(old / "manifest.json", "w") as f:
        json.dump({**manifest, "version": 1}, f)
    assert checkpoint.verify(str(old)) is None
    shard = old / manifest["shards"][0]["file"]
    with h5py.File(shard, "r+") as f:
        f["state"][0, 0] += 1
    assert checkpoint.verify(str(old)) == \
        f"{shard.name}: dataset state does not match its checksum"
    with open(old / "manifest.json", "w") as f:
        json.dump({**manifest, "version": 3}, f)
    assert "version 3: this mpips reads checkpoints of versions 1 to 2" in \
        checkpoint.verify(str(old))
    del manifest["shards"][1]["sha256"]   # a file's entry with no checksums at all
    with open(old / "manifest.json", "w") as f:
        json.dump({**manifest, "version": 2}, f)
    assert "checksums (one of sha256, xxh64)" in checkpoint.verify(str(old))
