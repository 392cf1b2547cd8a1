"""lbfgs.minimize in process, on tables held in numpy arrays (the servers' operations, same
kernels): it reaches the optimum, and a run resumed from a checkpoint ends on the same bits."""
import copy
import itertools
import json
import math

import numpy as np
import pytest

from mpips.kernels.elementwise import MAPS, ZIPS
from mpips.models import lbfgs


class Table:
    """A dense table's vector operations, as DenseClient's, on one numpy array."""

    def __init__(self, name: str, n: int):
        self.name, self.v = name, np.zeros(n)

    def copy(self, other):
        self.v[:] = other.v
        return self

    def scale(self, a):
        self.v *= a
        return self

    def axpy(self, a, other):
        self.v += a * other.v
        return self

    def dot(self, other):
        return float(self.v @ other.v)

    def nrm2(self):
        return float(np.linalg.norm(self.v))

    def sum(self):
        return float(self.v.sum())

    def map(self, name, x, a=0.0):
        MAPS[name].py_func(x.v, self.v, a)
        return self

    def zip(self, name, x, y, a=0.0):
        out = np.empty_like(self.v)
        ZIPS[name].py_func(x.v, y.v, out, a)
        self.v = out
        return self


rng = np.random.default_rng(0)
X = rng.normal(size=(200, 12)) * (rng.random((200, 12)) < 0.5)
Y = (rng.random(200) < 1 / (1 + np.exp(-X @ rng.normal(size=12)))).astype(float)


def evaluate(point, gradient) -> float:
    """Mean logistic loss + 0.005 |w|^2."""
    m = X @ point.v
    gradient.v[:] = X.T @ (1 / (1 + np.exp(-m)) - Y) / len(Y) + 0.01 * point.v
    return float(np.mean(np.logaddexp(0, m) - Y * m) + 0.005 * point.v @ point.v)


def solve(settings, **kwargs):
    t = {name: Table(name, X.shape[1]) for name in lbfgs.tables(settings.memory, settings.l1)}
    return t, lbfgs.minimize(t, evaluate, settings, **kwargs)


@pytest.mark.parametrize("l1", [0.0, 0.03])
def test_the_gradient_vanishes_at_the_end(l1):
    t, steps = solve(lbfgs.Settings(memory=4, l1=l1, tol=0.0))
    assert steps[-1].gradient_norm < 1e-6
    assert all(a.objective >= b.objective for a, b in itertools.pairwise(steps))
    if l1:
        assert (t["w"].v == 0).any()


@pytest.mark.parametrize("l1", [0.0, 0.03])
def test_a_resumed_run_ends_on_the_uninterrupted_bits(l1):
    settings = lbfgs.Settings(memory=3, l1=l1, max_iter=25, tol=0.0)
    whole_t, whole = solve(settings)
    saved = []

    def checkpoint(iteration, state):   # as the manifest keeps it: JSON, nan as null
        plain = json.loads(json.dumps(state).replace("NaN", "null"))
        plain["steps"] = [[math.nan if v is None else v for v in s] for s in plain["steps"]]
        saved.append((plain, copy.deepcopy(t)))

    t = {name: Table(name, X.shape[1]) for name in lbfgs.tables(settings.memory, settings.l1)}
    asked = iter([False] * 6 + [True])
    first = lbfgs.minimize(t, evaluate, settings, checkpoint=checkpoint, every=3,
                           stop=lambda: next(asked))
    assert first[-1].iteration == 7 and len(saved) == 3   # at 3, 6, and 7 when stopped
    state, tables = saved[1]
    rest = lbfgs.minimize(tables, evaluate, settings, resume=state)
    assert tables["w"].v.tobytes() == whole_t["w"].v.tobytes()
    assert [s._replace(seconds=0) for s in rest] == [s._replace(seconds=0) for s in whole]
