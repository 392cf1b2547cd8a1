"""Server memory per stored key at 10^7 keys, for each optimizer.

    python bench/memory.py [--keys 10000000]

Inserts the keys into one server's table (KVStore) in minibatches of 20,000, as
pulls do, and reports table bytes per key (the table is all a server stores per
key), the insert rate, and what 10^10 keys would take across servers. Writes
bench/results/memory.json.
"""
import argparse
import json
import os
import time

import numpy as np

from mpips.optimizer import NAMES, Optimizer
from mpips.store import KVStore

HERE = os.path.dirname(os.path.abspath(__file__))


def measure(name: str, n_keys: int, batch: int = 20_000) -> dict:
    store = KVStore(width=1, optimizer=Optimizer(name, lr=0.1))
    keys = np.random.default_rng(0).integers(0, 2**64 - 1, n_keys, dtype=np.uint64)
    out = np.empty((batch, 1), np.float32)
    start = time.perf_counter()
    for a in range(0, n_keys, batch):
        part = np.unique(keys[a:a + batch])
        store.pull(part, out[:part.shape[0]])
    seconds = time.perf_counter() - start
    per_key = store.nbytes / len(store)
    return {"optimizer": name, "keys": len(store), "bytes_per_key": per_key,
            "payload_bytes_per_key": 8 + 4 * store.columns, "load": len(store) / store.capacity,
            "inserts_per_s": len(store) / seconds, "gb_for_1e10_keys": per_key * 1e10 / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "memory.json"))
    args = parser.parse_args()
    rows = [measure(name, args.keys) for name in NAMES]
    print(f"{'':8} {'keys':>11} {'bytes/key':>9} {'of which data':>13} {'load':>5} "
          f"{'M inserts/s':>11} {'GB for 1e10 keys':>16}")
    for r in rows:
        print(f"{r['optimizer']:8} {r['keys']:>11,} {r['bytes_per_key']:9.1f} "
              f"{r['payload_bytes_per_key']:13d} {r['load']:5.2f} {r['inserts_per_s'] / 1e6:11.2f} "
              f"{r['gb_for_1e10_keys']:16.0f}")
    sgd = rows[NAMES.index("sgd")]["bytes_per_key"]
    print(f"target: <= 16 bytes per key for SGD: {'met' if sgd <= 16 else 'NOT met'} ({sgd:.1f})")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"bench": "memory", "date": time.strftime("%Y-%m-%d %H:%M"), "rows": rows},
                  f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
