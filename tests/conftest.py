"""Shared test helpers: launching real mpiexec jobs, and small generated datasets."""
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import pytest

# What the Makefile exports, so `pytest` also works when run by hand (as root, on few cores).
for _name, _value in (("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                      ("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe"),
                      ("OMPI_MCA_osc", "^ucx"), ("OMPI_MCA_btl", "^ofi")):
    os.environ.setdefault(_name, _value)


# mpiexec's options for hot failover: ULFM and its failure detector (what FT=1 adds).
ULFM = ("--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true",
        "--mca", "mpi_ft_detector_period", "0.2", "--mca", "mpi_ft_detector_timeout", "1")


def mpiexec_path() -> str:
    if os.environ.get("MPIEXEC"):
        return os.environ["MPIEXEC"]
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else "mpiexec"


@dataclass
class Job:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def launch(n_ranks: int, *args) -> subprocess.Popen:
    """Start `mpiexec -n N python -m mpips ARGS` in its own process group."""
    cmd = [mpiexec_path(), "-n", str(n_ranks), sys.executable, "-m", "mpips", *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 180) -> Job:
    """Wait for a launched job; kill its whole process group and fail the test if it
    outlives `timeout`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"job did not finish within {timeout} s: {' '.join(proc.args)}\n{out}\n{err}")
    return Job(proc.returncode, out, err)


# Open MPI's launcher, started many times in a row, now and then fails to start before any
# rank runs (its PMIx listener cannot bind): that launch is tried again.
LAUNCHER_DID_NOT_START = "The PMIx server's listener thread failed to start"


def run_job(n_ranks: int, *args: str, timeout: float = 180) -> Job:
    """Run `mpiexec -n N python -m mpips ARGS` to completion (see `finish`)."""
    for _ in range(3):
        job = finish(launch(n_ranks, *args), timeout)
        if LAUNCHER_DID_NOT_START not in job.stderr:
            break
    return job


def run_mpips(*args: str, timeout: float = 120) -> Job:
    """Run `python -m mpips ARGS` as a plain process (no mpiexec)."""
    proc = subprocess.run([sys.executable, "-m", "mpips", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)
    return Job(proc.returncode, proc.stdout, proc.stderr)


def read_summary(run_dir) -> dict:
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def small_data(tmp_path_factory):
    """A small CTR-like dataset: 20,000 training rows, 10,000 test rows, 10 features each."""
    prefix = tmp_path_factory.mktemp("small") / "s"
    job = run_mpips("make-data", "--rows", 20000, "--test-rows", 10000, "--features", 2000,
                    "--nnz", 10, "--seed", 3, prefix)
    assert job.returncode == 0, job.output
    return f"{prefix}.train.svm", f"{prefix}.test.svm"
