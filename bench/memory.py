"""Server memory per stored key at 10^7 keys, for each optimizer (SGD plain, as with
--average-after off, and averaged, as by default).

    python bench/memory.py [--keys 10000000]

Inserts the keys into one server's table (KVStore) in minibatches of 20,000, as
pulls do, and reports table bytes per key (the table is all a server stores per
key), the insert rate, and what 10^10 keys would take across servers. Writes
bench/results/memory.json.
"""
import argparse
import os
import time

import numpy as np

import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from mpips.models.optimizer import NAMES, Optimizer
from mpips.server.store import KVStore
from report import save

HERE = os.path.dirname(os.path.abspath(__file__))


def measure(name: str, optimizer: Optimizer, n_keys: int, batch: int = 20_000) -> dict:
    store = KVStore(width=1, optimizer=optimizer)
    keys = np.random.default_rng(0).integers(0, 2**64 - 1, n_keys, dtype=np.uint64)
    out = np.empty((batch, 1), np.float32)
    seconds, low, high, transient, large = 0.0, np.inf, 0.0, 0.0, False
    for a in range(0, n_keys, batch):
        part = np.unique(keys[a:a + batch])
        before, capacity, generation = store.nbytes, store.capacity, store.generation
        start = time.perf_counter()
        store.pull(part, out[:part.shape[0]])
        seconds += time.perf_counter() - start
        if store.generation != generation:   # rebuilt larger: both tables existed for a moment
            large = large or store.capacity < 1.5 * capacity   # grown by 25%, not doubled
            if large:
                transient = max(transient, (before + store.nbytes) / len(store))
        if large:                             # the range once the table grows by 25% a step
            low = min(low, store.nbytes / len(store))
            high = max(high, store.nbytes / len(store))
    per_key = store.nbytes / len(store)
    return {"optimizer": name, "keys": len(store), "bytes_per_key": per_key,
            "bytes_per_key_range": [low, high], "bytes_per_key_while_growing": transient,
            "payload_bytes_per_key": 8 + 4 * store.columns, "load": len(store) / store.capacity,
            "inserts_per_s": len(store) / seconds, "gb_for_1e10_keys": per_key * 1e10 / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "memory.json"))
    args = parser.parse_args()
    rows = [measure(name, Optimizer(name, lr=0.1), args.keys) for name in NAMES]
    rows.append(measure("sgd avg", Optimizer("sgd", lr=0.1, average_from=0), args.keys))
    print(f"{'':8} {'keys':>11} {'bytes/key':>9} {'range':>11} {'growing':>7} {'data':>4} "
          f"{'load':>5} {'M inserts/s':>11} {'GB for 1e10 keys':>16}")
    for r in rows:
        low, high = r["bytes_per_key_range"]
        print(f"{r['optimizer']:8} {r['keys']:>11,} {r['bytes_per_key']:9.1f} "
              f"{low:5.1f}-{high:<5.1f} {r['bytes_per_key_while_growing']:7.1f} "
              f"{r['payload_bytes_per_key']:4d} {r['load']:5.2f} {r['inserts_per_s'] / 1e6:11.2f} "
              f"{r['gb_for_1e10_keys']:16.0f}")
    print("range: over all sizes once the table is large (past 2^20 rows it grows by 25% when "
          "90% full); growing: the moment a larger table is built beside the old one")
    sgd = rows[NAMES.index("sgd")]
    print(f"target: <= 16 bytes per key for SGD at {args.keys:,} keys: "
          f"{'met' if sgd['bytes_per_key'] <= 16 else 'NOT met'} ({sgd['bytes_per_key']:.1f}; "
          f"at most {sgd['bytes_per_key_range'][1]:.1f} at other sizes, "
          f"{sgd['bytes_per_key_while_growing']:.1f} while growing)")
    save(args.out, "memory", rows=rows)


if __name__ == "__main__":
    main()
