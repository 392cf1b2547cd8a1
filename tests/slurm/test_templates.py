"""The job templates in slurm/, submitted with sbatch to the real Slurm of the `slurm` fixture."""
import glob
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from support import LAUNCHER_DID_NOT_START, run_job
from watch import pid_of_rank

from mpips.model_io import load_model
from slurm_cluster import TERMINAL, slurm_fixture  # noqa: F401  (provides `slurm`)

pytestmark = pytest.mark.slurm


def summary(run_dir) -> dict:
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def has_a_model(run_dir) -> None:
    keys, _ = load_model(os.path.join(run_dir, "model"))
    assert keys.shape[0] == summary(run_dir)["keys_stored"] > 0


def finished_with_a_model(cluster, job_id, run_dir, timeout=240) -> str:
    job = cluster.wait(job_id, timeout)
    out = cluster.output(job)
    assert job["JobState"] == "COMPLETED", f"{job['JobState']} {job['ExitCode']}:\n{out}"
    has_a_model(run_dir)
    return out


def trained(cluster, run_dir, template, *options, **env) -> str:
    """Submit a template that runs once (no requeue) and wait for its model. A job whose
    launcher did not start (see conftest) is submitted again, as run_job launches again."""
    for _ in range(3):
        job = cluster.wait(cluster.submit(template, *options, RUN_DIR=run_dir, **env), 240)
        out = cluster.output(job)
        if job["JobState"] == "COMPLETED" or LAUNCHER_DID_NOT_START not in out:
            break
    assert job["JobState"] == "COMPLETED", f"{job['JobState']} {job['ExitCode']}:\n{out}"
    has_a_model(run_dir)
    return out


def test_single_node_template(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    out = trained(slurm, run, "train.sbatch", "--ntasks=3", TRAIN=small_data[0],
                  TEST=small_data[1], SERVERS=1)
    assert "launcher mpiexec" in out and summary(run)["workers"] == 2


def test_ft_knob_launches_with_ulfm(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    out = trained(slurm, run, "train.sbatch", "--ntasks=3", TRAIN=small_data[0],
                  TEST=small_data[1], SERVERS=1, FT=1)
    assert "launcher mpiexec with ULFM (FT=1)" in out
    assert "hot failover is on: Open MPI" in out, out


def test_multinode_template_spreading_servers(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    trained(slurm, run, "multinode.sbatch", "--nodes=2", "--ntasks-per-node=2",
            TRAIN=small_data[0], TEST=small_data[1], SERVERS=2, SPREAD=1)
    assert (summary(run)["servers"], summary(run)["workers"]) == (2, 2)
    assert sorted(summary(run)["nodes"]["servers"]) == ["ps1", "ps2"], "one server per node"


def test_heterogeneous_template_puts_servers_in_the_first_component(slurm, small_data,
                                                                      tmp_path):
    run = tmp_path / "run"
    trained(slurm, run, "hetjob.sbatch", "--ntasks=1", "--constraint=bigmem", ":",
            "--ntasks=2", "--constraint=standard", TRAIN=small_data[0], TEST=small_data[1])
    assert (summary(run)["servers"], summary(run)["workers"]) == (1, 2)
    assert summary(run)["nodes"] == {"servers": ["ps1"], "workers": ["ps2", "ps2"]}


def wait_for_checkpoint(run_dir, timeout=120) -> str:
    deadline = time.monotonic() + timeout
    while not glob.glob(os.path.join(run_dir, "checkpoints", "clock-*", "manifest.json")):
        assert time.monotonic() < deadline, f"no checkpoint in {run_dir} after {timeout} s"
        time.sleep(0.2)
    return sorted(glob.glob(os.path.join(run_dir, "checkpoints", "clock-*")))[-1]


@pytest.mark.timeout(600)
def test_requeued_job_resumes_after_a_rank_is_killed(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    job = slurm.submit("requeue.sbatch", "--ntasks=3", TRAIN=small_data[0], TEST=small_data[1],
                       RUN_DIR=run, CHECKPOINT_EVERY=20, EXTRA="--epochs 6 --batch-size 100")
    wait_for_checkpoint(run)
    # Kill one rank of the running job, as a failing node would: the launch fails.
    killed = subprocess.run(["pkill", "-KILL", "-f", f"mpips train .*--out {run}"])
    assert killed.returncode == 0, "a rank of the job was running"
    out = finished_with_a_model(slurm, job, run, timeout=500)
    assert slurm.job(job)["Restarts"] == "1"
    assert "requeueing to resume from the last checkpoint" in out
    assert "resumed from checkpoint" in out
    assert summary(run)["train_examples"] == 6 * 20000


@pytest.mark.timeout(600)
def test_time_limit_warning_checkpoints_stops_and_requeues(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    job = slurm.submit("requeue.sbatch", "--ntasks=3", TRAIN=small_data[0], TEST=small_data[1],
                       RUN_DIR=run, CHECKPOINT_EVERY=1000, EXTRA="--epochs 6 --batch-size 100")
    slurm.wait(job, 120, until={"RUNNING"})
    deadline = time.monotonic() + 120
    while not os.path.exists(run / "mpips.lock"):   # every rank is up and takes signals
        assert time.monotonic() < deadline, "the job did not start in 120 s"
        time.sleep(0.2)
    # What Slurm does --signal=B:USR1@120 before the time limit: signal the batch shell.
    slurm.run("scancel", "--batch", "--signal=USR1", job)
    out = finished_with_a_model(slurm, job, run, timeout=500)
    assert "asking the job to checkpoint and stop" in out
    assert "stopped after a checkpoint; requeueing" in out and "resumed from checkpoint" in out
    assert summary(run)["train_examples"] == 6 * 20000


def wait_for_output(cluster, job_id, text, timeout=120) -> str:
    """Wait until the running job's output file contains `text`; fail if the job ends first."""
    deadline = time.monotonic() + timeout
    while True:
        job = cluster.job(job_id)
        out = cluster.output(job) if os.path.exists(job["StdOut"]) else ""
        if text in out:
            return out
        assert job["JobState"] not in TERMINAL, \
            f"job {job_id} ended ({job['JobState']}) without saying {text!r}:\n{out}"
        assert time.monotonic() < deadline, f"job {job_id} did not say {text!r} in {timeout} s"
        time.sleep(0.1)


# 3 servers + 2 workers, every key on 2 servers (as in tests/jobs/test_failover.py), training
# for some seconds, so that the kill comes well before the end.
EPOCHS = 40
FAILOVER = ("--replicas", "2", "--epochs", str(EPOCHS), "--batch-size", "200",
            "--log-every", "0.2", "--timeout", "60")


@pytest.mark.timeout(600)
def test_with_ft_a_killed_server_fails_over_and_the_job_completes_without_a_requeue(
        slurm, small_data, tmp_path):
    run = tmp_path / "run"
    # requeue.sbatch would requeue the job had the launch failed: it must not.
    job = slurm.submit("requeue.sbatch", "--ntasks=5", "--overcommit", TRAIN=small_data[0],
                       TEST=small_data[1], RUN_DIR=run, SERVERS=3, CHECKPOINT_EVERY=100, FT=1,
                       EXTRA=" ".join(FAILOVER))
    wait_for_output(slurm, job, "training: epoch")
    rank_1 = pid_of_rank(run, 1, slurm_job=job)
    assert "trained: epoch" not in slurm.output(slurm.job(job)), "training ended before the kill"
    os.kill(rank_1, signal.SIGKILL)
    ended = slurm.wait(job, 240)
    out = slurm.output(ended)
    assert (ended["JobState"], ended["ExitCode"]) == ("COMPLETED", "0:0"), out
    assert ended["Restarts"] == "0" and out.count("mpips: job ") == 1, f"one launch:\n{out}"
    assert "launcher mpiexec with ULFM (FT=1)" in out and "mpips: training finished" in out
    assert "requeueing" not in out and not os.path.exists(run / "failed-attempts")
    assert "server 1 (rank 1) died; the living copies of its keys take over" in out, out
    s = summary(run)
    [failure] = s["failures"]
    assert (failure["server"], failure["rank"]) == (1, 1) and s["servers"] == 2
    assert s["train_examples"] == EPOCHS * 20000
    # The same training, uninterrupted and without Slurm, ends on the same model bit for bit.
    whole = tmp_path / "whole"
    ref = run_job(5, "train", "--train", small_data[0], "--test", small_data[1], "--out", whole,
                  "--servers", 3, "--overwrite", "--checkpoint-dir", whole / "checkpoints",
                  "--checkpoint-every", 100, *FAILOVER)
    assert ref.returncode == 0, ref.output
    ours, theirs = load_model(run / "model"), load_model(whole / "model")
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])
