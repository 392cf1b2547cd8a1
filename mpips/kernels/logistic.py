"""Logistic-regression loss, gradient and margins on a CSR minibatch. Pure numba.

Rows are CSR (indptr, cols, vals) where cols index the minibatch's unique keys,
so `w[cols[p]]` is the weight the worker pulled for that key.
"""
import math

import numpy as np

from .jit import njit


@njit(cache=True, nogil=True, inline="always")
def logloss_and_sigmoid(margin, y):
    """(the logloss, the sigmoid) of one margin from one exp: the logloss overflow-free
    (log(1 + exp(-m)) for y = 1, log(1 + exp(m)) for y = 0), the sigmoid as 1 / (1 +
    exp(-m)) or exp(m) / (1 + exp(m)) as m's sign asks."""
    e = math.exp(-abs(margin))
    loss = max(margin, 0.0) - margin * y + math.log1p(e)
    return loss, (1.0 / (1.0 + e) if margin >= 0 else e / (1.0 + e))


@njit(cache=True, nogil=True)
def logistic_gradient(indptr, cols, vals, labels, bias_col, w, grad):
    """Mean logloss gradient over the rows into `grad` (one entry per unique key).

    `bias_col` is the column of the always-on bias feature, or -1 for none.
    Returns the summed logloss of the rows, measured before the update. In three passes
    (margins, residuals, gradient): the transcendental functions in a loop of their own
    take a third less time over many rows than one pass.
    """
    residual = np.empty(indptr.shape[0] - 1)
    logistic_margins(indptr, cols, vals, bias_col, w, residual)
    loss = logistic_residuals(residual, labels, residual)
    residual_gradient(indptr, cols, vals, bias_col, residual, grad)
    return loss


@njit(cache=True, nogil=True)
def logistic_residuals(margins, labels, out):
    """out[r] = sigmoid(margins[r]) - labels[r], as `logistic_gradient` finds it; returns
    the rows' summed logloss."""
    loss = 0.0
    for r in range(margins.shape[0]):
        y = np.float64(labels[r])
        row_loss, sigmoid = logloss_and_sigmoid(margins[r], y)
        loss += row_loss
        out[r] = sigmoid - y
    return loss


@njit(cache=True, nogil=True)
def residual_gradient(indptr, cols, vals, bias_col, residual, grad):
    """The mean over the rows of residual[r] x_r into `grad` (each entry adds its rows in
    order)."""
    grad[:] = 0.0
    n_rows = indptr.shape[0] - 1
    for r in range(n_rows):
        d = residual[r]
        for p in range(indptr[r], indptr[r + 1]):
            grad[cols[p]] += d * vals[p]
        if bias_col >= 0:
            grad[bias_col] += d
    if n_rows > 0:
        scale = 1.0 / n_rows
        for k in range(grad.shape[0]):
            grad[k] *= scale


@njit(cache=True, nogil=True)
def logistic_margins(indptr, cols, vals, bias_col, w, out):
    """out[r] = w . x_r (+ bias weight) for each row."""
    for r in range(indptr.shape[0] - 1):
        m = np.float64(w[bias_col]) if bias_col >= 0 else 0.0
        for p in range(indptr[r], indptr[r + 1]):
            m += np.float64(w[cols[p]]) * vals[p]
        out[r] = m


@njit(cache=True, nogil=True)
def mean_logloss(margins, labels):
    """Mean logloss of labels in {0, 1} given margins (computed from the margin, no clipping)."""
    total = 0.0
    for i in range(margins.shape[0]):
        total += logloss_and_sigmoid(np.float64(margins[i]), np.float64(labels[i]))[0]
    return total / max(margins.shape[0], 1)


@njit(cache=True, nogil=True)
def roc_auc(scores, labels):
    """Area under the ROC curve, ties counted as half (Mann-Whitney U). NaN without both classes."""
    order = np.argsort(scores, kind="mergesort")
    n = scores.shape[0]
    rank_sum = 0.0
    n_pos = 0
    i = 0
    while i < n:
        j = i
        while j + 1 < n and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        avg_rank = 0.5 * (i + j) + 1.0
        for k in range(i, j + 1):
            if labels[order[k]] > 0.5:
                rank_sum += avg_rank
                n_pos += 1
        i = j + 1
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        return np.nan
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def held_out(margins, labels) -> tuple[float, float]:
    """(mean logloss, AUC) of scored test rows, the same bits in whatever order the rows
    come (the job's ranks score chunks in no fixed order): summed sorted by margin, then
    label. AUC is NaN without both classes."""
    order = np.lexsort((labels, margins))
    margins, labels = margins[order], labels[order]
    return float(mean_logloss(margins, labels)), float(roc_auc(margins, labels))

