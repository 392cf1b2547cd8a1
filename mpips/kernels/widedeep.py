"""Wide & Deep's sparse half: rows [w, e_1..e_k] per key. A row's wide margin is
b + sum_i w_i x_i; its deep input the pooled embedding sum_i x_i e_i. Pure numba over the
CSR minibatch; the dense layers on top are kernels.mlp."""
import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def wide_and_pooled(indptr, cols, vals, bias_col, w, wide, pooled):
    """wide[r] = the row's wide margin; pooled[r, :] = sum of x_i e_i (float64)."""
    k = pooled.shape[1]
    for r in range(indptr.shape[0] - 1):
        m = np.float64(w[bias_col, 0]) if bias_col >= 0 else 0.0
        for f in range(k):
            pooled[r, f] = 0.0
        for p in range(indptr[r], indptr[r + 1]):
            c, x = cols[p], vals[p]
            m += np.float64(w[c, 0]) * x
            for f in range(k):
                pooled[r, f] += np.float64(w[c, 1 + f]) * x
        wide[r] = m


@njit(cache=True, nogil=True)
def scatter_sparse(indptr, cols, vals, bias_col, dmargin, dpooled, grad):
    """The rows' gradients (dmargin[r] on the margin, dpooled[r] on the pooled embedding)
    added into each key's row of grad[n_keys, 1 + k]: x dmargin on w, x dpooled on e."""
    k = dpooled.shape[1]
    for r in range(indptr.shape[0] - 1):
        for p in range(indptr[r], indptr[r + 1]):
            c, x = cols[p], vals[p]
            grad[c, 0] += dmargin[r] * x
            for f in range(k):
                grad[c, 1 + f] += dpooled[r, f] * x
        if bias_col >= 0:
            grad[bias_col, 0] += dmargin[r]
