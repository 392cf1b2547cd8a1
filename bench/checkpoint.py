"""Checkpoint write and read time for one server holding 10^7 keys, for each optimizer; and
what a checkpoint costs the workers while the server serves, three ways of writing it.

    python bench/checkpoint.py [--keys 10000000] [--dir bench/out/checkpoint]
                               [--serve-seconds 24] [--every 3] [--workers 2]
                               [--writers resident,...] [--repeats 1]

Fills one server's table (KVStore) with random 64-bit keys, then times, as a job does:
writing its shard (HDF5 to a temporary name, fsynced, renamed) and the manifest; verifying
the checkpoint's XXH64 checksums (what --resume does before choosing it); and loading the
shard into an empty table.

Then, serving (bench/checkpoint_serving.py, 1 server + --workers workers under mpiexec,
AdaGrad, BSP, each worker reading and updating 10,000 of the keys a clock, a timed
checkpoint every --every seconds), with the file written as jobs do (`resident`: by the
server's resident writer, forked once, which reads the live table in place while the server
logs the rows it changes until it has), by the resident from a copy of the table made a span
at a time between requests into shared memory (`copied`: what jobs did before, and do where a
process may not read another's memory), from that copy by a child forked for each file
(`snapshot`), by a child forked from the live table (`fork`: copy-on-write pages)
and in the server's loop (`inline`, --checkpoint-inline), and if asked, parts of the
resident's write (`sleep`: its writer only waits as long as it paces a file, the cost of the
copy alone; `gather`: it reads the copy as for a file, and hashes and writes nothing; `hash`:
it also hashes it): for
each checkpoint the write
time (from taking the state to the file in) against the longest a worker was held because
of it (its longest clock from the moment the state is taken to the file's arrival, less the
median clock outside checkpoints), and the server's longest turn on it (a span's copy; the
turn that started the writer: the fork, or the task sent); the workers' clocks per second
while a file is being written against outside, and the writer's CPU seconds for each; and
the memory of server and writers at most beyond the server's before any checkpoint
(proportional set sizes: copy-on-write pages counted once). With --repeats N the ways are
run N times in turn, and the medians of each way's figures close the report (this machine's
neighbours load it for seconds at a time). Writes bench/results/checkpoint.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from mpips.storage import checkpoint
from mpips.models.optimizer import NAMES, Optimizer
from mpips.wire.placement import Placement
from mpips.server.store import KVStore
from report import save
from workers import mpiexec

HERE = os.path.dirname(os.path.abspath(__file__))
WARMUP_S = 1.0   # the workers' first second (caches, first growth) is left out
SAMPLE_S = 0.1   # how often the memory of the serving bench's server and writer is read
WAYS = ("resident", "copied", "snapshot", "fork", "inline", "sleep", "gather",
        "hash")   # of serving


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


def serving(mode: str, n_keys: int, seconds: float, every: float, root: str,
            workers: int = 2) -> dict:
    """One launch of checkpoint_serving.py (1 server and `workers` workers): the figures of
    its checkpoints taken while the workers ran."""
    out = tempfile.mkdtemp(prefix=f"serving-{mode}-", dir=root)
    cmd = [mpiexec(), "-n", str(workers + 1), sys.executable,
           os.path.join(HERE, "checkpoint_serving.py"), mode, str(n_keys), str(seconds),
           str(every), out]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        memory = watch_memory(proc, os.path.join(out, "server.pid"), 600 + 4 * seconds)
        log.seek(0)
        if proc.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{log.read()}")
    ranks = []
    for r in range(workers + 1):
        with open(os.path.join(out, f"rank-{r}.json")) as f:
            ranks.append(json.load(f))
    shutil.rmtree(out, ignore_errors=True)
    server = next(r for r in ranks if r["role"] == "server")
    steps = [np.array(r["steps"]) for r in ranks if r["role"] == "worker"]
    figures = analyse(mode, server, steps)
    compiled = sorted({name for r in ranks for name in r["compiled"]})
    return {**figures, **memory, "memory_mb": memory["with_writer_mb"] - figures["server_pss_mb"]
            if memory["with_writer_mb"] else 0.0, "compiled": compiled}


def pss_mb(pid: int) -> float:
    """Proportional set size: pages shared by server and writer counted once between them."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1e3
    except (OSError, StopIteration):
        return 0.0


def watch_memory(proc, pid_file: str, timeout: float) -> dict:
    """Until `proc` ends (within `timeout`): the server's memory alone (its largest) and with
    its writers (their largest sum), read from /proc every SAMPLE_S."""
    alone = together = 0.0
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"the serving bench did not end within {timeout:g} s")
        time.sleep(SAMPLE_S)
        try:
            with open(pid_file) as f:
                server = int(f.read())
            with open(f"/proc/{server}/task/{server}/children") as f:
                writers = [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            continue
        mine = pss_mb(server)
        if writers:
            together = max(together, mine + sum(pss_mb(w) for w in writers))
        else:
            alone = max(alone, mine)
    return {"server_mb": alone, "with_writer_mb": together}


def _in_windows(server: dict, begin: float, end: float) -> list:
    """The server's records of the checkpoints `analyse` measures (written within the
    workers' run, without an error)."""
    return [c for c in server["checkpoints"]
            if begin <= c["take"] and c.get("done", end) <= end and not c.get("error")]


def analyse(mode: str, server: dict, steps: list) -> dict:
    """Hold against write time, and clocks per second during writes against outside."""
    begin = max(s[0, 0] for s in steps) + WARMUP_S
    end = min(s[-1, 1] for s in steps)
    windows = [(c["take"], c["done"]) for c in _in_windows(server, begin, end)]
    if not windows:
        sys.exit(f"{mode}: no checkpoint fell within the workers' run: give more "
                 f"--serve-seconds or a smaller --every")

    def during(t0, t1, a, b):
        return (t1 > a) & (t0 < b)

    quiet = []
    for s in steps:
        inside = np.zeros(s.shape[0], bool)
        for a, b in windows:
            inside |= during(s[:, 0], s[:, 1], a, b)
        quiet.append(s[~inside & (s[:, 0] >= begin)])
    typical = float(np.median(np.concatenate([q[:, 1] - q[:, 0] for q in quiet])))
    rows = []
    for c in server["checkpoints"]:
        a, b = c["take"], c.get("done")
        if b is None or not (begin <= a and b <= end) or c.get("error"):
            continue
        held = max(float(((s[:, 1] - s[:, 0])[during(s[:, 0], s[:, 1], a, b)]).max(initial=0))
                   for s in steps) - typical
        rows.append({"clock": c["clock"], "write_s": b - a, "take_s": c["taken"] - a,
                     "held_s": max(held, 0.0), "copy_turn_s": c.get("copy_turn_s", 0.0),
                     "start_writer_s": c.get("start_writer_s", 0.0),
                     "spread_s": c.get("spread_s", 0.0),
                     "writer_cpu_s": c.get("writer_cpu_s")})
    # Clocks completed per second (both workers) while a file was being written, and outside.
    ends = np.concatenate([s[s[:, 1] >= begin, 1] for s in steps])
    in_windows = np.zeros(ends.shape[0], bool)
    for a, b in windows:
        in_windows |= (ends >= a) & (ends < b)
    window_s = sum(min(b, end) - max(a, begin) for a, b in windows)
    rate_during = in_windows.sum() / window_s
    rate_without = (~in_windows).sum() / (end - begin - window_s)
    # Each write against the stretch without one just before it (from the last file in, or
    # the start): the load this node's neighbours put on it comes and goes over seconds, and
    # one ratio pooled over a run moved 0.78-0.88 between runs of the same code; the median
    # of these paired ones moves less.
    paired, last = [], begin
    for a, b in windows:
        if a - last >= 0.5 and b <= end:
            before = ((ends >= last) & (ends < a)).sum() / (a - last)
            inside = ((ends >= a) & (ends < b)).sum() / (b - a)
            paired.append(float(inside / before))
        last = b
    # The same for the two phases of a write: the table's copy (a span at a time between
    # the server's requests), then the file written from it (the writer).
    phases = {}
    for phase, spans in (("copy", [(a, c.get("copied", a)) for (a, b), c in
                                   zip(windows, _in_windows(server, begin, end))]),
                         ("file", [(c.get("copied", a), b) for (a, b), c in
                                   zip(windows, _in_windows(server, begin, end))])):
        inside = np.zeros(ends.shape[0], bool)
        for a, b in spans:
            inside |= (ends >= a) & (ends < b)
        seconds = sum(b - a for a, b in spans)
        phases[f"{phase}_s"] = seconds / len(spans)
        phases[f"throughput_{phase}"] = (inside.sum() / seconds / rate_without
                                         if seconds > 0 else None)
    write_s = max(r["write_s"] for r in rows)
    held_s = max(r["held_s"] for r in rows)
    cpu = [r["writer_cpu_s"] for r in rows if r["writer_cpu_s"] is not None]
    phases["writer_cpu_s"] = float(np.median(cpu)) if cpu else None
    # The share of the node's cores the writing process took while the file was written: on
    # a node whose ranks leave no core idle, about what the ranks lose then.
    phases["writer_core_share"] = (phases["writer_cpu_s"] / (os.cpu_count() * phases["file_s"])
                                   if cpu and phases["file_s"] > 0 else None)
    return {"mode": mode, "workers": len(steps), "keys": server["keys"],
            "table_mb": server["table_bytes"] / 1e6,
            "server_pss_mb": server["pss_kb"] / 1e3, "checkpoints": rows,
            "typical_clock_s": typical, "write_s": write_s, "held_s": held_s,
            "held_of_write": held_s / write_s,
            "clocks_per_s_during": rate_during, "clocks_per_s_without": rate_without,
            "throughput_during": rate_during / rate_without,
            "throughput_paired": paired, "throughput_paired_median":
                float(np.median(paired)) if paired else None, **phases,
            # what a checkpoint costs the workers in all: the clocks they would have done
            "clocks_lost_per_checkpoint": (rate_without - rate_during) * window_s / len(windows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--dir", default=os.path.join(HERE, "out", "checkpoint"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "checkpoint.json"))
    parser.add_argument("--serve-seconds", type=float, default=24.0)
    parser.add_argument("--every", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=2,
                        help="workers serving beside the server (default %(default)s: with "
                             "the server, more ranks than this machine's 2 cores)")
    parser.add_argument("--writers", default="resident,copied,snapshot,fork,inline",
                        help="the ways of writing measured serving, of "
                             f"{','.join(WAYS)} (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the ways this many times in turn (default %(default)s)")
    parser.add_argument("--serving-only", action="store_true",
                        help="skip the table of write and read times per optimizer")
    args = parser.parse_args()
    unknown = sorted(set(args.writers.split(",")) - set(WAYS))
    if unknown:
        parser.error(f"--writers: no way named {', '.join(unknown)} (the ways: {', '.join(WAYS)})")
    os.makedirs(args.dir, exist_ok=True)
    served = [serving(mode, args.keys, args.serve_seconds, args.every, args.dir, args.workers)
              for _ in range(args.repeats) for mode in args.writers.split(",")]
    report_serving(served)
    medians = report_medians(served) if args.repeats > 1 else []
    rows = [] if args.serving_only else [measure(name, args.keys, args.dir) for name in NAMES]
    print(f"{'':8} {'keys':>11} {'MB':>7} {'write s':>8} {'MB/s':>6} {'verify s':>8} "
          f"{'load s':>7} {'read s':>7}")
    for r in rows:
        print(f"{r['optimizer']:8} {r['keys']:>11,} {r['bytes'] / 1e6:7.0f} {r['write_s']:8.2f} "
              f"{r['write_mb_per_s']:6.0f} {r['verify_s']:8.2f} {r['load_s']:7.2f} "
              f"{r['read_s']:7.2f}")
    save(args.out, "checkpoint", rows=rows, serving=served, medians=medians,
         note="rows: one server's shard; read_s = verify_s (checksums) + load_s. serving: "
              f"1 server + {args.workers} workers, AdaGrad, BSP, a timed checkpoint every "
              f"{args.every:g} s; held_s: the longest a worker was held because of a "
              "checkpoint (its longest clock during the write less the median clock), "
              "write_s: from taking the state to the file in; memory_mb: server and "
              "writers together at most (Pss, read from /proc every 0.1 s) beyond the server "
              "before any checkpoint")


MEDIANS = ("held_of_write", "throughput_during", "throughput_paired_median", "throughput_copy",
           "throughput_file", "clocks_lost_per_checkpoint")


def report_medians(served: list) -> list:
    """Each way's median of its runs' figures (MEDIANS), printed; returned as rows."""
    rows = []
    print(f"medians over the repeats: {'way':8} {'runs':>4} "
          + " ".join(f"{m:>{max(len(m), 6)}}" for m in MEDIANS))
    for mode in dict.fromkeys(r["mode"] for r in served):
        runs = [r for r in served if r["mode"] == mode]
        row = {"mode": mode, "runs": len(runs)}
        for m in MEDIANS:
            got = [r[m] for r in runs if r.get(m) is not None]
            row[m] = float(np.median(got)) if got else None
        rows.append(row)
        print(f"{'':25} {mode:8} {len(runs):>4} " + " ".join(
            f"{row[m]:>{max(len(m), 6)}.3f}" if row[m] is not None else f"{'-':>{max(len(m), 6)}}"
            for m in MEDIANS))
    return rows


def report_serving(served: list) -> None:
    print(f"serving {served[0]['keys']:,} keys (table {served[0]['table_mb']:.0f} MB, server "
          f"{served[0]['server_mb']:.0f} MB), a checkpoint every few seconds:")
    print(f"{'writer':8} {'files':>5} {'write s':>8} {'held s':>8} {'held/write':>10} "
          f"{'take ms':>8} {'span ms':>8} {'start ms':>8} {'clocks/s during':>15} "
          f"{'without':>8} {'ratio':>6} {'lost':>5} {'memory MB':>9}")
    for r in served:
        def most(field: str) -> float:
            return max(c.get(field, 0.0) for c in r["checkpoints"]) * 1e3
        print(f"{r['mode']:8} {len(r['checkpoints']):>5} {r['write_s']:8.3f} "
              f"{r['held_s']:8.3f} {r['held_of_write']:10.3f} {most('take_s'):8.1f} "
              f"{most('copy_turn_s'):8.2f} {most('start_writer_s'):8.2f} "
              f"{r['clocks_per_s_during']:15.1f} {r['clocks_per_s_without']:8.1f} "
              f"{r['throughput_during']:6.2f} {r['clocks_lost_per_checkpoint']:5.0f} "
              f"{r['memory_mb'] if r['with_writer_mb'] else float('nan'):9.0f}")
        if r["throughput_paired"]:
            print(f"{'':8} clocks/s during each write against the stretch before it: "
                  f"{' '.join(f'{x:.2f}' for x in r['throughput_paired'])} (median "
                  f"{r['throughput_paired_median']:.2f})")
        held = " ".join(f"{c['held_s'] / c['write_s']:.3f}" for c in r["checkpoints"])
        spread = max(c.get("spread_s", 0.0) for c in r["checkpoints"])
        print(f"{'':8} held/write per checkpoint: {held}"
              + (f" (each file spread over {spread:.1f} s at least, as jobs do)" if spread else ""))
        if r["compiled"]:
            print(f"{'':8} kernels compiled while serving (a rank held that long; `make "
                  f"kernels` builds them ahead): {', '.join(r['compiled'])}")
        if r.get("throughput_file") is not None and r["copy_s"] > 0:
            print(f"{'':8} the table's copy {r['copy_s']:.2f} s at {r['throughput_copy']:.2f} "
                  f"of the clocks/s without, then the file {r['file_s']:.2f} s at "
                  f"{r['throughput_file']:.2f}"
                  + (f" (its writer {r['writer_cpu_s']:.2f} CPU-s a file, "
                     f"{r['writer_core_share']:.0%} of the node's {os.cpu_count()} cores then)"
                     if r.get("writer_core_share") else ""))
    print("(write s, held s: the longest over the checkpoints; take ms: the longest the server "
          "took to take the state; span ms: its longest turn copying a span; start ms: its "
          "longest turn starting the writer (a fork, or the task sent); lost: the clocks a "
          "checkpoint cost the workers, (without - during) x its write time; memory: server and "
          "writers at most beyond the server before any checkpoint, Pss; targets for resident "
          "(what jobs do): held/write <= 0.05, ratio (and the paired median) >= 0.90)")


if __name__ == "__main__":
    main()
