"""Each rank loads only its role's kernels before training: a worker none of a server's
table, a server none of a worker's gradient; without a role, both."""
import json
import subprocess
import sys

import pytest

LOADED = """
import json, sys
from mpips import models
from mpips.warmup import compile_kernels
from mpips.kernels import logistic, optim, table
role = None if sys.argv[1] == "both" else sys.argv[1]
compile_kernels(model=models.LogisticRegression(), optimizer="adagrad", full_batch=False,
                push_filter=False, role=role)
print(json.dumps({"table": bool(table.find_and_read.signatures),
                  "update": bool(optim.adagrad_update.signatures),
                  "gradient": bool(logistic.logistic_gradient.signatures)}))
"""


@pytest.mark.parametrize("role, expected", [
    ("worker", {"table": False, "update": False, "gradient": True}),
    ("server", {"table": True, "update": True, "gradient": False}),
    ("both", {"table": True, "update": True, "gradient": True}),
])
def test_a_rank_loads_its_roles_kernels(role, expected):
    done = subprocess.run([sys.executable, "-c", LOADED, role], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected
