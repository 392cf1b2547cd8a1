"""Fixtures shared by the test folders; the helpers themselves are in support.py (imported as
`support`: tests/ is on pytest's python path)."""
import pytest
from support import run_mpips


@pytest.fixture(scope="session")
def small_data(tmp_path_factory):
    """A small CTR-like dataset: 20,000 training rows, 10,000 test rows, 10 features each."""
    prefix = tmp_path_factory.mktemp("small") / "s"
    job = run_mpips("make-data", "--rows", 20000, "--test-rows", 10000, "--features", 2000,
                    "--nnz", 10, "--seed", 3, prefix)
    assert job.returncode == 0, job.output
    return f"{prefix}.train.svm", f"{prefix}.test.svm"


@pytest.fixture(scope="session")
def criteo(tmp_path_factory):
    """A small Criteo TSV dataset: 20,000 training rows, 5,000 test rows."""
    prefix = tmp_path_factory.mktemp("criteo") / "c"
    job = run_mpips("make-data", "--format", "criteo", "--rows", 20000, "--test-rows", 5000,
                    "--features", 20000, "--seed", 4, prefix)
    assert job.returncode == 0, job.output
    return f"{prefix}.train.tsv", f"{prefix}.test.tsv"
