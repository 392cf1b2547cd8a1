"""The lead's handle on the process that scores snapshots as the job trains
(job/snapshot_scorer): told that training is over it ends; one still at work when the
bound is up is stopped, with a warning naming it."""
import logging
import os

import h5py
import numpy as np

from mpips.job.server_files import drop_unfinished_snapshots
from mpips.job.snapshot_scorer import PATIENCE_S, SnapshotScorer


def a_run(tmp_path, complete: bool):
    """A run's directory with one snapshot of two servers' files, both or only one written,
    and a test file."""
    snap = tmp_path / "run" / "snapshots" / "0000"
    snap.mkdir(parents=True)
    for server in range(2 if complete else 1):
        with h5py.File(snap / f"server-{server:04d}.h5", "w") as f:
            f.attrs["n_servers"] = 2
    test = tmp_path / "t.svm"
    test.write_text("1 5:1\n0 7:1\n")
    return str(tmp_path / "run"), str(test)


def test_told_that_training_is_over_the_scorer_ends(tmp_path, caplog):
    run, test = a_run(tmp_path, complete=True)
    scorer = SnapshotScorer.start(run, str(tmp_path / "tb"), test, "r")
    assert scorer is not None
    with caplog.at_level(logging.WARNING, logger="mpips"):
        scorer.finish(bound=120)
    assert scorer.process.returncode == 0   # the snapshot, not mpips's, is passed over
    assert not caplog.records


def test_a_scorer_still_waiting_when_the_bound_is_up_is_stopped(tmp_path, caplog):
    """One server's file of the snapshot never comes (its server died): the scorer would
    wait PATIENCE_S for it; a shorter bound stops it, saying so."""
    run, test = a_run(tmp_path, complete=False)
    scorer = SnapshotScorer.start(run, str(tmp_path / "tb"), test, "r")
    assert scorer is not None
    with caplog.at_level(logging.WARNING, logger="mpips"):
        scorer.finish(bound=PATIENCE_S / 5)
    assert scorer.process.returncode < 0
    assert f"(process {scorer.process.pid}) was still at work after" in caplog.text


def test_at_the_end_only_the_trailing_snapshots_some_server_never_took_are_removed(tmp_path):
    """Servers take numbered snapshots by their own timers: at the end one may have taken a
    last one the other never did. That one goes; one a dead server left incomplete earlier,
    and every whole one, stay."""
    snapshots = tmp_path / "snapshots"
    written = {"0000": 2, "0001": 1, "0002": 2, "0003": 1, "0004": 1, "final": 2}
    for label, files in written.items():
        (snapshots / label).mkdir(parents=True)
        for server in range(files):
            with h5py.File(snapshots / label / f"server-{server:04d}.h5", "w") as f:
                f.attrs["n_servers"] = 2
    removed = drop_unfinished_snapshots(str(tmp_path), np.array([5, 3]))
    assert removed == ["0003", "0004"]
    assert sorted(os.listdir(snapshots)) == ["0000", "0001", "0002", "final"]
    assert drop_unfinished_snapshots(str(tmp_path), np.array([5, 3])) == []
