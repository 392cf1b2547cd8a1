"""Parse rate of each text format, one core: Criteo TSV against svmlight, the same number of
rows with about the same features per row, read side by side in one run.

    python bench/formats.py [--rows 300000] [--repeats 3]

Data (made once in bench/data/formats/, `mpips make-data`): Criteo layout (39 fields, ~15%
empty) and svmlight rows of 33 hashed features (the Criteo rows' mean). Each pass reads the
whole file with TextShard (the reader training uses); prints MB/s and rows/s, the best of
`--repeats` passes, and the ratio; writes bench/results/formats.json.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from report import save  # noqa: E402

from mpips.data import TextShard  # noqa: E402


def dataset(fmt: str, rows: int) -> str:
    prefix = os.path.join(HERE, "data", "formats", f"{fmt}-{rows}")
    path = f"{prefix}.train.{'tsv' if fmt == 'criteo' else 'svm'}"
    if not os.path.exists(path):
        extra = ["--format", "criteo"] if fmt == "criteo" else ["--nnz", "33"]
        subprocess.run([sys.executable, "-m", "mpips", "make-data", "--rows", str(rows),
                        "--test-rows", "1", "--features", "1000000", *extra, prefix],
                       check=True, capture_output=True)
    return path


def rate(path: str, repeats: int) -> dict:
    best, rows, nnz = float("inf"), 0, 0
    for _ in range(repeats):
        start = time.perf_counter()
        rows = nnz = 0
        for chunk in TextShard(path).rows():
            rows += len(chunk)
            nnz += chunk.indices.shape[0]
        best = min(best, time.perf_counter() - start)
    size = os.path.getsize(path)
    return {"bytes": size, "rows": rows, "features_per_row": nnz / rows, "seconds": best,
            "mb_per_s": size / best / 1e6, "rows_per_s": rows / best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "formats.json"))
    args = parser.parse_args()
    results = {fmt: rate(dataset(fmt, args.rows), args.repeats) for fmt in ("svmlight", "criteo")}
    for fmt, r in results.items():
        print(f"{fmt:9} {r['bytes'] / 1e6:7.1f} MB  {r['features_per_row']:4.1f} features/row  "
              f"{r['mb_per_s']:6.1f} MB/s  {r['rows_per_s'] / 1e3:7.0f}k rows/s (one core)")
    c, s = results["criteo"], results["svmlight"]
    print(f"criteo / svmlight: {c['mb_per_s'] / s['mb_per_s']:.2f}x in MB/s, "
          f"{c['rows_per_s'] / s['rows_per_s']:.2f}x in rows/s")
    save(args.out, "formats", rows=args.rows, results=results)


if __name__ == "__main__":
    main()
