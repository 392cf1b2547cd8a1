"""Key spread against --vnodes, and the keys a join or a leave moves, on the built-in data.

    python bench/ring.py [--rows 500000] [--servers 4]

No MPI: the placement is a pure function of the keys. The keys are the unique keys of the
CTR-like bench set (made once in bench/data/). For each V (key ranges per server), the
largest server's key count over the mean: as launched, after one server joins, after a
second leaves again, and after the servers double one join at a time; and the share of the
keys each join or leave moved (the ideal is 1/n, n the servers after a join or before a
leave). Writes bench/results/ring.json.
"""
import argparse
import os
import sys
import time

import numpy as np
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from report import save
from workers import dataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mpips.data.textfile import KeyIndexer, TextShard  # noqa: E402
from mpips.wire.placement import Placement, dealt, with_server, without_server  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VNODES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def unique_keys(path: str) -> np.ndarray:
    seen = [KeyIndexer()(rows, bias=False)[0] for rows in TextShard(path).rows()]
    return np.unique(np.concatenate(seen))


def spread(keys: np.ndarray, assign: tuple, n_servers: int, gone=()) -> tuple:
    """(the largest member's keys over the members' mean, each key's owner); a server that
    has left is no member, one that joined and took nothing is."""
    owners = Placement(n_servers, assign=assign).owners(keys)
    counts = np.delete(np.bincount(owners, minlength=n_servers), list(gone))
    return float(counts.max() / counts.mean()), owners


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "ring.json"))
    args = parser.parse_args()
    keys = unique_keys(dataset(args.rows) + ".train.svm")
    n = args.servers
    print(f"{keys.shape[0]:,} unique keys of {args.rows:,} rows; {n} servers, then joins "
          f"and leaves")
    print(f"{'vnodes':>6} {'launched':>9} {'+1 join':>8} {'moved':>7} {'-1 leave':>9} "
          f"{'moved':>7} {f'x2 ({2 * n})':>9} {'worst move':>10} {'ns/key':>7}")
    rows = []
    for v in VNODES:
        start = dealt(n, v)
        launched, before = spread(keys, start, n)
        joined = with_server(start, n)
        one_more, after = spread(keys, joined, n + 1)
        moved_join = float(np.mean(before != after))
        left = without_server(joined, 0, range(n + 1))
        one_less, final = spread(keys, left, n + 1, gone=[0])
        moved_leave = float(np.mean(after != final))
        grown, moves = start, []
        for new in range(n, 2 * n):
            nxt = with_server(grown, new)
            a = Placement(new, assign=grown).owners(keys)
            b = Placement(new + 1, assign=nxt).owners(keys)
            moves.append(float(np.mean(a != b)) * (new + 1))   # in units of the ideal 1/n
            grown = nxt
        doubled, _ = spread(keys, grown, 2 * n)
        p = Placement(n, vnodes=v)
        p.owners(keys[:10])
        began = time.perf_counter()
        p.by_server(keys)
        ns = (time.perf_counter() - began) / keys.shape[0] * 1e9
        row = {"vnodes": v, "launched": launched, "joined": one_more,
               "moved_join": moved_join, "ideal_join": 1 / (n + 1), "left": one_less,
               "moved_leave": moved_leave, "ideal_leave": 1 / (n + 1), "doubled": doubled,
               "worst_move_over_ideal": max(moves), "split_ns_per_key": ns}
        rows.append(row)
        print(f"{v:>6} {launched:>9.3f} {one_more:>8.3f} {moved_join:>7.3f} {one_less:>9.3f} "
              f"{moved_leave:>7.3f} {doubled:>9.3f} {max(moves):>9.2f}x {ns:>7.1f}")
    print(f"(spread: the largest server's keys over the mean; moved: the share of the keys "
          f"that changed server, ideal {1 / (n + 1):.3f}; worst move: the largest of the "
          f"{n} joins to {2 * n} servers over its ideal 1/n)")
    save(args.out, "ring", rows=args.rows, keys=int(keys.shape[0]), servers=n, table=rows)


if __name__ == "__main__":
    main()
