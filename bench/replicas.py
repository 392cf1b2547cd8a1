"""The cost of copies: the same job with every key on R = 1, 2 and 3 servers, side by side.

    python bench/replicas.py [--rows 500000] [--repeats 5]

3 servers + 2 workers, BSP, one epoch of the CTR-like bench set (made once in bench/data/).
Prints examples/s and its ratio to R=1, the servers' table memory and key copies, the bytes
sent per example, and whether the held-out logloss is that of R=1 (under BSP the copies must
not change the model); writes bench/results/replicas.json. On a machine with fewer cores than
ranks, the ranks share cores: backups then take CPU from the primaries and the workers.
"""
import argparse
import json
import os
import platform
import statistics
import sys

import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from report import save
from workers import dataset, mpiexec, run

HERE = os.path.dirname(os.path.abspath(__file__))
SERVERS, WORKERS = 3, 2
REPLICAS = (1, 2, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=5, help="rounds of R=1,2,3; the best run of each R "
                        "counts, and the median ratio to R=1 within a round is shown beside it "
                        "(short runs on shared cores vary by 10-20%%)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "replicas.json"))
    args = parser.parse_args()

    prefix = dataset(args.rows)
    # Rounds of R = 1, 2, 3 in turn, so that a change in the machine's load meets every R.
    runs = {r: [] for r in REPLICAS}
    for rep in range(args.repeats):
        for replicas in REPLICAS:
            out = os.path.join(HERE, "out", f"replicas{replicas}r{rep}")
            run([mpiexec(), "-n", str(SERVERS + WORKERS), sys.executable, "-m", "mpips",
                 "train", "--servers", str(SERVERS), "--replicas", str(replicas),
                 "--train", prefix + ".train.svm", "--test", prefix + ".test.svm",
                 "--out", out, "--overwrite"])
            with open(os.path.join(out, "summary.json")) as f:
                runs[replicas].append(json.load(f))
    rows = []
    for replicas in REPLICAS:
        best = max(runs[replicas], key=lambda s: s["examples_per_s"])
        ratios = [s["examples_per_s"] / b["examples_per_s"]
                  for s, b in zip(runs[replicas], runs[1])]
        rows.append({"replicas": replicas, "examples_per_s": best["examples_per_s"],
                     "median_ratio_in_round": statistics.median(ratios),
                     "train_s": best["train_s"], "test_logloss": best["test_logloss"],
                     "server_bytes": best["server_bytes"], "keys": best["keys_stored"],
                     "key_copies": best["key_copies_stored"],
                     "bytes_per_example": best["bytes_per_example"]})
    base = rows[0]
    print(f"{SERVERS} servers + {WORKERS} workers, {args.rows:,} rows, one epoch, BSP")
    print(f"{'R':>2} {'examples/s':>11} {'vs R=1':>7} {'server MB':>10} {'key copies':>11} "
          f"{'bytes/ex':>9} {'logloss':>8} {'= R=1':>6} {'in-round':>9}")
    for r in rows:
        r["ratio_to_r1"] = r["examples_per_s"] / base["examples_per_s"]
        r["same_logloss_as_r1"] = r["test_logloss"] == base["test_logloss"]
        print(f"{r['replicas']:>2} {r['examples_per_s']:>11,.0f} {r['ratio_to_r1']:>6.2f}x "
              f"{r['server_bytes'] / 2**20:>10.1f} {r['key_copies']:>11,} "
              f"{r['bytes_per_example']:>9.0f} {r['test_logloss']:>8.4f} "
              f"{'yes' if r['same_logloss_as_r1'] else 'NO':>6} "
              f"{r['median_ratio_in_round']:>8.2f}x")
    save(args.out, "replicas", rows=args.rows, servers=SERVERS, workers=WORKERS,
         cpus=os.cpu_count(), machine=platform.machine(), results=rows)


if __name__ == "__main__":
    main()
