"""A worker's rows for a full-batch job: CSR over the coordinates of a dense weight vector
that they touch (a feature is coordinate key mod dim; the bias, coordinate dim). No MPI."""
import numpy as np

from ..kernels.logistic import logistic_gradient, logistic_margins
from .textfile import Rows


class Part:
    """A worker's rows, as CSR over the dense coordinates they touch (sorted, unique)."""

    def __init__(self, rows: Rows, dim: int, bias: bool):
        coords = rows.indices % np.uint64(dim)
        self.coords, cols = np.unique(coords, return_inverse=True)
        self.bias_col = -1
        if bias:
            self.bias_col = self.coords.shape[0]
            self.coords = np.append(self.coords, np.uint64(dim))
        self.cols = cols.astype(np.int64).reshape(-1)
        self.indptr, self.values, self.labels = rows.indptr, rows.values, rows.labels
        self.n_rows = len(rows)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.coords, self.cols, self.indptr, self.values,
                                      self.labels))

    def loss_and_gradient(self, w: np.ndarray):
        """(summed logloss, gradient summed over the rows) at weights w[coords]."""
        grad = np.empty(self.coords.shape[0])
        loss = logistic_gradient(self.indptr, self.cols, self.values, self.labels,
                                 self.bias_col, w, grad)
        return loss, grad * self.n_rows   # the kernel gives the mean

    def margins(self, w: np.ndarray) -> np.ndarray:
        out = np.empty(self.n_rows)
        logistic_margins(self.indptr, self.cols, self.values, self.bias_col, w, out)
        return out
