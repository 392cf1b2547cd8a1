"""What a user imports comes from `mpips` itself (issue 31): every public name resolves,
`import mpips` alone starts nothing (no MPI, no numba), and the Python snippets of the README
and the user guide (docs/) import from `mpips` only, never from the packages below it, which
may move."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mpips

ROOT = Path(__file__).resolve().parents[2]
# What a user reads: the README and the guide (architecture.md is for those who change mpips).
PAGES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").rglob("*.md"))
                               if p.name != "architecture.md")]


@pytest.mark.parametrize("name", sorted(set(mpips.__all__) - {"__version__"}))
def test_every_public_name_resolves(name):
    assert getattr(mpips, name) is not None


def test_the_dense_table_handle_the_kv_client_and_the_errors_are_public():
    from mpips.base.errors import MpipsError
    assert issubclass(mpips.ConfigError, mpips.MpipsError) and mpips.MpipsError is MpipsError
    assert callable(mpips.KVWorker) and callable(mpips.DenseClient) and callable(mpips.serve)


def test_an_unknown_name_says_so():
    with pytest.raises(AttributeError, match="no attribute 'Server'"):
        mpips.Server   # noqa: B018 (the attribute access is the test)


def test_importing_mpips_starts_neither_mpi_nor_numba():
    done = subprocess.run([sys.executable, "-c", "import json, sys, mpips; print(json.dumps("
                           "sorted(m for m in sys.modules if m.startswith(('mpi4py', 'numba', "
                           "'h5py', 'mpips.')))))"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["mpips.base", "mpips.base.version"]


def test_the_docs_import_from_mpips_only():
    code = "\n".join(block for page in PAGES
                     for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S))
    assert "import mpips" in code or "from mpips import" in code
    assert not re.findall(r"from mpips\.\w+", code)
