"""A smoke run under MPICH (the `mpich` wheel, in .venv-mpich: `make test` runs this file with
that venv's python, so `mpiexec` is MPICH's Hydra): training, a checkpoint and a resume to
the same bits, a pipeline, a full-batch solver and a server joining a running job end as
they do under Open MPI. Users of the MPICH family (Cray MPICH, Intel MPI, MVAPICH) run what
this checks; hot failover is Open MPI's (ULFM), so none here."""
import pytest
from support import ctl_answers, fired, read_summary, run_job, run_mpips, same_model


@pytest.fixture(scope="module")
def mpi_library():
    from mpi4py import MPI
    version = MPI.Get_library_version()
    if "MPICH" not in version:
        pytest.skip(f"not under MPICH (run with .venv-mpich/bin/python): {version.splitlines()[0]}")
    return version


@pytest.fixture(scope="module")
def data(tmp_path_factory, mpi_library):
    prefix = tmp_path_factory.mktemp("data") / "s"
    made = run_mpips("make-data", "--rows", 8000, "--test-rows", 2000, "--features", 2000,
                     "--nnz", 10, "--seed", 3, prefix)
    assert made.returncode == 0, made.output
    return f"{prefix}.train.svm", f"{prefix}.test.svm"


TRAIN = ("--servers", 2, "--epochs", 3, "--batch-size", 200, "--checkpoint-every", 10)


def test_a_stopped_job_resumes_to_the_uninterrupted_bits(data, tmp_path):
    args = ("train", "--train", data[0], "--test", data[1], *TRAIN)
    whole = run_job(4, *args, "--out", tmp_path / "whole")
    assert whole.returncode == 0, whole.output
    run = tmp_path / "run"
    stopped = run_job(4, *args, "--out", run, "--test-event", "stop rank 3 at clock 25")
    fired(stopped, "stop rank 3 at clock 25")
    assert stopped.returncode == 75, stopped.output
    resumed = run_job(4, *args, "--out", run, "--resume", run / "checkpoints")
    assert resumed.returncode == 0, resumed.output
    same_model(run, tmp_path / "whole")
    assert read_summary(run)["train_examples"] == 3 * 8000


def test_a_pipeline_of_two_stages_trains(data, tmp_path):
    job = run_job(4, "train", "--train", data[0], "--test", data[1], "--out", tmp_path / "run",
                  "--servers", 2, "--model", "widedeep", "--embedding-dim", 4, "--hidden", "8",
                  "--stages", 2, "--epochs", 2, "--batch-size", 50)
    assert job.returncode == 0, job.output
    assert read_summary(tmp_path / "run")["test_auc"] > 0.7


def test_the_full_batch_solver_converges(data, tmp_path):
    job = run_job(4, "train", "--train", data[0], "--test", data[1], "--out", tmp_path / "run",
                  "--servers", 2, "--solver", "lbfgs", "--dim", 4096, "--l2", 1e-3)
    assert job.returncode == 0, job.output
    s = read_summary(tmp_path / "run")
    solver = s["solver"]
    assert solver["iterations"] < 500 and solver["gradient_norm"] < 1e-4, solver
    assert s["test_auc"] > 0.7


def test_a_spare_server_joins_a_running_job(data, tmp_path):
    run = tmp_path / "run"
    job = run_job(5, "train", "--train", data[0], "--out", run, "--servers", 2, "--spares", 1,
                  "--vnodes", 8, "--epochs", 20, "--batch-size", 200,
                  "--test-event", "ctl add-server at clock 5")
    assert job.returncode == 0, job.output
    [answer] = ctl_answers(run)
    assert answer["ok"] and answer["command"] == "add-server" and answer["keys_moved"] > 0, answer
    assert read_summary(run)["moves"][0]["ranges_after"] == {"0": 5, "1": 6, "2": 5}
