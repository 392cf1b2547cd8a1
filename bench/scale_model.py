"""A model of scale: examples/s of a BSP job on up to 1,000 nodes, from costs measured here.

    python bench/scale_model.py [--quick] [--network ib-hdr --network 25gbe] [--cores-per-node 1]

No machine here has more than 2 cores, so this predicts instead of measuring. It measures
the costs that one clock (one minibatch per worker) is made of, on a CTR-like set (1,000,000
rows of 20 hashed features, made once in bench/data/, converted to binary shards), with
minibatches of 1,000 rows and 2 epochs:

  worker kernels  (in one process) per example: reading the minibatch and finding its
                  sorted unique keys; its gradient. Per key: splitting the keys by server
                  and putting the values back in order (when there are 2 or more servers)
  one server and one worker  (mpiexec -n 2, the training loop's messages: each clock's push
                  and the next clock's pull as one message, BSP) for each share 1/k of every
                  minibatch's keys (the share a server gets when there are k servers): the
                  server's handling time (CPU, comm.handling_cpu_s) and the worker's time
                  outside waits, per clock; a
                  straight line through them gives the cost per worker (its message of a
                  clock handled) and per key found, read and updated
  the link        an MPI ping-pong of 3 messages of the sizes a pull, its reply and a push
                  take: latency and bandwidth of the local link

A clock under BSP (see clock()): every worker pushes, with the pull for the next clock in
the same message; each server applies every worker's push and answers every worker's pull
(held until the clock is complete), the replies cross, the workers compute their gradients;
meanwhile each worker found the keys of the minibatch after. Examples/s = workers x rows per
minibatch / the clock. The bound named is the largest term on that path: worker compute,
server per-key work, server per-message work (each server handles a message of every worker
every clock), NIC bandwidth, or latency. Ranks beyond the cores share them (the runs here);
at scale each process has a core, --cores-per-node processes share a node's NIC, servers and
workers on nodes apart.

It checks the model against real runs here (1 server + 1 worker, 1+2, 2+1, 1+3, 2+2 on 2
cores; `--repeats` rounds of every measurement, the fastest of each counts, as other work on
this machine only slows them), then predicts examples/s against nodes with
the best servers-to-workers split at each size, for InfiniBand HDR (200 Gb/s, 1.5 us) and
25 GbE (25 Gb/s, 15 us) or a link given by --latency-us and --gbps. Writes
bench/results/scale_model.json and bench/results/scale_model.png. --quick measures nothing:
it takes the measurements from the last JSON and only runs the model (a second).

Every timed step runs in its own process under `flock /tmp/mpips-bench.lock`, so that
another benchmark on this machine does not run at the same time.
"""
import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from report import save  # noqa: E402
from workers import mpiexec, run  # noqa: E402

from mpips.wire.protocol import HEADER_BYTES, REPORT_BYTES  # noqa: E402

OUT = os.path.join(HERE, "results", "scale_model.json")
PLOT = os.path.join(HERE, "results", "scale_model.png")
WORK = os.path.join(HERE, "out", "scale")
DATA = os.path.join(HERE, "data", "scale")
LOCK = "/tmp/mpips-bench.lock"
ROWS, NNZ, FEATURES = 1_000_000, 20, 1 << 20
BATCH, EPOCHS = 1000, 2
LAYOUTS = [(1, 1), (1, 2), (2, 1), (1, 3), (2, 2)]    # (servers, workers) run here
SHARES = (1, 4, 32, 256)       # the probe's shares 1/k of each minibatch's keys
SPLIT_SERVERS = 8              # servers the keys are split over when timing the split
NODES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 1024)
TIMEOUT = 120.0
SPIN_S = 2e-3         # mpips.bounded.Backoff: a wait polls, yielding, for 2 ms, then sleeps
EPS = 1e-12           # seconds: less is nothing left to run


# ---- the model: pure functions --------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    name: str
    latency_s: float           # one message, end to end
    bandwidth: float           # bytes/s of one NIC, each direction


PRESETS = {
    "ib-hdr": Link("InfiniBand HDR", 1.5e-6, 200e9 / 8),
    "25gbe": Link("25 GbE", 15e-6, 25e9 / 8),
}


@dataclass(frozen=True)
class Costs:
    """What one clock is made of, as measured (seconds, bytes)."""
    batch: int                      # rows per minibatch
    keys_per_batch: float           # unique keys of a minibatch (the bias among them)
    keys_s_per_example: float       # a worker reading a row and finding its keys
    gradient_s_per_example: float   # a worker's gradient kernel
    client_s_per_server: float      # a worker's message of a clock and its reply, one server
    #                                 (the probe has one server: its per-call cost counts here)
    client_s_per_key: float         # a worker packing a key and its values
    split_s_per_key: float          # grouping keys by server and values back (2+ servers)
    server_s_per_worker: float      # a server handling one worker's message of a clock
    server_s_per_key: float         # a server finding, reading and updating a key
    key_bytes: int = 8              # a pull sends the keys; pushes reuse them (SAME_KEYS)
    value_bytes: int = 4            # float32, width 1, in the reply and in the push


@dataclass(frozen=True)
class Shape:
    servers: int
    workers: int
    cores: int | None = None        # cores the ranks share; None: one each
    per_node: int = 1               # processes of a kind sharing a node's NIC


def shared_finish(works: list, cores: int | None, polling: tuple = ()) -> list:
    """When each of `works` (CPU seconds, started together) ends, on `cores` shared evenly by
    the ranks working and the ranks polling, none faster than one core. A rank that waits
    polls for its first SPIN_S, then sleeps; `polling` is how long each rank with no work
    here has waited already, and a rank whose work ends starts polling."""
    if cores is None or cores >= len(works) + len(polling):
        return list(works)
    left, finish = list(works), [None] * len(works)
    idle_since = [-age for age in polling]
    t = 0.0
    while None in finish:
        running = [i for i, f in enumerate(finish) if f is None]
        spinning = [since + SPIN_S for since in idle_since + [f for f in finish if f is not None]
                    if since + SPIN_S > t + EPS]
        rate = min(1.0, cores / (len(running) + len(spinning)))
        step = min([left[i] / rate for i in running] + [end - t for end in spinning])
        t += step
        for i in running:
            left[i] -= rate * step
            if left[i] <= EPS:
                finish[i] = t
    return finish


def client_s(c: Costs, servers: int) -> float:
    """A worker's time per clock in its messages: per server, per key, and the split."""
    split = c.split_s_per_key if servers > 1 else 0.0
    return servers * c.client_s_per_server + c.keys_per_batch * (c.client_s_per_key + split)


def nic_bytes(c: Costs, s: Shape) -> float:
    """Bytes per clock through the busiest NIC, in its busier direction: a server node's
    (pulls' keys and pushes in, replies out) or a worker node's (the opposite)."""
    keys = c.keys_per_batch / s.servers
    server_in = s.workers * (2 * HEADER_BYTES + REPORT_BYTES
                             + keys * (c.key_bytes + c.value_bytes))
    server_out = s.workers * keys * c.value_bytes
    worker_out = s.servers * (2 * HEADER_BYTES + REPORT_BYTES) \
        + c.keys_per_batch * (c.key_bytes + c.value_bytes)
    worker_in = c.keys_per_batch * c.value_bytes
    return max(min(s.per_node, s.servers) * max(server_in, server_out),
               min(s.per_node, s.workers) * max(worker_in, worker_out))


def bytes_per_example(c: Costs, s: Shape) -> float:
    """All parameter-server bytes sent per example trained, as summary.json counts them."""
    per_worker = s.servers * (2 * HEADER_BYTES + REPORT_BYTES) \
        + c.keys_per_batch * (c.key_bytes + 2 * c.value_bytes)
    return per_worker / c.batch


def clock(c: Costs, link: Link, s: Shape) -> dict:
    """One BSP clock: its seconds, its terms and the bound. From the pushes: each server
    applies every worker's push and serves every worker's pull (held until then) while each
    worker finds the next minibatch's keys and makes their pull (`pre`); the replies cross;
    each worker computes its gradient and pushes, the pull with it (`post`). A worker's client time is half in
    pre, half in post. The bound: worker compute if the workers end the first part last,
    else the largest server-side term."""
    client = client_s(c, s.servers)
    pre = c.keys_s_per_example * c.batch + client / 2
    post = c.gradient_s_per_example * c.batch + client / 2
    terms = {"server per-key work": s.workers * c.keys_per_batch / s.servers * c.server_s_per_key,
             "server per-message work": s.workers * c.server_s_per_worker,
             "NIC bandwidth": nic_bytes(c, s) / link.bandwidth,
             "latency": 2 * link.latency_s}
    serve = terms["server per-key work"] + terms["server per-message work"]
    ends = shared_finish([pre] * s.workers + [serve] * s.servers, s.cores)
    found, done = max(ends[:s.workers]), ends[s.workers:]
    served = max(done) + terms["NIC bandwidth"] + terms["latency"]
    phase = max(found, served)
    computed = max(shared_finish([post] * s.workers, s.cores, tuple(phase - d for d in done)))
    seconds = phase + computed
    bound = "worker compute" if found >= served else max(terms, key=terms.get)
    return {"seconds": seconds, "bound": bound, "worker_pre_s": pre, "worker_post_s": post,
            **{k.replace(" ", "_").replace("-", "_") + "_s": v for k, v in terms.items()}}


def examples_per_s(c: Costs, link: Link, s: Shape) -> float:
    return s.workers * c.batch / clock(c, link, s)["seconds"]


def ceiling(c: Costs) -> float:
    """Examples/s no split passes: every clock each server handles a message (a push and
    the next pull) from every worker, so a clock takes at least workers x that time."""
    return c.batch / c.server_s_per_worker


def processes(nodes: int, cores_per_node: int) -> int:
    """A process per core; one node of one core still runs a server and a worker."""
    return max(2, nodes * cores_per_node)


def cluster(nodes: int, cores_per_node: int, servers: int) -> Shape:
    """`nodes` x `cores_per_node` processes, `servers` of them servers, a core each unless
    there are more processes than cores."""
    cores = nodes * cores_per_node
    procs = processes(nodes, cores_per_node)
    return Shape(servers, procs - servers, cores=cores if procs > cores else None,
                 per_node=cores_per_node)


def best_split(c: Costs, link: Link, nodes: int, cores_per_node: int = 1) -> dict:
    """The number of servers that gives the most examples/s on `nodes`, with its figures."""
    best = max((cluster(nodes, cores_per_node, s)
                for s in range(1, processes(nodes, cores_per_node))),
               key=lambda shape: examples_per_s(c, link, shape))
    return {"nodes": nodes, "servers": best.servers, "workers": best.workers,
            "examples_per_s": examples_per_s(c, link, best), **clock(c, link, best)}


# ---- calibration: costs from measurements (pure) --------------------------------------------

def fit_line(x, y) -> tuple:
    """(intercept, slope) of the line through the points that fits each point's relative
    error, not its absolute one. The probe's points run from about 20 us (33 keys) to 250 us
    (8,382 keys): a plain least-squares line fits the largest best, where the table's work
    per key grows a little with the keys (caches), while the per-message cost that bounds a
    large cluster is that of messages of tens of keys (each of 100 servers gets about 80 of
    a minibatch's keys)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    slope, intercept = np.polyfit(x, y, 1, w=1.0 / np.abs(y))
    return float(intercept), float(slope)


def link_from_pingpong(rounds: list) -> Link:
    """The local link from ping-pong rounds of 3 messages: time = 3 latency + bytes /
    bandwidth."""
    fixed, per_byte = fit_line([r["bytes"] for r in rounds], [r["seconds"] for r in rounds])
    return Link("local (measured)", max(fixed / 3, 0.0), 1.0 / per_byte)


def calibrate(kernels: dict, probe: list) -> Costs:
    """Costs from the kernel timings and the one-server probe (a line per side through its
    shares: keys per clock against seconds per clock)."""
    keys = [p["keys_per_clock"] for p in probe]
    server_fixed, server_per_key = fit_line(keys, [p["server_s_per_clock"] for p in probe])
    client_fixed, client_per_key = fit_line(keys, [p["worker_s_per_clock"] for p in probe])
    return Costs(batch=kernels["batch"], keys_per_batch=kernels["keys_per_batch"],
                 keys_s_per_example=kernels["keys_s_per_example"],
                 gradient_s_per_example=kernels["gradient_s_per_example"],
                 client_s_per_server=client_fixed, client_s_per_key=client_per_key,
                 split_s_per_key=kernels["split_s_per_key"],
                 server_s_per_worker=server_fixed, server_s_per_key=server_per_key)


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


# ---- measurements (each in its own process, under the lock) ---------------------------------

def locked(cmd: list) -> list:
    return ["flock", LOCK] + cmd


def dataset() -> str:
    """The binary shards of the CTR-like set, made once in bench/data/."""
    if not os.path.exists(DATA + ".train.svm"):
        run([sys.executable, "-m", "mpips", "make-data", "--rows", str(ROWS), "--test-rows",
             "1000", "--features", str(FEATURES), "--nnz", str(NNZ), "--seed", "1", DATA])
    if not os.path.exists(DATA + ".train.bin/meta.json"):
        run([mpiexec(), "-n", "2", sys.executable, "-m", "mpips", "convert", "--overwrite",
             DATA + ".train.svm", DATA + ".train.bin"])
    return DATA + ".train.bin"


def minibatch_keys(path: str) -> list:
    """Each minibatch's sorted unique keys (the bias key among them), one epoch."""
    from mpips.data.textfile import KeyIndexer
    from mpips.data.shards import CsrShard
    index = KeyIndexer()
    return [index(rows, True)[0].copy() for rows in CsrShard(path).minibatches(BATCH)]


def split_and_back(placement, keys: np.ndarray, values: np.ndarray) -> tuple:
    """What a worker does per key with 2+ servers: the keys grouped by server, the
    replies' values put back in key order, the gradient grouped by server."""
    perm, _ = placement.by_server(keys)
    back = np.empty_like(values)
    back[perm] = values
    return keys[perm], back, values[perm]


def time_kernels(path: str) -> dict:
    """A worker's numeric work per example over EPOCHS passes (reading and finding keys;
    the gradient) and the split of each minibatch's keys over SPLIT_SERVERS servers."""
    from mpips.data.textfile import KeyIndexer
    from mpips.models.catalog import LogisticRegression
    from mpips.wire.placement import Placement
    from mpips.data.shards import CsrShard
    index, model, placement = KeyIndexer(), LogisticRegression(), Placement(SPLIT_SERVERS)
    weights = np.random.default_rng(0).normal(0, 0.3, (1 << 16, 1)).astype(np.float32)
    keys_s = gradient_s = split_s = 0.0
    keys_total = examples = 0
    for _ in range(EPOCHS):
        batches = CsrShard(path).minibatches(BATCH)
        while True:
            start = time.perf_counter()
            rows = next(batches, None)
            if rows is None:
                break
            keys, cols, bias_col = index(rows, True)
            found = time.perf_counter()
            grad, _ = model.gradient(rows, cols, bias_col, weights[:keys.shape[0]])
            computed = time.perf_counter()
            split_and_back(placement, keys, grad)
            split_s += time.perf_counter() - computed
            keys_s += found - start
            gradient_s += computed - found
            keys_total += keys.shape[0]
            examples += len(rows)
    return {"batch": BATCH, "epochs": EPOCHS, "examples": examples,
            "keys_per_batch": keys_total / (examples / BATCH),
            "keys_s_per_example": keys_s / examples,
            "gradient_s_per_example": gradient_s / examples,
            "split_s_per_key": split_s / keys_total, "split_servers": SPLIT_SERVERS}


def share_of(batches: list, k: int) -> list:
    """Server 0's part of each minibatch's keys when k servers hold them (none empty)."""
    from mpips.wire.placement import Placement
    placement = Placement(k)
    parts = []
    for keys in batches:
        perm, offsets = placement.by_server(keys)
        part = keys if perm is None else keys[perm[offsets[0]:offsets[1]]]
        if part.shape[0]:
            parts.append(part)
    return parts


def probe_worker(roles, parts: list) -> tuple:
    """One session of the training loop's messages over `parts` EPOCHS times (each clock's
    push and the next clock's pull in one message): (seconds, seconds waited, clocks)."""
    from mpips.worker.kvworker import KVWorker
    kv = KVWorker(roles, width=1, timeout=TIMEOUT)
    grads = np.full((max(p.shape[0] for p in parts), 1), 1e-4, np.float32)
    order = parts * EPOCHS
    start = time.perf_counter()
    pull, push = kv.pull(order[0]), None
    for i, keys in enumerate(order):
        ahead = kv.pull(order[i + 1], with_push=True) if i + 1 < len(order) else None
        kv.wait(pull)
        if push is not None:
            kv.wait(push)
        push = kv.push(keys, grads[:keys.shape[0]], clock=True)
        pull = ahead
    kv.wait(push)
    seconds = time.perf_counter() - start
    kv.finish()
    kv.close()
    return seconds, kv.wait_s, len(order)


def probe_server(roles) -> float:
    """Serve one worker session under BSP on a new table; seconds spent handling it."""
    from comm import handling_cpu_s
    from mpips.wire.clocks import ClockTable
    from mpips.models.optimizer import Optimizer
    from mpips.server.loop import Server
    from mpips.server.store import KVStore
    store = KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.05))
    return handling_cpu_s(Server(roles, store, ClockTable(1, staleness=0), timeout=TIMEOUT))


def probe(out: str) -> None:
    """Rank 0 serves, rank 1 runs a session per share and then the raw ping-pong; rank 1
    writes what it measured to `out`."""
    from mpi4py import MPI

    from comm import raw_rounds, raw_server, wire
    from mpips.ranks.roles import split
    roles = split(1, MPI.COMM_WORLD)
    comm = MPI.COMM_WORLD.Dup()
    sizes = (10, 1000, 10_000, 100_000)
    if roles.is_server:
        probe_server(roles)                         # the warm-up session
        comm.Send(np.array([probe_server(roles) for _ in SHARES]), dest=1)
        for n in sizes:
            raw_server(comm, n, "reuse")
    else:
        batches = minibatch_keys(DATA + ".train.bin")
        probe_worker(roles, batches[:20])
        rows = []
        for k in SHARES:
            parts = share_of(batches, k)
            seconds, waited, clocks = probe_worker(roles, parts)
            rows.append({"share": k, "clocks": clocks,
                         "keys_per_clock": sum(p.shape[0] for p in parts) / len(parts),
                         "worker_s_per_clock": (seconds - waited) / clocks,
                         "clock_s": seconds / clocks})
        busy = np.empty(len(SHARES))
        comm.Recv(busy, source=0)
        for row, seconds in zip(rows, busy.tolist()):
            row["server_s_per_clock"] = seconds / row["clocks"]
        pingpong = [{"bytes": sum(wire(n, "reuse")),
                     "seconds": float(np.median(raw_rounds(comm, n, "reuse", 200)))}
                    for n in sizes]
        with open(out, "w") as f:
            json.dump({"shares": rows, "pingpong": pingpong}, f, indent=2)
    comm.Free()
    roles.free()


def train_run(servers: int, workers: int, path: str, repeat: int) -> dict:
    """One training job of the layout, under the lock: its summary's figures."""
    out = os.path.join(WORK, f"s{servers}w{workers}r{repeat}")
    run(locked([mpiexec(), "-n", str(servers + workers), sys.executable, "-m", "mpips", "train",
                "--servers", str(servers), "--train", path, "--batch-size", str(BATCH),
                "--epochs", str(EPOCHS), "--out", out, "--overwrite"]))
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return {k: s[k] for k in ("examples_per_s", "train_s", "bytes_per_example", "wait_s",
                              "server_busy")}


def in_child(flag: str, repeat: int) -> dict:
    """Run this script with `flag` in its own process under the lock; what it wrote."""
    out = os.path.join(WORK, f"{flag.strip('-')}{repeat}.json")
    launcher = [mpiexec(), "-n", "2"] if flag == "--probe" else []
    run(locked(launcher + [sys.executable, __file__, flag, out]))
    with open(out) as f:
        return json.load(f)


def measure(repeats: int) -> dict:
    """Everything the model is calibrated and checked with: `repeats` rounds of the kernels,
    the probe and every layout, so that drift on this machine hits them alike."""
    path = dataset()
    os.makedirs(WORK, exist_ok=True)
    kernels, probes, runs = [], [], {layout: [] for layout in LAYOUTS}
    for repeat in range(repeats):
        print(f"[{repeat + 1}/{repeats}] the worker's kernels, the probe, the runs", flush=True)
        kernels.append(in_child("--kernels", repeat))
        probes.append(in_child("--probe", repeat))
        for servers, workers in LAYOUTS:
            runs[(servers, workers)].append(train_run(servers, workers, path, repeat))
    return {"kernels": kernels, "probes": probes,
            "runs": [{"servers": s, "workers": w, "each": rs} for (s, w), rs in runs.items()]}


def fastest(rows: list) -> dict:
    """Each field's smallest value over repeated measurements of the same things: other work
    on this machine only ever slows them (the fields are times, or the same every time)."""
    return {k: min(r[k] for r in rows) for k in rows[0]}


def summarize(measured: dict) -> tuple:
    """(kernels, probe shares, ping-pong rounds, runs): the fastest of the repeats."""
    probes = measured["probes"]
    runs = [{"servers": r["servers"], "workers": r["workers"],
             "examples_per_s": max(e["examples_per_s"] for e in r["each"]),
             "bytes_per_example": min(e["bytes_per_example"] for e in r["each"])}
            for r in measured["runs"]]
    return (fastest(measured["kernels"]),
            [fastest(rows) for rows in zip(*(p["shares"] for p in probes))],
            [fastest(rows) for rows in zip(*(p["pingpong"] for p in probes))], runs)


# ---- report ---------------------------------------------------------------------------------

def local_checks(c: Costs, link: Link, runs: list, cores: int) -> list:
    """Each run here beside the model's examples/s and bytes/example for it."""
    rows = []
    for r in runs:
        shape = Shape(r["servers"], r["workers"], cores=cores,
                      per_node=r["servers"] + r["workers"])
        predicted = examples_per_s(c, link, shape)
        rows.append({**r, "predicted_examples_per_s": predicted,
                     "relative_error": relative_error(predicted, r["examples_per_s"]),
                     "predicted_bytes_per_example": bytes_per_example(c, shape),
                     "bound": clock(c, link, shape)["bound"]})
    return rows


def print_costs(c: Costs, link: Link) -> None:
    print(f"\ncosts measured here: {c.keys_per_batch:,.0f} unique keys per minibatch of "
          f"{c.batch:,} rows")
    print(f"  worker: {c.keys_s_per_example * 1e6:.3f} us/example reading + keys, "
          f"{c.gradient_s_per_example * 1e6:.3f} us/example gradient; "
          f"{c.client_s_per_server * 1e6:.1f} us per server + {c.client_s_per_key * 1e9:.1f} ns "
          f"per key in messages (+ {c.split_s_per_key * 1e9:.1f} ns/key split, 2+ servers)")
    print(f"  server: {c.server_s_per_worker * 1e6:.1f} us per worker (its message of a clock: "
          f"a push and the next pull) + {c.server_s_per_key * 1e9:.1f} ns per key found, read "
          f"and updated")
    print(f"  local link: {link.latency_s * 1e6:.2f} us latency, "
          f"{link.bandwidth / 1e9:.1f} GB/s")


def print_local(rows: list, cores: int) -> None:
    print(f"\nruns here ({cores} cores; the best examples/s of the repeats)")
    print(f"{'servers':>7} {'workers':>7} {'measured':>10} {'model':>10} {'error':>7} "
          f"{'bytes/ex':>8} {'model':>7}  bound")
    for r in rows:
        print(f"{r['servers']:>7} {r['workers']:>7} {r['examples_per_s']:>10,.0f} "
              f"{r['predicted_examples_per_s']:>10,.0f} {r['relative_error']:>+7.1%} "
              f"{r['bytes_per_example']:>8.1f} {r['predicted_bytes_per_example']:>7.1f}  "
              f"{r['bound']}")


def print_scale(link: Link, rows: list, cores_per_node: int) -> None:
    print(f"\n{link.name}: {link.bandwidth * 8 / 1e9:g} Gb/s, {link.latency_s * 1e6:g} us; "
          f"{cores_per_node} process(es) per node, the best split at each size")
    print(f"{'nodes':>6} {'servers':>7} {'workers':>7} {'examples/s':>12} {'clock ms':>8}  bound")
    for r in rows:
        print(f"{r['nodes']:>6} {r['servers']:>7} {r['workers']:>7} {r['examples_per_s']:>12,.0f} "
              f"{r['seconds'] * 1e3:>8.2f}  {r['bound']}")


MARKERS = {"worker compute": "o", "server per-key work": "s", "server per-message work": "D",
           "NIC bandwidth": "^", "latency": "v"}


def plot(predictions: dict, limit: float, cores_per_node: int, path: str) -> None:
    """Examples/s against nodes, log-log, a line per network, each point marked by its
    bound; the best split written at a few sizes; the servers' per-message ceiling."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    styles = zip(predictions.items(), ("tab:blue", "tab:orange", "tab:green"), (True, False, False))
    for (name, rows), color, filled in styles:
        x = [r["nodes"] for r in rows]
        ax.plot(x, [r["examples_per_s"] for r in rows], color=color, label=name)
        for r in rows:
            ax.scatter(r["nodes"], r["examples_per_s"], marker=MARKERS[r["bound"]], zorder=3,
                       facecolors=color if filled else "none", edgecolors=color, s=40)
            if r["nodes"] in (16, 128, 1000) and filled:
                ax.annotate(f"{r['servers']}:{r['workers']}", (r["nodes"], r["examples_per_s"]),
                            textcoords="offset points", xytext=(-12, 8), fontsize=8)
    first = next(iter(predictions.values()))
    two = next(r["examples_per_s"] for r in first if r["nodes"] == 2)
    ax.plot(x, [two * n / 2 for n in x], ":", color="grey", label="linear from 2 nodes")
    ax.axhline(limit, ls="--", color="grey", lw=0.8,
               label="ceiling: rows per minibatch / a server's time per worker")
    seen = {r["bound"] for rows in predictions.values() for r in rows}
    for bound, marker in MARKERS.items():
        if bound in seen:
            ax.scatter([], [], marker=marker, color="grey", label=f"bound: {bound}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"nodes ({cores_per_node} process(es) each)")
    ax.set_ylabel("examples/s (model)")
    ax.set_title("Predicted throughput at the best servers:workers split (BSP)\n"
                 "labels: servers:workers")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def links(args) -> list:
    chosen = [PRESETS[n] for n in args.network or ("ib-hdr", "25gbe")]
    if args.latency_us is not None or args.gbps is not None:
        base = chosen[0]
        chosen.append(replace(base, name="given",
                              latency_s=base.latency_s if args.latency_us is None
                              else args.latency_us * 1e-6,
                              bandwidth=base.bandwidth if args.gbps is None
                              else args.gbps * 1e9 / 8))
    return chosen


def last_measurements() -> dict:
    if not os.path.exists(OUT):
        sys.exit(f"--quick needs {OUT} from a full run first")
    with open(OUT) as f:
        return json.load(f)["measured"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="measure nothing: the model on the last JSON's measurements")
    parser.add_argument("--repeats", type=int, default=4,
                        help="rounds of every measurement; the fastest of each counts")
    parser.add_argument("--network", action="append", choices=sorted(PRESETS),
                        help="link preset(s) to predict for (default: ib-hdr and 25gbe)")
    parser.add_argument("--latency-us", type=float, help="also predict for this latency")
    parser.add_argument("--gbps", type=float, help="also predict for this bandwidth")
    parser.add_argument("--cores-per-node", type=int, default=1,
                        help="processes per node at scale, sharing its NIC (default: 1)")
    parser.add_argument("--cores", type=int, default=os.cpu_count(),
                        help="cores the runs here share (default: this machine's)")
    parser.add_argument("--kernels", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--probe", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kernels:
        with open(args.kernels, "w") as f:
            json.dump(time_kernels(DATA + ".train.bin"), f)
        return
    if args.probe:
        probe(args.probe)
        return
    measured = last_measurements() if args.quick else measure(args.repeats)
    kernels, shares, pingpong, runs = summarize(measured)
    costs = calibrate(kernels, shares)
    local = link_from_pingpong(pingpong)
    print_costs(costs, local)
    checks = local_checks(costs, local, runs, args.cores)
    print_local(checks, args.cores)
    predictions = {}
    for link in links(args):
        rows = [best_split(costs, link, n, args.cores_per_node) for n in NODES]
        print_scale(link, rows, args.cores_per_node)
        predictions[link.name] = rows
    save(OUT, "scale_model", cpus=os.cpu_count(), cores=args.cores, rows=ROWS, nnz=NNZ,
         features=FEATURES, batch=BATCH, epochs=EPOCHS, cores_per_node=args.cores_per_node,
         measured=measured, costs=asdict(costs), local_link=asdict(local),
         links={link.name: asdict(link) for link in links(args)},
         local_runs=checks,
         mean_abs_error=float(np.mean([abs(r["relative_error"]) for r in checks])),
         ceiling_examples_per_s=ceiling(costs), predictions=predictions)
    plot(predictions, ceiling(costs), args.cores_per_node, PLOT)


if __name__ == "__main__":
    main()
