"""Realm 3: operations on dense tables run where their blocks are, side by side with this
machine's memory bandwidth and with pulling the vectors to one rank; L-BFGS over dense tables
against scikit-learn's on the same objective.

    python bench/dense.py [--rows 2**24] [--repeats 5] [--data-rows 100000]

Part 1 (under mpiexec: 2 servers + 1 worker): two vectors of --rows float64 across the
servers; the worker times x.dot(y) and y.axpy(a, x) (bytes each server reads and writes,
per second, per server), and the same dot after gathering both vectors to itself; every
server first times a copy and a dot of local arrays of the size it holds (its memory
bandwidth: both at once, as they run the operations), in the same run. Part 2: `mpips train
--solver lbfgs` (1 server + 1 worker, and 2 + 2) and scikit-learn's lbfgs on the census-like
set, same L2, runs alternating: solver time (median), its ratio to scikit-learn's, objective.
Writes bench/results/dense.json.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

import checkout  # noqa: F401  (this checkout's mpips: see checkout.py)

HERE = os.path.dirname(os.path.abspath(__file__))
L2, DIM = 1e-4, 1 << 12


def bandwidth(n: int, repeats: int) -> dict:
    """GB/s of a copy (read + write) and a dot (two reads) of local arrays of n float64."""
    a, b = np.ones(n), np.ones(n)
    copy = min(_timed(lambda: np.copyto(b, a)) for _ in range(repeats))
    dot = min(_timed(lambda: a @ b) for _ in range(repeats))
    return {"copy_gbs": 2 * a.nbytes / copy / 1e9, "dot_gbs": 2 * a.nbytes / dot / 1e9}


def _timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def on_ranks(n: int, repeats: int, out: str) -> None:
    """Part 1, on every rank of a 3-rank job."""
    from mpi4py import MPI

    from mpips.worker.kvworker import KVWorker
    from mpips.wire.clocks import ClockTable
    from mpips.worker.dense_client import DenseClient
    from mpips.models.optimizer import Optimizer
    from mpips.ranks.roles import split
    from mpips.server.loop import Server
    from mpips.server.store import KVStore
    roles = split(2, MPI.COMM_WORLD)
    # The servers measure their memory at once, as they will run the operations; the worker
    # waits.
    local = bandwidth(n // 2, repeats) if roles.is_server else None
    MPI.COMM_WORLD.Barrier()
    if roles.is_server:
        Server(roles, KVStore(1, Optimizer("sgd", lr=1.0)), ClockTable(1), timeout=600).run()
    else:
        ps = DenseClient(KVWorker(roles, timeout=600))
        x, y = ps.dense("x", n).fill(1.0), ps.dense("y", n).fill(2.0)
        x.dot(y)   # warm
        dot = min(_timed(lambda: x.dot(y)) for _ in range(repeats))
        axpy = min(_timed(lambda: y.axpy(1e-9, x)) for _ in range(repeats))
        rows = np.arange(n)
        pulled = min(_timed(lambda: x.gather(rows) @ y.gather(rows)) for _ in range(repeats))
        per_server = n // 2 * 8
        result = {"rows": n, "bytes_per_vector": 8 * n,
                  "dot_gbs_per_server": 2 * per_server / dot / 1e9,
                  "axpy_gbs_per_server": 3 * per_server / axpy / 1e9,
                  "dot_s": dot, "axpy_s": axpy, "pulled_dot_s": pulled}
        ps.kv.finish()
        ps.kv.close()
    # numpy buffers only: the servers' local figures to the worker, which writes them all
    mine = np.array([local["copy_gbs"], local["dot_gbs"]] if local else [0.0, 0.0])
    every = np.empty((3, 2)) if not roles.is_server else None
    MPI.COMM_WORLD.Gather(mine, every, root=2)
    if not roles.is_server:
        result["server_local"] = [{"copy_gbs": c, "dot_gbs": d} for c, d in every[:2].tolist()]
        with open(out, "w") as f:
            json.dump(result, f)
    roles.free()


def mpiexec() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return os.environ.get("MPIEXEC") or (beside if os.path.exists(beside) else "mpiexec")


LAYOUTS = ((1, 1), (2, 2))   # (servers, workers) of the L-BFGS runs


def lbfgs_vs_sklearn(rows: int, repeats: int) -> dict:
    """mpips's L-BFGS on each of LAYOUTS and scikit-learn's on the same rows and objective:
    solver seconds (the median of `repeats` runs each, alternating), iterations, objectives."""
    import scipy.sparse as sp
    from sklearn.linear_model import LogisticRegression

    from mpips.models.evaluate import read_rows
    prefix = os.path.join(HERE, "data", f"census{rows}")
    if not os.path.exists(prefix + ".train.svm"):
        subprocess.run([sys.executable, "-m", "mpips", "make-data", "--kind", "census",
                        "--rows", str(rows), "--seed", "1", prefix], check=True,
                       capture_output=True)
    data = read_rows(prefix + ".train.svm")
    n = len(data)
    cols = np.concatenate([(data.indices % np.uint64(DIM)).astype(np.int64), np.full(n, DIM)])
    which = np.concatenate([np.repeat(np.arange(n), np.diff(data.indptr)), np.arange(n)])
    X = sp.csr_matrix((np.concatenate([data.values.astype(float), np.ones(n)]), (which, cols)),
                      shape=(n, DIM + 1))
    y = data.labels.astype(float)
    runs: dict = {f"{s}+{w}": [] for s, w in LAYOUTS}
    sk_times = []
    for _ in range(repeats):
        for servers, workers in LAYOUTS:
            runs[f"{servers}+{workers}"].append(_mpips_lbfgs(prefix, servers, workers))
        t = time.perf_counter()
        model = LogisticRegression(C=1 / (L2 * n), fit_intercept=False, tol=1e-10,
                                   max_iter=100000).fit(X, y)
        sk_times.append(time.perf_counter() - t)
    w = model.coef_.ravel()
    z = X @ w
    sk_f = float(np.mean(np.logaddexp(0, z) - y * z) + L2 / 2 * w @ w)
    sk_s = float(np.median(sk_times))
    layouts = {}
    for name, results in runs.items():
        solver_s = float(np.median([r["solver_s"] for r in results]))
        last = results[-1]
        layouts[name] = {**last, "solver_s": solver_s, "vs_sklearn": solver_s / sk_s,
                         "relative_gap": (last["objective"] - sk_f) / sk_f}
    return {"rows": n, "dim": DIM, "l2": L2, "repeats": repeats, "sklearn_objective": sk_f,
            "sklearn_s": sk_s, "sklearn_iterations": int(model.n_iter_[0]),
            "mpips": layouts}


def _mpips_lbfgs(prefix: str, servers: int, workers: int) -> dict:
    run_dir = os.path.join(HERE, "out", f"dense-lbfgs-{servers}-{workers}")
    started = time.perf_counter()
    subprocess.run([mpiexec(), "-n", str(servers + workers), sys.executable, "-m", "mpips",
                    "train", "--servers", str(servers), "--solver", "lbfgs", "--l2", str(L2),
                    "--dim", str(DIM), "--train", prefix + ".train.svm", "--out", run_dir,
                    "--overwrite"], check=True, capture_output=True)
    wall = time.perf_counter() - started
    with open(os.path.join(run_dir, "summary.json")) as f:
        solver = json.load(f)["solver"]
    return {"objective": solver["objective"], "iterations": solver["iterations"],
            "evaluations": solver["steps"][-1]["evaluations"],
            "solver_s": solver["steps"][-1]["seconds"], "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1 << 24)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-rows", type=int, default=100_000)
    parser.add_argument("--fit-repeats", type=int, default=3,
                        help="L-BFGS runs of each layout and of scikit-learn (medians)")
    parser.add_argument("--on-ranks", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "dense.json"))
    args = parser.parse_args()
    if args.on_ranks:
        on_ranks(args.rows, args.repeats, args.on_ranks)
        return
    from report import save
    part = os.path.join(HERE, "out", "dense-ops.json")
    os.makedirs(os.path.dirname(part), exist_ok=True)
    subprocess.run([mpiexec(), "-n", "3", sys.executable, os.path.abspath(__file__),
                    "--rows", str(args.rows), "--repeats", str(args.repeats),
                    "--on-ranks", part], check=True)
    with open(part) as f:
        ops = json.load(f)
    local = ops["server_local"]
    mem_copy = min(r["copy_gbs"] for r in local)
    mem_dot = min(r["dot_gbs"] for r in local)
    print(f"{args.rows:,} rows x 2 vectors across 2 servers ({8 * args.rows / 2**20:.0f} MiB "
          f"each); one worker asks")
    print(f"{'':28} {'GB/s per server':>16} {'vs local numpy':>15}")
    print(f"{'local copy (memory)':28} {mem_copy:>16.2f} {'':>15}")
    print(f"{'local dot (memory)':28} {mem_dot:>16.2f} {1.0:>14.2f}x")
    print(f"{'server-side dot':28} {ops['dot_gbs_per_server']:>16.2f} "
          f"{ops['dot_gbs_per_server'] / mem_dot:>14.2f}x")
    print(f"{'server-side axpy':28} {ops['axpy_gbs_per_server']:>16.2f} "
          f"{ops['axpy_gbs_per_server'] / mem_copy:>14.2f}x (of copy)")
    print(f"dot on the servers {ops['dot_s'] * 1e3:.1f} ms; pulling both vectors to the worker "
          f"and dotting there {ops['pulled_dot_s'] * 1e3:.1f} ms "
          f"({ops['pulled_dot_s'] / ops['dot_s']:.0f}x longer)")
    fit = lbfgs_vs_sklearn(args.data_rows, args.fit_repeats)
    print(f"L-BFGS, {fit['rows']:,} census-like rows, dim {fit['dim']}, l2 {fit['l2']:g} "
          f"(medians of {fit['repeats']} runs, side by side):")
    print(f"{'':16} {'solver s':>9} {'vs sklearn':>11} {'iterations':>11} {'objective':>14} "
          f"{'rel. gap':>9}")
    for name, m in fit["mpips"].items():
        print(f"{'mpips ' + name:16} {m['solver_s']:>9.2f} {m['vs_sklearn']:>10.2f}x "
              f"{m['iterations']:>11} {m['objective']:>14.10f} {m['relative_gap']:>9.1e}")
    print(f"{'scikit-learn':16} {fit['sklearn_s']:>9.2f} {1.0:>10.2f}x "
          f"{fit['sklearn_iterations']:>11} {fit['sklearn_objective']:>14.10f}")
    save(args.out, "dense", cpus=os.cpu_count(), machine=platform.machine(), operations=ops,
         memory={"copy_gbs": mem_copy, "dot_gbs": mem_dot}, lbfgs=fit)


if __name__ == "__main__":
    main()
