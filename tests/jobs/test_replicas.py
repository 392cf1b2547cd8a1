"""--replicas: every key on R servers. Under BSP the copies change nothing of the model: it is
bit for bit that of a run without copies; checkpoints and models hold each key once."""
import os
import shutil

import h5py
import numpy as np
import pytest
from support import read_summary, run_job, run_mpips
from watch import complete_checkpoints

from mpips.storage.checkpoint import read_manifest
from mpips.run.config import LayoutConfig
from mpips.storage.model_files import load_model
from mpips.wire.placement import Placement

# One worker: 50 clocks an epoch (20,000 rows in minibatches of 400), a checkpoint every 40.
TRAIN = ("--epochs", 3, "--batch-size", 400, "--checkpoint-every", 40)


def train(n_ranks, data, run, servers, replicas, *more):
    job = run_job(n_ranks, "train", "--train", data[0], "--test", data[1], "--servers", servers,
                  "--replicas", replicas, "--out", run, *TRAIN, *more)
    assert job.returncode == 0, job.output
    return job


@pytest.fixture(scope="module")
def single(small_data, tmp_path_factory):
    """2 servers + 1 worker, one copy of each key."""
    run = tmp_path_factory.mktemp("single") / "run"
    train(3, small_data, run, 2, 1)
    return run


@pytest.fixture(scope="module")
def replicated(small_data, tmp_path_factory):
    """3 servers + 1 worker, each key on 2 of them."""
    run = tmp_path_factory.mktemp("replicated") / "run"
    train(4, small_data, run, 3, 2)
    return run


def same_model(a, b) -> None:
    ours, theirs = load_model(a / "model"), load_model(b / "model")
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])   # bit for bit


def test_copies_leave_the_model_bitwise_unchanged(single, replicated):
    same_model(replicated, single)
    s = read_summary(replicated)
    assert s["keys_stored"] == read_summary(single)["keys_stored"]
    assert s["key_copies_stored"] == 2 * s["keys_stored"]
    assert s["config"]["replicas"] == 2
    primary = Placement(3, replicas=2, vnodes=LayoutConfig.vnodes)   # the job's
    for server in range(3):   # each server wrote the keys it answers reads for, no others
        with h5py.File(replicated / "model" / f"server-{server:04d}.h5") as f:
            assert (primary.owners(f["keys"][:]) == server).all()


def test_checkpoints_hold_each_key_once_and_say_where_the_copies_are(replicated):
    newest = os.path.dirname(complete_checkpoints(replicated / "checkpoints")[-1])
    manifest = read_manifest(newest)
    assert sum(s["keys"] for s in manifest["shards"]) == read_summary(replicated)["keys_stored"]
    assert manifest["placement"]["replicas"] == 2
    report = run_mpips("inspect", replicated / "checkpoints")
    assert report.returncode == 0, report.output
    assert "3 server(s), each key on 2 servers (written once)" in report.output
    assert "server 0: " in report.output and "backed up on server(s) [1]" in report.output


@pytest.mark.parametrize("servers,replicas", [(2, 2), (3, 3), (2, 1)])
def test_a_replicated_checkpoint_resumes_on_any_layout(small_data, single, replicated, tmp_path,
                                                       servers, replicas):
    mid = os.path.dirname(complete_checkpoints(replicated / "checkpoints")[0])
    assert read_manifest(mid)["positions"]["0"]["epoch"] < 3, "a checkpoint from mid-run"
    ckpt = tmp_path / "ckpt"
    shutil.copytree(mid, ckpt / os.path.basename(mid))
    run = tmp_path / "run"
    job = train(servers + 1, small_data, run, servers, replicas, "--resume", ckpt)
    assert f"resumed from checkpoint clock {read_manifest(mid)['clock']}" in job.output
    same_model(run, single)



def test_the_key_ranges_spread_keys_and_reads_evenly_and_leave_the_bits(small_data, single,
                                                                        replicated, tmp_path):
    """--vnodes cuts the hash into more ranges; which server holds a key never changes what
    it learns. The summary says how evenly the servers share the keys and the reads."""
    run = tmp_path / "64-ranges-each"
    train(4, small_data, run, 3, 2, "--vnodes", 64)
    same_model(run, single)
    for r in (run, replicated):
        s = read_summary(r)
        assert sum(s["server_keys"]) == s["keys_stored"] and len(s["server_keys"]) == 3
        assert 1 <= s["key_spread"] < 1.05, s["server_keys"]
        served = s["server_keys_served"]
        assert min(served) > 0.5 * max(served), served   # hot keys weigh on their server
    for server in range(3):
        with h5py.File(run / "model" / f"server-{server:04d}.h5") as f:
            assert f.attrs["ranges"].tolist() == list(range(server, 192, 3))
            assert f.attrs["n_ranges"] == 192
    assert read_summary(replicated)["config"]["vnodes"] == LayoutConfig.vnodes
