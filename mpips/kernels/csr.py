"""CSR arrays: structure checks of those read from disk, before any kernel indexes with
them (one sequential pass, no allocation), and the scatter-add of a sparse product. Pure
numba."""
from .jit import njit


@njit(cache=True, nogil=True)
def first_bad_pointer(indptr, nnz):
    """Index of the first row pointer that is below the one before or outside [0, nnz];
    -1 if they are all in order."""
    for i in range(indptr.shape[0]):
        p = indptr[i]
        if p < 0 or p > nnz or (i > 0 and p < indptr[i - 1]):
            return i
    return -1


@njit(cache=True, nogil=True)
def first_bad_label(labels):
    """Index of the first label that is not 0 or 1; -1 if none."""
    for i in range(labels.shape[0]):
        if labels[i] != 0.0 and labels[i] != 1.0:
            return i
    return -1


@njit(cache=True, nogil=True)
def scatter_add(into, values, source, at, out):
    """out[into[i]] += values[i] * source[at[i]] for each entry i in order (out as given):
    np.bincount(into, values * source[at]) without its temporaries, to the same bits."""
    for i in range(into.shape[0]):
        out[into[i]] += values[i] * source[at[i]]
