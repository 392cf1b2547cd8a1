"""What the README shows runs as written."""
import os
import re
import subprocess
import sys

from conftest import mpiexec_path


README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def python_blocks(path=README) -> list:
    return re.findall(r"```python\n(.*?)```", open(path).read(), re.S)


def run_snippet(snippet: str, tmp_path) -> str:
    script = tmp_path / "script.py"
    script.write_text(snippet)
    job = subprocess.run([mpiexec_path(), "-n", "3", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stdout + job.stderr
    return job.stdout


def test_the_key_value_snippet_runs_as_written(tmp_path):
    out = run_snippet(python_blocks()[0], tmp_path)
    assert out.count("[1. 1. 1.]") == 2, out


def test_the_dense_table_snippet_runs_as_written(tmp_path):
    out = run_snippet(python_blocks()[1], tmp_path)
    assert out.split() == ["True", "1000000.0"], out
