"""Push filters in whole jobs (--push-values, --push-threshold, --push-skip-zeros): fewer
bytes pushed per example, held-out logloss within 1% of the same job unfiltered; their work
in summary.json; the last push's flush of what was held back, deterministic under BSP; what
a failover or another number of servers keeps (the same bits, but for int8)."""
import numpy as np
import pytest
from support import ULFM, close_logloss, fired, read_summary, run_job, same_model

from mpips.storage.model_files import load_model
from mpips.worker.pushfilter import FIGURES

# 2 servers and 1 worker (3 ranks), but where a test says otherwise.
ARGS = ("--servers", 2, "--epochs", 3, "--batch-size", 100)
FTRL = ("--optimizer", "ftrl", "--l1", 0.01)


@pytest.fixture(scope="module")
def unfiltered(small_data, tmp_path_factory):
    """The summaries of the jobs without a filter: adagrad, and FTRL with L1."""
    out = {}
    for name, extra in (("adagrad", ()), ("ftrl", FTRL)):
        run = tmp_path_factory.mktemp("unfiltered") / name
        job = run_job(3, "train", "--train", small_data[0], "--test", small_data[1],
                      "--out", run, *ARGS, *extra)
        assert job.returncode == 0, job.output
        out[name] = read_summary(run)
    return out


@pytest.mark.parametrize("optimizer, args, at_most", [
    ("adagrad", ("--push-values", "float16"), 0.6),
    ("adagrad", ("--push-values", "int8"), 0.4),
    ("adagrad", ("--push-threshold", 0.01), 0.5),
    ("adagrad", ("--push-values", "int8", "--push-threshold", 0.01), 0.3),
    ("ftrl", ("--push-skip-zeros",), 0.95),
], ids=["float16", "int8", "threshold", "int8 and threshold", "ftrl zero weights"])
def test_a_filter_pushes_fewer_bytes_for_the_same_logloss(small_data, tmp_path, unfiltered,
                                                          optimizer, args, at_most):
    run = tmp_path / "run"
    job = run_job(3, "train", "--train", small_data[0], "--test", small_data[1], "--out", run,
                  *ARGS, *(FTRL if optimizer == "ftrl" else ()), *args)
    assert job.returncode == 0, job.output
    s, base = read_summary(run), unfiltered[optimizer]
    assert s["config"]["push_values"] == (args[1] if args[0] == "--push-values" else "float32")
    assert s["late_compiles"] == 0, "warm-up compiled the filter's kernels"
    assert s["push_bytes_per_example"] < at_most * base["push_bytes_per_example"]
    assert s["bytes_per_example"] < base["bytes_per_example"]
    gap = (s["test_logloss"] - base["test_logloss"]) / base["test_logloss"]
    assert abs(gap) < 0.01, f"{s['test_logloss']:.5f} against {base['test_logloss']:.5f}"


def test_the_filters_work_is_reported_and_zero_without_one(unfiltered):
    s = unfiltered["adagrad"]
    assert s["push_rows"] > 0
    assert all(s[name] == 0 for name in FIGURES if name != "push_rows"), \
        {name: s[name] for name in FIGURES}


def test_the_last_push_delivers_what_was_held_back_with_the_same_bits_every_run(small_data,
                                                                                 tmp_path):
    """A threshold no gradient reaches holds every row back: the model is all zeros until
    each worker's last push, which delivers them all. BSP: two runs, the same bits. (Two
    workers, 4 ranks.)"""
    summaries, models = [], []
    for name in ("first", "second"):
        run = tmp_path / name
        job = run_job(4, "train", "--train", small_data[0], "--test", small_data[1],
                      "--out", run, *ARGS, "--push-threshold", 1000)
        assert job.returncode == 0, job.output
        summaries.append(read_summary(run))
        models.append(load_model(str(run / "model")))
    s = summaries[0]
    assert s["push_rows_held"] > 0 and s["residual_keys_dropped"] == 0
    assert s["residual_keys_flushed"] > 0 and s["residual_flushed"] > 0
    assert s["residual_keys_left"] == 0 and s["residual_left"] == 0
    assert s["pushes_applied"] == [s["pushes_sent"]] * 2, "the flush is no extra push"
    keys, weights = models[0]
    # (A key whose gradients summed to exactly 0 would stay at 0.)
    assert np.count_nonzero(weights[:, 0]) > 0.99 * keys.shape[0] > 0, "every key got there"
    np.testing.assert_array_equal(keys, models[1][0])
    np.testing.assert_array_equal(weights, models[1][1])
    assert s["test_logloss"] == summaries[1]["test_logloss"]
    assert {n: s[n] for n in FIGURES} == {n: summaries[1][n] for n in FIGURES}


# Filters whose work on a key depends on that key alone. A threshold that holds back about 1
# row in 10: where a part of a push holds back few rows, a bitmap would cost more than they.
BY_KEY = ("--push-threshold", 0.001, "--push-values", "float16")
KILL = "kill rank 1 at clock 60"


def filtered_run(small_data, run, *extra, servers: int = 3, launcher=()):
    """A filtered job of 1 worker on `servers` servers (every key on 2 of them if 3)."""
    copies = ("--replicas", 2) if servers == 3 else ()
    return run_job(servers + 1, "train", "--train", small_data[0], "--test", small_data[1],
                   "--out", run, *ARGS, "--servers", servers, *copies, *extra,
                   "--timeout", 60, launcher=launcher)


@pytest.fixture(scope="module")
def by_key(small_data, tmp_path_factory):
    """The runs of the BY_KEY filters on 3 servers (2 copies of each key) and on 2."""
    runs = {}
    for servers in (3, 2):
        run = tmp_path_factory.mktemp("by-key") / f"servers-{servers}"
        job = filtered_run(small_data, run, *BY_KEY, servers=servers)
        assert job.returncode == 0, job.output
        runs[servers] = run
    return runs


def test_filters_by_key_end_on_the_same_bits_on_any_number_of_servers(by_key):
    s = read_summary(by_key[3])
    assert s["push_rows_held"] > 0 and s["residual_keys_flushed"] > 0, "the filters held rows"
    same_model(by_key[2], by_key[3])


def test_filters_by_key_fail_over_to_the_uninterrupted_runs_bits(small_data, by_key, tmp_path):
    run = tmp_path / "run"
    job = filtered_run(small_data, run, *BY_KEY, "--test-event", KILL, launcher=ULFM)
    assert job.returncode == 0, job.output
    fired(job, KILL)
    s = read_summary(run)
    assert [f["server"] for f in s["failures"]] == [1], s["failures"]
    same_model(run, by_key[3])


def test_int8_after_a_failover_loses_no_push_and_keeps_its_logloss(small_data, unfiltered,
                                                                    tmp_path):
    """int8's scales are per block of a server's part: not the same bits after a failover
    (docs/push-filters.md says so), but every push applied and the logloss of an unfiltered run."""
    run = tmp_path / "run"
    job = filtered_run(small_data, run, "--push-values", "int8", "--test-event", KILL,
                       launcher=ULFM)
    assert job.returncode == 0, job.output
    fired(job, KILL)
    s = read_summary(run)
    assert [f["server"] for f in s["failures"]] == [1], s["failures"]
    assert s["train_examples"] == 3 * 20000
    assert s["pushes_applied"] == [s["pushes_sent"]] * 2, "every push on each living server"
    close_logloss(s["test_logloss"], unfiltered["adagrad"]["test_logloss"], 0.01)
