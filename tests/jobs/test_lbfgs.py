"""--solver lbfgs: full-batch L-BFGS (OWL-QN with --l1) over dense tables, against
scikit-learn on the same objective, mean logloss + l2/2 |w|^2 (+ l1 |w|_1), on a one-hot
census-like set, on real-valued features and on hashed CTR-like features (the built-in
data's kind, folded into DIM coordinates); deterministic from run to run."""
import glob
import os
import shutil

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from support import ULFM, fired, read_summary, run_here, run_job, run_mpips
from sklearn.linear_model import LogisticRegression

from mpips.run.config import LayoutConfig
from mpips.models.evaluate import read_rows
from mpips.wire.placement import Placement

L2, L1, DIM = 1e-3, 3e-3, 4096


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = {}
    for kind in ("census", "dense", "ctr"):   # ctr: the built-in data's kind, smaller
        prefix = tmp_path_factory.mktemp(kind) / kind
        extra = ("--features", 20000) if kind == "ctr" else ()
        job = run_mpips("make-data", "--kind", kind, "--rows", 6000, "--test-rows", 2000,
                        "--seed", 2, *extra, prefix)
        assert job.returncode == 0, job.output
        out[kind] = (f"{prefix}.train.svm", f"{prefix}.test.svm")
    return out


def objective(path: str, w: np.ndarray, l1: float = 0.0) -> float:
    X, y = design(path)
    z = X @ w
    return float(np.mean(np.logaddexp(0, z) - y * z) + L2 / 2 * w @ w + l1 * np.abs(w).sum())


def design(path: str):
    """The rows as mpips sees them: feature key mod DIM, the bias as coordinate DIM."""
    rows = read_rows(path)
    n = len(rows)
    cols = np.concatenate([(rows.indices % np.uint64(DIM)).astype(np.int64),
                           np.full(n, DIM)])
    which = np.concatenate([np.repeat(np.arange(n), np.diff(rows.indptr)), np.arange(n)])
    vals = np.concatenate([rows.values.astype(np.float64), np.ones(n)])
    return sp.csr_matrix((vals, (which, cols)), shape=(n, DIM + 1)), rows.labels.astype(float)


def sklearn_optimum(path: str, l1: float = 0.0) -> float:
    X, y = design(path)
    if l1:
        model = LogisticRegression(l1_ratio=l1 / (l1 + L2), C=1 / ((l1 + L2) * len(y)),
                                   solver="saga", fit_intercept=False, tol=1e-10,
                                   max_iter=100000)
    else:
        model = LogisticRegression(C=1 / (L2 * len(y)), fit_intercept=False, tol=1e-12,
                                   max_iter=100000)
    return objective(path, model.fit(X, y).coef_.ravel(), l1)


def train(train_path: str, out, *extra, servers: int = 2, ranks: int = 4):
    job = run_job(ranks, "train", "--servers", servers, "--solver", "lbfgs", "--l2", L2,
                  "--dim", DIM, "--train", train_path, "--out", out, *extra, timeout=300)
    assert job.returncode == 0, job.output
    return read_summary(out)


def model(run_dir, dim: int = DIM) -> np.ndarray:
    """Table w from every server's file, put together."""
    w = np.full(dim + 1, np.nan)
    for path in sorted(glob.glob(f"{run_dir}/model/server-*.h5")):
        with h5py.File(path) as f:
            n, width, block_rows = f["dense/w/shape"][()]
            values, at = f["dense/w/values"][()], 0
            for b in f["dense/w/blocks"][()]:
                rows = min(block_rows, n - b * block_rows)
                w[b * block_rows:b * block_rows + rows] = values[at:at + rows]
                at += rows
            assert "dense/g/shape" not in f, "only the model is kept: the solver's tables go"
    assert not np.isnan(w).any(), "every block written once"
    return w


@pytest.fixture(scope="module")
def census_run(data, tmp_path_factory):
    """The census set on 2 servers and 3 workers, scored on its test rows: (run directory,
    summary)."""
    run = tmp_path_factory.mktemp("census") / "run"
    return run, train(data["census"][0], run, "--test", data["census"][1], ranks=5)


@pytest.mark.parametrize("kind", ["census", "dense", "ctr"])
def test_lbfgs_reaches_scikit_learns_objective(data, tmp_path, kind, request):
    """(The census set's run is `census_run`, of 3 workers; the others', of 2.)"""
    if kind == "census":
        run, summary = request.getfixturevalue("census_run")
    else:
        run = tmp_path / "run"
        summary = train(data[kind][0], run, "--test", data[kind][1])
    best = sklearn_optimum(data[kind][0])
    mine = objective(data[kind][0], model(run))
    assert mine == pytest.approx(summary["solver"]["objective"], rel=1e-9), \
        "the saved model is the one the solver reported"
    assert abs(mine - best) / best <= 1e-6, (mine, best)
    objectives = [s["objective"] for s in summary["solver"]["steps"]]
    assert all(b <= a for a, b in zip(objectives, objectives[1:])), "each step descends"
    assert summary["test_examples"] == 2000 and summary["test_logloss"] < 0.7


def test_owlqn_reaches_the_l1_optimum_with_exact_zeros(data, tmp_path):
    train(data["census"][0], tmp_path / "run", "--l1", L1)
    w = model(tmp_path / "run")
    best = sklearn_optimum(data["census"][0], L1)
    mine = objective(data["census"][0], w, L1)
    assert mine <= best * (1 + 1e-6), (mine, best)
    used = np.unique(design(data["census"][0])[0].indices)
    assert 0 < np.count_nonzero(w[used]) < used.shape[0] * 0.9, "L1 zeroes some weights"


def test_the_same_job_gives_the_same_bits(data, census_run, tmp_path):
    """Sums over workers and servers are taken in a fixed order: two runs agree to the bit,
    with three workers whose rows arrive in any order (`census_run`, and the same job
    again)."""
    (a, first), b = census_run, tmp_path / "b"
    second = train(data["census"][0], b, "--test", data["census"][1], ranks=5)
    np.testing.assert_array_equal(model(a), model(b))
    assert first["solver"]["objective"] == second["solver"]["objective"]


def test_no_rank_holds_the_model(data, tmp_path):
    """26 vectors of 2^23 + 1 float64 (1.6 GiB) on 4 servers, each rank allowed 600 MiB of
    tables: the job trains to the end, and no rank's memory comes near the whole."""
    dim, limit = 1 << 23, 600 << 20
    job = run_job(6, "train", "--servers", 4, "--solver", "lbfgs", "--l2", L2, "--dim", dim,
                  "--max-iter", 3, "--max-rank-memory", "600M", "--train", data["census"][0],
                  "--out", tmp_path / "run", timeout=300)
    assert job.returncode == 0, job.output
    s = read_summary(tmp_path / "run")
    total = len(lbfgs_tables()) * (dim + 1) * 8
    assert total > 2 * limit, "the vectors together are far larger than one rank may hold"
    held = [mb * 2**20 for mb in s["held_peak_mb"]]
    assert max(held) <= limit and sum(held[:4]) >= 0.999 * total, "the servers held it all"
    assert max(s["peak_rss_mb"]) * 2**20 < total / 2, s["peak_rss_mb"]


def lbfgs_tables():
    from mpips.models.lbfgs import tables
    return tables(10, 0.0)


# 5 blocks per table; 30 iterations at most (a tolerance of 0 never stops it sooner)
CKPT = ("--dim", 1 << 18, "--tol", 0, "--checkpoint-every", 10, "--max-iter", 30)


@pytest.fixture(scope="module")
def whole(data, tmp_path_factory):
    """The uninterrupted run the interrupted ones must end on: (run directory, summary)."""
    run = tmp_path_factory.mktemp("whole") / "run"
    return run, train(data["census"][0], run, *CKPT)


def test_a_resumed_solver_ends_on_the_uninterrupted_bits(data, whole, tmp_path):
    """A run killed after its checkpoint at iteration 10 resumes from it (the tables from the
    servers' files, the solver's history and scalars from the manifest) and ends where an
    uninterrupted run ends, bit for bit; resumed on 3 servers instead of 2 (other blocks per
    server) too: reductions add per-block partials."""
    whole_run, whole = whole
    run = tmp_path / "run"
    kill = "kill rank 2 at iteration 10"   # the driver, once iteration 10 is checkpointed
    killed = run_job(4, "train", "--servers", 2, "--solver", "lbfgs", "--l2", L2,
                     "--train", data["census"][0], "--out", run, *CKPT, "--test-event", kill)
    assert killed.returncode != 0
    fired(killed, kill)
    assert "checkpoint at iteration 10:" in killed.output
    job = run_job(4, "train", "--servers", 2, "--solver", "lbfgs", "--l2", L2,
                  "--train", data["census"][0], "--out", run, *CKPT, "--resume",
                  run / "checkpoints")
    assert job.returncode == 0, job.output
    assert "resumed from checkpoint iteration 10" in job.output
    resumed = read_summary(run)
    assert resumed["solver"]["objective"] == whole["solver"]["objective"]
    np.testing.assert_array_equal(model(run, 1 << 18), model(whole_run, 1 << 18))
    assert [s["objective"] for s in resumed["solver"]["steps"]] == \
        [s["objective"] for s in whole["solver"]["steps"]], "the trace goes on from the checkpoint"
    other = train(data["census"][0], run, *CKPT, "--resume", run / "checkpoints", servers=3,
                  ranks=5)
    assert other["solver"]["objective"] == whole["solver"]["objective"]
    np.testing.assert_array_equal(model(run, 1 << 18), model(whole_run, 1 << 18))


def test_a_killed_server_of_a_replicated_solver_is_replaced_bitwise(data, whole, tmp_path):
    """3 servers, every block on 2 of them, launched with ULFM: server 1 SIGKILLed mid-solve.
    Its backups answer for its blocks at once, the ranges it held get a second copy again,
    and the job ends on the bits of the uninterrupted 2-server run (same workers, and
    reductions that do not depend on which server holds which block)."""
    whole_run, whole = whole
    run = tmp_path / "run"
    kill = "kill rank 1 at iteration 15"   # the driver kills it
    ended = run_job(5, "train", "--servers", 3, "--replicas", 2, "--solver", "lbfgs",
                    "--l2", L2, "--train", data["census"][0], "--out", run, *CKPT,
                    "--test-event", kill, launcher=ULFM)
    assert ended.returncode == 0, ended.output
    fired(ended, kill)
    assert ended.output.count("of the dense tables have their copies again") == 2, \
        "server 1 held copies of server 0's and server 1's ranges: each has a new holder"
    s = read_summary(run)
    assert s["solver"]["objective"] == whole["solver"]["objective"]
    np.testing.assert_array_equal(model(run, 1 << 18), model(whole_run, 1 << 18))
    [failure] = s["failures"]
    assert failure["server"] == 1 and failure["rank"] == 1
    before = Placement(3, 2, vnodes=LayoutConfig.vnodes)   # the job's
    anew = before.without({1}).held_ranges(0) & ~before.held_ranges(0)
    assert [r["ranges"] for r in failure["rebuilt"] if "blocks" in r] == \
        [np.flatnonzero(anew).tolist()], "server 0 (whose view the summary keeps) holds " \
                                         "server 1's ranges anew"
    assert sorted(os.listdir(run / "model")) == ["server-0000.h5", "server-0002.h5"]


def test_a_damaged_dense_checkpoint_is_passed_over(data, whole, tmp_path):
    """The newest checkpoint's block of table w flipped on disk: the resume says so, takes
    the one before, and still ends on the uninterrupted bits. (The uninterrupted run's
    checkpoints at iterations 10 and 20, copied: 20 is the newest.)"""
    whole_run, whole = whole
    ckpt = tmp_path / "ckpt"
    for name in ("clock-000000000010", "clock-000000000020"):
        shutil.copytree(whole_run / "checkpoints" / name, ckpt / name)
    newest = ckpt / "clock-000000000020" / "server-0000.h5"
    with h5py.File(newest, "r+") as f:
        f["dense/w/values"][0] += 1.0
    run = tmp_path / "run"
    job = run_job(4, "train", "--servers", 2, "--solver", "lbfgs", "--l2", L2, "--train",
                  data["census"][0], "--out", run, *CKPT, "--resume", ckpt, timeout=300)
    assert job.returncode == 0, job.output
    assert "dataset dense/w/values does not match its checksum" in job.output
    assert "resumed from checkpoint iteration 10" in job.output
    assert read_summary(run)["solver"]["objective"] == whole["solver"]["objective"]


def test_a_stop_signal_to_one_worker_checkpoints_and_resumes_on_the_same_bits(data, whole,
                                                                              tmp_path):
    """SIGUSR1 (Slurm's warning) to a worker that is not the driver, as iteration 15 ends:
    the driver hears of it with that worker's next loss, checkpoints at the end of the
    iteration (16), and the job exits 75; the resume ends on the uninterrupted bits."""
    whole = whole[1]
    run = tmp_path / "run"
    stop = "stop rank 3 at iteration 15"
    ended = run_job(4, "train", "--servers", 2, "--solver", "lbfgs", "--l2", L2,
                    "--train", data["census"][0], "--out", run, *CKPT, "--test-event", stop)
    assert ended.returncode == 75, ended.output
    fired(ended, stop)
    stopped = read_summary(run)["stopped_at_clock"]
    assert stopped == 16 and "checkpoint at iteration 16:" in ended.output, ended.output
    resumed = train(data["census"][0], run, *CKPT, "--resume", run / "checkpoints")
    assert resumed["solver"]["objective"] == whole["solver"]["objective"]


def test_a_solvers_report_plots_its_objective(whole, tmp_path):
    page = tmp_path / "solver.html"
    job = run_here("report", whole[0], "--out", page)
    assert job.returncode == 0, job.output
    text = page.read_text()
    assert 'alt="Full-batch solver"' in text and 'alt="Throughput"' not in text
