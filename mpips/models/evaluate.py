"""Score a saved model, or every snapshot of a run, on a test file, in one process."""
import glob
import logging
import os

import numpy as np

from ..base.files import open_hdf5
from ..data.dense_rows import Part
from ..data.inputs import format_mismatch, is_dataset
from ..data.shards import CsrShard, open_shard
from ..data.textfile import BIAS_KEY, Rows
from ..kernels.logistic import held_out
from ..storage.model_files import load_full_batch, load_model, model_info, written_whole
from . import catalog

log = logging.getLogger("mpips")
FEW_KNOWN = 0.05   # of the test's keys known to the model, below which scores are suspect
_LR = catalog.LogisticRegression()   # the default model (it holds no state)


def read_rows(path: str) -> Rows:
    """All rows of a text file, converted dataset or Parquet (for test sets that fit in
    memory)."""
    if is_dataset(path):
        shard = CsrShard(path)
        return shard.parts[0] if len(shard.parts) == 1 else Rows.concat(shard.parts)
    chunks = list(open_shard(path, 0, 1).rows())
    if not chunks:
        raise ValueError(f"{path}: no examples")
    return Rows.concat(chunks)


def margins_of(keys: np.ndarray, weights: np.ndarray, rows: Rows, bias: bool,
               model=_LR) -> np.ndarray:
    """The model's margin (float64) of each row: sorted keys -> weights[n, width]; keys the
    model lacks count as zero."""
    n = keys.shape[0]
    # w[0] = 0 is the row of unknown keys; first, so that the model's own rows stay last
    w = np.zeros((n + 1, model.width), np.float32)
    w[1:] = weights[:, :model.width]
    pos = np.searchsorted(keys, rows.indices)
    found = pos < n
    found[found] = keys[pos[found]] == rows.indices[found]
    cols = np.where(found, pos + 1, 0)
    bias_col = -1
    if bias:
        bias_col = n if n and keys[-1] == BIAS_KEY else 0
    return model.margins(rows, cols, bias_col, w)


def full_batch_margins(w: np.ndarray, rows: Rows, dim: int, bias: bool) -> np.ndarray:
    """A full-batch model's margin (float64) of each row: w[dim + 1] over the coordinates
    key mod dim, the bias coordinate dim (see data/dense_rows)."""
    part = Part(rows, dim, bias)
    return part.margins(w[part.coords.astype(np.int64)])


def known_fraction(keys: np.ndarray, rows: Rows) -> float:
    """The fraction of the distinct keys of `rows` that the model (sorted `keys`) holds."""
    distinct = np.unique(rows.indices)
    if not distinct.size:
        return 1.0
    pos = np.minimum(np.searchsorted(keys, distinct), max(keys.shape[0] - 1, 0))
    return float((keys[pos] == distinct).mean()) if keys.shape[0] else 0.0


def warn_if_few_known(fraction: float, test: str, model: str) -> None:
    """Say loudly when the model knows few of the test data's keys: its scores are then
    mostly the bias's (data of another source, or hashed otherwise)."""
    if fraction < FEW_KNOWN:
        log.warning("the model %s knows only %.2f%% of the distinct feature keys of %s: its "
                    "scores are mostly its bias; is that data of the same source and format "
                    "as the training data?", model, 100 * fraction, test)


def score(keys: np.ndarray, weights: np.ndarray, rows: Rows, bias: bool,
          model=_LR) -> dict:
    """Held-out logloss and AUC of the model (sorted keys -> weights[n, width]) on `rows`."""
    return scores(margins_of(keys, weights, rows, bias, model), rows)


def scores(margins: np.ndarray, rows: Rows) -> dict:
    logloss, auc = held_out(margins, rows.labels)
    return {"logloss": logloss, "auc": None if np.isnan(auc) else auc, "examples": len(rows)}


def score_model(model_dir: str, rows: Rows, allow_partial: bool = False,
                test: str | None = None) -> dict:
    """Held-out logloss and AUC of the model in `model_dir` on `rows`, and (a model of keys)
    the fraction of their distinct keys it knows. `test`: the rows' file, refused
    (ValueError) if of another format than the training data."""
    info = model_info(model_dir)
    mismatch = test and format_mismatch(test, info.data_format, f"the model in {model_dir}")
    if mismatch:
        raise ValueError(mismatch)
    bias = bool(info.config["bias"])
    if info.full_batch:
        w = load_full_batch(model_dir, allow_partial)
        return scores(full_batch_margins(w, rows, int(info.config["dim"]), bias), rows)
    keys, weights = load_model(model_dir, allow_partial=allow_partial)
    return {**score(keys, weights, rows, bias, catalog.from_config(info.config)),
            "known_keys": known_fraction(keys, rows)}


def score_snapshots(run_dir: str, rows: Rows, skipped: list, test: str | None = None) -> list:
    """One entry per snapshot in RUN_DIR/snapshots/: seconds into training, logloss, AUC
    (`test`: see score_model). A snapshot that cannot be read is passed over, and why is
    added to `skipped`."""
    out = []
    # Numbered snapshots in order, then "final" (taken when every worker had finished).
    for snap in sorted(glob.glob(os.path.join(run_dir, "snapshots", "*"))):
        try:
            scored = score_snapshot(snap, rows, test)
        except (ValueError, KeyError) as e:   # DamagedFile; a shard mpips did not write
            skipped.append(f"snapshot {os.path.basename(snap)} left out: {e}")
            continue
        if scored is not None:
            out.append(scored)
    return out


def score_snapshot(snap: str, rows: Rows, test: str | None) -> dict | None:
    """A snapshot's entry (see score_snapshots); None if the run stopped before its servers
    had all written it."""
    if not written_whole(snap):
        return None    # the run stopped before or while the servers were writing this one
    paths = sorted(glob.glob(os.path.join(snap, "server-*.h5")))
    elapsed, slowest, trained = [], [], []
    for p in paths:
        with open_hdf5(p) as f:
            elapsed.append(float(f.attrs["elapsed_s"]))
            slowest.append(int(f.attrs["slowest_clock"]))
            trained.append(int(f.attrs.get("examples", -1)))   # (older runs: none)
    return {"snapshot": os.path.basename(snap), "elapsed_s": max(elapsed),
            "slowest_clock": -1 if -1 in slowest else min(slowest),
            "trained_examples": max(trained) if max(trained) >= 0 else None,
            **score_model(snap, rows, test=test)}
