"""Careless and damaged inputs to `mpips report`: a directory that is no run, a damaged
summary or timeline, a test file gone, a page that cannot be written. Either a one-line error
naming the file, or the page with what can be shown and a note naming what could not."""
import shutil

import pytest
from support import run_job, run_mpips


@pytest.fixture(scope="module")
def run(small_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile-report") / "run"
    job = run_job(3, "train", "--train", small_data[0], "--test", small_data[1], "--out", out,
                  "--batch-size", 200, "--snapshot-every", 0.5)
    assert job.returncode == 0, job.output
    return out


def copy_of(run, tmp_path):
    return shutil.copytree(run, tmp_path / "run")


@pytest.mark.parametrize("damage, says", [
    ("no run", "no summary.json (not the --out directory of a finished mpips run)"),
    ("damaged summary", "summary.json: not a summary written by mpips"),
])
def test_what_is_no_run_is_refused_naming_it(run, tmp_path, damage, says):
    target = tmp_path / "empty"
    target.mkdir()
    if damage == "damaged summary":
        target = copy_of(run, tmp_path)
        (target / "summary.json").write_text('{"servers": 2, "work')
    job = run_mpips("report", target)
    assert job.returncode == 2, job.output
    assert says in job.stderr and "Traceback" not in job.stderr
    assert not (target / "report.html").exists()


def test_a_damaged_timeline_leaves_the_page_without_its_plots_over_time(run, tmp_path):
    target = copy_of(run, tmp_path)
    (target / "timeline.h5").write_bytes(b"not hdf5 at all")
    job = run_mpips("report", target)
    assert job.returncode == 0, job.output
    page = (target / "report.html").read_text()
    assert f"{target / 'timeline.h5'}: not a readable timeline" in job.stderr
    assert "no plots over time" in page
    assert page.count("<img ") == 2   # learning curves and the workers' totals


def test_a_test_file_gone_leaves_the_learning_curve_out_saying_so(run, small_data, tmp_path):
    target = copy_of(run, tmp_path)
    missing = tmp_path / "moved.svm"
    job = run_mpips("report", target, "--test", missing)
    assert job.returncode == 0, job.output
    assert f"no learning curve: {missing}" in job.stderr
    assert "no learning curve" in (target / "report.html").read_text()


def test_a_page_that_cannot_be_written_is_one_line_of_error(run, tmp_path):
    (tmp_path / "notes").write_text("a file, where the page's directory would be")
    job = run_mpips("report", run, "--out", tmp_path / "notes" / "r.html")
    assert job.returncode == 2, job.output
    assert "r.html" in job.stderr and "Traceback" not in job.stderr
