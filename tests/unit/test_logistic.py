"""Logistic-regression kernels and metrics against numpy and scikit-learn."""
import numpy as np
from sklearn.metrics import log_loss, roc_auc_score

from mpips.kernels.logistic import logistic_gradient, logistic_margins, mean_logloss, roc_auc


def random_batch(rng, n_rows=50, n_keys=30):
    nnz = rng.integers(0, 8, n_rows)
    indptr = np.concatenate([[0], np.cumsum(nnz)]).astype(np.int64)
    cols = rng.integers(0, n_keys, indptr[-1]).astype(np.int64)
    vals = rng.normal(size=indptr[-1]).astype(np.float32)
    labels = rng.integers(0, 2, n_rows).astype(np.float32)
    w = rng.normal(size=n_keys + 1).astype(np.float32)
    return indptr, cols, vals, labels, w


def dense(indptr, cols, vals, n_cols):
    x = np.zeros((indptr.shape[0] - 1, n_cols))
    for r in range(x.shape[0]):
        for p in range(indptr[r], indptr[r + 1]):
            x[r, cols[p]] += vals[p]
    return x


def test_gradient_and_loss_match_dense_numpy():
    rng = np.random.default_rng(0)
    indptr, cols, vals, labels, w = random_batch(rng)
    bias_col = w.shape[0] - 1
    x = dense(indptr, cols, vals, w.shape[0])
    x[:, bias_col] = 1.0
    margin = x @ w.astype(np.float64)
    p = 1 / (1 + np.exp(-margin))
    grad = np.empty_like(w)
    loss = logistic_gradient(indptr, cols, vals, labels, bias_col, w, grad)
    np.testing.assert_allclose(grad, x.T @ (p - labels) / len(labels), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(loss, log_loss(labels, p, normalize=False), rtol=1e-9)
    m = np.empty(len(labels))
    logistic_margins(indptr, cols, vals, bias_col, w, m)
    np.testing.assert_allclose(m, margin, rtol=1e-9)


def test_gradient_is_the_derivative():
    rng = np.random.default_rng(1)
    indptr, cols, vals, labels, w = random_batch(rng)
    w = w.astype(np.float32)
    grad = np.empty_like(w)
    logistic_gradient(indptr, cols, vals, labels, -1, w, grad)
    k, h = int(cols[0]), 1e-2
    up, down = w.copy(), w.copy()
    up[k] += h
    down[k] -= h
    scratch = np.empty_like(w)
    numeric = (logistic_gradient(indptr, cols, vals, labels, -1, up, scratch)
               - logistic_gradient(indptr, cols, vals, labels, -1, down, scratch)) / (2 * h)
    np.testing.assert_allclose(grad[k], numeric / len(labels), rtol=1e-3)


def test_extreme_margins_do_not_overflow():
    m = np.array([800.0, -800.0, 0.0])
    y = np.float32([1, 0, 1])
    assert np.isclose(mean_logloss(m, y), np.log(2) / 3)
    assert np.isfinite(mean_logloss(-m, y))


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(3)
    scores = np.round(rng.normal(size=2000), 1)   # many ties
    labels = (rng.random(2000) < 1 / (1 + np.exp(-scores))).astype(np.float32)
    np.testing.assert_allclose(roc_auc(scores, labels), roc_auc_score(labels, scores), rtol=1e-12)
    assert np.isnan(roc_auc(scores, np.zeros(2000, np.float32)))
