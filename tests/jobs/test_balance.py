"""--balance dynamic: the lead hands each epoch's rows out in chunks, each worker's minibatch
following its speed. With a worker slowed 3x, one that dies (ULFM), one that leaves (ctl
remove-worker) or leaves and joins again (ctl add-worker), every row is still trained once per
epoch (rows_per_epoch, in the summary)."""
import numpy as np
import pytest
from support import ULFM, ctl_answers, fired, read_summary, run_job, run_mpips

from mpips.cli.ctl import describe
from mpips.storage.checkpoint import latest_valid

ROWS, EPOCHS, BATCH = 600, 3, 10


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("tiny") / "t"
    job = run_mpips("make-data", "--rows", ROWS, "--test-rows", 100, "--features", 300,
                    "--nnz", 5, "--seed", 7, prefix)
    assert job.returncode == 0, job.output
    return f"{prefix}.train.svm", f"{prefix}.test.svm"


def train(tiny, run, workers: int, *extra, launcher=(), status=0, servers=1):
    job = run_job(servers + workers, "train", "--train", tiny[0], "--test", tiny[1], "--out", run,
                  "--epochs", EPOCHS, "--batch-size", BATCH, "--balance", "dynamic",
                  "--timeout", 60, *extra, launcher=launcher)
    assert job.returncode == status, job.output
    return job, read_summary(run)


def test_every_row_trains_once_per_epoch_with_a_straggler(tiny, tmp_path):
    """4 workers (2 workers: see the leave, and the stop and resume, below)."""
    workers = 4
    _, s = train(tiny, tmp_path / "run", workers, "--straggler", "0:3")
    per_epoch = np.array(s["rows_per_epoch"])   # [worker][epoch]
    assert per_epoch.sum(axis=0).tolist() == [ROWS] * EPOCHS, per_epoch
    assert s["train_examples"] == EPOCHS * ROWS and s["status"] == "complete"
    assert s["balance"] == "dynamic"
    rows = per_epoch.sum(axis=1)
    assert rows[0] < rows[1:].max(), f"the straggler trained fewer rows: {rows}"


def test_a_dead_workers_chunks_are_handed_on(tiny, tmp_path):
    kill = "kill rank 2 at clock 20"   # worker 1, in its first epoch (30 clocks of 20 rows)
    job, s = train(tiny, tmp_path / "run", 2, "--test-event", kill, launcher=ULFM)
    fired(job, kill)
    assert "worker 1's chunks of training rows not trained go to the next" in job.output
    assert s["train_examples"] == EPOCHS * ROWS, "every example once per epoch"
    assert s["failures"][0]["worker"] == 1


@pytest.mark.parametrize("servers, dead", [(2, [0]), (3, [0, 1])],
                         ids=["the lead", "the lead and its first standby"])
def test_the_lead_dies_and_a_standby_goes_on_handing_out_the_rows(tiny, tmp_path, servers,
                                                                   dead):
    """Each key on every server (--replicas = servers): the lead copies its hand-out to the
    others. The lead, or the lead and the first of them together, die in epoch 1 and the next
    living server hands out the rest from its copy; every row still trains once per epoch,
    and a worker whose question died with the lead gets its answer again."""
    kill = f"kill rank{'s' * (len(dead) > 1)} {','.join(map(str, dead))} at clock 40"
    job, s = train(tiny, tmp_path / "run", 2, "--servers", servers, "--replicas", servers,
                   "--test-event", kill, launcher=ULFM, servers=servers)   # 30 clocks an epoch
    fired(job, kill)
    heir = len(dead)
    assert f"server {heir} hands out the training rows now, from the copy the lead kept" \
        in job.output
    per_epoch = np.array(s["rows_per_epoch"])
    assert per_epoch.sum(axis=0).tolist() == [ROWS] * EPOCHS, per_epoch
    assert s["train_examples"] == EPOCHS * ROWS and s["status"] == "complete"


def test_a_leaving_workers_chunks_are_handed_on(tiny, tmp_path):
    """2 workers, worker 0 slowed 3x: worker 1 leaves at clock 20, in epoch 0."""
    leave = "ctl remove-worker 1 at clock 20"
    job, s = train(tiny, tmp_path / "run", 2, "--straggler", "0:3", "--test-event", leave)
    fired(job, leave)
    assert "worker 1's chunks of training rows not trained go to the next" in job.output
    per_epoch = np.array(s["rows_per_epoch"])
    assert per_epoch.sum(axis=0).tolist() == [ROWS] * EPOCHS, per_epoch
    assert per_epoch[1, 1:].sum() == 0 < per_epoch[1, 0] < ROWS, "it left in epoch 0"


LEAVE, JOIN = "ctl remove-worker 2 at clock 20", "ctl add-worker at clock 40"


def test_a_worker_that_left_joins_again_and_asks_for_chunks(tiny, tmp_path):
    """3 workers: worker 2 leaves at clock 20 (about the end of epoch 0) and joins again at
    clock 40 (in epoch 1, which 2 workers train in about 30 clocks): it trains rows of epoch 2,
    which it could only reach once joined. A join with no worker idle (clock 5), or of a
    worker training (clock 30), is refused."""
    idle, busy = "ctl add-worker at clock 5", "ctl add-worker 1 at clock 30"
    run, asked = tmp_path / "run", (idle, LEAVE, busy, JOIN)
    job, s = train(tiny, run, 3, *(a for e in asked for a in ("--test-event", e)))
    for event in asked:
        fired(job, event)
    nobody, left, training, joined = ctl_answers(run)
    assert not nobody["ok"] and "no worker is idle to join" in nobody["error"], nobody
    assert not training["ok"] and training["error"] == "worker 1 is training", training
    assert left["ok"] and left["command"] == "remove-worker" and left["target"] == 2, left
    assert joined["ok"] and joined["command"] == "add-worker" and joined["target"] == 2, joined
    assert joined["clock"] > 40 and joined["from"] == [], joined
    assert "asking for chunks of the rows left" in describe(joined)
    for said in ("ctl add-worker 2 done: it trains again from clock",
                 "worker 2 asks for chunks of training rows again", "joining again at clock"):
        assert said in job.output, said
    per_epoch = np.array(s["rows_per_epoch"])
    assert per_epoch.sum(axis=0).tolist() == [ROWS] * EPOCHS, per_epoch
    assert s["train_examples"] == EPOCHS * ROWS and s["status"] == "complete"
    assert per_epoch[2, EPOCHS - 1] > 0, f"worker 2 trained after it joined: {per_epoch}"
    assert [m["command"] for m in s["moves"]] == ["remove-worker", "add-worker"]


def test_a_job_stopped_after_a_join_resumes_where_its_checkpoint_says(tiny, tmp_path):
    """Worker 2 leaves and joins again as above; the job stops at clock 46, the joiner a few
    chunks on: the checkpoint numbers its chunks as the hand-out it keeps does, so every row
    is still trained once per epoch across the two launches."""
    stop, run = "stop rank 1 at clock 46", tmp_path / "run"
    job, stopped = train(tiny, run, 3, "--test-event", LEAVE, "--test-event", JOIN,
                         "--test-event", stop, status=75)
    fired(job, stop)
    assert [a["command"] for a in ctl_answers(run) if a["ok"]] == ["remove-worker",
                                                                   "add-worker"]
    before = np.array(stopped["rows_per_epoch"])
    _, s = train(tiny, run, 3, "--resume", run / "checkpoints")
    per_epoch = before + np.array(s["rows_per_epoch"])
    assert per_epoch.sum(axis=0).tolist() == [ROWS] * EPOCHS, per_epoch
    assert s["train_examples"] == EPOCHS * ROWS and s["status"] == "complete"


def test_a_stopped_job_resumes_where_its_checkpoint_says(tiny, tmp_path):
    """Stopped at clock 40 (in epoch 1) and resumed: the checkpoint records the hand-out and
    each worker's place in its chunks; every row is still trained once per epoch across the
    two launches."""
    stop, run = "stop rank 1 at clock 40", tmp_path / "run"
    job, stopped = train(tiny, run, 2, "--straggler", "0:3", "--test-event", stop, status=75)
    fired(job, stop)
    assert stopped["status"] == "stopped"
    found = latest_valid(str(run / "checkpoints"))
    assert found is not None and "balance" in found[1], "the manifest keeps the hand-out"
    before = np.array(stopped["rows_per_epoch"])
    assert 0 < before.sum() == stopped["train_examples"] < EPOCHS * ROWS
    _, s = train(tiny, run, 2, "--straggler", "0:3", "--resume", run / "checkpoints")
    per_epoch = before + np.array(s["rows_per_epoch"])
    assert per_epoch.sum(axis=0).tolist() == [ROWS] * EPOCHS, per_epoch
    assert s["train_examples"] == EPOCHS * ROWS and s["status"] == "complete"
