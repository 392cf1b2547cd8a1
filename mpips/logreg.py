"""Sparse logistic regression on one minibatch: the worker's numeric steps (no MPI)."""
import numpy as np

from .data import Rows
from .kernels.logistic import logistic_gradient, logistic_margins


def gradient(batch: Rows, cols: np.ndarray, bias_col: int, weights: np.ndarray):
    """(mean logloss gradient per unique key as float32, summed logloss) for pulled
    weights[n_keys, 1]."""
    grad = np.empty(weights.shape[0], np.float32)
    loss = logistic_gradient(batch.indptr, cols, batch.values, batch.labels, bias_col,
                             weights.reshape(-1), grad)
    return grad, loss


def margins(batch: Rows, cols: np.ndarray, bias_col: int, weights: np.ndarray) -> np.ndarray:
    """w . x for each row (float64) for pulled weights[n_keys, 1]."""
    out = np.empty(len(batch))
    logistic_margins(batch.indptr, cols, batch.values, bias_col, weights.reshape(-1), out)
    return out
