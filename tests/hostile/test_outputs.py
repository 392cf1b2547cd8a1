"""Hostile and careless uses of the run and checkpoint directories: what a user has there is
never lost, and two jobs never share one.

Each case is a real job under mpiexec. To add one: start from the closest case, set up the
directory as the careless user would, and assert what must survive and what the job says.
"""
import json
import os
import re
import shutil
import signal
import socket

import h5py
import pytest
from support import ULFM, fired, read_summary, run_job
from mounts import tmpfs
from watch import WatchedJob, rank_pids, wait_for_file

from mpips.storage.model_files import load_model

# One worker by default (2 ranks): 50 clocks an epoch of its 20,000 rows.
QUICK = ("--batch-size", 400)


def train(data, run, *extra, n=2, timeout=120):
    return run_job(n, "train", "--train", data, "--out", run, *QUICK, *extra, timeout=timeout)


def run_id_of(run) -> str:
    return read_summary(run)["run_id"]


@pytest.fixture(scope="module")
def checkpointed(small_data, tmp_path_factory):
    """A finished run with checkpoints (every 20 clocks), left as it ended: a test that
    resumes it in place resumes a copy."""
    run = tmp_path_factory.mktemp("checkpointed") / "run"
    job = train(small_data[0], run, "--checkpoint-every", 20)
    assert job.returncode == 0, job.output
    return run


def test_resume_refuses_to_replace_another_runs_outputs(small_data, checkpointed, tmp_path):
    first, second = checkpointed, tmp_path / "second"
    assert train(small_data[0], second).returncode == 0
    before = (second / "summary.json").read_bytes()
    job = train(small_data[0], second, "--resume", first / "checkpoints")
    assert job.returncode == 2, job.output
    assert (f"the checkpoint is of run {run_id_of(first)}, but --out {second}" in job.stderr
            and run_id_of(second) in job.stderr)
    assert (second / "summary.json").read_bytes() == before, "the finished run is untouched"
    with h5py.File(second / "model" / "server-0000.h5") as f:
        assert f.attrs["run_id"] == run_id_of(second)


def test_resume_goes_on_under_its_own_run_id(small_data, checkpointed, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(checkpointed, run)
    first_id = run_id_of(run)
    job = train(small_data[0], run, "--resume", run / "checkpoints", "--epochs", 2,
                "--checkpoint-every", 20)
    assert job.returncode == 0, job.output
    assert run_id_of(run) == first_id, "the resumed run replaced its own outputs"


def test_overwrite_removes_only_what_mpips_wrote(small_data, tmp_path):
    run = tmp_path / "run"
    assert train(small_data[0], run, "--snapshot-every", 0.01, "--checkpoint-every", 20,
                 timeout=120).returncode == 0
    notes, photo = run / "model" / "notes.txt", run / "snapshots" / "photo.jpg"
    mine = run / "checkpoints" / "README"
    for path, text in ((notes, "my notes"), (photo, "jpeg"), (mine, "keep")):
        path.write_text(text)
    job = train(small_data[0], run, "--overwrite", "--servers", 2, n=3)
    assert job.returncode == 0, job.output
    assert notes.read_text() == "my notes" and photo.read_text() == "jpeg"
    assert mine.read_text() == "keep"
    assert "not written by mpips" in job.output and "notes.txt" in job.output
    assert sorted(p.name for p in (run / "model").glob("*.h5")) == ["server-0000.h5",
                                                                   "server-0001.h5"]
    assert not list((run / "snapshots").glob("0*")), "the old snapshots went"


def test_a_second_job_on_the_same_out_stops_at_once_naming_the_first(small_data, tmp_path):
    """The first job's worker 0 (rank 1) pauses at clock 5: the job certainly runs, holding
    the lock, while the second starts; then it stops itself there (SIGUSR1: checkpoint and
    stop, exit 75)."""
    run, go = tmp_path / "run", tmp_path / "go"
    pause, stop = f"pause rank 1 until {go} at clock 5", "stop rank 1 at clock 5"
    first = WatchedJob(2, "train", "--train", small_data[0], "--out", run, *QUICK,
                       "--checkpoint-every", 200, "--timeout", 300,
                       "--test-event", pause, "--test-event", stop)
    wait_for_file(first, f"{go}.reached", timeout=120)
    lock = json.loads((run / "mpips.lock").read_text())
    second = train(small_data[0], run, "--epochs", 1, timeout=60)
    open(go, "w").close()
    ended = first.finish()
    assert ended.returncode == 75, ended.output
    for event in (pause, stop):
        fired(ended, event)
        assert f"test event: {event} (reached clock 5)" in ended.output
    assert second.returncode == 2, second.output
    assert (f"is in use by run {lock['run_id']} on host {socket.gethostname()}"
            in second.stderr)
    assert run_id_of(run) == lock["run_id"], "the first job's outputs only"
    assert not (run / "mpips.lock").exists(), "released when the job ended"
    # (A new job given its --checkpoint-dir, which holds its checkpoint, is refused:
    # tests/jobs/test_checkpoints.py, test_a_new_run_keeps_out_of_old_checkpoints.)


def test_a_lock_left_by_a_dead_job_is_taken_over(small_data, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    dead = {"run_id": "gone", "host": socket.gethostname(), "pid": 2**22 + 1, "started": "1",
            "taken": "then", "what": "--out"}
    (run / "mpips.lock").write_text(json.dumps(dead))
    job = train(small_data[0], run)
    assert job.returncode == 0, job.output
    assert "taking over the lock of run gone" in job.output


def test_the_lock_of_a_failover_job_killed_whole_is_taken_over(small_data, tmp_path):
    """Under hot failover (ULFM, --replicas 2) the lock names every server, since the job
    outlives its lead. Its worker (rank 2) pauses at clock 5 and the test SIGKILLs every rank:
    no process of the job runs, so the next job takes the lock over at once, saying so."""
    run, go = tmp_path / "run", tmp_path / "go"
    first = WatchedJob(3, "train", "--train", small_data[0], "--out", run, *QUICK,
                       "--servers", 2, "--replicas", 2, "--timeout", 300,
                       "--test-event", f"pause rank 2 until {go} at clock 5", launcher=ULFM)
    wait_for_file(first, f"{go}.reached", timeout=120)
    lock = json.loads((run / "mpips.lock").read_text())
    ranks = rank_pids(run)
    for pid in ranks:
        os.kill(pid, signal.SIGKILL)
    first.finish(timeout=120)   # (its launcher ends once no rank is left)
    servers = [p["pid"] for p in lock["job"]]
    assert len(servers) == 2 and set(servers) <= set(ranks), (lock, ranks)
    again = train(small_data[0], run, "--overwrite")
    assert again.returncode == 0, again.output
    assert (f"taking over the lock of run {lock['run_id']} in {run}: its processes on this "
            f"host ({servers[0]}, {servers[1]}) are no longer running") in again.output
    assert run_id_of(run) != lock["run_id"]


def test_a_fresh_lock_of_another_host_is_respected_and_a_stale_one_taken_over(small_data,
                                                                             tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    other = {"run_id": "elsewhere", "host": "node-that-is-not-this-one", "pid": 1,
             "started": "1", "taken": "now", "what": "--out"}
    lock = run / "mpips.lock"
    lock.write_text(json.dumps(other))
    refused = train(small_data[0], run, timeout=60)
    assert refused.returncode == 2
    assert "in use by run elsewhere on host node-that-is-not-this-one" in refused.stderr
    os.utime(lock, (0, 0))   # its holder stopped refreshing it long ago
    job = train(small_data[0], run)
    assert job.returncode == 0, job.output
    assert "taking over the lock of run elsewhere" in job.output


def test_a_read_only_checkpoint_dir_matters_only_when_checkpoints_are_on(small_data, tmp_path):
    with tmpfs(tmp_path / "ro", read_only=True) as ro:
        quiet = train(small_data[0], tmp_path / "run", "--checkpoint-dir", ro, timeout=60)
        assert quiet.returncode == 0, quiet.output
        job = train(small_data[0], tmp_path / "run2", "--checkpoint-dir", ro,
                    "--checkpoint-every", 10, timeout=60)
        assert job.returncode == 2, job.output
        assert f"--checkpoint-dir {ro}: cannot write there (Read-only file system)" in job.stderr
        assert "Traceback" not in job.output


def test_a_killed_job_leaves_a_lock_that_its_resume_takes_over(small_data, tmp_path):
    """Rank 0, which holds the lock, is killed once it has written its file of the third
    checkpoint (clock 60), before that checkpoint is complete. An earlier one is: each server
    writes one file at a time, so server 1 had its file of clock 20 in before clock 40 (its
    file of clock 40 may still have been on its way: the resume is from clock 20 or 40)."""
    run = tmp_path / "run"
    args = ("train", "--train", small_data[0], "--out", run, "--servers", 2, "--batch-size", 100,
            "--epochs", 1, "--checkpoint-every", 20)   # 1 worker: 200 clocks
    kill = "kill rank 0 at checkpoint 3"
    job = run_job(3, *args, "--test-event", kill)
    assert job.returncode != 0
    fired(job, kill)
    assert f"test event: {kill} (reached checkpoint 3)" in job.output
    assert (run / "mpips.lock").exists()
    resumed = run_job(3, *args, "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    assert "is no longer running" in resumed.output
    assert re.search(r"resumed from checkpoint clock (20|40)\b", resumed.output), resumed.output
    keys, _ = load_model(run / "model")
    assert keys.shape[0] == read_summary(run)["keys_stored"]


def test_an_out_or_checkpoint_dir_that_is_a_file_is_refused(small_data, tmp_path):
    taken = tmp_path / "a-file"
    taken.write_text("not a directory")
    job = train(small_data[0], taken, timeout=60)
    assert job.returncode == 2 and f"--out {taken}: cannot create the directory" in job.stderr
    job = train(small_data[0], tmp_path / "run", "--checkpoint-dir", taken,
                "--checkpoint-every", 10, timeout=60)
    assert job.returncode == 2
    assert f"--checkpoint-dir {taken}: cannot create the directory" in job.stderr
    assert taken.read_text() == "not a directory"


def test_printed_output_piped_to_a_reader_that_stops_is_no_error():
    """`mpips schedule ... | head -1`: the reader closes the pipe early; no traceback."""
    import subprocess
    import sys
    for args in (["schedule", "--stages", "8", "--micro-batches", "4000"],
                 ["train", "--train", "nowhere.svm", "--model", "widedeep", "--stages", "3",
                  "--print-schedule"]):
        mpips = subprocess.Popen([sys.executable, "-m", "mpips", *args],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        mpips.stdout.read(10)
        mpips.stdout.close()   # as `head` does
        _, err = mpips.communicate(timeout=60)
        assert mpips.returncode == 0 and b"Traceback" not in err, err.decode()
