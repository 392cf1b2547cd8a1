"""Each rank loads only its role's kernels before training: a worker none of a server's
table, a server none of a worker's gradient, nor the text parser and the key indexer (a
worker samples the data for the defaults); without a role, all of them."""
import json
import subprocess
import sys

import pytest

LOADED = """
import json, sys
from mpips.models import catalog as models
from mpips.run.warmup import compile_kernels
from mpips.kernels import keys, logistic, optim, svmlight, table
role = None if sys.argv[1] == "both" else sys.argv[1]
compile_kernels(model=models.LogisticRegression(), optimizer="adagrad", full_batch=False,
                push_filter=False, role=role)
def used(kernel):   # compiled ahead: called; numba's: compiled or loaded from its cache
    return bool(kernel.hits) if hasattr(kernel, "hits") else bool(kernel.signatures)
print(json.dumps({"table": used(table.find_and_read),
                  "update": used(optim.adagrad_update),
                  "gradient": used(logistic.logistic_gradient),
                  "parser": used(svmlight.parse_lines),
                  # both ways to a minibatch's keys: sorting entries, and for keys that bunch
                  "keys": [used(keys.sorted_entries), used(keys.sorted_unique_inverse)]}))
"""


@pytest.mark.parametrize("role, expected", [
    ("worker", {"table": False, "update": False, "gradient": True, "parser": True,
                "keys": [True, True]}),
    ("server", {"table": True, "update": True, "gradient": False, "parser": False,
                "keys": [False, False]}),
    ("both", {"table": True, "update": True, "gradient": True, "parser": True,
              "keys": [True, True]}),
])
def test_a_rank_loads_its_roles_kernels(role, expected):
    done = subprocess.run([sys.executable, "-c", LOADED, role], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected


def test_a_server_warms_its_table_with_the_keys_a_worker_would_pull():
    from mpips.data.textfile import KeyIndexer
    from mpips.run.warmup import _TINY_ROWS, _tiny_batch
    parsed = _tiny_batch()
    for field in ("labels", "indptr", "indices", "values", "origins"):
        a, b = getattr(parsed, field), getattr(_TINY_ROWS, field)
        assert a.dtype == b.dtype and (a == b).all(), field
    keys, _, _ = KeyIndexer()(parsed, bias=True)
    assert keys.tolist() == [1, 2, 3, 2**64 - 2, 2**64 - 1]
