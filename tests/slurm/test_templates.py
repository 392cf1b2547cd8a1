"""The job templates in slurm/, submitted with sbatch to the real Slurm of the `slurm` fixture."""
import glob
import json
import os
import subprocess
import time

import pytest

from mpips.model_io import load_model
from slurm_cluster import slurm_fixture  # noqa: F401  (provides the `slurm` fixture)

pytestmark = pytest.mark.slurm


def summary(run_dir) -> dict:
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def finished_with_a_model(cluster, job_id, run_dir, timeout=240) -> str:
    job = cluster.wait(job_id, timeout)
    out = cluster.output(job)
    assert job["JobState"] == "COMPLETED", f"{job['JobState']} {job['ExitCode']}:\n{out}"
    keys, _ = load_model(os.path.join(run_dir, "model"))
    assert keys.shape[0] == summary(run_dir)["keys_stored"] > 0
    return out


def test_single_node_template(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    job = slurm.submit("train.sbatch", "--ntasks=3", TRAIN=small_data[0], TEST=small_data[1],
                       RUN_DIR=run, SERVERS=1)
    out = finished_with_a_model(slurm, job, run)
    assert "launcher mpiexec" in out and summary(run)["workers"] == 2


def test_ft_knob_launches_with_ulfm(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    job = slurm.submit("train.sbatch", "--ntasks=3", TRAIN=small_data[0], TEST=small_data[1],
                       RUN_DIR=run, SERVERS=1, FT=1)
    out = finished_with_a_model(slurm, job, run)
    assert "launcher mpiexec with ULFM (FT=1)" in out
    assert "hot failover is on: Open MPI" in out, out


def test_multinode_template_spreading_servers(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    job = slurm.submit("multinode.sbatch", "--nodes=2", "--ntasks-per-node=2",
                       TRAIN=small_data[0], TEST=small_data[1], RUN_DIR=run, SERVERS=2, SPREAD=1)
    finished_with_a_model(slurm, job, run)
    assert (summary(run)["servers"], summary(run)["workers"]) == (2, 2)
    assert sorted(summary(run)["nodes"]["servers"]) == ["ps1", "ps2"], "one server per node"


def test_heterogeneous_template_puts_servers_in_the_first_component(slurm, small_data,
                                                                      tmp_path):
    run = tmp_path / "run"
    job = slurm.submit("hetjob.sbatch", "--ntasks=1", "--constraint=bigmem", ":",
                       "--ntasks=2", "--constraint=standard",
                       TRAIN=small_data[0], TEST=small_data[1], RUN_DIR=run)
    finished_with_a_model(slurm, job, run)
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
                       RUN_DIR=run, CHECKPOINT_EVERY=20, EXTRA="--epochs 12 --batch-size 100")
    wait_for_checkpoint(run)
    # Kill one rank of the running job, as a failing node would: the launch fails.
    killed = subprocess.run(["pkill", "-KILL", "-f", f"mpips train .*--out {run}"])
    assert killed.returncode == 0, "a rank of the job was running"
    out = finished_with_a_model(slurm, job, run, timeout=500)
    assert slurm.job(job)["Restarts"] == "1"
    assert "requeueing to resume from the last checkpoint" in out
    assert "resumed from checkpoint" in out
    assert summary(run)["train_examples"] == 12 * 20000


@pytest.mark.timeout(600)
def test_time_limit_warning_checkpoints_stops_and_requeues(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    job = slurm.submit("requeue.sbatch", "--ntasks=3", TRAIN=small_data[0], TEST=small_data[1],
                       RUN_DIR=run, CHECKPOINT_EVERY=1000, EXTRA="--epochs 12 --batch-size 100")
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
    assert summary(run)["train_examples"] == 12 * 20000
