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


REFUSED = """
import sys
from mpips.base.errors import ConfigError
from mpips.cli.main import build_parser
from mpips.run.config_checks import check
from mpips.run.options import config_of
import mpips.job.training
build_parser().format_help()
cfg = config_of(build_parser().parse_args(sys.argv[1:]))
try:
    check(cfg, 4)
except ConfigError as e:
    print("refused:", e)
print(sorted(m for m in ("numba", "mpips.kernels.optim", "mpips.data.textfile") if m in sys.modules))
"""


@pytest.mark.parametrize("args", [
    ["--train", "/nonexistent"],
    ["--train", "/nonexistent", "--model", "widedeep", "--hidden", "0", "--optimizer", "ftrl"],
])
def test_a_launch_its_checks_refuse_loads_no_numba(args):
    """Parsing options, checking them and everything a rank imports until they pass load no
    numba (a quarter of a second of every rank): a refused launch is cheap."""
    done = subprocess.run([sys.executable, "-c", REFUSED, "train", *args], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    refused, loaded = done.stdout.strip().splitlines()[-2:]
    assert refused.startswith("refused: "), refused
    assert loaded == "[]", f"{loaded} loaded to check the options"
