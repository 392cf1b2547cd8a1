"""Synthetic CTR-like data: hashed categorical features with Zipf-skewed frequencies,
a few numeric ones, and binary labels drawn from a planted logistic model."""
import math
import os

import numpy as np

from .errors import ConfigError
from .kernels.synth import max_bytes_per_row, write_rows

ZIPF_EXPONENT = 1.1
NUMERIC_FIELDS = 2
BIAS = -1.4          # about 25% positives, like a click-through log
MARGIN_STD = 1.5     # spread of the planted model's margins


def zipf_cdf(vocab: int, exponent: float = ZIPF_EXPONENT) -> np.ndarray:
    weights = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def write_svmlight(path: str, seed: int, first_row: int, n_rows: int, n_fields: int,
                   features: int, rows_per_chunk: int = 50000) -> int:
    """Write rows [first_row, first_row + n_rows) to `path` atomically. Returns positives."""
    n_numeric = min(NUMERIC_FIELDS, n_fields)
    n_categorical = max(n_fields - n_numeric, 1)
    cdf = zipf_cdf(max(features // n_categorical, 1))
    sigma = MARGIN_STD / math.sqrt(n_fields)
    buf = np.empty(max_bytes_per_row(n_fields) * rows_per_chunk, np.uint8)
    positives = 0
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        for start in range(first_row, first_row + n_rows, rows_per_chunk):
            count = min(rows_per_chunk, first_row + n_rows - start)
            nbytes, pos = write_rows(seed, start, count, n_fields, n_numeric, cdf, BIAS, sigma, buf)
            positives += pos
            f.write(buf[:nbytes].data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return positives


def make_data(prefix: str, rows: int, features: int, nnz: int, seed: int,
              test_rows: int | None = None) -> dict:
    """Write PREFIX.train.svm (rows) and PREFIX.test.svm (test_rows, default rows // 5).

    The test file is written first, so an existing train file means both are complete.
    """
    if test_rows is None:
        test_rows = max(rows // 5, 1)
    for name, value in (("--rows", rows), ("--features", features), ("--nnz", nnz)):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")
    if test_rows < 0:
        raise ConfigError(f"--test-rows must be >= 0, got {test_rows}")
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    parent = os.path.dirname(os.path.abspath(prefix))
    os.makedirs(parent, exist_ok=True)
    out = {}
    for name, first, count in (("test", rows, test_rows), ("train", 0, rows)):
        path = f"{prefix}.{name}.svm"
        positives = write_svmlight(path, seed, first, count, nnz, features)
        out[name] = {"path": path, "rows": count, "positive_rate": positives / max(count, 1)}
    return out
