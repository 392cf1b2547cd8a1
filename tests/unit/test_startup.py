"""Start-up: every rank imports what all ranks use, then its own part's modules only; HDF5 is
loaded by the ranks that write or read a file, once they do."""
import json
import subprocess
import sys

import pytest

IMPORTED = """
import json, sys
import mpips.cli.main, mpips.job.training
if sys.argv[1]:
    __import__(sys.argv[1])
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("mpips", "h5py")))))
"""

# What no rank of a plain job (minibatches, no checkpoint, no pipeline) imports before its
# first minibatch (HDF5: servers save their shards at the end, rank 0 the timelines), and
# what only one role's ranks import.
NOWHERE = {"h5py", "mpips.job.fullbatch_part", "mpips.server.dense_tables", "mpips.worker.dense_client", "mpips.data.dense_rows",
           "mpips.cli.report", "mpips.models.evaluate", "mpips.api", "mpips.data.synthetic"}
SERVERS_ONLY = {"mpips.job.server_part", "mpips.server.loop", "mpips.server.store", "mpips.membership.requests",
                "mpips.membership.rangemoves", "mpips.membership.workermoves"}
WORKERS_ONLY = {"mpips.job.worker_part", "mpips.worker.kvworker"}


def imported(part: str) -> set:
    done = subprocess.run([sys.executable, "-c", IMPORTED, part], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("part, unused", [
    ("", NOWHERE | SERVERS_ONLY | WORKERS_ONLY),
    ("mpips.job.worker_part", NOWHERE | SERVERS_ONLY),
    ("mpips.job.server_part", (NOWHERE - {"mpips.server.dense_tables"}) | {"mpips.job.worker_part"}),
])
def test_a_rank_imports_no_module_its_part_does_not_use(part, unused):
    assert imported(part) & unused == set()



def loaded(*args) -> tuple:
    """(the exit status, the error's last line, the top-level packages imported) of
    `python -m mpips ARGS`, a plain process."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "mpips", *args],
                          capture_output=True, text=True, timeout=300)
    names = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
             if line.startswith("import time:")}
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    return done.returncode, said[-1] if said else "", names


@pytest.mark.parametrize("args", [
    ["--train", "/nonexistent"],
    ["--train", "/nonexistent", "--model", "widedeep", "--hidden", "0", "--optimizer", "ftrl"],
])
def test_a_launch_its_checks_refuse_loads_no_numba(args):
    """Parsing options, checking them and leaving load no numba (a quarter of a second of
    every rank): a refused launch is cheap."""
    status, said, names = loaded("train", *args)
    assert status == 2 and "mpips train: error:" in said, said
    assert "numba" not in names and "mpips.kernels.optim" not in names


def test_help_loads_no_numba():
    status, _, names = loaded("train", "--help")
    assert status == 0 and "numba" not in names and "mpi4py" not in names
