"""Communication cost: a pull + push through mpips beside a raw MPI ping-pong of the same bytes.

    mpiexec -n 2 python bench/comm.py

Rank 0 is a server, rank 1 a worker. For each key count n, the worker times
rounds of one pull (waiting for its reply) and one push of the same keys
(clock=True, ASP so nothing waits for clocks), against a warm server table, in
two variants:
  reuse  the push passes the pull's own key array, so it sends only the values
         (the server reuses that pull's keys and rows): H + 8n bytes out, 4n back,
         H + 4n out, with H = protocol.HEADER_BYTES;
  keys   the push passes another array of the same keys, so it sends keys and
         values: H + 8n out, 4n back, H + 12n out;
  fused  as training sends them: the next round's pull is made first (pull with_push,
         while the reply to this one is awaited) and travels with this round's push (reusing
         this pull's keys), one message: 2H + 12n out, 4n back (ps-lite's push-pull).
Right after each, the same exchange with plain blocking MPI Send/Recv of
preallocated uint8 buffers of those sizes (no packing, table or optimizer), on a
communicator of its own. Prints the median time per round, keys/s, the ratio
mpips / raw, the server's handling time per round (its thread's CPU time receiving,
handling and answering requests: `handling_cpu_s`), the
messages it received per round and how full its table is (keys / rows: a lookup's probes
grow with it); then fused 10-key rounds against a server that only answers each pull with
zeros (bare mpi4py: the worker's own part of a round, the rest is the server's), and writes
bench/results/comm.json. The targets (issue 32):
a 10-key round in at most 15 us, a 10,000-key one at most 3x its raw exchange.
"""
import os
import platform
import time

import numpy as np
from mpi4py import MPI

import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from mpips.worker.kvworker import KVWorker
from mpips.wire.clocks import ClockTable
from mpips.models.optimizer import Optimizer
from mpips.wire import protocol, tags
from mpips.wire.protocol import HEADER_BYTES
from mpips.ranks.roles import split
from mpips.server.loop import Server
from mpips.server.store import KVStore
from report import save

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "comm.json")
SIZES = (10, 100, 1000, 10_000, 100_000)
VARIANTS = ("reuse", "keys", "fused")
WARMUP = 5          # rounds before measuring: numba kernels load, the table fills and grows
MIN_ROUNDS = 20
PHASE_S = 0.5       # measured rounds per phase are chosen to last about this long
SMALL_KEYS, SMALL_US = 10, 15.0          # the targets: a 10-key round in 15 us, ...
TARGET_KEYS, TARGET_RATIO = 10_000, 3.0  # ... a 10,000-key one within 3x raw
TIMEOUT = 120.0
SERVER, WORKER = 0, 1


def wire(n: int, variant: str) -> tuple:
    """Bytes of (pull request, its reply, push request) for n keys, as mpips sends them."""
    if variant == "fused":   # one message: the pull's keys, then the push's values
        return 2 * HEADER_BYTES + 12 * n, 4 * n, 0
    push = HEADER_BYTES + (4 if variant == "reuse" else 12) * n
    return HEADER_BYTES + 8 * n, 4 * n, push


def make_keys(n: int) -> np.ndarray:
    """n random unique uint64 keys, sorted; the same ones for every round."""
    keys = np.unique(np.random.default_rng(n).integers(0, 2**64, n, dtype=np.uint64))
    assert keys.shape[0] == n
    return keys


def handling_cpu_s(server: Server) -> float:
    """Run `server` until its workers are done; the CPU seconds its thread spent receiving,
    handling and answering requests (`Server._receive`: Server.stats.busy_s, but CPU time:
    on a machine shared with other jobs wall time also counts theirs), less what the two
    clock reads add to each (`clock_reads_ns`). Not the probes that waited for them."""
    receive, cpu, reads = server._receive, [0], clock_reads_ns()

    def timed_receive(msg, now: float) -> None:
        start = time.thread_time_ns()
        receive(msg, now)
        cpu[0] += time.thread_time_ns() - start - reads
    server._receive = timed_receive
    server.run()
    return cpu[0] / 1e9


def clock_reads_ns(pairs: int = 2001) -> int:
    """What two reads of the thread's CPU clock in a row measure between them, the median
    of `pairs` (what they add to a turn timed by them): a system call, not the vDSO's
    clocks, about 0.8 us in a virtual machine."""
    read = time.thread_time_ns
    return int(np.median([-read() + read() for _ in range(pairs)]))


def serve(roles, store: KVStore) -> tuple:
    """Server: answer one worker session (until it says BYE); (CPU seconds spent handling
    it, messages received, how full its table is: keys / rows)."""
    clocks = ClockTable(len(roles.workers), staleness=None)
    server = Server(roles, store, clocks, timeout=TIMEOUT)
    return handling_cpu_s(server), server.stats.requests, len(store) / store.capacity


def mpips_rounds(roles, keys: np.ndarray, variant: str, rounds: int) -> np.ndarray:
    """Worker: one session of `rounds` pull + push rounds; seconds per round."""
    kv = KVWorker(roles, width=1, timeout=TIMEOUT)
    push_keys = keys if variant == "reuse" else keys.copy()
    grads = np.full((keys.shape[0], 1), 1e-3, np.float32)
    times = np.empty(rounds)
    if variant == "fused":
        pull = kv.pull(keys)
        for i in range(rounds):
            start = time.perf_counter()
            ahead = kv.pull(keys, with_push=True)
            kv.wait(pull)
            kv.wait(kv.push(keys, grads, clock=True))
            pull = ahead
            times[i] = time.perf_counter() - start
        kv.wait(pull)
    else:
        for i in range(rounds):
            start = time.perf_counter()
            kv.wait(kv.pull(keys))
            kv.wait(kv.push(push_keys, grads, clock=True))
            times[i] = time.perf_counter() - start
    kv.finish()
    kv.close()
    return times


# The raw exchange has no ack after the push, because an mpips push has no reply either: its
# wait() ends once the send completes locally, as a blocking Send does. In both, the next
# round's pull queues behind the push at the server, so over many rounds the time to deliver
# and handle each push is part of the time per round.

def raw_server(comm: MPI.Intracomm, n: int, variant: str) -> None:
    """Server side of the raw ping-pong; the worker says how many rounds."""
    rounds = np.empty(1, np.int64)
    comm.Recv(rounds, WORKER)
    pull, reply, push = (np.zeros(size, np.uint8) for size in wire(n, variant))
    for _ in range(WARMUP + int(rounds[0])):
        comm.Recv(pull, WORKER)
        comm.Send(reply, WORKER)
        if push.shape[0]:
            comm.Recv(push, WORKER)


def raw_rounds(comm: MPI.Intracomm, n: int, variant: str, rounds: int) -> np.ndarray:
    """Worker side of the raw ping-pong: seconds per round, after WARMUP untimed rounds."""
    comm.Send(np.array([rounds], np.int64), SERVER)
    pull, reply, push = (np.zeros(size, np.uint8) for size in wire(n, variant))
    times = np.empty(WARMUP + rounds)
    for i in range(times.shape[0]):
        start = time.perf_counter()
        comm.Send(pull, SERVER)
        comm.Recv(reply, SERVER)
        if push.shape[0]:
            comm.Send(push, SERVER)
        times[i] = time.perf_counter() - start
    return times[WARMUP:]


def echo(roles, sessions: int) -> None:
    """A server that only answers: each pull gets as many zeros as it has keys (bare mpi4py,
    no table, no clocks), until `sessions` BYEs; what is left of a round is the worker's."""
    buf, status, zeros = np.empty(1 << 16, np.uint8), MPI.Status(), np.zeros(1 << 14, np.float32)
    n_tags = protocol.reply_tags(roles.comm.Get_attr(MPI.TAG_UB))
    while sessions:
        roles.comm.Recv(buf, MPI.ANY_SOURCE, tags.REQUEST_TAG, status)
        h = protocol.header(buf)
        if h.op == protocol.Op.PULL:
            roles.comm.Send(zeros[:h.nkeys], status.Get_source(),
                            protocol.reply_tag(h.ts, n_tags))
        sessions -= h.op == protocol.Op.BYE


def server_side(roles, comm: MPI.Intracomm) -> None:
    """Rank 0: serve each phase the worker runs, then send it the handling times; then
    only answer (`echo`) a warm-up and a measured session."""
    measured = []
    for n in SIZES:
        store = KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.05))
        for variant in VARIANTS:
            serve(roles, store)                      # the warm-up session
            measured.append(serve(roles, store))     # the measured one
            raw_server(comm, n, variant)
    comm.Send(np.array(measured, np.float64), WORKER)
    echo(roles, sessions=2)


def worker_side(roles, comm: MPI.Intracomm) -> list:
    """Rank 1: for each size and variant, warm up, time mpips, then time the raw exchange."""
    rows = []
    for n in SIZES:
        keys = make_keys(n)
        for variant in VARIANTS:
            warm = mpips_rounds(roles, keys, variant, WARMUP)
            rounds = max(MIN_ROUNDS, int(PHASE_S / np.median(warm)))
            mpips_s = float(np.median(mpips_rounds(roles, keys, variant, rounds)))
            raw_s = float(np.median(raw_rounds(comm, n, variant, rounds)))
            rows.append({"keys": n, "push": variant, "rounds": rounds,
                         "bytes_per_round": sum(wire(n, variant)),
                         "mpips_us": mpips_s * 1e6, "raw_us": raw_s * 1e6,
                         "ratio": mpips_s / raw_s, "keys_per_s": n / mpips_s})
    measured = np.empty((len(rows), 3))
    comm.Recv(measured, source=SERVER)
    for row, (busy_s, messages, load) in zip(rows, measured.tolist()):
        row["server_us"] = busy_s / row["rounds"] * 1e6
        row["messages_per_round"] = messages / row["rounds"]   # FINISH and BYE included
        row["table_load"] = load
    return rows


def worker_alone(roles) -> dict:
    """Rank 1: fused 10-key rounds against `echo` (the worker's own part of a round)."""
    keys = make_keys(SMALL_KEYS)
    warm = mpips_rounds(roles, keys, "fused", 1000)
    rounds = max(MIN_ROUNDS, int(PHASE_S / np.median(warm)))
    times = mpips_rounds(roles, keys, "fused", rounds)
    return {"keys": SMALL_KEYS, "push": "fused", "rounds": rounds,
            "us": float(np.median(times)) * 1e6, "mean_us": float(times.mean()) * 1e6}


def report(rows: list, alone: dict) -> None:
    """Print the table, the worker's part of a round and the target's verdict; write the
    JSON result."""
    print(f"{'keys':>7} {'push':>5} {'rounds':>6} {'bytes/round':>11} {'raw us':>9} "
          f"{'mpips us':>9} {'ratio':>6} {'Mkeys/s':>8} {'server us':>9} {'msgs':>5} "
          f"{'load':>5}")
    for r in rows:
        print(f"{r['keys']:>7,} {r['push']:>5} {r['rounds']:>6} {r['bytes_per_round']:>11,} "
              f"{r['raw_us']:>9.1f} {r['mpips_us']:>9.1f} {r['ratio']:>5.2f}x "
              f"{r['keys_per_s'] / 1e6:>8.2f} {r['server_us']:>9.1f} "
              f"{r['messages_per_round']:>5.2f} {r['table_load']:>5.0%}")
    fused = next(r for r in rows if r["keys"] == SMALL_KEYS and r["push"] == "fused")
    print(f"a fused {SMALL_KEYS}-key round against a server that only answers (the worker's "
          f"own part): {alone['us']:.1f} us (mean {alone['mean_us']:.1f}); the rest of the "
          f"{fused['mpips_us']:.1f} us round, {fused['mpips_us'] - alone['us']:.1f} us, "
          f"waits for the server")
    targets = []
    for variant in ("reuse", "fused"):
        small = next(r for r in rows if r["keys"] == SMALL_KEYS and r["push"] == variant)
        large = next(r for r in rows if r["keys"] == TARGET_KEYS and r["push"] == variant)
        targets += [{"what": f"{SMALL_KEYS}-key round, {variant}", "at_most_us": SMALL_US,
                     "us": small["mpips_us"], "met": small["mpips_us"] <= SMALL_US},
                    {"what": f"{TARGET_KEYS:,}-key round / raw, {variant}",
                     "at_most": TARGET_RATIO, "ratio": large["ratio"],
                     "met": large["ratio"] <= TARGET_RATIO}]
    for t in targets:
        figure = f"{t['us']:.1f} us" if "us" in t else f"{t['ratio']:.2f}x"
        bound = f"{t['at_most_us']:g} us" if "us" in t else f"{t['at_most']:g}x"
        print(f"target: {t['what']} at most {bound}: {figure}, "
              f"{'met' if t['met'] else 'NOT met'}")
    save(OUT, "comm", cpus=os.cpu_count(), machine=platform.machine(),
         mpi=MPI.Get_library_version().replace("\0", "").splitlines()[0],
         key_counts=list(SIZES), warmup_rounds=WARMUP,
         note="per round: median microseconds; ratio = mpips_us / raw_us; "
              "server_us = the server's CPU time receiving, handling and answering requests / "
              "rounds; "
              "messages_per_round: received by the server; table_load: the server's keys / "
              "its table's rows",
         targets=targets, results=rows, worker_alone=alone)


def main() -> None:
    if MPI.COMM_WORLD.size != 2:
        raise SystemExit("run with exactly 2 ranks: mpiexec -n 2 python bench/comm.py")
    roles = split(1, MPI.COMM_WORLD)
    comm = MPI.COMM_WORLD.Dup()   # the raw ping-pong's own communicator
    if roles.is_server:
        server_side(roles, comm)
    else:
        rows = worker_side(roles, comm)
        report(rows, worker_alone(roles))
    comm.Free()
    roles.free()


if __name__ == "__main__":
    main()
