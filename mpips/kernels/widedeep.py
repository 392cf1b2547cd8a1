"""Wide & Deep's sparse half: rows [w, e_1..e_k] per key. A row's wide margin is
b + sum_i w_i x_i; its deep input, of `slots` blocks of k, holds in block s the pooled
embedding sum of x_i e_i over the features i of slot s (a feature's field, when the input is
the fields' embeddings concatenated; slot 0 for all, when it is their sum). Pure numba over
the CSR minibatch; the dense layers on top are kernels.mlp."""
import numpy as np

from .jit import njit


@njit(cache=True, nogil=True, inline="always")
def _slot(slots, p):
    return slots[p] if slots.shape[0] else 0


@njit(cache=True, nogil=True)
def wide_and_pooled(indptr, cols, vals, slots, bias_col, w, wide, pooled):
    """wide[r] = the row's wide margin; pooled[r, s*k:(s+1)*k] = the sum of x_i e_i over
    the row's features i of slot slots[i] = s (float64; `slots` empty: all in slot 0)."""
    k = w.shape[1] - 1
    for r in range(indptr.shape[0] - 1):
        m = np.float64(w[bias_col, 0]) if bias_col >= 0 else 0.0
        for f in range(pooled.shape[1]):
            pooled[r, f] = 0.0
        for p in range(indptr[r], indptr[r + 1]):
            c, x, at = cols[p], vals[p], _slot(slots, p) * k
            m += np.float64(w[c, 0]) * x
            for f in range(k):
                pooled[r, at + f] += np.float64(w[c, 1 + f]) * x
        wide[r] = m


@njit(cache=True, nogil=True)
def scatter_sparse(indptr, cols, vals, slots, bias_col, dmargin, dpooled, grad):
    """The rows' gradients (dmargin[r] on the margin, dpooled[r] on the deep input) added
    into each key's row of grad[n_keys, 1 + k]: x dmargin on w, x dpooled's block of the
    feature's slot on e."""
    k = grad.shape[1] - 1
    for r in range(indptr.shape[0] - 1):
        for p in range(indptr[r], indptr[r + 1]):
            c, x, at = cols[p], vals[p], _slot(slots, p) * k
            grad[c, 0] += dmargin[r] * x
            for f in range(k):
                grad[c, 1 + f] += dpooled[r, at + f] * x
        if bias_col >= 0:
            grad[bias_col, 0] += dmargin[r]
