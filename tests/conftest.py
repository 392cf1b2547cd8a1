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
