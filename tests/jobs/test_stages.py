"""Wide & Deep with its network split across workers (train --stages S), as whole jobs: one
micro-batch gives the bits of the whole network on one worker, whatever S (the stages push
their own layers' rows; a key's row comes from one push either way); more micro-batches add
the same gradients in another order; two copies of a pipeline train every row once; a
checkpoint resumes to the uninterrupted bits; the schedule prints. The network reads the six
fields of libffm rows concatenated."""
import shutil

import h5py
import numpy as np
import pytest
from support import ULFM, fired, read_summary, run_here, run_job, run_mpips, same_model

from mpips.storage.model_files import load_model
from mpips.pipeline.schedule import POLICIES
from mpips.base.errors import ConfigError
from mpips.base.timeline import read_tasks
from mpips.cli.main import build_parser
from mpips.run.config_checks import check_resumable
from mpips.run.options import config_of
from mpips.storage.checkpoint import read_manifest

ROWS = 6000
ARGS = ("--servers", 1, "--model", "widedeep", "--embedding-dim", 4, "--hidden", "16,8",
        "--fields", 6,
        "--batch-size", 200, "--epochs", 2, "--lr", 0.05)


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("paired") / "p"
    job = run_mpips("make-data", "--rows", ROWS, "--test-rows", 2000, "--features", 300,
                    "--nnz", 6, "--interactions", 4, "--seed", 5, "--format", "libffm", prefix)
    assert job.returncode == 0, job.output
    return f"{prefix}.train.ffm", f"{prefix}.test.ffm"


def train(data, run, workers, *extra, servers=1):
    job = run_job(servers + workers, "train", "--train", data[0], "--test", data[1],
                  "--out", run, *ARGS, *extra)
    assert job.returncode == 0, job.output
    return read_summary(run), job.output


@pytest.fixture(scope="module")
def whole(paired, tmp_path_factory):
    """The whole network on one worker: the reference."""
    run = tmp_path_factory.mktemp("whole") / "run"
    return run, train(paired, run, 1)[0]


@pytest.mark.parametrize("stages", [2, 3])
def test_one_micro_batch_gives_the_bits_of_the_whole_network(paired, whole, stages, tmp_path):
    summary, output = train(paired, tmp_path / "run", stages, "--stages", stages,
                            "--micro-batches", 1)
    keys, weights = load_model(tmp_path / "run" / "model")
    keys0, weights0 = load_model(whole[0] / "model")
    np.testing.assert_array_equal(keys, keys0)
    np.testing.assert_array_equal(weights, weights0)
    assert summary["test_logloss"] == whole[1]["test_logloss"]
    assert summary["train_examples"] == 2 * ROWS
    assert f"1 pipeline(s) of {stages} stages" in output


@pytest.mark.parametrize("policy", ["gpipe", "1f1b"])
def test_micro_batches_add_the_same_gradients_in_another_order(paired, whole, policy,
                                                               tmp_path):
    """Sums in float64 of another order, rounded to the servers' float32: the same model
    to float32's precision (here, as a rule, to the bit)."""
    summary, _ = train(paired, tmp_path / "run", 2, "--stages", 2, "--micro-batches", 3,
                       "--pipeline", policy)
    _, weights = load_model(tmp_path / "run" / "model")
    _, weights0 = load_model(whole[0] / "model")
    np.testing.assert_allclose(weights, weights0, rtol=1e-5, atol=1e-7)
    assert summary["test_logloss"] == pytest.approx(whole[1]["test_logloss"], rel=1e-5)
    # The run's record of its tasks: each stage ran its list of the schedule, per clock.
    tasks = read_tasks(tmp_path / "run")
    clock = tasks["clock"].max()
    for stage in (0, 1):
        mine = (tasks["clock"] == clock) & (tasks["stage"] == stage)
        order = [f"{k.decode()}{m}" if k != b"U" else "U"
                 for k, m in zip(tasks["kind"][mine], tasks["micro"][mine])]
        assert order == [str(t) for t in POLICIES[policy](2, 3)[stage]]
        assert (np.diff(tasks["start"][mine]) >= 0).all()
        assert (tasks["end"][mine] >= tasks["start"][mine]).all()
    pipeline = summary["pipeline"]
    assert pipeline["micro_batches"] == 3 and pipeline["schedule"] == policy
    assert pipeline["bubble_theory"] == pytest.approx(0.25)
    assert 0 < pipeline["bubble_measured"] < 1 and pipeline["steps_logged"] == 12
    assert summary["late_compiles"] == 0
    report = run_here("report", tmp_path / "run")
    assert report.returncode == 0, report.output
    page = (tmp_path / "run" / "report.html").read_text()
    assert '<h2>Pipeline</h2><img alt="Pipeline" src="data:image/png;base64,' in page
    # A damaged task log: the page without that plot, and a note naming the file.
    with h5py.File(tmp_path / "run" / "timeline.h5", "r+") as f:
        del f["tasks/start"]
        f["tasks/start"] = np.zeros(3)
    report = run_here("report", tmp_path / "run")
    assert report.returncode == 0, report.output
    page = (tmp_path / "run" / "report.html").read_text()
    assert "<h2>Pipeline</h2>" not in page and "<h2>Workers</h2>" in page
    assert "timeline.h5: the pipeline&#x27;s task fields differ in length" in page


def test_two_copies_of_a_pipeline_share_the_rows(paired, tmp_path):
    summary, output = train(paired, tmp_path / "run", 4, "--stages", 2)
    assert "2 pipeline(s) of 2 stages" in output
    assert summary["train_examples"] == 2 * ROWS
    assert summary["test_examples"] == 2000
    data_parallel, _ = train(paired, tmp_path / "dp", 2)   # 2 workers, whole networks
    assert summary["test_logloss"] == pytest.approx(data_parallel["test_logloss"], rel=0.01)


def test_a_checkpoint_resumes_to_the_uninterrupted_bits(paired, tmp_path):
    """Clock 20 of 60, resumed on two servers: the stages' rows and their optimizer state
    are in the servers' checkpoint, and each stage goes on at its clock."""
    run = tmp_path / "run"
    train(paired, run, 2, "--stages", 2, "--checkpoint-every", 20, "--keep-checkpoints", 5)
    _, weights = load_model(run / "model")
    mid = tmp_path / "ckpt" / "clock-000000000020"
    shutil.copytree(run / "checkpoints" / mid.name, mid)
    again = tmp_path / "again"
    job = run_job(4, "train", "--train", paired[0], "--test", paired[1], "--out", again,
                  *ARGS, "--servers", 2, "--stages", 2, "--resume", mid.parent)
    assert job.returncode == 0, job.output
    assert "resumed from checkpoint clock 20" in job.output
    _, resumed = load_model(again / "model")
    np.testing.assert_array_equal(resumed, weights)
    job = run_job(3, "train", "--train", paired[0], "--out", tmp_path / "other", *ARGS,
                  "--resume", mid.parent)
    assert job.returncode == 2 and "was written with --stages 2, this job has 1" in job.output
    # The same check (check_resumable, as each rank makes it) of another setting, here in
    # this process: a job of 2 workers, its configuration as the job completes it.
    args = build_parser().parse_args(["train", "--train", paired[0], "--out",
                                      str(tmp_path / "other"), *map(str, ARGS), "--stages", "2",
                                      "--fields", "0", "--resume", str(mid.parent)])
    with pytest.raises(ConfigError, match="was written with --fields 6, this job has 0"):
        check_resumable(config_of(args).with_data_fields(), read_manifest(mid), 2)


def test_print_schedule_shows_the_stages_and_their_tasks():
    job = run_mpips("train", "--train", "nowhere.svm", "--model", "widedeep", "--hidden",
                    "64,32", "--stages", 3, "--micro-batches", 5, "--print-schedule")
    assert job.returncode == 0, job.output
    assert ("network: embeddings of 8 from the servers -> sum (8) -> dense 8x64 relu -> "
            "dense 64x32 relu -> dense 32x1 identity -> plus the wide margin") in job.output
    assert "stage 0: layers 0-0" in job.output and "stage 2: layers 2-2" in job.output
    assert "stage 2: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4  U" in job.output
    assert "theory 28.6%" in job.output


def test_a_pipeline_goes_on_when_its_lead_server_dies(paired, whole, tmp_path):
    """Under ULFM, server 0 (the lead) killed at clock 30 of 60, 2 servers, --replicas 2: a
    stage waiting for stage 0 asks the lead for the workers' clocks, and asks the next lead
    once it learns that the lead died. One micro-batch: the model is the whole network's,
    bit for bit, as without the death."""
    kill = "kill rank 0 at clock 30"
    run = tmp_path / "run"
    job = run_job(4, "train", "--train", paired[0], "--test", paired[1], "--out", run, *ARGS,
                  "--stages", 2, "--micro-batches", 1, "--servers", 2, "--replicas", 2,
                  "--test-event", kill, launcher=ULFM)
    assert job.returncode == 0, job.output
    fired(job, kill)
    summary = read_summary(run)
    assert [f["rank"] for f in summary["failures"]] == [0], summary["failures"]
    same_model(run, whole[0])
    assert (summary["test_logloss"], summary["test_auc"]) == (whole[1]["test_logloss"],
                                                              whole[1]["test_auc"])
