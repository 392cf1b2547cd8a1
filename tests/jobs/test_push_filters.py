"""Push filters in whole jobs (--push-values, --push-threshold, --push-skip-zeros): fewer
bytes pushed per example, held-out logloss within 1% of the same job unfiltered."""
import pytest
from conftest import read_summary, run_job

ARGS = ("--servers", 2, "--epochs", 3, "--batch-size", 100)
FTRL = ("--optimizer", "ftrl", "--l1", 0.01)


@pytest.fixture(scope="module")
def unfiltered(small_data, tmp_path_factory):
    """The summaries of the jobs without a filter: adagrad, and FTRL with L1."""
    out = {}
    for name, extra in (("adagrad", ()), ("ftrl", FTRL)):
        run = tmp_path_factory.mktemp("unfiltered") / name
        job = run_job(4, "train", "--train", small_data[0], "--test", small_data[1],
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
    job = run_job(4, "train", "--train", small_data[0], "--test", small_data[1], "--out", run,
                  *ARGS, *(FTRL if optimizer == "ftrl" else ()), *args)
    assert job.returncode == 0, job.output
    s, base = read_summary(run), unfiltered[optimizer]
    assert s["config"]["push_values"] == (args[1] if args[0] == "--push-values" else "float32")
    assert s["late_compiles"] == 0, "warm-up compiled the filter's kernels"
    assert s["push_bytes_per_example"] < at_most * base["push_bytes_per_example"]
    assert s["bytes_per_example"] < base["bytes_per_example"]
    gap = (s["test_logloss"] - base["test_logloss"]) / base["test_logloss"]
    assert abs(gap) < 0.01, f"{s['test_logloss']:.5f} against {base['test_logloss']:.5f}"
