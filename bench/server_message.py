"""A server's CPU per message of the training loop (a worker's push of a clock and its pull
of the next in one message, 10 keys), where the scale model's ceiling comes from: in the
server's own code, and in its running loop.

    python bench/server_message.py [--keys 10] [--rounds 20000]

In process: a fresh server (1 of 1, AdaGrad) is handed recorded messages of 1, 2, 3, 4 and 8
workers, BSP and ASP, as its loop hands them over, with its sends left out: the fewest us a
message of 12 replays of 300 clocks, after 600 messages to warm up (the handling alone).
In the loop (`mpiexec -n 2`, this script with --loop; bench/scale_model.py's probe): a
server serves one worker's --rounds messages after a session of 3,000 to warm up; its
thread's CPU time receiving, handling and answering the messages (`comm.handling_cpu_s`:
the receive, the handling and the reply's send), per message, over 3 launches. Between them,
the kernels of a message on their own (`kernel_parts`). Prints all three and writes
bench/results/server_message.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from report import save  # noqa: E402
from workers import mpiexec  # noqa: E402

from mpips.wire import messages, protocol  # noqa: E402
from mpips.wire.protocol import Header, Op, Report  # noqa: E402

OUT = os.path.join(HERE, "results", "server_message.json")
TIMEOUT = 120.0
REPORT = Report(epoch=0, offset=7, examples=64, loss=3.0, progress=0.25)
WARMUP, CLOCKS, REPLAYS = 600, 300, 12


def bundle(clock: int, keys: np.ndarray, grads: np.ndarray) -> np.ndarray:
    """A worker's message at `clock`: its push of the clock (values for the keys of the pull
    it answers) and its pull for the next, as KVWorker sends them (timestamps 2c+1, 2c+2)."""
    pull = protocol.pack(Header(Op.PULL, ts=2 * clock + 2, nkeys=keys.shape[0]), keys)
    push = protocol.pack(Header(Op.PUSH, ts=2 * clock + 1, nkeys=grads.shape[0], width=1,
                                flags=protocol.SAME_KEYS | protocol.CLOCK | protocol.REPORT,
                                **messages.same_keys_push(2 * clock)), grads, report=REPORT)
    return protocol.bundle(pull, push)


def in_process(workers: int, staleness, n_keys: int) -> float:
    """The fewest us a message over the replays (see the module's docstring)."""
    from mpi4py import MPI

    from mpips.models.optimizer import Optimizer
    from mpips.ranks.roles import Roles
    from mpips.server.loop import Server
    from mpips.server.store import KVStore
    from mpips.wire.clocks import ClockTable
    roles = Roles(MPI.COMM_WORLD, MPI.COMM_SELF, (0,), tuple(range(1, 1 + workers)))
    server = Server(roles, KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.1)),
                    ClockTable(workers, staleness), timeout=TIMEOUT)
    server.ctx.outbox.send = lambda buf, dest, tag=0: None
    keys = np.sort(np.random.default_rng(0).choice(1 << 40, n_keys, replace=False)
                   .astype(np.uint64))
    grads = np.full((n_keys, 1), 1e-3, np.float32)
    first = protocol.pack(Header(Op.PULL, ts=0, nkeys=n_keys), keys)
    for w in range(workers):
        server.handle(1 + w, first)
    clocks = (WARMUP + CLOCKS * REPLAYS) // workers + 1
    sent = [bundle(c, keys, grads) for c in range(clocks)]
    clock = 0

    def replay(n: int) -> None:
        nonlocal clock
        for _ in range(n):
            for w in range(workers):
                server.handle(1 + w, sent[clock])
            clock += 1
    replay(WARMUP // workers)
    best = float("inf")
    per = CLOCKS // workers
    for _ in range(REPLAYS):
        start = time.perf_counter()
        replay(per)
        best = min(best, time.perf_counter() - start)
    return best / (per * workers) * 1e6


def best_us(call, reps: int) -> float:
    """The fewest us a call of `call()` over 5 runs of `reps` calls."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            call()
        best = min(best, (time.perf_counter() - start) / reps)
    return best * 1e6


def kernel_parts(n_keys: int) -> dict:
    """The kernels of a message's handling on their own, each over the message's keys in a
    table that holds them (a server's store after its first pull), in us: where the
    in-process figure goes as the keys grow."""
    from mpips.kernels import requests
    from mpips.models.optimizer import Optimizer
    from mpips.server.store import KVStore
    from mpips.wire.placement import Placement
    store = KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.1))
    keys = np.sort(np.random.default_rng(0).choice(1 << 40, n_keys, replace=False)
                   .astype(np.uint64))
    grads = np.full((n_keys, 1), 1e-3, np.float32)
    store.push(keys, grads, 0)
    pull = protocol.pack(Header(Op.PULL, ts=0, nkeys=n_keys), keys)
    bounds, allowed, counts = Placement(1).key_check(0, True, None)
    copied, slots = np.empty(n_keys, np.uint64), np.empty(n_keys, np.int64)
    out, fresh = np.empty((n_keys, 1), np.float32), np.empty(n_keys, np.uint8)
    start = protocol.HEADER_BYTES
    reps = max(10, 300_000 // n_keys)

    def pull_rows():
        requests.pull_rows(pull, start, bounds, allowed, counts, store._rows, store._meta, True,
                           store._limit, copied, slots, out, fresh)
    pull_rows()   # (slots: the keys' rows, for the update)
    return {
        "pull_rows": best_us(pull_rows, reps),
        "key_checks": best_us(lambda: requests.pull_keys(pull, start, bounds, allowed, counts,
                                                         copied), reps),
        "update": best_us(lambda: store.update(slots, grads, 1), reps),
        "first_not_finite": best_us(lambda: requests.first_not_finite(grads), reps),
        "values_copy": best_us(grads.copy, reps)}


def loop_rank(out: str, rounds: int, n_keys: int) -> None:
    """Under mpiexec -n 2: rank 0 serves, rank 1 sends (the scale model's probe, one share of
    `rounds` messages of the same keys); rank 0 writes its figure to `out`."""
    from mpi4py import MPI
    from scale_model import EPOCHS, probe_server, probe_worker

    from mpips.ranks.roles import split
    roles = split(1, MPI.COMM_WORLD)
    if roles.is_server:
        probe_server(roles)   # the warm-up session
        cpu = probe_server(roles)
        with open(out, "w") as f:
            json.dump({"us_per_message": cpu / rounds * 1e6}, f)
    else:
        keys = np.sort(np.random.default_rng(0).choice(1 << 40, n_keys, replace=False)
                       .astype(np.uint64))
        for n in (3000, rounds):   # the warm-up session, then the measured one
            probe_worker(roles, [keys] * (n // EPOCHS))
    roles.free()


def in_loop(rounds: int, n_keys: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "loop.json")
        proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, __file__, "--loop", out,
                               "--rounds", str(rounds), "--keys", str(n_keys)],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            sys.exit(f"the loop's launch failed:\n{proc.stdout}{proc.stderr}")
        with open(out) as f:
            return json.load(f)["us_per_message"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10, help="keys a message (default 10)")
    parser.add_argument("--rounds", type=int, default=20_000,
                        help="messages the loop's measured session sends (default 20000)")
    parser.add_argument("--loop", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    args.rounds -= args.rounds % 2   # the probe sends its keys over 2 epochs
    if args.loop:
        loop_rank(args.loop, args.rounds, args.keys)
        return
    rows = []
    print(f"a server's CPU per message (a push of a clock and the next pull, {args.keys} keys)")
    print(f"{'workers':>7} {'BSP us':>7} {'ASP us':>7}   (in process: the handling alone)")
    for workers in (1, 2, 3, 4, 8):
        bsp, asp = in_process(workers, 0, args.keys), in_process(workers, None, args.keys)
        rows.append({"workers": workers, "bsp_us": bsp, "asp_us": asp})
        print(f"{workers:>7} {bsp:7.2f} {asp:7.2f}", flush=True)
    parts = kernel_parts(args.keys)
    print(f"its kernels on their own ({args.keys} keys, us; ns a key): " + ", ".join(
        f"{name} {us:.1f} ({us * 1e3 / args.keys:.1f})" for name, us in parts.items())
        + " (pull_rows: the checks, hash, probe and read; key_checks: the checks alone; "
          "update: AdaGrad's, through the store)")
    loops = [in_loop(args.rounds, args.keys) for _ in range(3)]
    print(f"in the running loop (mpiexec -n 2, 1 worker, BSP): "
          f"{', '.join(f'{u:.1f}' for u in loops)} us a message (median "
          f"{statistics.median(loops):.1f}); beyond the handling alone: "
          f"{statistics.median(loops) - rows[0]['bsp_us']:.1f} us (the receive, the reply's "
          f"send and the loop's own turn)")
    save(args.out, "server_message", keys=args.keys, rounds=args.rounds,
         in_process=rows, kernels_us=parts, in_loop_us=loops)


if __name__ == "__main__":
    main()
