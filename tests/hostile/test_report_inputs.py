"""Careless and damaged inputs to `mpips report` (and to `score` and `mpips.load`, which read
the same files): a directory that is no run, a damaged summary or timeline, a model or
snapshot file cut short, a run that crashed, a test file gone, a page that cannot be
written. Either a one-line error naming the file, or the page with what can be shown and a
note naming what could not."""
import os
import shutil

import pytest
from support import run_here, run_job

import mpips
from mpips.cli.report import load_run


@pytest.fixture(scope="module")
def run(small_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile-report") / "run"
    job = run_job(3, "train", "--train", small_data[0], "--test", small_data[1], "--out", out,
                  "--batch-size", 200, "--snapshot-every", 0.5, "--checkpoint-every", 20)
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
    job = run_here("report", target)
    assert job.returncode == 2, job.output
    assert says in job.stderr and "Traceback" not in job.stderr
    assert not (target / "report.html").exists()


def test_a_damaged_timeline_leaves_the_page_without_its_plots_over_time(run, tmp_path):
    target = copy_of(run, tmp_path)
    (target / "timeline.h5").write_bytes(b"not hdf5 at all")
    job = run_here("report", target)
    assert job.returncode == 0, job.output
    page = (target / "report.html").read_text()
    assert f"{target / 'timeline.h5'}: not a readable timeline" in job.stderr
    assert "no plots over time" in page
    assert page.count("<img ") == 2   # learning curves and the workers' totals


def test_a_test_file_gone_leaves_the_learning_curve_out_saying_so(run, small_data, tmp_path):
    target = copy_of(run, tmp_path)
    missing = tmp_path / "moved.svm"
    job = run_here("report", target, "--test", missing)
    assert job.returncode == 0, job.output
    assert f"no learning curve: {missing}" in job.stderr
    assert "no learning curve" in (target / "report.html").read_text()


def test_a_page_that_cannot_be_written_is_one_line_of_error(run, tmp_path):
    (tmp_path / "notes").write_text("a file, where the page's directory would be")
    job = run_here("report", run, "--out", tmp_path / "notes" / "r.html")
    assert job.returncode == 2, job.output
    assert "r.html" in job.stderr and "Traceback" not in job.stderr


def cut_short(path) -> str:
    """Truncate an HDF5 file as an unfinished copy leaves it; its path."""
    os.truncate(path, 3000)
    return str(path)


def test_a_model_cut_short_is_named_by_score_and_load(run, small_data, tmp_path):
    target = copy_of(run, tmp_path)
    shard = cut_short(target / "model" / "server-0000.h5")
    job = run_here("score", target, "--test", small_data[1])
    assert job.returncode == 2, job.output
    [line] = job.stderr.splitlines()
    assert f"{shard}: cut short" in line and "copy it again" in line
    with pytest.raises(ValueError, match=f"{shard}: cut short"):
        mpips.load(target)


def test_a_checkpoint_shard_cut_short_is_named_by_load(run, tmp_path):
    target = copy_of(run, tmp_path)
    checkpoint = sorted((target / "checkpoints").glob("clock-*"))[-1]
    shard = cut_short(checkpoint / "server-0000.h5")
    with pytest.raises(ValueError, match=f"{shard}: cut short"):
        mpips.load(checkpoint)


def with_a_cut_short_snapshot(run, tmp_path) -> tuple:
    """A copy of `run` with one more snapshot (a copy of the final one, numbered after those
    the run took: how many it took depends on its speed) and the final one cut short; (the
    copy, the damaged file, the numbered snapshots)."""
    target = copy_of(run, tmp_path)
    taken = [int(p.name) for p in (target / "snapshots").iterdir() if p.name.isdigit()]
    shutil.copytree(target / "snapshots" / "final",
                    target / "snapshots" / f"{max(taken, default=-1) + 1:04d}")
    numbered = sorted(p.name for p in (target / "snapshots").iterdir() if p.name.isdigit())
    return target, cut_short(target / "snapshots" / "final" / "server-0000.h5"), numbered


def test_a_snapshot_cut_short_is_left_out_of_the_curve_naming_it(run, tmp_path):
    target, shard, numbered = with_a_cut_short_snapshot(run, tmp_path)
    job = run_here("report", target)
    assert job.returncode == 0, job.output
    assert f"{shard}: cut short" in job.stderr and "Traceback" not in job.stderr
    page = (target / "report.html").read_text()
    assert "snapshot final left out" in page and "no learning curve" not in page
    assert [p["snapshot"] for p in load_run(str(target)).curve] == numbered


def test_score_of_the_snapshots_passes_over_one_cut_short_naming_it(run, small_data, tmp_path):
    target, shard, numbered = with_a_cut_short_snapshot(run, tmp_path)
    job = run_here("score", target, "--test", small_data[1], "--snapshots")
    assert job.returncode == 0, job.output
    assert f"{shard}: cut short" in job.stderr and "Traceback" not in job.stderr
    assert all(f"snapshot  {name}" in job.stdout for name in numbered), job.stdout
    assert "snapshot final" not in job.stdout


def test_a_crashed_run_among_several_is_a_note_and_the_others_are_reported(run, small_data,
                                                                           tmp_path):
    crashed = tmp_path / "crashed"
    job = run_job(3, "train", "--train", small_data[0], "--out", crashed, "--batch-size", 200,
                  "--test-event", "kill rank 1 at clock 10", timeout=120)
    assert job.returncode != 0 and not (crashed / "summary.json").exists(), job.output
    page = tmp_path / "both.html"
    job = run_here("report", run, crashed, "--out", page)
    assert job.returncode == 0, job.output
    text = page.read_text()
    assert f"left out: {crashed}: no summary.json" in text
    assert "<th>run</th>" in text and "<th>crashed</th>" not in text
