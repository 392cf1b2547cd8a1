"""Bad input and bad launches: a clear message, every rank stops, nothing trained is lost."""
import subprocess

import h5py
import pytest
from support import read_summary, refusal, run_job, run_mpips

from mpips.storage.model_files import load_model


def no_processes_mention(marker: str) -> bool:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return not [line for line in ps.splitlines() if marker in line and "ps -eo" not in line]


def with_bad_line(src: str, dst, line_no: int, text: str):
    lines = open(src).read().splitlines()
    lines[line_no - 1] = text
    dst.write_text("\n".join(lines) + "\n")
    return str(dst)


def test_malformed_line_stops_the_job_and_names_file_and_line(tmp_path):
    # 100,000 rows (~22 MB): each of the 2 workers reads its 11 MB in several 4 MiB chunks,
    # so worker 1 trains on its first chunks before it reaches the bad line near the end.
    prefix = tmp_path / "d"
    assert run_mpips("make-data", "--rows", 100000, "--test-rows", 10, "--features", 5000,
                     "--nnz", 10, prefix).returncode == 0
    bad = with_bad_line(f"{prefix}.train.svm", tmp_path / "bad.svm", 95001, "1 123:4 oops:1")
    run = tmp_path / "run"
    job = run_job(3, "train", "--train", bad, "--servers", 1, "--out", run, timeout=90)
    assert job.returncode != 0
    assert f"{bad}:95001: feature index is not a non-negative integer" in job.stderr
    assert "'1 123:4 oops:1'" in job.stderr
    # Worker 1 read the bad line and told the server, which says so naming worker 1 once
    # (the server's relay once repeated the worker's own prefix).
    assert f"ERROR stopping: worker 1: {bad}:95001:" in job.stderr, job.stderr
    relayed = [line for line in job.stderr.splitlines() if "ERROR stopping:" in line]
    assert all(line.count("worker 1:") == 1 for line in relayed), relayed
    assert no_processes_mention(str(run)), "every rank of the failed job has exited"
    # The worker that failed told the server, which saved what had been trained.
    with h5py.File(run / "model" / "server-0000.h5") as f:
        assert not f.attrs["complete"]
        assert f.attrs["note"].startswith(f"worker 1: {bad}:95001:"), f.attrs["note"]
        assert f.attrs["note"].count("worker 1:") == 1, f.attrs["note"]
        assert f["keys"].shape[0] > 1000
        assert abs(f["weights"][:]).max() > 0


def test_skip_bad_lines_counts_and_reports(small_data, tmp_path):
    bad = with_bad_line(small_data[0], tmp_path / "bad.svm", 5, "2 1:1")
    bad = with_bad_line(bad, tmp_path / "bad2.svm", 19000, "1 1:1 2")
    run = tmp_path / "run"
    job = run_job(2, "train", "--train", bad, "--servers", 1, "--out", run, "--skip-bad-lines",
                  "--batch-size", 500)
    assert job.returncode == 0, job.output
    assert read_summary(run)["bad_lines"] == 2
    assert "skipping bad line" in job.stderr and "skipped 2 bad input line(s)" in job.stdout


@pytest.mark.parametrize("case, message", [
    ("missing", "--train {dir}/missing.svm: no such file"),
    ("empty", "--train {dir}/empty.svm: the file is empty"),
])
def test_missing_or_empty_file(tmp_path, case, message):
    """The missing file is launched under mpiexec (every rank stops, the message said once);
    the empty one is found by the same check of --train (check_input, as each rank makes it),
    here in this process."""
    (tmp_path / "empty.svm").write_text("")
    argv = ["--train", tmp_path / f"{case}.svm", "--out", tmp_path / "run"]
    if case == "empty":
        status, said = refusal(argv, 3)
        assert status == 2 and message.format(dir=tmp_path) in said, said
        return
    job = run_job(3, "train", *argv, timeout=60)
    assert job.returncode != 0
    assert message.format(dir=tmp_path) in job.stderr
    assert job.stderr.count("mpips train: error:") == 1, "printed once, not once per rank"


def test_too_many_servers(small_data, tmp_path):
    """The layout's check as each rank of a 3-rank launch makes it, in this process
    (tests/hostile/test_options.py launches a refused layout under mpiexec)."""
    status, said = refusal(["--train", small_data[0], "--servers", 3, "--out", tmp_path / "r"],
                           3)
    assert status == 2, said
    assert "--servers 3 leaves no worker: the job has 3 rank(s)" in said


def test_without_mpiexec_the_error_says_how_to_launch(small_data, tmp_path):
    job = run_mpips("train", "--train", small_data[0], "--out", tmp_path / "r")
    assert job.returncode == 2
    assert "mpiexec -n 2 python -m mpips train" in job.stderr


def test_an_earlier_run_is_kept_unless_overwrite(small_data, tmp_path):
    run = tmp_path / "run"
    quick = ("--batch-size", 500)   # what is trained does not matter here, only what is kept
    first = run_job(4, "train", "--train", small_data[0], "--servers", 3, "--out", run, *quick)
    assert first.returncode == 0, first.output
    again = run_job(3, "train", "--train", small_data[0], "--servers", 1, "--out", run, timeout=60)
    assert again.returncode == 2
    assert f"--out {run} already holds a run (summary.json, model)" in again.stderr
    assert (run / "model" / "server-0002.h5").exists(), "the earlier model is untouched"
    third = run_job(3, "train", "--train", small_data[0], "--servers", 2, "--out", run,
                    "--overwrite", *quick)
    assert third.returncode == 0, third.output
    # Only the new run's two shards, both of the same run: the 3-server files are gone.
    assert sorted(p.name for p in (run / "model").iterdir()) == ["server-0000.h5",
                                                                  "server-0001.h5"]
    keys, _ = load_model(run / "model")
    assert read_summary(run)["servers"] == 2 and keys.shape[0] == read_summary(run)["keys_stored"]
