"""The command line without MPI: help, argument errors, make-data."""
from conftest import run_mpips


def test_help_explains_each_option():
    job = run_mpips("train", "--help")
    assert job.returncode == 0
    for option in ("--train", "--test", "--servers", "--epochs", "--batch-size", "--optimizer",
                   "--lr", "--l2", "--l1", "--out", "--skip-bad-lines", "--timeout"):
        assert option in job.stdout
    assert "summary.json" in job.stdout


def test_bad_option_values_are_named():
    job = run_mpips("train", "--train", "x.svm", "--optimizer", "adam")
    assert job.returncode == 2 and "--optimizer" in job.stderr


def test_make_data_rejects_bad_sizes(tmp_path):
    job = run_mpips("make-data", "--rows", "0", tmp_path / "x")
    assert job.returncode == 2 and "--rows must be at least 1" in job.stderr
