"""Small CSR minibatches for the models' unit tests."""
import numpy as np

from mpips.data.textfile import Rows


def batch(seed: int = 0, rows: int = 6, keys: int = 5):
    """A CSR minibatch over `keys` unique keys (columns), real values, 0/1 labels."""
    rng = np.random.default_rng(seed)
    indptr, cols, vals = [0], [], []
    for _ in range(rows):
        chosen = np.sort(rng.choice(keys, rng.integers(1, keys), replace=False))
        cols += chosen.tolist()
        vals += rng.normal(size=chosen.shape[0]).tolist()
        indptr.append(len(cols))
    b = Rows(rng.integers(0, 2, rows).astype(np.float32), np.array(indptr, np.int64),
             np.zeros(len(cols), np.uint64), np.array(vals, np.float32))
    return b, np.array(cols, np.int64)
