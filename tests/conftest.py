"""Fixtures shared by the test folders; the helpers themselves are in support.py (imported as
`support`: tests/ is on pytest's python path)."""
import os

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With MPIPS_TEST_CPU_LOG=FILE: each test's CPU seconds (its setup, call and teardown,
    this process's and its children's: the jobs it launched) appended to FILE, to see where
    the suite's time goes."""
    log = os.environ.get("MPIPS_TEST_CPU_LOG")
    if not log:
        yield
        return
    before = _cpu()
    yield
    with open(log, "a") as f:
        f.write(f"{_cpu() - before:.2f}\t{item.nodeid}\n")


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
