"""Models (mpips.models): factorization machines' margins against the pairwise sum written
out, their gradient against finite differences, a new key's first latent values, and
logistic regression as the one-column case."""
import numpy as np
import pytest
from minibatches import batch

from mpips.base.errors import ConfigError
from mpips.models.catalog import FactorizationMachine, LogisticRegression, model_of
from mpips.models.optimizer import Optimizer
from mpips.server.store import KVStore


def pairwise(b, cols, bias_col, w) -> np.ndarray:
    """b + sum_i w_i x_i + sum_{i<j} <v_i, v_j> x_i x_j, row by row."""
    out = []
    for r in range(len(b)):
        lo, hi = b.indptr[r], b.indptr[r + 1]
        c, x = cols[lo:hi], b.values[lo:hi].astype(np.float64)
        m = (w[bias_col, 0] if bias_col >= 0 else 0.0) + (w[c, 0] * x).sum()
        for i in range(len(c)):
            for j in range(i + 1, len(c)):
                m += w[c[i], 1:].astype(np.float64) @ w[c[j], 1:] * x[i] * x[j]
        out.append(m)
    return np.array(out)


def mean_loss(model, b, cols, bias_col, w) -> float:
    m = model.margins(b, cols, bias_col, w)
    y = b.labels.astype(np.float64)
    return float(np.mean(np.logaddexp(0, m) - y * m))


@pytest.mark.parametrize("bias_col", [-1, 5])
def test_fm_margins_are_the_pairwise_sum(bias_col):
    b, cols = batch()
    fm = FactorizationMachine(3)
    w = np.random.default_rng(1).normal(size=(6, fm.width)).astype(np.float32)
    np.testing.assert_allclose(fm.margins(b, cols, bias_col, w), pairwise(b, cols, bias_col, w),
                               rtol=1e-10, atol=1e-12)


def test_fm_gradient_is_the_derivative_of_its_mean_logloss():
    b, cols = batch(2)
    fm = FactorizationMachine(4)
    w = np.random.default_rng(3).normal(0, 0.5, size=(6, fm.width)).astype(np.float64)
    grad, loss = fm.gradient(b, cols, 5, w.astype(np.float32))
    assert loss / len(b) == pytest.approx(mean_loss(fm, b, cols, 5, w.astype(np.float32)),
                                          rel=1e-6)
    h = 1e-4
    for key in range(6):
        for c in range(fm.width):
            up, down = w.copy(), w.copy()
            up[key, c] += h
            down[key, c] -= h
            numeric = (mean_loss(fm, b, cols, 5, up) - mean_loss(fm, b, cols, 5, down)) / (2 * h)
            assert grad[key, c] == pytest.approx(numeric, abs=2e-5), (key, c)


def test_fm_with_no_factors_at_work_is_logistic_regression():
    b, cols = batch(4)
    w = np.random.default_rng(5).normal(size=(6, 3)).astype(np.float32)
    w[:, 1:] = 0
    lr = LogisticRegression()
    fm = FactorizationMachine(2)
    np.testing.assert_allclose(fm.margins(b, cols, 5, w), lr.margins(b, cols, 5, w[:, :1]),
                               rtol=1e-12)
    np.testing.assert_allclose(fm.gradient(b, cols, 5, w)[0][:, 0],
                               lr.gradient(b, cols, 5, w[:, :1])[0][:, 0], rtol=1e-6)


def test_a_new_keys_latent_values_are_small_random_and_its_own():
    fm = FactorizationMachine(8)
    keys = np.arange(1, 20001, dtype=np.uint64)
    out = np.empty((keys.shape[0], fm.width), np.float32)
    fm.init(keys, out)
    assert (out[:, 0] == 0).all(), "the linear weight starts at zero"
    assert out[:, 1:].std() == pytest.approx(fm.init_scale, rel=0.02)
    again = np.empty((3, fm.width), np.float32)
    fm.init(keys[[7, 0, 19999]], again)
    np.testing.assert_array_equal(again, out[[7, 0, 19999]])   # whatever the batch


def test_a_store_gives_new_keys_their_first_values_once_even_as_it_grows():
    fm = FactorizationMachine(2)
    store = KVStore(fm.width, Optimizer("sgd", lr=1.0), capacity=16, init=fm.init)
    keys = np.arange(100, dtype=np.uint64)   # grows the table mid-lookup
    first = store.pull(keys, np.empty((100, fm.width), np.float32))
    expect = np.empty_like(first)
    fm.init(keys, expect)
    np.testing.assert_array_equal(first, expect)
    store.push(keys[:3], np.ones((3, fm.width), np.float32), clock=1)
    again = store.pull(keys, np.empty((100, fm.width), np.float32))
    np.testing.assert_array_equal(again[3:], expect[3:])
    np.testing.assert_array_equal(again[:3], expect[:3] - 1)


def test_models_are_named_and_refused_by_name():
    assert model_of("lr").width == 1 and model_of("fm", 4).width == 5
    with pytest.raises(ConfigError, match="--model must be one of lr, fm, widedeep, got .gbdt."):
        model_of("gbdt")
    with pytest.raises(ConfigError, match="--factors must be from 1 to 1024, got 0"):
        model_of("fm", 0)
