"""mpips from Python: a trained model in one process, and a training job from a script.

    import mpips
    model = mpips.load("runs/clicks")       # a run, its model directory, or a checkpoint
    p = model.predict_proba("test.svm")      # a file, or scipy CSR (+ the columns' keys)
    w = model.weights(np.array([3, 17], np.uint64))   # rows of zeros for unknown keys
    model.config["optimizer"]

    summary = mpips.train(train="clicks.svm", servers=2, epochs=3)   # under mpiexec
"""
import os

import numpy as np

from .base.files import open_hdf5
from .data.inputs import format_mismatch
from .data.textfile import Rows
from .models import catalog, updates
from .models.evaluate import (
    full_batch_margins,
    known_fraction,
    margins_of,
    read_rows,
    warn_if_few_known,
)
from .models.optimizer import Optimizer
from .storage.checkpoint import MANIFEST, read_manifest, verify
from .storage.dense_files import read_table
from .storage.model_files import ModelInfo, load_full_batch, load_model, model_dir_of, model_info


class Model:
    """A trained model in memory: sorted keys, weights[n, width], the run's configuration."""

    def __init__(self, keys: np.ndarray, weights: np.ndarray, info: ModelInfo, source: str):
        self.keys, self._weights, self.source = keys, weights, source
        self.config, self.data_format = info.config, info.data_format
        self.model = catalog.from_config(self.config)

    def __repr__(self) -> str:
        return (f"mpips.Model({self.model.describe()}, {self.keys.shape[0]:,} keys, "
                f"from {self.source})")

    def weights(self, keys) -> np.ndarray:
        """float32[len(keys), width]: each key's weights (its weight, then an FM's latent
        vector); zeros for keys the model lacks. `keys`: feature keys (a single key gives one
        row)."""
        keys = _feature_keys(keys)
        pos = np.minimum(np.searchsorted(self.keys, keys), max(self.keys.shape[0] - 1, 0))
        out = np.zeros((keys.shape[0], self.model.width), np.float32)
        if self.keys.shape[0]:
            found = self.keys[pos] == keys
            out[found] = self._weights[pos[found], :self.model.width]
        return out

    def predict_proba(self, X, columns=None) -> np.ndarray:
        """P(label 1) of each row: X the path of a data file (svmlight, Criteo) or of a
        converted dataset, of the training data's format (else ValueError), or a scipy
        sparse matrix whose column j is feature key columns[j] (default: j; 64-bit hashed
        keys do not fit scipy's indices). Warns when the model knows few of its keys."""
        if isinstance(X, (str, os.PathLike)):
            path = os.fspath(X)
            mismatch = format_mismatch(path, self.data_format, f"the model from {self.source}")
            if mismatch:
                raise ValueError(mismatch)
            rows, what = read_rows(path), path
        else:
            rows, what = _rows_of(X, columns), "the matrix given"
        m = self._margins(rows, what)
        return 0.5 * (1.0 + np.tanh(0.5 * m))   # the logistic function, without overflow

    def _margins(self, rows: Rows, what: str) -> np.ndarray:
        warn_if_few_known(known_fraction(self.keys, rows), what, f"from {self.source}")
        return margins_of(self.keys, self._weights, rows, bool(self.config.get("bias", True)),
                          self.model)


class FullBatchModel(Model):
    """A full-batch solver's model (--solver lbfgs): w[dim + 1], a feature's weight at
    coordinate key mod dim, the bias's at dim."""

    def __init__(self, w: np.ndarray, info: ModelInfo, source: str):
        super().__init__(np.empty(0, np.uint64), np.empty((0, 1), np.float32), info, source)
        self.w, self.dim = w, int(info.config["dim"])

    def __repr__(self) -> str:
        return f"mpips.FullBatchModel({self.dim:,} coordinates, from {self.source})"

    def weights(self, keys) -> np.ndarray:
        """float64[len(keys), 1]: each key's weight, that of its coordinate (key mod dim)."""
        return self.w[(_feature_keys(keys) % np.uint64(self.dim)).astype(np.int64), None]

    def _margins(self, rows: Rows, what: str) -> np.ndarray:
        # Every key has a coordinate: no count of the keys known.
        return full_batch_margins(self.w, rows, self.dim, bool(self.config.get("bias", True)))


def _feature_keys(keys) -> np.ndarray:
    """`keys` (one, or a 1-D sequence) as uint64; TypeError or ValueError for what is not a
    feature key."""
    given = np.atleast_1d(np.asarray(keys))
    if given.ndim != 1 or not (given.dtype.kind in "ui" or given.size == 0):
        raise TypeError(f"keys must be integer feature keys (one, or a 1-D sequence), not "
                        f"{given.dtype} of shape {given.shape}")
    if given.dtype.kind == "i" and given.size and given.min() < 0:
        raise ValueError(f"keys are unsigned 64-bit feature keys; {given.min()} is negative")
    return given.astype(np.uint64)


def _rows_of(X, columns) -> Rows:
    try:
        X = X.tocsr()
    except AttributeError:
        raise TypeError(f"predict_proba takes a scipy sparse matrix or a file's path, not "
                        f"{type(X).__name__}") from None
    keys = X.indices.astype(np.uint64)
    if columns is not None:
        columns = np.asarray(columns, np.uint64)
        if columns.shape != (X.shape[1],):
            raise ValueError(f"columns: {columns.shape[0]} keys for a matrix of "
                             f"{X.shape[1]} columns")
        keys = columns[X.indices]
    n = X.shape[0]
    return Rows(np.zeros(n, np.float32), X.indptr.astype(np.int64), keys,
                X.data.astype(np.float32))


def load(path) -> Model:
    """The model of a run directory (its model/), of a model directory, or of a checkpoint
    directory (clock-N, with its manifest), once its checksums match. ValueError naming
    what is wrong."""
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, MANIFEST)):
        return _from_checkpoint(path)
    model_dir = model_dir_of(path)
    if model_dir is None:
        raise ValueError(f"{path}: no model (server-*.h5 files) and no checkpoint "
                         f"({MANIFEST}) there")
    info = model_info(model_dir)
    if info.full_batch:
        return FullBatchModel(load_full_batch(model_dir), info, model_dir)
    keys, weights = load_model(model_dir)
    return Model(keys, weights, info, model_dir)


def _from_checkpoint(directory: str) -> Model:
    problem = verify(directory)
    if problem:
        raise ValueError(f"{directory}: not a usable checkpoint: {problem}")
    manifest = read_manifest(directory)
    info = ModelInfo(manifest["config"], manifest.get("data_format"))
    files = [os.path.join(directory, shard["file"]) for shard in manifest["shards"]]
    if info.full_batch:   # the solver's point is the table in the role of w (see lbfgs)
        point = manifest["solver"]["roles"]["w"]
        return FullBatchModel(read_table(files, point).reshape(-1), info, directory)
    key_parts, state_parts = [], []
    for path in files:
        with open_hdf5(path) as f:
            key_parts.append(f["keys"][:])
            state_parts.append(f["state"][:])
    keys, first = np.unique(np.concatenate(key_parts), return_index=True)   # copies once
    state = np.concatenate(state_parts)
    state = state[first]
    width = catalog.from_config(info.config).width
    weights = updates.weights(Optimizer(**info.config["optimizer"]), state, width,
                              manifest["clock"])
    return Model(keys, weights, info, directory)


def train(**options) -> dict | None:
    """Train on MPI.COMM_WORLD with these options, as `python -m mpips train` does: the
    command line's names with _ for - (train="x.svm", servers=2, checkpoint_every=100,
    bias=False), each a value of its type or the command line's text for it (see
    run.options.config_from); collective. Returns the summary on rank 0, None on the others;
    ConfigError for a bad option, on every rank."""
    from mpi4py import MPI

    from .job.training import train as run
    from .run.options import config_from
    return run(config_from(options), MPI.COMM_WORLD)
