"""Servers joining and leaving under load, and rebalancing a skewed load (`mpips ctl`).

    python bench/membership.py [--keys 10000000] [--vnodes 16]

Launches itself under mpiexec: 2 servers, a spare and 1 worker (BSP). The worker first
stores --keys keys (AdaGrad, width 1), then trains on minibatches of 20,000 keys drawn from
them, one clock each, and meanwhile asks the job through RUN_DIR/control/, as `mpips ctl`
does: add-server (the spare takes a third of the keys), then remove-server 0. For each
move: the keys copied, how long copying them took (training going on) and the whole move,
how long training waited for the switch, the worker's clocks/s in the 2 s before the
request, from the request to the answer, and in the 2 s after, and its longest clock during
the move. Then a hot shard: half of each minibatch drawn from the keys of 4 of server 1's key
ranges (hashing spreads skewed key frequencies evenly over ranges; a load concentrated on a
few ranges is what rebalancing is for): `rebalance` three times; each answer's busiest
server's reads over the mean, before and (as planned) after; each "before" is the previous
one's measured after (the first's reads counted since the last move, so 2 s of the uniform
load too).
Writes bench/results/membership.json.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from mpips.membership import channel as control  # noqa: E402

BATCH = 20_000
STEADY_S = 2.0


def mpiexec() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else "mpiexec"


def rate(times: list, start: float, end: float) -> float:
    """Clocks per second completed in [start, end)."""
    t = np.asarray(times)
    n = int(((t >= start) & (t < end)).sum())
    return n / max(end - start, 1e-9)


def longest(times: list, start: float, end: float) -> float:
    """The longest time between two clocks ending in [start, end] (or around it)."""
    t = np.asarray(times)
    inside = t[(t >= start) & (t <= end)]
    edges = np.concatenate([t[t < start][-1:], inside, t[t > end][:1]])
    return float(np.diff(edges).max()) if edges.shape[0] > 1 else 0.0


class Trainer:
    """The worker's loop: a clock per minibatch, its end times kept."""

    def __init__(self, kv, draw):
        self.kv, self.draw, self.times = kv, draw, []

    def step(self) -> None:
        keys = self.draw()
        values = self.kv.wait(self.kv.pull(keys))
        self.kv.wait(self.kv.push(keys, 0.01 * (values - 0.5), clock=True))
        self.times.append(time.monotonic())

    def run_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.step()

    def ask(self, run_dir: str, command: str, target=None) -> dict:
        """A ctl request, training meanwhile; the answer and the rates around it."""
        before = time.monotonic()
        self.run_for(STEADY_S)
        asked = time.monotonic()
        ident = control.submit(run_dir, command, target)
        path = os.path.join(run_dir, control.DIRECTORY, f"answer-{ident}.json")
        while not os.path.exists(path):
            self.step()
            if time.monotonic() - asked > 300:
                raise TimeoutError(f"no answer to {command} in 300 s")
        answered = time.monotonic()
        with open(path) as f:
            answer = json.load(f)
        self.run_for(STEADY_S)
        return {"command": command, "target": target, **{k: answer.get(k) for k in (
            "ok", "clock", "fraction_moved", "keys_moved", "copy_s", "seconds", "paused_s",
            "load_spread_before", "load_spread_after", "ranges_after", "servers")},
            "request_to_answer_s": round(answered - asked, 4),
            "clocks_per_s_before": round(rate(self.times, before, asked), 1),
            "clocks_per_s_during": round(rate(self.times, asked, answered), 1),
            "clocks_per_s_after": round(rate(self.times, answered, answered + STEADY_S), 1),
            "longest_clock_s_during": round(longest(self.times, asked, answered), 4)}


def in_mpi(args) -> None:
    from mpi4py import MPI

    from mpips.worker.kvworker import KVWorker
    from mpips.wire.clocks import ClockTable
    from mpips.models.optimizer import Optimizer
    from mpips.wire.placement import Placement, dealt
    from mpips.ranks.roles import split
    from mpips.server.loop import Server
    from mpips.server.store import KVStore
    roles = split(3, MPI.COMM_WORLD)
    placement = Placement(3, assign=dealt(2, args.vnodes))   # server 2: a spare
    if roles.is_server:
        store = KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.1),
                        capacity=int(args.keys / 0.8))
        Server(roles, store, ClockTable(1, 0), timeout=300, placement=placement,
               run_dir=args.run_dir).run()
        return
    kv = KVWorker(roles, width=1, timeout=300, placement=placement)
    began = time.monotonic()
    for start in range(0, args.keys, 1_000_000):
        keys = np.arange(start, min(start + 1_000_000, args.keys), dtype=np.uint64)
        kv.wait(kv.push(keys, np.zeros((keys.shape[0], 1), np.float32), clock=True))
    filled = time.monotonic() - began
    rng = np.random.default_rng(0)
    uniform = Trainer(kv, lambda: np.unique(rng.integers(0, args.keys, BATCH, dtype=np.uint64)))
    uniform.run_for(STEADY_S)   # kernels compiled, caches warm
    moves = [uniform.ask(args.run_dir, "add-server"), uniform.ask(args.run_dir, "remove-server", 0)]
    # Half of each minibatch from 4 key ranges of server 1: a hot shard.
    p = kv.placement
    hot_ranges = np.flatnonzero(p.primary_ranges(1))[:4]
    pool = np.arange(args.keys, dtype=np.uint64)
    hot = pool[np.isin(p.ranges_of(pool), hot_ranges)]
    skewed = Trainer(kv, lambda: np.unique(np.concatenate([
        rng.choice(hot, BATCH // 2), rng.integers(0, args.keys, BATCH // 2, dtype=np.uint64)])))
    # The first rebalance's reads counted since the last move: 2 s of the uniform load too.
    rebalances = [skewed.ask(args.run_dir, "rebalance") for _ in range(3)]
    kv.close()
    with open(args.result, "w") as f:
        json.dump({"fill_s": round(filled, 2), "moves": moves, "rebalances": rebalances}, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--vnodes", type=int, default=16)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "membership.json"))
    parser.add_argument("--in-mpi", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_mpi:
        in_mpi(args)
        return
    from report import save
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = [mpiexec(), "-n", "4", sys.executable, os.path.abspath(__file__), "--in-mpi",
               "--keys", str(args.keys), "--vnodes", str(args.vnodes), "--run-dir", tmp,
               "--result", result]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"the bench job failed:\n{done.stdout}\n{done.stderr}")
        with open(result) as f:
            figures = json.load(f)
    print(f"{args.keys:,} keys stored in {figures['fill_s']:.1f} s; 2 servers, a spare, "
          f"1 worker, {args.vnodes} key ranges per server")
    print(f"{'request':<16}{'moved':>8}{'keys':>12}{'copy s':>8}{'move s':>8}{'waited s':>9}"
          f"{'clocks/s before':>16}{'during':>8}{'after':>8}{'longest clock s':>16}")
    for m in figures["moves"]:
        name = m["command"] + ("" if m["target"] is None else f" {m['target']}")
        print(f"{name:<16}{m['fraction_moved']:>8.3f}{m['keys_moved']:>12,}{m['copy_s']:>8.2f}"
              f"{m['seconds']:>8.2f}{m['paused_s']:>9.2f}{m['clocks_per_s_before']:>16.1f}"
              f"{m['clocks_per_s_during']:>8.1f}{m['clocks_per_s_after']:>8.1f}"
              f"{m['longest_clock_s_during']:>16.2f}")
    for i, r in enumerate(figures["rebalances"]):
        print(f"rebalance {i + 1}: busiest server's reads over the mean {r['load_spread_before']:.3f}"
              f" before, {r['load_spread_after']:.3f} planned after; ranges per server "
              f"{r['ranges_after']}")
    save(args.out, "membership", keys=args.keys, vnodes=args.vnodes, batch=BATCH, **figures)


if __name__ == "__main__":
    main()
