"""The job templates in slurm/, submitted with sbatch to the real Slurm of the `slurm` fixture.

Kills and pauses come from the ranks at a named point (mpips/run/testevents.py), given to the
job in MPIPS_TEST_EVENTS with MPIPS_TESTING=1 in its environment: the templates pass EXTRA
on as words, and an event is several."""
import json
import os
import time

import numpy as np
import pytest
from support import DETECTOR_S, LAUNCHER_DID_NOT_START, run_job

from mpips.storage.model_files import load_model
from slurm_cluster import TERMINAL, slurm_fixture  # noqa: F401  (provides `slurm`)

pytestmark = pytest.mark.slurm


def fired(out: str, text: str) -> None:
    """The job's output says it fired the event `text`."""
    assert f"test event: {text} (reached" in out, f"the job never fired {text!r}:\n{out}"


def wait_for_file(path, cluster, job_id, timeout=120) -> None:
    """Wait until `path` exists (a pause reached); fail if the job ends first."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        job = cluster.job(job_id)
        assert job["JobState"] not in TERMINAL, \
            f"job {job_id} ended ({job['JobState']}) before {path} was written"
        assert time.monotonic() < deadline, f"job {job_id} did not write {path} in {timeout} s"
        time.sleep(0.1)


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


# Minibatches of 200 rows: the templates' jobs run 50 clocks an epoch, not the default's 1,000
# (what is tested is the launch: the ranks, nodes and options the templates give).
QUICK = "--batch-size 200"


def test_single_node_template(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    out = trained(slurm, run, "train.sbatch", "--ntasks=3", TRAIN=small_data[0],
                  TEST=small_data[1], SERVERS=1, EXTRA=QUICK)
    assert "launcher mpiexec" in out and summary(run)["workers"] == 2


def test_ft_knob_launches_with_ulfm(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    out = trained(slurm, run, "train.sbatch", "--ntasks=3", TRAIN=small_data[0],
                  TEST=small_data[1], SERVERS=1, FT=1, FT_TIMEOUT=DETECTOR_S, EXTRA=QUICK)
    assert "launcher mpiexec with ULFM (FT=1)" in out
    assert "hot failover is on: Open MPI" in out, out


def test_multinode_template_spreading_servers(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    trained(slurm, run, "multinode.sbatch", "--nodes=2", "--ntasks-per-node=2",
            TRAIN=small_data[0], TEST=small_data[1], SERVERS=2, SPREAD=1, EXTRA=QUICK)
    assert (summary(run)["servers"], summary(run)["workers"]) == (2, 2)
    assert sorted(summary(run)["nodes"]["servers"]) == ["ps1", "ps2"], "one server per node"


def test_heterogeneous_template_puts_servers_in_the_first_component(slurm, small_data,
                                                                      tmp_path):
    run = tmp_path / "run"
    trained(slurm, run, "hetjob.sbatch", "--ntasks=1", "--constraint=bigmem", ":",
            "--ntasks=2", "--constraint=standard", TRAIN=small_data[0], TEST=small_data[1],
            EXTRA=QUICK)
    assert (summary(run)["servers"], summary(run)["workers"]) == (1, 2)
    assert summary(run)["nodes"] == {"servers": ["ps1"], "workers": ["ps2", "ps2"]}


@pytest.mark.timeout(600)
def test_requeued_job_resumes_after_a_rank_is_killed(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    # The server (rank 0) dies as a failing node would, during its 8th checkpoint (clock 160
    # of 202: its file written, the manifest not): the launch fails. The requeued launch,
    # from clock 140, is given the same event, which fires once per run.
    kill = "kill rank 0 at checkpoint 8"
    job = slurm.submit("requeue.sbatch", "--ntasks=3", TRAIN=small_data[0], TEST=small_data[1],
                       RUN_DIR=run, CHECKPOINT_EVERY=20, MPIPS_TESTING=1,
                       MPIPS_TEST_EVENTS=kill, EXTRA="--epochs 2 --batch-size 100")
    out = finished_with_a_model(slurm, job, run, timeout=500)
    fired(out, kill)
    assert out.count("test event: ") == 1, "the requeued launch did not kill again"
    assert slurm.job(job)["Restarts"] == "1"
    assert "requeueing to resume from the last checkpoint" in out
    assert "resumed from checkpoint clock 140" in out, out
    assert summary(run)["train_examples"] == 2 * 20000


@pytest.mark.timeout(600)
def test_time_limit_warning_checkpoints_stops_and_requeues(slurm, small_data, tmp_path):
    run = tmp_path / "run"
    # Worker 0 (rank 1) waits at its clock 30 until the test has signalled: the job is
    # running, every rank up, and cannot have ended (nor trained past clock 31) when the
    # signal comes. The requeued launch passes the pause at once (the file exists).
    held = tmp_path / "signalled"
    pause = f"pause rank 1 until {held} at clock 30"
    job = slurm.submit("requeue.sbatch", "--ntasks=3", TRAIN=small_data[0], TEST=small_data[1],
                       RUN_DIR=run, CHECKPOINT_EVERY=1000, MPIPS_TESTING=1,
                       MPIPS_TEST_EVENTS=pause, EXTRA="--epochs 2 --batch-size 100")
    wait_for_file(f"{held}.reached", slurm, job)
    # What Slurm does --signal=B:USR1@120 before the time limit: signal the batch shell. The
    # lead names the clock to stop at (two past the slowest worker, held at 30) before the
    # pause ends.
    slurm.run("scancel", "--batch", "--signal=USR1", job)
    wait_for_output(slurm, job, "stopping at clock 32, two past the slowest worker")
    held.touch()
    out = finished_with_a_model(slurm, job, run, timeout=500)
    fired(out, pause)
    assert "asking the job to checkpoint and stop" in out
    assert "stopped after a checkpoint; requeueing" in out and "resumed from checkpoint" in out
    [stop] = [int(line.split("resumed from checkpoint clock ")[1].split()[0])
              for line in out.splitlines() if "resumed from checkpoint clock " in line]
    assert stop == 32, "two clocks past the slowest worker, held at 30"
    assert summary(run)["train_examples"] == 2 * 20000


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


# 3 servers + 2 workers, every key on 2 servers (as in tests/jobs/test_failover.py); server 1
# (rank 1) dies once every worker has completed clock 60 (of 153).
EPOCHS = 3
FAILOVER = ("--replicas", "2", "--epochs", str(EPOCHS), "--batch-size", "200",
            "--log-every", "0.2", "--timeout", "60")
KILL = "kill rank 1 at clock 60"


@pytest.mark.timeout(600)
def test_with_ft_a_killed_server_fails_over_and_the_job_completes_without_a_requeue(
        slurm, small_data, tmp_path):
    run = tmp_path / "run"
    # requeue.sbatch would requeue the job had the launch failed: it must not.
    # ULFM's failure detector as in the other tests (support.ULFM), not the template's 1 s.
    job = slurm.submit("requeue.sbatch", "--ntasks=5", "--overcommit", TRAIN=small_data[0],
                       TEST=small_data[1], RUN_DIR=run, SERVERS=3, CHECKPOINT_EVERY=100, FT=1,
                       FT_TIMEOUT=DETECTOR_S, MPIPS_TESTING=1, MPIPS_TEST_EVENTS=KILL,
                       EXTRA=" ".join(FAILOVER))
    ended = slurm.wait(job, 240)
    out = slurm.output(ended)
    assert (ended["JobState"], ended["ExitCode"]) == ("COMPLETED", "0:0"), out
    fired(out, KILL)
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
