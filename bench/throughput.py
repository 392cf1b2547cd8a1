"""mpips beside Vowpal Wabbit, scikit-learn and a bare numba loop: one pass, same data.

    python bench/throughput.py [--repeats 3]

Data (made once in bench/data/): 2,000,000 training and 400,000 test rows of 40
hashed features over a key space of 2^22 values (`mpips make-data`), as
svmlight text, as mpips binary shards (`mpips convert`), and in VW's format.
Every system runs in its own processes; each is timed on its training pass,
`--repeats` times (the median counts), and scored on the same test rows:

  mpips     1 server + 1 worker and 1 + 3 (ranks share the 2 cores here), from
            binary shards and from text, default settings (training time is
            mpips' own `train_s`: set-up and scoring excluded)
  VW        vowpalwabbit's Workspace(...).run_parser(), --loss_function logistic,
            -b 22 (2^22 weights, the data's key space), otherwise defaults; from
            text, and from its cache (made beforehand, untimed here)
  sklearn   SGDClassifier(loss="log_loss"), one epoch, keys hashed to 2^22 columns
  numba     the limit: per-example AdaGrad over the same CSR arrays in one
            process, weight and accumulator side by side, 2^22 hashed slots

Also "mpips 1+1 binary cold": the same run with the shards first dropped from the
page cache (posix_fadvise DONTNEED), as on the first run after `convert`, beside the
time to read the shards' files from disk alone: a cold run can go no faster.

Also measured: the steps of a pass over the same rows, each timed apart in one
process (a worker's keys and gradient; a server's checks of a pull and of a push, its
lookup and its update), against the numba loop: what each step of a training pass
costs; and, from the 1+1 job's summary, how busy its server was (`server_busy`) and how
long its worker waited for replies (`wait_s`). Prints a table with
ratios to VW (cache) and to the numba loop; writes bench/results/throughput.json.

VW, scikit-learn and the loop hash the 3.35M distinct keys into 2^22 slots (so
some collide); mpips stores every key exactly.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
PREFIX = os.path.join(DATA, "big")
ROWS, TEST_ROWS, NNZ, BITS = 2_000_000, 400_000, 40, 22
sys.path.insert(0, HERE)
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from workers import mpiexec, run  # noqa: E402
from report import save  # noqa: E402


# ---- data ----------------------------------------------------------------------------------

def prepare() -> None:
    """Make the text, binary and VW forms of the data, once."""
    if not os.path.exists(PREFIX + ".train.svm"):
        run([sys.executable, "-m", "mpips", "make-data", "--rows", str(ROWS), "--test-rows",
             str(TEST_ROWS), "--nnz", str(NNZ), "--features", str(1 << BITS), "--seed", "7",
             PREFIX])
    from mpips.data.shards import distinct_keys
    for part in ("train", "test"):
        if distinct_keys(f"{PREFIX}.{part}.bin") is None:   # absent, or converted before it
            # kept the estimate of distinct keys that servers size their tables by
            run([mpiexec(), "-n", "2", sys.executable, "-m", "mpips", "convert", "--overwrite",
                 f"{PREFIX}.{part}.svm", f"{PREFIX}.{part}.bin"])
        if not os.path.exists(f"{PREFIX}.{part}.vw"):
            write_vw(f"{PREFIX}.{part}.bin", f"{PREFIX}.{part}.vw")
    if not os.path.exists(PREFIX + ".train.vwcache"):
        from vowpalwabbit import Workspace
        vw = Workspace(f"{vw_args()} -d {PREFIX}.train.vw --cache_file {PREFIX}.train.vwcache")
        vw.run_parser()
        vw.finish()


def write_vw(src: str, dst: str) -> None:
    """VW text: '1 |f key:value ...' (-1 for negatives; ':value' left out when it is 1)."""
    from baselines import format_vw

    from mpips.data.shards import CsrShard
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        for part in CsrShard(src).parts:
            for a in range(0, len(part), 100_000):
                rows = part.slice(a, min(a + 100_000, len(part)))
                out = np.empty(rows.indices.shape[0] * 32 + len(rows) * 8, np.uint8)
                n = format_vw(rows.indptr, rows.indices, rows.values, rows.labels, out)
                f.write(out[:n].tobytes())
    os.replace(tmp, dst)


def vw_args() -> str:
    return f"--loss_function logistic -b {BITS} --quiet"


# ---- one system per child process ----------------------------------------------------------

def child(name: str) -> dict:
    """Train one system once; return its figures (run in a fresh process)."""
    from mpips.models.evaluate import read_rows
    if name.startswith("VW"):
        return vw_run(cache=name.endswith("cache"))
    if name == "sklearn":
        return sklearn_run(read_rows(PREFIX + ".train.bin"), read_rows(PREFIX + ".test.bin"))
    if name == "numba":
        return numba_run(PREFIX + ".train.bin", read_rows(PREFIX + ".test.bin"))
    if name == "kernel":
        return kernel_run(PREFIX + ".train.bin")
    raise ValueError(name)


def scores(margins, labels) -> dict:
    from mpips.kernels.logistic import mean_logloss, roc_auc
    return {"test_logloss": float(mean_logloss(margins, labels)),
            "test_auc": float(roc_auc(margins, labels))}


def vw_run(cache: bool) -> dict:
    from vowpalwabbit import Workspace
    model = os.path.join(DATA, "vw.model")
    source = f"--cache_file {PREFIX}.train.vwcache" if cache else f"-d {PREFIX}.train.vw"
    start = time.perf_counter()
    vw = Workspace(f"{vw_args()} {source} -f {model}")
    vw.run_parser()
    vw.finish()
    train_s = time.perf_counter() - start
    preds = os.path.join(DATA, "vw.preds")
    test = Workspace(f"--quiet -t -i {model} --link logistic -d {PREFIX}.test.vw -p {preds}")
    test.run_parser()
    test.finish()
    p = np.clip(np.loadtxt(preds), 1e-15, 1 - 1e-15)
    labels = np.fromiter((line[0] == ord("1") for line in open(PREFIX + ".test.vw", "rb")),
                         np.float32)
    return {"train_s": train_s, **scores(np.log(p) - np.log1p(-p), labels)}


def hashed(rows):
    import scipy.sparse as sp
    cols = (rows.indices & np.uint64((1 << BITS) - 1)).astype(np.int32)
    return sp.csr_matrix((rows.values.astype(np.float64), cols, rows.indptr),
                         shape=(len(rows), 1 << BITS))


def sklearn_run(train, test) -> dict:
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import SGDClassifier
    x, y, xt = hashed(train), train.labels, hashed(test)
    model = SGDClassifier(loss="log_loss", max_iter=1, tol=None, random_state=0)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)   # one epoch is the point
        model.fit(x, y)
    return {"train_s": time.perf_counter() - start,
            **scores(model.decision_function(xt), test.labels)}


def numba_run(train_path, test) -> dict:
    from baselines import adagrad_pass, hashed_margins

    from mpips.data.shards import CsrShard
    mask = np.uint64((1 << BITS) - 1)
    shard = CsrShard(train_path)
    lr = 2.0 / (NNZ + 1)          # mpips' default rule for AdaGrad
    warm = np.zeros((4, 2), np.float32)
    adagrad_pass(np.array([0, 1]), np.zeros(1, np.uint64), np.ones(1, np.float32),
                 np.zeros(1, np.float32), warm, lr, np.uint64(1))
    table = np.zeros(((1 << BITS) + 2, 2), np.float32)
    start = time.perf_counter()
    for part in shard.parts:
        adagrad_pass(part.indptr, part.indices, part.values, part.labels, table, lr, mask)
    train_s = time.perf_counter() - start
    out = np.empty(len(test))
    hashed_margins(test.indptr, test.indices, test.values, table, mask, out)
    return {"train_s": train_s, **scores(out, test.labels)}


def kernel_run(train_path) -> dict:
    """The work of a training pass over minibatches of 1,000 rows, one minibatch at a time as
    in training, each step timed apart: a worker finds the minibatch's keys (KeyIndexer) and
    computes its gradient; a server takes the pull as the short way does (server/hotpath: its
    keys checked, sorted and its own, in the pass that finds their rows and reads their
    weights), checks the push (values finite, the worker's figures) and applies AdaGrad. Beside
    it, on a table of its own, the table's work alone: the same lookups and updates with no
    check (`table_s`): the server's own work over it is what the checks cost."""
    from mpips.data.shards import CsrShard, distinct_keys
    from mpips.data.textfile import KeyIndexer
    from mpips.kernels.requests import first_not_finite
    from mpips.models.catalog import LogisticRegression
    from mpips.models.optimizer import Optimizer
    from mpips.server.admission import check_report
    from mpips.server.store import KVStore
    from mpips.wire import protocol
    from mpips.wire.placement import Placement
    index = KeyIndexer()

    def a_store():
        store = KVStore(1, Optimizer("adagrad", lr=2.0 / (NNZ + 1), eps=1e-3))
        store.reserve(int(distinct_keys(train_path) * 1.1))   # as a server does (server_side)
        return store
    store, table = a_store(), a_store()
    placement = Placement(1, vnodes=16)                    # a job's, with one server
    check = placement.key_check(0, True, np.zeros(placement.n_ranges, np.int64))
    report = protocol.Report(examples=1000, loss=1.0, progress=0.5)
    times = dict.fromkeys(("keys_s", "gradient_s", "pull_s", "check_push_s", "update_s",
                           "table_find_s", "table_update_s"), 0.0)
    keys_served = 0

    def timed(name, step):
        start = time.perf_counter()
        out = step()
        times[name] += time.perf_counter() - start
        return out

    # The server's way and the table's alone take turns at going first, so that neither
    # finds the minibatch's keys and rows in cache more often.
    for i, batch in enumerate(CsrShard(train_path).minibatches(1000)):
        keys, cols, bias_col = timed("keys_s", lambda: index(batch, True))
        n = keys.shape[0]
        pull = protocol.pack(protocol.Header(protocol.Op.PULL, nkeys=n), keys)
        weights = np.empty((n, 1), np.float32)
        finds = [lambda: timed("pull_s", lambda: store.find_checked(
                     pull, protocol.HEADER_BYTES, check, np.empty(n, np.uint64), True, weights)),
                 lambda: timed("table_find_s", lambda: table.find(
                     keys, True, np.empty((n, 1), np.float32)))]
        found = [find() for find in (finds if i % 2 else finds[::-1])]
        (rows, bad), table_rows = found if i % 2 else found[::-1]
        assert bad < 0
        grad, _ = timed("gradient_s",
                        lambda: LogisticRegression().gradient(batch, cols, bias_col, weights))
        push = protocol.pack(protocol.Header(protocol.Op.PUSH, nkeys=n, width=1,
                                             flags=protocol.SAME_KEYS | protocol.REPORT),
                             grad, report=report)

        def check_push():
            values = push[protocol.HEADER_BYTES:protocol.HEADER_BYTES + 4 * n].view(
                np.float32).reshape(n, 1)
            assert first_not_finite(values) < 0
            check_report(protocol.Op.PUSH,
                         protocol.report_at(push, protocol.HEADER_BYTES + 4 * n))
            return values
        values = timed("check_push_s", check_push)
        updates = [lambda: timed("update_s", lambda: store.update(rows, values, 0)),
                   lambda: timed("table_update_s", lambda: table.update(table_rows, grad, 0))]
        for update in (updates if i % 2 else updates[::-1]):
            update()
        keys_served += n
    server_s = times["pull_s"] + times["check_push_s"] + times["update_s"]
    table_s = times["table_find_s"] + times["table_update_s"]
    return {"train_s": times["keys_s"] + times["gradient_s"], **times, "server_s": server_s,
            "table_s": table_s, "server_over_table": server_s / table_s,
            "keys_served": keys_served}


def in_child(name: str) -> dict:
    """Run `child(name)` in a fresh process; add its peak resident memory and wall time
    (process start to exit: loading the data and scoring included)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", name], stdout=subprocess.PIPE,
                            text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        sys.exit(f"{name} failed:\n{out}")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_rss_mb": usage.ru_maxrss / 1024,
            "wall_s": time.perf_counter() - start}


def evict(path: str) -> None:
    """Drop a file's or a directory's files from the page cache (posix_fadvise DONTNEED), as if
    the machine had just written or copied them elsewhere: the next read comes from disk."""
    paths = ([os.path.join(path, f) for f in os.listdir(path)] if os.path.isdir(path)
             else [path])
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cold_read(path: str) -> float:
    """Seconds to read a dataset's files from disk (dropped from the page cache first): how
    fast a cold run could go at most."""
    evict(path)
    start = time.perf_counter()
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass
    return time.perf_counter() - start


def mpips_run(servers: int, workers: int, source: str, cold: bool = False) -> dict:
    out = os.path.join(HERE, "out", f"throughput-{servers}-{workers}-{source}")
    data = {"binary": ".bin", "text": ".svm"}[source]
    if cold:
        evict(PREFIX + ".train" + data)
    start = time.perf_counter()
    run([mpiexec(), "-n", str(servers + workers), sys.executable, "-m", "mpips", "train",
         "--servers", str(servers), "--train", PREFIX + ".train" + data,
         "--test", PREFIX + ".test.bin", "--out", out, "--overwrite"])
    wall_s = time.perf_counter() - start
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return {"train_s": s["train_s"], "wall_s": wall_s, "test_logloss": s["test_logloss"],
            "test_auc": s["test_auc"], "peak_rss_mb": s["peak_rss_mb_total"],
            "bytes_per_example": s["bytes_per_example"], "score_s": s["score_s"],
            "server_busy": max(s["server_busy"]), "wait_s": max(s["wait_s"])}


SYSTEMS = {
    "mpips 1+1 binary": lambda: mpips_run(1, 1, "binary"),
    "mpips 1+1 binary cold": lambda: mpips_run(1, 1, "binary", cold=True),
    "mpips 1+1 text": lambda: mpips_run(1, 1, "text"),
    "mpips 1+3 binary": lambda: mpips_run(1, 3, "binary"),
    "mpips 1+3 text": lambda: mpips_run(1, 3, "text"),
    "VW text": lambda: in_child("VW text"),
    "VW cache": lambda: in_child("VW cache"),
    "sklearn SGD": lambda: in_child("sklearn"),
    "numba AdaGrad (limit)": lambda: in_child("numba"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs per system; median counts")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "throughput.json"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    prepare()
    results, reads = {}, []
    for repeat in range(args.repeats):      # interleaved, so drift hits every system alike
        for name, fn in list(SYSTEMS.items()) + [("gradient kernel", lambda: in_child("kernel"))]:
            print(f"[{repeat + 1}/{args.repeats}] {name}", flush=True)
            results.setdefault(name, []).append(fn())
        reads.append(cold_read(PREFIX + ".train.bin"))
    rows = {name: summarize(runs) for name, runs in results.items()}
    report(rows, statistics.median(reads), args)


def summarize(runs: list) -> dict:
    row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    row["train_s_each"] = [r["train_s"] for r in runs]
    row["examples_per_s"] = ROWS / row["train_s"]
    row["nnz_per_s"] = ROWS * NNZ / row["train_s"]
    return row


def report(rows: dict, disk_s: float, args) -> None:
    vw, limit = rows["VW cache"]["examples_per_s"], rows["numba AdaGrad (limit)"]["examples_per_s"]
    kernel = rows.pop("gradient kernel")
    print(f"\none pass over {ROWS:,} rows x {NNZ} non-zeros, test on {TEST_ROWS:,} rows; "
          f"medians of {args.repeats}; {os.cpu_count()} cores")
    print("train s: the training pass (mpips: its train_s, from all ranks ready to all workers "
          "done); wall s: the whole command, start-up, data loading, scoring and saving included")
    print(f"{'':22} {'train s':>8} {'wall s':>7} {'k ex/s':>7} {'M nnz/s':>8} {'vs VW':>6} "
          f"{'vs limit':>8} {'peak MB':>8} {'logloss':>8} {'AUC':>7}")
    for name, r in rows.items():
        r["ratio_to_vw_cache"] = r["examples_per_s"] / vw
        r["ratio_to_numba_limit"] = r["examples_per_s"] / limit
        print(f"{name:22} {r['train_s']:8.2f} {r['wall_s']:7.1f} {r['examples_per_s'] / 1e3:7.0f} "
              f"{r['nnz_per_s'] / 1e6:8.1f} {r['ratio_to_vw_cache']:6.2f} "
              f"{r['ratio_to_numba_limit']:8.2f} {r['peak_rss_mb']:8.0f} "
              f"{r['test_logloss']:8.4f} {r['test_auc']:7.4f}")
    print("peak MB: the child's peak resident memory; for mpips the sum of every rank's peak "
          "(an upper bound: shared libraries and mapped data files count once per rank)")
    loop_s = rows["numba AdaGrad (limit)"]["train_s"]
    kernel_ratio = loop_s / kernel["train_s"]
    best, cold = rows["mpips 1+1 binary"], rows["mpips 1+1 binary cold"]
    targets = {
        "mpips 1+1 binary >= 80% of the numba loop": best["ratio_to_numba_limit"] >= 0.8,
        "mpips 1+1 text >= VW text": rows["mpips 1+1 text"]["examples_per_s"]
                                     >= rows["VW text"]["examples_per_s"],
        "mpips 1+1 logloss <= VW's": best["test_logloss"] <= rows["VW cache"]["test_logloss"],
        # A cold run cannot beat the disk: within 10% of a warm run, or of reading the shards.
        "a cold run within 10% of a warm one or of the disk":
            cold["train_s"] <= 1.1 * max(best["train_s"], disk_s),
    }
    per = 1e3 / (ROWS / 1000)   # ms per minibatch of 1,000 rows
    print("\nwhere a minibatch of 1,000 rows goes (ms; steps timed apart in one process):")
    print(f"  worker: keys {kernel['keys_s'] * per:.3f} + gradient {kernel['gradient_s'] * per:.3f}"
          f" = {kernel['train_s'] * per:.3f}")
    print(f"  server: check, find and read the pull {kernel['pull_s'] * per:.3f} + check the "
          f"push {kernel['check_push_s'] * per:.3f} + update {kernel['update_s'] * per:.3f} = "
          f"{kernel['server_s'] * per:.3f} ({kernel['keys_served'] / (ROWS / 1000):,.0f} keys); "
          f"the table's work alone {kernel['table_s'] * per:.3f}: "
          f"{kernel['server_over_table']:.2f}x (target at most 1.1x)")
    print(f"  mpips 1+1 binary: {best['train_s'] * per:.3f} a minibatch; the numba loop "
          f"{loop_s * per:.3f}; cold {cold['train_s'] * per:.3f}")
    print(f"  bounds on a worker's speed against the loop's, whatever overlaps: one server's "
          f"own work {loop_s / kernel['server_s']:.2f}, the worker's own work "
          f"{loop_s / kernel['train_s']:.2f} (messages not counted)")
    print(f"  in the 1+1 job the server was busy in its handlers {best['server_busy']:.0%} of "
          f"the pass ({best['server_busy'] * best['train_s'] * per:.3f} a minibatch); the "
          f"worker waited {best['wait_s'] * per:.3f} a minibatch for its replies")
    size = sum(os.path.getsize(os.path.join(PREFIX + ".train.bin", f))
               for f in os.listdir(PREFIX + ".train.bin"))
    print(f"  reading the shards from disk alone (cache dropped): {disk_s:.2f} s "
          f"({size / 2**20 / disk_s:.0f} MiB/s); the cold run {cold['train_s']:.2f} s, "
          f"the warm {best['train_s']:.2f} s")
    for what, met in targets.items():
        print(f"  {'met    ' if met else 'NOT met'}  {what}")
    save(args.out, "throughput", rows=ROWS, test_rows=TEST_ROWS, nnz=NNZ, key_bits=BITS,
         repeats=args.repeats, cpus=os.cpu_count(), systems=rows,
         worker_kernels={**kernel, "speed_relative_to_numba_loop": kernel_ratio,
                         "server_bound_relative_to_numba_loop": loop_s / kernel["server_s"]},
         shards_cold_read_s=disk_s,
         targets=targets)


if __name__ == "__main__":
    main()
