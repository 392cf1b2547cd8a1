"""Level-1 vector kernels over the float64 blocks of dense tables: one pass, no temporaries.
Pure numba; blocks are 1-d views (a block of rows of width k is flattened)."""
from .jit import njit


@njit(cache=True, nogil=True)
def axpy(a, x, y):
    """y += a * x."""
    for i in range(x.shape[0]):
        y[i] += a * x[i]


@njit(cache=True, nogil=True)
def scale(a, x):
    for i in range(x.shape[0]):
        x[i] *= a


@njit(cache=True, nogil=True)
def dot(x, y):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * y[i]
    return s


@njit(cache=True, nogil=True)
def total(x):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i]
    return s
