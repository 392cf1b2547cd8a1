"""What a user imports comes from `mpips` itself (issue 31): every public name resolves,
`import mpips` alone starts nothing (no MPI, no numba), and the README's Python snippets
import from `mpips` only, never from the packages below it, which may move."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mpips

README = Path(__file__).resolve().parents[2] / "README.md"


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


def test_the_readme_imports_from_mpips_only():
    code = "\n".join(re.findall(r"```python\n(.*?)```", README.read_text(), re.S))
    assert "import mpips" in code or "from mpips import" in code
    assert not re.findall(r"from mpips\.\w+", code)
