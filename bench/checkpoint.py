"""Checkpoint write and read time for one server holding 10^7 keys, for each optimizer.

    python bench/checkpoint.py [--keys 10000000] [--dir bench/out/checkpoint]

Fills one server's table (KVStore) with random 64-bit keys, then times, as a job does:
writing its shard (HDF5 to a temporary name, fsynced, renamed) and the manifest; verifying
the checkpoint's SHA-256 checksums (what --resume does before choosing it); and loading the
shard into an empty table. Writes bench/results/checkpoint.json.
"""
import argparse
import os
import shutil
import time

import numpy as np

from mpips.storage import checkpoint
from mpips.models.optimizer import NAMES, Optimizer
from mpips.wire.placement import Placement
from mpips.server.store import KVStore
from report import save

HERE = os.path.dirname(os.path.abspath(__file__))


def filled(name: str, n_keys: int) -> KVStore:
    store = KVStore(width=1, optimizer=Optimizer(name, lr=0.1), capacity=2 * n_keys)
    keys = np.unique(np.random.default_rng(0).integers(0, 2**64 - 1, n_keys, dtype=np.uint64))
    grads = np.random.default_rng(1).normal(size=(keys.shape[0], 1)).astype(np.float32)
    store.push(keys, grads, 0)
    return store


def measure(name: str, n_keys: int, root: str) -> dict:
    store = filled(name, n_keys)
    shutil.rmtree(root, ignore_errors=True)
    start = time.perf_counter()
    entry = checkpoint.write_shard(root, 1, 0, store, {})
    directory = checkpoint.write_manifest(root, 1, [entry], servers=1, positions={}, config={})
    write_s = time.perf_counter() - start
    size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
    start = time.perf_counter()
    problem = checkpoint.verify(directory)
    verify_s = time.perf_counter() - start
    assert problem is None, problem
    empty = KVStore(width=1, optimizer=store.optimizer)
    start = time.perf_counter()
    loaded = checkpoint.load_shards(directory, checkpoint.read_manifest(directory), empty,
                                    Placement(1), 0)
    load_s = time.perf_counter() - start
    assert loaded == len(store)
    shutil.rmtree(root, ignore_errors=True)
    return {"optimizer": name, "keys": len(store), "bytes": size, "write_s": write_s,
            "verify_s": verify_s, "load_s": load_s, "write_mb_per_s": size / write_s / 1e6,
            "read_s": verify_s + load_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--dir", default=os.path.join(HERE, "out", "checkpoint"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "checkpoint.json"))
    args = parser.parse_args()
    rows = [measure(name, args.keys, args.dir) for name in NAMES]
    print(f"{'':8} {'keys':>11} {'MB':>7} {'write s':>8} {'MB/s':>6} {'verify s':>8} "
          f"{'load s':>7} {'read s':>7}")
    for r in rows:
        print(f"{r['optimizer']:8} {r['keys']:>11,} {r['bytes'] / 1e6:7.0f} {r['write_s']:8.2f} "
              f"{r['write_mb_per_s']:6.0f} {r['verify_s']:8.2f} {r['load_s']:7.2f} "
              f"{r['read_s']:7.2f}")
    save(args.out, "checkpoint", rows=rows,
         note="one server's shard; read_s = verify_s (checksums) + load_s")


if __name__ == "__main__":
    main()
