"""A trained model on disk: one plain HDF5 file per server shard, written atomically.

    RUN_DIR/model/server-0000.h5   keys (uint64, sorted), weights (float32[n, width]),
                                   optimizer_state (float32[n, k]); attributes describe the run
"""
import glob
import json
import os

import numpy as np

from .files import open_hdf5, write_hdf5
from .placement import describe_ranges


def shard_path(model_dir: str, server: int) -> str:
    return os.path.join(model_dir, f"server-{server:04d}.h5")


def save_shard(model_dir: str, server: int, n_servers: int, store, attrs: dict,
               clocks: int, weights_only: bool = False, ranges: list | None = None,
               n_ranges: int | None = None,
               dense: dict | None = None) -> str:
    """Write one server's keys, the model's weights once `clocks` clocks are done (see
    `Optimizer.weights`) and the optimizer state, sorted by key. `weights_only` (snapshots
    for learning curves) skips the optimizer state and the sort. `ranges`: the key ranges
    the shard holds (by default the server's own: after a server died, another holds its
    keys). `dense`: the server's blocks of dense tables (DenseTables.datasets)."""
    keys, state = store.items()
    weights = store.optimizer.weights(state, store.width, clocks)
    datasets = {"keys": keys, "weights": weights}
    if not weights_only:
        order = np.argsort(keys)   # keys are unique: any sort gives this order, quicksort fastest
        datasets = {"keys": keys[order], "weights": weights[order],
                    "optimizer_state": state[order, store.width:]}
    path = shard_path(model_dir, server)
    write_hdf5(
        path, {**datasets, **(dense or {})},
        {"server": server, "n_servers": n_servers, "width": store.width,
         "ranges": np.array([server] if ranges is None else ranges, np.int64),
         "n_ranges": n_servers if n_ranges is None else n_ranges,
         "optimizer": store.optimizer.name, "config": json.dumps(attrs.get("config", {})),
         **{k: v for k, v in attrs.items() if k != "config"}})
    return path


def load_model(model_dir: str, allow_partial: bool = False):
    """(keys, weights) of every shard in `model_dir`, merged and sorted by key.

    Checks that the shards are all of one run and that none is missing; a model
    saved after an error is refused unless `allow_partial`. DamagedFile naming a shard
    that cannot be read.
    """
    paths = sorted(glob.glob(os.path.join(model_dir, "server-*.h5")))
    if not paths:
        raise FileNotFoundError(f"{model_dir}: no server-*.h5 model files")
    keys, weights, runs, sizes, ranges, cut = [], [], set(), set(), [], set()
    for p in paths:
        with open_hdf5(p) as f:
            if "keys" not in f or "n_servers" not in f.attrs:
                raise ValueError(f"{p}: not a model shard written by mpips")
            runs.add(str(f.attrs["run_id"]))
            sizes.add(int(f.attrs["n_servers"]))
            cut.add(int(f.attrs.get("n_ranges", f.attrs["n_servers"])))
            if not f.attrs["complete"] and not allow_partial:
                raise ValueError(f"{p}: saved after an error ({f.attrs['note']}); "
                                 f"read it anyway with allow_partial (score --allow-partial)")
            ranges += (f.attrs["ranges"].tolist() if "ranges" in f.attrs
                       else [int(f.attrs["server"])])
            keys.append(f["keys"][:])
            weights.append(f["weights"][:])
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
    keys, weights = np.concatenate(keys), np.concatenate(weights)
    order = np.argsort(keys, kind="stable")
    return keys[order], weights[order]
