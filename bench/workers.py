"""Data parallelism: the same job with 1, 2 and 3 workers (and 2 servers), side by side.

    python bench/workers.py [--rows 500000] [--repeats 2]

Generates a CTR-like set in bench/data/ (once), trains one epoch per layout,
prints examples/s and the ratio to one worker, and writes bench/results/workers.json.
On a machine with fewer cores than ranks the ranks share cores: the ratio shows
what that costs.
"""
import argparse
import json
import os
import platform
import subprocess
import sys

import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from report import save

HERE = os.path.dirname(os.path.abspath(__file__))
LAYOUTS = [(1, 1), (1, 2), (1, 3), (2, 2)]   # (servers, workers)


def mpiexec() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return os.environ.get("MPIEXEC") or (beside if os.path.exists(beside) else "mpiexec")


def run(cmd: list, timeout: float = 1800) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")


def dataset(rows: int) -> str:
    """The CTR-like bench set of `rows` training rows, made once in bench/data/."""
    prefix = os.path.join(HERE, "data", f"ctr{rows}")
    if not os.path.exists(prefix + ".train.svm"):
        run([sys.executable, "-m", "mpips", "make-data", "--rows", str(rows),
             "--features", str(1 << 20), "--nnz", "20", "--seed", "1", prefix])
    return prefix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=2, help="runs per layout; the best counts")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "workers.json"))
    args = parser.parse_args()

    prefix = dataset(args.rows)
    rows = []
    for servers, workers in LAYOUTS:
        best = None
        for rep in range(args.repeats):
            out = os.path.join(HERE, "out", f"s{servers}w{workers}r{rep}")
            run([mpiexec(), "-n", str(servers + workers), sys.executable, "-m", "mpips", "train",
                 "--servers", str(servers), "--train", prefix + ".train.svm",
                 "--test", prefix + ".test.svm", "--out", out])
            with open(os.path.join(out, "summary.json")) as f:
                s = json.load(f)
            if best is None or s["examples_per_s"] > best["examples_per_s"]:
                best = s
        rows.append({"servers": servers, "workers": workers,
                     "examples_per_s": best["examples_per_s"], "train_s": best["train_s"],
                     "test_logloss": best["test_logloss"], "test_auc": best["test_auc"],
                     "bytes_per_example": best["bytes_per_example"],
                     "wait_s_mean": sum(best["wait_s"]) / len(best["wait_s"])})
    base = rows[0]["examples_per_s"]
    print(f"{'servers':>7} {'workers':>7} {'examples/s':>11} {'vs 1 worker':>11} "
          f"{'logloss':>8} {'AUC':>7} {'bytes/ex':>8} {'wait s':>7}")
    for r in rows:
        r["ratio_to_one_worker"] = r["examples_per_s"] / base
        print(f"{r['servers']:>7} {r['workers']:>7} {r['examples_per_s']:>11,.0f} "
              f"{r['ratio_to_one_worker']:>10.2f}x {r['test_logloss']:>8.4f} {r['test_auc']:>7.4f} "
              f"{r['bytes_per_example']:>8.0f} {r['wait_s_mean']:>7.2f}")
    save(args.out, "workers", rows=args.rows, cpus=os.cpu_count(),
         machine=platform.machine(), results=rows)


if __name__ == "__main__":
    main()
