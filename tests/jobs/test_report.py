"""`mpips report`: the timeline a job writes, and the page of plots of two runs side by side,
opened in a real browser (headless Chromium) to see that every image loaded."""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from support import read_summary, run_here, run_job, run_mpips
from debian import CHROMIUM, ensure
from watch import WatchedJob, wait_for_file

from mpips.base import timeline

ARGS = ("--servers", 2, "--epochs", 1, "--snapshot-every", 0.3)


@pytest.fixture(scope="module")
def runs(small_data, tmp_path_factory):
    """A BSP run and an SSP one of the same data. The BSP run's worker 0 is held at clock 10
    until its snapshots taken so far have their held-out scores in the live curves: they are
    scored as the job trains."""
    root = tmp_path_factory.mktemp("report")
    (root / "not-a-directory").write_text("a file where the ssp run's curves would go")
    go = root / "go"
    bsp = WatchedJob(4, "train", "--train", small_data[0], "--test", small_data[1],
                     "--out", root / "bsp", *ARGS, "--tensorboard", root / "tb",
                     "--test-event", f"pause rank 2 until {go} at clock 10")
    wait_for_file(bsp, f"{go}.reached")
    held_out_points(root / "tb", bsp)
    go.write_text("")
    job = bsp.finish(timeout=300)
    assert job.returncode == 0, job.output
    shutil.copytree(root / "tb", root / "tb-live")   # as the job left them (reports rewrite)
    ssp = run_job(4, "train", "--train", small_data[0], "--test", small_data[1],
                  "--out", root / "ssp", *ARGS, "--consistency", "ssp", "--staleness", 2,
                  "--tensorboard", root / "not-a-directory")
    assert ssp.returncode == 0, ssp.output
    # its curves could not be written: it trained all the same
    assert "the live curves cannot be written" in ssp.output, ssp.output
    return root / "bsp", root / "ssp"


def held_out_points(directory, job, timeout: float = 120) -> list:
    """Wait until the live curves in `directory` have a snapshot's held-out logloss, while
    `job` runs (held at a pause); returns the points."""
    def points():
        acc = read_back(directory)
        if "test/logloss_snapshots" in acc.Tags()["scalars"]:
            return acc.Scalars("test/logloss_snapshots")
        return None
    return job.wait_until(points, f"a snapshot scored in {directory} while the job was held",
                          timeout, recheck=0.1)


def test_the_live_curves_read_back_in_tensorboard(runs):
    """--tensorboard: the lead's event files, read with TensorBoard's own reader: the
    training curves as the job trained, each worker's waiting, the configuration, and the
    final model's held-out scores as the summary gives them."""
    acc = read_back(runs[0].parent / "tb-live")
    s = read_summary(runs[0])
    tags = set(acc.Tags()["scalars"])
    assert {"train/logloss", "train/examples_per_s", "wait/worker_0_s", "wait/worker_1_s",
            "server/bytes_sent", "test/logloss", "test/auc"} <= tags, tags
    loss = acc.Scalars("train/logloss")
    # (a line every --log-every s or tenth of an epoch: how many depends on the run's speed)
    assert len(loss) >= 1 and all(a.step < b.step for a, b in zip(loss, loss[1:]))
    assert 0 < loss[-1].value < 1 and loss[-1].step <= s["train_examples"]
    sent = [e.value for e in acc.Scalars("server/bytes_sent")]
    assert len(sent) >= 1 and sent == sorted(sent)
    samples, ranks, _ = timeline.read(str(runs[0]))   # the loop's last sample is there too
    assert sent[-1] == pytest.approx(samples[ranks == 0]["bytes_sent"][-1], rel=1e-6)
    assert acc.Scalars("test/auc")[-1].value == pytest.approx(s["test_auc"], rel=1e-6)
    assert acc.Scalars("test/logloss")[-1].step == s["train_examples"]
    config = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert "| servers | 2 |" in config and "| epochs | 1 |" in config
    # The held-out scores of every snapshot, the final one's the job's own.
    scored = acc.Scalars("test/logloss_snapshots")
    assert len(scored) == len(os.listdir(runs[0] / "snapshots")) >= 2
    # (snapshots taken while worker 0 was held trained the same examples)
    assert all(a.step <= b.step for a, b in zip(scored, scored[1:]))
    assert scored[0].step < scored[-1].step
    assert scored[-1].step == s["train_examples"]
    assert scored[-1].value == pytest.approx(s["test_logloss"], rel=1e-6)
    assert len(acc.Scalars("test/auc_snapshots")) == len(scored)


def test_every_rank_keeps_a_timeline_that_adds_up_to_its_summary(runs):
    samples, ranks, servers = timeline.read(str(runs[0]))
    s = read_summary(runs[0])
    assert servers == 2 and set(ranks) == {0, 1, 2, 3}
    for rank in range(4):
        mine = samples[ranks == rank]
        assert mine.shape[0] >= 3 and (np.diff(mine["t"]) > 0).all()
    for w in range(s["workers"]):   # a worker's last sample: all it trained
        assert samples[ranks == 2 + w]["examples"][-1] == s["worker_examples"][w]
    assert sum(samples[ranks == r]["pushes"][-1] for r in (0, 1)) == sum(s["pushes_applied"])
    assert samples[ranks < 2]["gap"].max() <= 1   # BSP


def test_the_report_of_two_runs_shows_every_plot_in_a_browser(runs, tmp_path):
    ensure(CHROMIUM)
    page = tmp_path / "both.html"
    job = run_here("report", *runs, "--out", page)
    assert job.returncode == 0, job.output
    text = page.read_text()
    images = text.count("<img ")
    assert images == 5, "learning curves, throughput, workers, clocks, servers"
    assert "<th>bsp</th><th>ssp</th>" in text
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                          "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    loaded = re.search(r'data-images-loaded="(\d+)/(\d+)"', dom.stdout)
    assert loaded, f"the page's check did not run:\n{dom.stdout[-500:]}{dom.stderr[-2000:]}"
    assert loaded.groups() == (str(images), str(images))
    shot = tmp_path / "page.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                    "--window-size=1100,3000", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.stat().st_size > 50_000, "a page of plots, not a blank one"
    # The snapshots it scored went beside the bsp run's live curves (--tensorboard), in
    # place of those the job scored as it trained: the same points.
    live = read_back(runs[0].parent / "tb-live").Scalars("test/logloss_snapshots")
    scored = read_back(runs[0].parent / "tb").Scalars("test/logloss_snapshots")
    assert [(a.step, a.value) for a in scored] == [(a.step, a.value) for a in live]


def read_back(directory):
    """The TensorBoard event files in `directory`, read with TensorBoard's own reader."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(directory), size_guidance={
        accumulator.SCALARS: 0, accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def test_one_run_gets_its_report_in_its_directory(runs):
    job = run_mpips("report", runs[1])
    assert job.returncode == 0, job.output
    assert f"report: {runs[1] / 'report.html'}" in job.stdout
    assert "data:image/png;base64," in (runs[1] / "report.html").read_text()


def test_the_snapshot_scorer_passes_over_a_damaged_snapshot_and_uses_no_mpi(
        runs, small_data, tmp_path):
    """The scorer the lead starts, on a copy of the BSP run's snapshots, one of them damaged:
    it says which one it leaves out, scores the others as it did while the job trained, and
    never starts MPI (it is no rank of the job). A test file it cannot read ends it with a
    message naming the file."""
    run = tmp_path / "run"
    shutil.copytree(runs[0] / "snapshots", run / "snapshots")
    damaged = sorted((run / "snapshots" / "0001").glob("server-*.h5"))[0]
    damaged.write_bytes(damaged.read_bytes()[:200])
    code = ("import sys; from mpips.job import snapshot_scorer as s; "
            "n = s.score_as_they_come(*sys.argv[1:]); print(n, 'mpi4py.MPI' in sys.modules)")
    scorer = subprocess.run([sys.executable, "-c", code, run, tmp_path / "tb", small_data[1],
                             "copy"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=120)
    assert scorer.returncode == 0, scorer.stderr
    assert scorer.stdout.split() == [str(len(os.listdir(run / "snapshots"))), "False"]
    assert "snapshot 0001 not scored" in scorer.stderr, scorer.stderr
    live = read_back(runs[0].parent / "tb-live").Scalars("test/logloss_snapshots")
    again = read_back(tmp_path / "tb").Scalars("test/logloss_snapshots")
    assert [(a.step, a.value) for a in again] == [(a.step, a.value) for a in live[:1] + live[2:]]
    missing = subprocess.run([sys.executable, "-m", "mpips.job.snapshot_scorer", run,
                              tmp_path / "tb2", tmp_path / "no-such.svm", "copy"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 1
    assert (f"not scored as the job trains: cannot read {tmp_path / 'no-such.svm'}: No such "
            f"file or directory") in missing.stderr, \
        missing.stderr
