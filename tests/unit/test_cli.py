"""The command line without MPI: help, argument errors, make-data."""
import argparse

import pytest
from support import run_mpips

from mpips.run.option_spec import checkpoint_interval


def test_help_explains_each_option():
    job = run_mpips("train", "--help")
    assert job.returncode == 0
    for option in ("--train", "--test", "--servers", "--epochs", "--batch-size", "--optimizer",
                   "--lr", "--l2", "--l1", "--out", "--skip-bad-lines", "--timeout"):
        assert option in job.stdout
    assert "summary.json" in job.stdout


def test_bad_option_values_are_named():
    job = run_mpips("train", "--train", "x.svm", "--optimizer", "rmsprop")
    assert job.returncode == 2 and "--optimizer" in job.stderr


def test_make_data_rejects_bad_sizes(tmp_path):
    job = run_mpips("make-data", "--rows", "0", tmp_path / "x")
    assert job.returncode == 2 and "--rows must be at least 1" in job.stderr


def test_checkpoint_interval_is_clocks_or_time():
    assert checkpoint_interval("500") == (500, 0.0)
    assert checkpoint_interval("30s") == (0, 30.0)
    assert checkpoint_interval("1.5m") == (0, 90.0)
    assert checkpoint_interval("2h") == (0, 7200.0)
    for bad in ("often", "10x", "-5", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            checkpoint_interval(bad)
    job = run_mpips("train", "--train", "x.svm", "--checkpoint-every", "soon")
    assert job.returncode == 2 and "--checkpoint-every" in job.stderr


@pytest.mark.parametrize("command", ["rebalance", "status"])
def test_ctl_refuses_a_number_its_command_does_not_take(tmp_path, command):
    job = run_mpips("ctl", tmp_path, command, 3)
    assert job.returncode == 2 and f"{command} takes no N (it was given 3)" in job.stderr, job


def test_make_data_under_a_file_says_so_without_a_traceback(tmp_path):
    (tmp_path / "afile").write_text("")
    job = run_mpips("make-data", "--rows", 10, tmp_path / "afile" / "sub" / "x")
    assert job.returncode == 2, job.output
    assert f"cannot make its directory {tmp_path / 'afile' / 'sub'}" in job.stderr, job.stderr
    assert "Traceback" not in job.stderr
