"""A trained model on disk: one plain HDF5 file per server shard, written atomically.

    RUN_DIR/model/server-0000.h5   keys (uint64, sorted), weights (float32[n, width]),
                                   optimizer_state (float32[n, k]); a full-batch model's
                                   blocks of table w (dense/w/...); attributes describe the
                                   run, the training data's format (data_format) and give a
                                   SHA-256 of each dataset (sha256, JSON)

Each server writes its own file at its own pace, so each file carries its own checksums;
the files' attributes say together whether the model is whole (one run, every key range).
"""
import glob
import json
import logging
import os
from dataclasses import dataclass

import numpy as np

from ..base import checksums
from ..base.errors import DamagedFile
from ..base.files import open_hdf5, write_hdf5
from ..wire.placement import describe_ranges
from .dense_files import read_table

log = logging.getLogger("mpips")
CHECKSUMS = checksums.Algorithm.SHA256.value   # the attribute of a shard's checksums


def shard_path(model_dir: str, server: int) -> str:
    return os.path.join(model_dir, f"server-{server:04d}.h5")


def save_shard(model_dir: str, server: int, n_servers: int, store, attrs: dict,
               clocks: int, weights_only: bool = False, ranges: list | None = None,
               n_ranges: int | None = None,
               dense: dict | None = None) -> str:
    """Write one server's keys, the model's weights once `clocks` clocks are done (see
    `models.updates.weights`) and the optimizer state, sorted by key. `weights_only` (snapshots
    for learning curves) skips the optimizer state and the sort. `ranges`: the key ranges
    the shard holds (by default the server's own: after a server died, another holds its
    keys). `dense`: the server's blocks of dense tables (DenseTables.datasets)."""
    keys, state = store.items()
    weights = store.weights(state, clocks)
    datasets = {"keys": keys, "weights": weights}
    if not weights_only:
        order = np.argsort(keys)   # keys are unique: any sort gives this order, quicksort fastest
        datasets = {"keys": keys[order], "weights": weights[order],
                    "optimizer_state": state[order, store.width:]}
    path = shard_path(model_dir, server)
    datasets.update(dense or {})
    write_hdf5(
        path, datasets,
        {CHECKSUMS: json.dumps({name: checksums.of(data) for name, data in datasets.items()}),
         "server": server, "n_servers": n_servers, "width": store.width,
         "ranges": np.array([server] if ranges is None else ranges, np.int64),
         "n_ranges": n_servers if n_ranges is None else n_ranges,
         "optimizer": store.optimizer.name, "config": json.dumps(attrs.get("config", {})),
         **{k: v for k, v in attrs.items() if k != "config"}})
    return path


@dataclass(frozen=True)
class ModelInfo:
    """What a model directory says of its model, from its first file."""
    config: dict               # the run's configuration (TrainConfig.as_dict)
    data_format: str | None    # of the data it was trained on (None: not recorded)

    @property
    def full_batch(self) -> bool:
        """A full-batch solver's model: table w of dense files, no keys."""
        return self.config.get("solver", "minibatch") != "minibatch"


def _files(directory: str) -> list:
    return sorted(glob.glob(os.path.join(directory, "server-*.h5")))


def shard_paths(model_dir: str) -> list:
    """The model files in `model_dir`; FileNotFoundError if there are none."""
    paths = _files(model_dir)
    if not paths:
        raise FileNotFoundError(f"{model_dir}: no server-*.h5 model files")
    return paths


def written_whole(model_dir: str) -> bool:
    """Whether every server wrote its file in `model_dir` (as many files as the first one's
    n_servers); False if none did."""
    paths = _files(model_dir)
    if not paths:
        return False
    with open_hdf5(paths[0]) as f:
        return len(paths) >= int(f.attrs["n_servers"])


def model_dir_of(path: str) -> str | None:
    """The model directory at `path`: a run's --out's model/, or `path` itself, whichever
    holds model files; None if neither does."""
    for directory in (os.path.join(path, "model"), path):
        if _files(directory):
            return directory
    return None


def model_info(model_dir: str) -> ModelInfo:
    """The configuration and training data's format the model in `model_dir` was saved with."""
    path = shard_paths(model_dir)[0]
    with open_hdf5(path) as f:
        try:
            return ModelInfo(json.loads(f.attrs["config"]),
                             str(f.attrs.get("data_format", "")) or None)
        except (KeyError, ValueError) as e:
            raise ValueError(f"{path}: not a model file written by mpips ({e})") from None


def verify_shard(f) -> str | None:
    """Why the open model file `f` is damaged (a dataset that does not match the SHA-256 it
    was written with), or None. A file written before models carried checksums passes:
    `CHECKSUMS in f.attrs` tells them apart."""
    if CHECKSUMS not in f.attrs:
        return None
    try:
        digests = json.loads(f.attrs[CHECKSUMS])
    except ValueError:
        return f"its checksums (attribute {CHECKSUMS}) are not JSON"
    return checksums.mismatched(f, digests)


def checked_paths(model_dir: str, allow_partial: bool = False) -> list:
    """The files of the model in `model_dir`, once every one matches its checksums, all are
    of one run and none is missing; ValueError naming the file or what is missing
    otherwise. A model saved after an error is refused unless `allow_partial`; files written
    before models carried checksums are read with a warning."""
    paths = shard_paths(model_dir)
    runs, sizes, cut = set(), set(), set()
    ranges: list[int] = []
    unverified: list[str] = []
    for p in paths:
        with open_hdf5(p) as f:
            if "keys" not in f or "n_servers" not in f.attrs:
                raise ValueError(f"{p}: not a model shard written by mpips")
            problem = verify_shard(f)
            if problem:
                raise ValueError(f"{p}: {problem}: the file is damaged; the run's "
                                 f"checkpoints (mpips inspect) may hold a sound copy")
            if CHECKSUMS not in f.attrs:
                unverified.append(os.path.basename(p))
            runs.add(str(f.attrs["run_id"]))
            sizes.add(int(f.attrs["n_servers"]))
            cut.add(int(f.attrs.get("n_ranges", f.attrs["n_servers"])))
            if not f.attrs["complete"] and not allow_partial:
                raise ValueError(f"{p}: saved after an error ({f.attrs['note']}); "
                                 f"read it anyway with allow_partial (score --allow-partial)")
            ranges += (f.attrs["ranges"].tolist() if "ranges" in f.attrs
                       else [int(f.attrs["server"])])
    if len(runs) > 1:
        raise ValueError(f"{model_dir}: shards of different runs {sorted(runs)}")
    if len(sizes) != 1 or len(cut) != 1 or sorted(ranges) != list(range(min(cut))):
        missing = sorted(set(range(min(cut))) - set(ranges))
        twice = sorted({r for r in ranges if ranges.count(r) > 1})
        raise ValueError(f"{model_dir}: {len(paths)} shard file(s) of a run of "
                         f"{sorted(sizes)} server(s) and {sorted(cut)} key ranges, but key "
                         f"range(s) " + (f"{describe_ranges(missing)} are in none of them"
                                         if missing else
                                         f"{describe_ranges(twice)} are in more than one"))
    if unverified:
        log.warning("%s: %s carry no checksums (written before mpips kept them): read without "
                    "verifying", model_dir, ", ".join(unverified))
    return paths


def load_model(model_dir: str, allow_partial: bool = False):
    """(keys, weights) of every shard in `model_dir`, merged and sorted by key, once
    `checked_paths` has checked the files."""
    key_parts, weight_parts = [], []
    for p in checked_paths(model_dir, allow_partial):
        with open_hdf5(p) as f:
            key_parts.append(f["keys"][:])
            weight_parts.append(f["weights"][:])
    keys, weights = np.concatenate(key_parts), np.concatenate(weight_parts)
    order = np.argsort(keys, kind="stable")
    return keys[order], weights[order]


def load_full_batch(model_dir: str, allow_partial: bool = False) -> np.ndarray:
    """A full-batch model's weights, float64[dim + 1] (the bias last): table w, put together
    from every file once `checked_paths` has checked them."""
    return read_table(checked_paths(model_dir, allow_partial), "w").reshape(-1)


def describe(model_dir: str) -> tuple[str, bool]:
    """A readable account of the model in `model_dir`, file by file (checksums, keys,
    weights), and whether `load_model` (or `score --allow-partial`, for a model saved after an
    error) would read it."""
    paths = shard_paths(model_dir)
    try:
        checked_paths(model_dir, allow_partial=True)
        problem = None
    except ValueError as e:
        problem = str(e)
    info = model_info(model_dir)
    c = info.config
    kind = f"a full-batch model (--solver {c['solver']}) " if info.full_batch else ""
    lines = [f"{model_dir}: {len(paths)} model file(s), {kind}trained on "
             f"{info.data_format or 'data of a format not recorded'} (--train {c.get('train')})"]
    for p in paths:
        lines.append(f"  {os.path.basename(p)}: {_describe_shard(p)}")
    lines.append(f"NOT USABLE: {problem}" if problem else "usable: every file is sound")
    return "\n".join(lines), problem is None


def _describe_shard(path: str) -> str:
    """One model file: its checksums, keys and weights, whether it was saved after an error."""
    try:
        with open_hdf5(path) as f:
            problem = verify_shard(f)
            if problem:
                return f"NOT USABLE: {problem}"
            checked = ("checksums match" if CHECKSUMS in f.attrs else
                       "no checksums (written before mpips kept them)")
            weights = f["weights"][:]
            norm = float(np.linalg.norm(weights)) if weights.size else 0.0
            biggest = float(np.abs(weights).max()) if weights.size else 0.0
            saved = ("" if f.attrs.get("complete", True) else
                     f", saved after an error ({f.attrs.get('note', '')})")
            dense = f", dense tables {sorted(f['dense'])}" if "dense" in f else ""
            return (f"{checked}, server {int(f.attrs['server'])}, {f['keys'].shape[0]:,} keys, "
                    f"weights L2 norm {norm:.4g}, largest {biggest:.4g}{dense}{saved}")
    except DamagedFile as e:
        return f"NOT USABLE: {e}"
    except KeyError as e:
        return f"NOT USABLE: not a model file written by mpips (no {e})"
