"""Scoring the test file on every rank: how long a job's `score_s` is, who scored what, against
the same scoring done in one process.

    python bench/scoring.py [--repeats 3]

The data of bench/throughput.py (2,000,000 training rows, 400,000 test rows of 40 hashed
features, binary shards). For each layout, `--repeats` jobs train one epoch and score the test
file: the lead hands it out in chunks to whichever rank asks (mpips/job/scoring.py); servers
take chunks only with a core of their own (here, 2 cores: in the 1 + 1 layout, not when 4
ranks share them). Each job's `score_s` (the slowest rank's), its rows per rank and rows per
second; the median job counts.

The reference, in one process (no MPI, no messages): the same test rows scored with the
trained model of the first job, its keys in one KVStore table: each batch's keys found
(KeyIndexer), looked up, and its margins computed, as a rank does. The ratio says how much
faster the ranks together score than one of them alone. Writes bench/results/scoring.json.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from report import save  # noqa: E402
from throughput import PREFIX, TEST_ROWS, prepare  # noqa: E402
from workers import mpiexec, run  # noqa: E402

LAYOUTS = [(1, 1), (1, 3), (2, 2)]   # (servers, workers)


def job(servers: int, workers: int, repeat: int) -> dict:
    out = os.path.join(HERE, "out", f"scoring-{servers}-{workers}-{repeat}")
    run([mpiexec(), "-n", str(servers + workers), sys.executable, "-m", "mpips", "train",
         "--servers", str(servers), "--train", PREFIX + ".train.bin",
         "--test", PREFIX + ".test.bin", "--out", out, "--overwrite"])
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return {"score_s": s["score_s"], "by_rank": s["test_examples_by_rank"],
            "test_logloss": s["test_logloss"], "model": os.path.join(out, "model")}


def one_process(model_dir: str) -> float:
    """Seconds to score the test rows in one process with the saved model (see docstring)."""
    from mpips.data.textfile import KeyIndexer
    from mpips.storage.model_files import load_model
    from mpips.models.catalog import LogisticRegression
    from mpips.models.optimizer import Optimizer
    from mpips.data.shards import open_shard
    from mpips.server.store import KVStore
    from mpips.job.chunks import EVAL_BATCH

    keys, weights = load_model(model_dir)
    store = KVStore(width=1, optimizer=Optimizer("sgd"), capacity=int(keys.shape[0] * 1.3))
    store.load(keys, np.column_stack([weights.reshape(-1, 1),
                                      np.zeros((keys.shape[0], store.columns - 1))]
                                     ).astype(np.float32))
    model, index = LogisticRegression(), KeyIndexer()
    shard = open_shard(PREFIX + ".test.bin", 0, 1)
    for batch in shard.minibatches(EVAL_BATCH):   # once untimed: pages in, kernels loaded
        index(batch, True)
    start = time.perf_counter()
    for batch in shard.minibatches(EVAL_BATCH):
        batch_keys, cols, bias_col = index(batch, True)
        out = np.empty((batch_keys.shape[0], 1), np.float32)
        store.find(batch_keys, False, out)
        model.margins(batch, cols, bias_col, out)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="jobs per layout; median counts")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "scoring.json"))
    args = parser.parse_args()
    prepare()
    runs = {layout: [] for layout in LAYOUTS}
    for repeat in range(args.repeats):   # interleaved, so drift hits every layout alike
        for servers, workers in LAYOUTS:
            print(f"[{repeat + 1}/{args.repeats}] {servers} server(s) + {workers} worker(s)",
                  flush=True)
            runs[(servers, workers)].append(job(servers, workers, repeat))
    alone = one_process(runs[LAYOUTS[0]][0]["model"])
    print(f"\nscoring {TEST_ROWS:,} test rows; medians of {args.repeats} jobs; "
          f"{os.cpu_count()} cores; one process alone: {alone:.3f} s "
          f"({TEST_ROWS / alone / 1e3:.0f}k rows/s)")
    print(f"{'layout':>8} {'score s':>8} {'k rows/s':>9} {'vs alone':>9}  rows scored by rank "
          f"(servers first)")
    table = []
    for (servers, workers), jobs in runs.items():
        median = statistics.median(j["score_s"] for j in jobs)
        middle = min(jobs, key=lambda j: abs(j["score_s"] - median))
        row = {"servers": servers, "workers": workers, "score_s": median,
               "score_s_each": [j["score_s"] for j in jobs], "rows_by_rank": middle["by_rank"],
               "rows_per_s": TEST_ROWS / median, "speedup_vs_one_process": alone / median,
               "test_logloss": middle["test_logloss"]}
        table.append(row)
        print(f"{servers:>4} + {workers} {median:8.3f} {row['rows_per_s'] / 1e3:9.0f} "
              f"{row['speedup_vs_one_process']:9.2f}  {middle['by_rank']}")
    save(args.out, "scoring", test_rows=TEST_ROWS, repeats=args.repeats, cpus=os.cpu_count(),
         one_process_s=alone, layouts=table)


if __name__ == "__main__":
    main()
