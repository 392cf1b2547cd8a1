"""mpips from Python: a trained model in one process, and a training job from a script.

    import mpips
    model = mpips.load("runs/clicks")       # a run, its model directory, or a checkpoint
    p = model.predict_proba("test.svm")      # a file, or scipy CSR (+ the columns' keys)
    w = model.weights(np.array([3, 17], np.uint64))   # rows of zeros for unknown keys
    model.config["optimizer"]

    summary = mpips.train(train="clicks.svm", servers=2, epochs=3)   # under mpiexec
"""
import glob
import os

import numpy as np

from . import models
from .checkpoint import MANIFEST, read_manifest
from .data import Rows
from .evaluate import margins_of, model_config, read_rows
from .files import open_hdf5
from .model_io import load_model
from .optimizer import Optimizer


class Model:
    """A trained model in memory: sorted keys, weights[n, width], the run's configuration."""

    def __init__(self, keys: np.ndarray, weights: np.ndarray, config: dict, source: str):
        self.keys, self._weights, self.config, self.source = keys, weights, config, source
        self.model = models.from_config(config)

    def __repr__(self) -> str:
        return (f"mpips.Model({self.model.describe()}, {self.keys.shape[0]:,} keys, "
                f"from {self.source})")

    def weights(self, keys) -> np.ndarray:
        """float32[len(keys), width]: each key's weights (its weight, then an FM's latent
        vector); zeros for keys the model lacks. `keys`: feature keys (a single key gives one
        row)."""
        given = np.atleast_1d(np.asarray(keys))
        if given.ndim != 1 or not (given.dtype.kind in "ui" or given.size == 0):
            raise TypeError(f"keys must be integer feature keys (one, or a 1-D sequence), not "
                            f"{given.dtype} of shape {given.shape}")
        if given.dtype.kind == "i" and given.size and given.min() < 0:
            raise ValueError(f"keys are unsigned 64-bit feature keys; {given.min()} is negative")
        keys = given.astype(np.uint64)
        pos = np.minimum(np.searchsorted(self.keys, keys), max(self.keys.shape[0] - 1, 0))
        out = np.zeros((keys.shape[0], self.model.width), np.float32)
        if self.keys.shape[0]:
            found = self.keys[pos] == keys
            out[found] = self._weights[pos[found], :self.model.width]
        return out

    def predict_proba(self, X, columns=None) -> np.ndarray:
        """P(label 1) of each row: X the path of a data file (svmlight, Criteo) or of a
        converted dataset, or a scipy sparse matrix whose column j is feature key
        columns[j] (default: j; 64-bit hashed keys do not fit scipy's indices)."""
        rows = (read_rows(os.fspath(X)) if isinstance(X, (str, os.PathLike))
                else _rows_of(X, columns))
        m = margins_of(self.keys, self._weights, rows, bool(self.config.get("bias", True)),
                       self.model)
        return 0.5 * (1.0 + np.tanh(0.5 * m))   # the logistic function, without overflow


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
    directory (clock-N, with its manifest). ValueError naming what is wrong."""
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, MANIFEST)):
        return _from_checkpoint(path)
    model_dir = os.path.join(path, "model") if os.path.isdir(os.path.join(path, "model")) \
        else path
    if not glob.glob(os.path.join(model_dir, "server-*.h5")):
        raise ValueError(f"{path}: no model (server-*.h5 files) and no checkpoint "
                         f"({MANIFEST}) there")
    config = model_config(model_dir)
    _refuse_full_batch(config, model_dir)
    keys, weights = load_model(model_dir)
    return Model(keys, weights, config, model_dir)


def _from_checkpoint(directory: str) -> Model:
    manifest = read_manifest(directory)
    config = manifest["config"]
    _refuse_full_batch(config, directory)
    keys, states = [], []
    for shard in manifest["shards"]:
        with open_hdf5(os.path.join(directory, shard["file"])) as f:
            keys.append(f["keys"][:])
            states.append(f["state"][:])
    keys, state = np.concatenate(keys), np.concatenate(states)
    keys, first = np.unique(keys, return_index=True)   # copies (--replicas) once
    state = state[first]
    width = models.from_config(config).width
    weights = Optimizer(**config["optimizer"]).weights(state, width, manifest["clock"])
    return Model(keys, weights, config, directory)


def _refuse_full_batch(config: dict, where: str) -> None:
    if config.get("solver", "minibatch") != "minibatch":
        raise ValueError(f"{where}: a full-batch model (--solver {config['solver']}) is table "
                         f"w of dense files; read it with mpips.dense.DenseClient.load or "
                         f"h5py (dense/w/blocks, dense/w/values)")


def train(**options) -> dict | None:
    """Run `python -m mpips train` with these options (names as the command line's, with _
    for -: train="x.svm", servers=2, checkpoint_every=100, no flags for False) on
    MPI.COMM_WORLD; collective. Returns the summary on rank 0, None on the others;
    ConfigError for a bad option, on every rank."""
    from mpi4py import MPI

    from .cli import build_parser, config_of
    from .errors import ConfigError
    from .job import train as run
    if options.get("print_schedule"):
        raise ConfigError("print_schedule is the command line's (`python -m mpips train ... "
                          "--print-schedule` prints a pipeline's schedule and trains nothing); "
                          "mpips.train trains: leave it out, or print the schedule with "
                          "`python -m mpips schedule`")
    argv = ["train"]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if key == "bias":
            argv += [] if value else ["--no-bias"]
        elif value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            for v in value:
                argv += [flag, str(v)]
        else:
            argv += [flag, str(value)]
    return run(config_of(build_parser(raising=True).parse_args(argv)), MPI.COMM_WORLD)
