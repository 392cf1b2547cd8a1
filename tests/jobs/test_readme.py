"""What the README shows runs as written."""
import os
import re
import subprocess
import sys

from support import mpiexec_path, run_mpips


README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def python_block(containing: str, path=README) -> str:
    """The README's one Python block that contains the text `containing`."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", open(path).read(), re.S)
              if containing in b]
    assert len(blocks) == 1, f"{len(blocks)} Python blocks in the README contain {containing!r}"
    return blocks[0]


def run_snippet(snippet: str, tmp_path, ranks: int = 3) -> str:
    script = tmp_path / "script.py"
    script.write_text(snippet)
    command = [sys.executable, str(script)]
    if ranks:
        command = [mpiexec_path(), "-n", str(ranks)] + command
    job = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert job.returncode == 0, job.stdout + job.stderr
    return job.stdout


def test_the_key_value_snippet_runs_as_written(tmp_path):
    out = run_snippet(python_block("kv = KVWorker(roles)\n    keys"), tmp_path)
    assert out.count("[1. 1. 1.]") == 2, out


def test_the_dense_table_snippet_runs_as_written(tmp_path):
    out = run_snippet(python_block("DenseClient(kv)"), tmp_path)
    assert out.split() == ["True", "1000000.0"], out


def test_the_train_and_load_snippets_run_as_written(tmp_path):
    made = run_mpips("make-data", "--rows", 4000, "--features", 500, "--nnz", 8,
                     tmp_path / "clicks")
    assert made.returncode == 0, made.output
    printed = run_snippet(python_block("mpips.train("), tmp_path, ranks=4)
    logloss = float(printed.split()[-1])      # after the job's progress lines
    assert 0 < logloss < 0.69
    run_snippet(python_block("mpips.load("), tmp_path, ranks=0)
    assert (tmp_path / "runs" / "clicks" / "summary.json").exists()
