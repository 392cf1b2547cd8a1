"""Factorization machines (Rendle, ICDM 2010) on a CSR minibatch, and the first values of a
key's latent vector. Pure numba.

A key's row is [w, v_1 .. v_k]: its linear weight and its latent vector. For a row x,
    margin = b + sum_i w_i x_i + 1/2 sum_f ((sum_i v_if x_i)^2 - sum_i v_if^2 x_i^2)
(the pairwise term sum_{i<j} <v_i, v_j> x_i x_j in O(k nnz)); the bias key has a linear
weight only (its latent vector stays unused, at its first values).
"""
import math

import numpy as np

from .hashing import mix64
from .jit import njit
from .logistic import logloss_and_sigmoid

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_TO_UNIT = 1.0 / 18446744073709551616.0   # 2^-64


@njit(cache=True, nogil=True)
def fm_init(keys, seed, scale, out):
    """out[i] = key i's first row: linear weight 0, latent values uniform in
    [-scale sqrt 3, scale sqrt 3) (standard deviation `scale`), a function of the key, the
    column and the seed alone, so that every server and every run draws the same."""
    half = scale * math.sqrt(3.0)
    for i in range(keys.shape[0]):
        out[i, 0] = 0.0
        h = mix64(keys[i] ^ np.uint64(seed))
        for c in range(1, out.shape[1]):
            h = mix64(h + _GOLDEN)
            out[i, c] = (np.float64(h) * _TO_UNIT * 2.0 - 1.0) * half


@njit(cache=True, nogil=True, inline="always")
def _margin(indptr, cols, vals, bias_col, w, r, sums):
    """Row r's margin; leaves sum_i v_if x_i in sums[f]."""
    k = sums.shape[0]
    m = np.float64(w[bias_col, 0]) if bias_col >= 0 else 0.0
    squares = 0.0
    sums[:] = 0.0
    for p in range(indptr[r], indptr[r + 1]):
        c, x = cols[p], np.float64(vals[p])
        m += np.float64(w[c, 0]) * x
        for f in range(k):
            vx = np.float64(w[c, 1 + f]) * x
            sums[f] += vx
            squares += vx * vx
    pairs = 0.0
    for f in range(k):
        pairs += sums[f] * sums[f]
    return m + 0.5 * (pairs - squares)


@njit(cache=True, nogil=True)
def fm_gradient(indptr, cols, vals, labels, bias_col, w, grad):
    """Mean logloss gradient over the rows into grad[n_keys, 1 + k] (d/dw_i = x_i,
    d/dv_if = x_i (sum_j v_jf x_j - v_if x_i), times sigmoid(margin) - y); returns the
    summed logloss, measured before the update."""
    grad[:] = 0.0
    k = w.shape[1] - 1
    sums = np.empty(k)
    n_rows = indptr.shape[0] - 1
    loss = 0.0
    for r in range(n_rows):
        m = _margin(indptr, cols, vals, bias_col, w, r, sums)
        y = np.float64(labels[r])
        row_loss, sigmoid = logloss_and_sigmoid(m, y)
        loss += row_loss
        d = sigmoid - y
        for p in range(indptr[r], indptr[r + 1]):
            c, x = cols[p], np.float64(vals[p])
            grad[c, 0] += d * x
            for f in range(k):
                grad[c, 1 + f] += d * x * (sums[f] - np.float64(w[c, 1 + f]) * x)
        if bias_col >= 0:
            grad[bias_col, 0] += d
    if n_rows > 0:
        scale = 1.0 / n_rows
        for i in range(grad.shape[0]):
            for j in range(grad.shape[1]):
                grad[i, j] *= scale
    return loss


@njit(cache=True, nogil=True)
def fm_margins(indptr, cols, vals, bias_col, w, out):
    """out[r] = the FM margin of row r."""
    sums = np.empty(w.shape[1] - 1)
    for r in range(indptr.shape[0] - 1):
        out[r] = _margin(indptr, cols, vals, bias_col, w, r, sums)
