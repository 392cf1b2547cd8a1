"""At start, rank 0 says whether hot failover can work in this launch, and if not, why."""
import subprocess
import sys

import pytest
from support import DETECTOR_S, ULFM, Job, finish, mpiexec_path, read_summary, run_mpips


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("tiny") / "t"
    job = run_mpips("make-data", "--rows", 3000, "--test-rows", 500, "--features", 500,
                    "--nnz", 5, "--seed", 1, prefix)
    assert job.returncode == 0, job.output
    return f"{prefix}.train.svm", f"{prefix}.test.svm"


def train(flags, data, out) -> Job:
    # (100-row minibatches: the default's 1-row ones make 1,500 clocks of a job that is only
    # asked what it says as it starts)
    cmd = [mpiexec_path(), *flags, "-n", "3", sys.executable, "-m", "mpips", "train",
           "--servers", "1", "--train", data[0], "--test", data[1], "--out", str(out),
           "--batch-size", "100"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    return finish(proc, timeout=120)


def ft_lines(job: Job) -> list:
    return [line for line in job.stderr.splitlines() if "hot failover is" in line]


def test_plain_launch_says_off_and_how_to_turn_it_on(tiny, tmp_path):
    job = train([], tiny, tmp_path / "run")
    assert job.returncode == 0, job.output
    lines = ft_lines(job)
    assert len(lines) == 1 and "mpips rank 0 (server 0): INFO" in lines[0], job.stderr
    assert lines[0].endswith("hot failover is off: launched without ULFM (use `make run FT=1`, "
                             "FT=1 in the Slurm templates, or mpiexec --with-ft ulfm --mca "
                             "mpi_ft_detector true --mca mpi_ft_detector_period 0.2 --mca "
                             "mpi_ft_detector_timeout 10)")
    assert read_summary(tmp_path / "run")["train_examples"] == 3000


def test_ulfm_launch_says_on(tiny, tmp_path):
    """The tests' ULFM launch: the sentence gives its failure detector's bound (6 s)."""
    job = train(ULFM, tiny, tmp_path / "run")
    assert job.returncode == 0, job.output
    lines = ft_lines(job)
    assert len(lines) == 1 and "mpips rank 0 (server 0): INFO" in lines[0], job.stderr
    assert "hot failover is on: Open MPI 5." in lines[0]
    assert lines[0].endswith("with ULFM and its failure detector (a rank silent for "
                             f"{DETECTOR_S:g} s counts as failed)")
    assert read_summary(tmp_path / "run")["train_examples"] == 3000


def test_ulfm_without_the_detector_says_off_and_why(tiny, tmp_path):
    job = train(["--with-ft", "ulfm"], tiny, tmp_path / "run")
    assert job.returncode == 0, job.output
    lines = ft_lines(job)
    assert len(lines) == 1, job.stderr
    assert "hot failover is off: launched with ULFM but without its failure detector" in lines[0]


# Rank 0 revokes the job's communicator, as a rank leaving after a failure does; rank 1 waits
# on a receive from it with Testall, as a worker does without failover, and says what mpips
# makes of the error, then tells rank 0 over a communicator made before (not revoked).
REVOKED = """
import os, sys
import numpy as np
from mpi4py import MPI
from mpips.ranks import ulfm
from mpips.ranks.bounded import wait_all
world = MPI.COMM_WORLD
comm, beside = world.Dup(), world.Dup()
ulfm.job_communicator(comm)
done = np.zeros(1, np.int64)
if world.rank == 0:
    ulfm.stop_the_others(comm)
    beside.Recv(done, source=1)
else:
    try:
        wait_all([comm.Irecv(np.zeros(1, np.int64), source=0)], 60, lambda: "rank 0")
        print("the wait ended without an error")
    except MPI.Exception as e:
        print(MPI.Get_error_string(e.Get_error_class()).split(":")[0],
              "revoked" if ulfm.revoked(e) else "not revoked",
              "a failure" if ulfm.is_failure(e) else "not a failure")
    beside.Send(done, dest=0)
sys.stdout.flush()
os._exit(0)
"""


def test_a_wait_on_a_revoked_communicator_is_read_as_the_job_stopped_by_another_rank():
    """MPI says MPI_ERR_IN_STATUS, not MPI_ERR_REVOKED, to a wait on several requests: read as
    the job stopped by another rank (ulfm.revoked) all the same, a worker then leaves with the
    job's exit 75 instead of a traceback and MPI_Abort."""
    proc = subprocess.Popen([mpiexec_path(), *ULFM, "-n", "2", sys.executable, "-c", REVOKED],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    job = finish(proc, timeout=120)
    assert job.returncode == 0, job.output
    assert job.stdout.strip() == "MPI_ERR_IN_STATUS revoked a failure", job.output
