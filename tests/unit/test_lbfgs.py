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


class Client:
    """DenseClient's requests over several tables."""
    requests = 0   # gram requests made

    def gram(self, rows, columns):
        Client.requests += 1
        return np.array([[a.dot(b) for b in columns] for a in rows])


class Table:
    """A dense table's vector operations, as DenseClient's, on one numpy array."""
    client = Client()

    def __init__(self, name: str, n: int):
        self.name, self.v = name, np.zeros(n)

    def combine(self, coefficients, tables):
        assert all(t is not self for t in tables)
        self.v = coefficients[0] * tables[0].v
        for a, t in zip(coefficients[1:], tables[1:]):
            self.v += a * t.v
        return self

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


def test_the_two_loop_on_scalars_is_the_two_loop_on_vectors():
    """two_loop's coefficients, applied to the basis, give the classic recursion's H q."""
    r = np.random.default_rng(3)
    n, k = 30, 5
    s = [r.normal(size=n) for _ in range(k)]
    y = [si + 0.1 * r.normal(size=n) for si in s]      # positive curvature
    q0 = r.normal(size=n)
    rhos = [1.0 / (si @ yi) for si, yi in zip(s, y)]
    q, alphas = q0.copy(), []
    for si, yi, rho in reversed(list(zip(s, y, rhos))):
        alphas.append(rho * si @ q)
        q -= alphas[-1] * yi
    q *= (s[-1] @ y[-1]) / (y[-1] @ y[-1])
    for si, yi, rho, a in zip(s, y, rhos, reversed(alphas)):
        q += (a - rho * yi @ q) * si
    basis = np.array(s + y + [q0])
    c = lbfgs.two_loop(basis @ basis.T, rhos)
    np.testing.assert_allclose(c @ basis, q, rtol=1e-10, atol=1e-12)
    assert lbfgs.two_loop(np.array([[4.0]]), []).tolist() == [1.0]   # no history: q itself


def test_an_iteration_asks_for_the_dot_products_once():
    """Vector-free: one gram request an iteration (the new vectors' dot products; those
    of the history are kept), none for the two-loop's steps."""
    Client.requests = 0
    _, steps = solve(lbfgs.Settings(memory=4, max_iter=20, tol=0.0))
    assert Client.requests <= steps[-1].iteration + 1


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
