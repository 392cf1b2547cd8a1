"""One-sided reads: a worker's MPI Get of a server's table rows beside a pull through mpips
and a raw two-sided ping-pong of the same bytes.

    mpiexec -n 2 python bench/rma.py

Rank 0 is a server, rank 1 a worker. For each key count n (sorted unique random keys, width
1, a warm table whose weights are set to a known function of the keys), the worker times
rounds of reading the n weights, in turn:
  mpips    KVWorker.pull + wait against a real Server (ASP, no push): what a pull costs;
  raw      blocking Send/Recv of the same bytes (H + 8n out, 4n back, H =
           protocol.HEADER_BYTES) on a communicator of its own;
  per-key  one-sided: the server's table (KVStore._rows) is exposed in an MPI.Win.Create
           window; the worker learned each key's row once (one two-sided request answered
           with KVStore.find, not timed) and each round issues one Get per row, then
           Flush(0), inside one Lock_all epoch;
  indexed  the same with a single Get through an indexed-block datatype of the n weights;
  gen      indexed, plus a Get of the table's generation (rows move when it changes, so a
           real design must check it every round) from a second window; both Gets are in
           flight together: MPI does not order them, so a design that must see the rows and
           the generation consistently pays one more round trip (Get it after the Flush);
  spin     indexed again, with the server polling without sleeping (the best case).
During the one-sided phases the server does what a real one does between requests: poll
(Iprobe, with ranks/bounded.Backoff's yields and sleeps), and it counts its polls per round.
Then, at the smallest n, it computes for BUSY_S without calling MPI while the worker times
one Get: whether a Get moves while the target makes no MPI calls. Open MPI says which osc
component and transport it chose for the windows (osc_base_verbose, read from its stderr).
Prints the median time per round after warm-up, the ratios gen / mpips and gen / raw, the
server's polls per indexed round, and writes bench/results/rma.json.
"""
import os
import platform
import re
import sys
import tempfile
import time
from contextlib import contextmanager

import numpy as np

# Open MPI names a window's osc component and transport only at this verbosity, which it reads
# at MPI_Init (the first import of mpi4py.MPI, just below). What it writes on fd 2 goes to
# OSC_LOG while MPI starts and while windows are created and freed, and is parsed at the end.
os.environ.setdefault("OMPI_MCA_osc_base_verbose", "60")
OSC_LOG, _path = tempfile.mkstemp(prefix="rma-osc-")
os.unlink(_path)


@contextmanager
def mpi_said():
    """Inside the block, fd 2 (where Open MPI writes) goes to OSC_LOG."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(OSC_LOG, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


with mpi_said():
    from mpi4py import MPI

import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from report import save  # noqa: E402

from mpips.models.optimizer import Optimizer  # noqa: E402
from mpips.ranks.bounded import Backoff, wait_all  # noqa: E402
from mpips.ranks.roles import split  # noqa: E402
from mpips.server.loop import Server  # noqa: E402
from mpips.server.store import KVStore  # noqa: E402
from mpips.wire.clocks import ClockTable  # noqa: E402
from mpips.wire.protocol import HEADER_BYTES  # noqa: E402
from mpips.worker.kvworker import KVWorker  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "rma.json")
SIZES = (10, 100, 1000, 10_000)
ONE_SIDED = ("per_key", "indexed", "gen", "spin")
WARMUP = 5          # rounds before measuring: numba kernels load, connections and windows warm
MIN_ROUNDS = 20
PHASE_S = 0.4       # measured rounds per phase are chosen to last about this long
# A one-sided round can last a second on a loaded machine: its warm-up stops after WARM_S
# and its measured rounds after about SLOW_S, but there are at least SLOW_ROUNDS of them.
WARM_S, SLOW_S, SLOW_ROUNDS = 0.5, 1.5, 5
BUSY_S = 0.05       # the server computes this long without calling MPI ...
BUSY_TRIALS = 5     # ... this many times, each while the worker times one Get
TIMEOUT = 120.0
SERVER, WORKER = 0, 1
CTRL = 7            # tag of the worker's orders to the server during the one-sided phases
DONE, POLL, SPIN, BUSY = range(4)


def make_keys(n: int) -> np.ndarray:
    """n random unique uint64 keys, sorted; the same ones on both ranks."""
    keys = np.unique(np.random.default_rng(n).integers(0, 2**64, n, dtype=np.uint64))
    assert keys.shape[0] == n
    return keys


def expected(keys: np.ndarray) -> np.ndarray:
    """The weights the server stores for `keys`, so every path's answer can be checked."""
    return (keys % np.uint64(1009)).astype(np.float32) + 0.25


def check(what: str, got: np.ndarray, keys: np.ndarray) -> None:
    if not np.array_equal(got.reshape(-1), expected(keys)):
        raise SystemExit(f"{what} read wrong weights")


def median_of(round_fn) -> tuple:
    """(median seconds of round_fn(), rounds timed, rounds run in all): up to WARMUP untimed
    rounds, then enough for PHASE_S (at least MIN_ROUNDS), within the bounds above."""
    warm: list = []
    began = time.perf_counter()
    while len(warm) < WARMUP and (not warm or time.perf_counter() - began < WARM_S):
        start = time.perf_counter()
        round_fn()
        warm.append(time.perf_counter() - start)
    rounds = max(MIN_ROUNDS, int(PHASE_S / float(np.median(warm))))
    # Bounded by time as well as count: a round can turn 1000x slower when the scheduler
    # puts both ranks on one core.
    times: list = []
    began = time.perf_counter()
    while len(times) < rounds and (len(times) < SLOW_ROUNDS
                                   or time.perf_counter() - began < SLOW_S):
        start = time.perf_counter()
        round_fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), len(times), len(warm) + len(times)


# Two-sided, through mpips: a warm-up session (it picks the round count), then the measured one.

def serve(roles, store: KVStore) -> None:
    """Server: answer one worker session (until it says BYE)."""
    Server(roles, store, ClockTable(len(roles.workers), staleness=None), timeout=TIMEOUT).run()


def mpips_pulls(roles, keys: np.ndarray, rounds: int) -> np.ndarray:
    """Worker: one session of `rounds` pulls, each waited for; seconds per round."""
    kv = KVWorker(roles, width=1, timeout=TIMEOUT)
    times = np.empty(rounds)
    for i in range(rounds):
        start = time.perf_counter()
        got = kv.wait(kv.pull(keys))
        times[i] = time.perf_counter() - start
    check("an mpips pull", got, keys)
    kv.finish()
    kv.close()
    return times


# Raw two-sided: the same bytes as a pull, no packing or table.

def raw_server(comm: MPI.Intracomm, n: int) -> None:
    """Server side of the raw ping-pong; the worker says how many rounds."""
    rounds = np.empty(1, np.int64)
    comm.Recv(rounds, WORKER)
    request, reply = np.zeros(HEADER_BYTES + 8 * n, np.uint8), np.zeros(4 * n, np.uint8)
    for _ in range(int(rounds[0])):
        comm.Recv(request, WORKER)
        comm.Send(reply, WORKER)


def raw_rounds(comm: MPI.Intracomm, n: int, rounds: int) -> float:
    """Worker side of the raw ping-pong: median seconds per round after WARMUP."""
    comm.Send(np.array([WARMUP + rounds], np.int64), SERVER)
    request, reply = np.zeros(HEADER_BYTES + 8 * n, np.uint8), np.zeros(4 * n, np.uint8)
    times = np.empty(WARMUP + rounds)
    for i in range(times.shape[0]):
        start = time.perf_counter()
        comm.Send(request, SERVER)
        comm.Recv(reply, SERVER)
        times[i] = time.perf_counter() - start
    return float(np.median(times[WARMUP:]))


# One-sided: the table in a window, the generation in another.

def windows(comm: MPI.Intracomm, rows: np.ndarray, generation: np.ndarray) -> tuple:
    """Collective: (window of the table's uint32 words, window of the int64 generation)."""
    with mpi_said():
        return (MPI.Win.Create(rows, disp_unit=4, comm=comm),
                MPI.Win.Create(generation, disp_unit=8, comm=comm))


def free(*wins: MPI.Win) -> None:
    with mpi_said():
        for win in wins:
            win.Free()


def target(comm: MPI.Intracomm, store: KVStore, keys: np.ndarray) -> None:
    """Server, one-sided phases: publish the keys' rows, expose the table, then poll as a
    server does until the worker is done, obeying its orders (spin, be busy)."""
    rows = store.find(keys, insert=True)   # the table is warm: no growth, rows stay put
    comm.Send(np.concatenate(([store.generation, store._rows.shape[1]], rows)), WORKER)
    generation = np.array([store.generation], np.int64)
    row_win, gen_win = windows(comm, store._rows, generation)
    told, backoff, spin = np.empty(1, np.int64), Backoff(), False
    polls, phase = np.zeros(len(ONE_SIDED) + 2, np.int64), 0
    heard = time.monotonic()
    while True:
        polls[min(phase, polls.shape[0] - 1)] += 1
        if not comm.Iprobe(WORKER, CTRL):
            if time.monotonic() - heard > TIMEOUT:
                raise SystemExit(f"server: no order from the worker for {TIMEOUT:g} s")
            if not spin:
                backoff.idle()
            continue
        comm.Recv(told, WORKER, CTRL)
        heard = time.monotonic()
        backoff.reset()
        phase += 1
        if told[0] == DONE:
            comm.Send(polls, WORKER, CTRL)
            break
        if told[0] in (SPIN, POLL):
            spin = told[0] == SPIN
        elif told[0] == BUSY:
            comm.Send(told, WORKER, CTRL)   # eager: it leaves before the busy spell
            end = time.perf_counter() + BUSY_S
            while time.perf_counter() < end:
                pass
    free(row_win, gen_win)


def order(comm: MPI.Intracomm, what: int) -> None:
    comm.Send(np.array([what], np.int64), SERVER, CTRL)


def origin(comm: MPI.Intracomm, keys: np.ndarray, busy_test: bool) -> tuple:
    """Worker, one-sided phases: ({variant: (median s, rounds, server polls a round)},
    busy-spell stalls in s). Each variant starts with an order (polls are counted between
    orders)."""
    n = keys.shape[0]
    published = np.empty(2 + n, np.int64)   # setup, not timed: one two-sided answer
    wait_all([comm.Irecv(published, SERVER)], TIMEOUT, lambda: "the rows' locations")
    generation, stride, rows = int(published[0]), int(published[1]), published[2:]
    # float32 weights are word 2 of a row (after the key's two words): displacements in floats
    disps = (rows * stride + 2).tolist()
    row_win, gen_win = windows(comm, np.empty(0, np.uint32), np.empty(0, np.int64))
    out, gen_out = np.empty(n, np.float32), np.empty(1, np.int64)
    singles = [out[i:i + 1] for i in range(n)]
    gather = MPI.FLOAT.Create_indexed_block(1, disps).Commit()
    reasks = 0

    def per_key() -> None:
        for one, disp in zip(singles, disps):
            row_win.Get(one, SERVER, (disp, 1, MPI.FLOAT))
        row_win.Flush(SERVER)

    def indexed() -> None:
        row_win.Get([out, n, MPI.FLOAT], SERVER, (0, 1, gather))
        row_win.Flush(SERVER)

    def with_generation() -> None:
        nonlocal reasks
        gen_win.Get([gen_out, 1, MPI.INT64_T], SERVER, (0, 1, MPI.INT64_T))
        row_win.Get([out, n, MPI.FLOAT], SERVER, (0, 1, gather))
        gen_win.Flush(SERVER)
        row_win.Flush(SERVER)
        if gen_out[0] != generation:
            reasks += 1   # a real worker would ask for the rows again here

    row_win.Lock_all()
    gen_win.Lock_all()
    timed = {}
    for name, round_fn in zip(ONE_SIDED, (per_key, indexed, with_generation, indexed)):
        order(comm, SPIN if name == "spin" else POLL)
        out[:] = np.nan
        timed[name] = median_of(round_fn)
        check(f"a one-sided Get ({name})", out, keys)
    order(comm, POLL)
    stalls = []
    if busy_test:
        ack = np.empty(1, np.int64)
        for _ in range(BUSY_TRIALS):
            order(comm, BUSY)
            wait_all([comm.Irecv(ack, SERVER, CTRL)], TIMEOUT, lambda: "the busy spell's start")
            start = time.perf_counter()
            indexed()
            stalls.append(time.perf_counter() - start)
    gen_win.Unlock_all()
    row_win.Unlock_all()
    gather.Free()
    assert reasks == 0, "the table grew although no key was added"
    order(comm, DONE)
    polls = np.empty(len(ONE_SIDED) + 2, np.int64)
    wait_all([comm.Irecv(polls, SERVER, CTRL)], TIMEOUT, lambda: "the server's poll counts")
    free(row_win, gen_win)
    results = {name: (seconds, rounds, polls[1 + i] / run)
               for i, (name, (seconds, rounds, run)) in enumerate(timed.items())}
    return results, stalls


def osc_choice() -> dict:
    """What Open MPI said of this rank's windows: the osc component and how it reaches rank 0."""
    os.lseek(OSC_LOG, 0, os.SEEK_SET)
    with os.fdopen(os.dup(OSC_LOG), "rb") as log:
        said = log.read().decode(errors="replace")
    component = re.search(r"select: component (\w+) selected", said)
    peer = re.search(r"found btl for peer 0 \((\w+), \d+, (\w+)\)", said)
    emulated = "falling back on active-message BTLs" in said
    return {"component": component.group(1) if component else "unknown (no osc_base_verbose)",
            "btl": peer.group(1) if peer else None,
            "active_message_rdma": emulated,
            "said": list(dict.fromkeys(
                line.split("] ", 1)[-1] for line in said.splitlines()
                if "accelerated" in line or "found btl for peer" in line or "select:" in line))}


# The two sides.

def server_side(roles, comm: MPI.Intracomm) -> None:
    """Rank 0: for each size, a table with the keys' known weights, then each phase's server."""
    for n in SIZES:
        keys = make_keys(n)
        store = KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.05))
        state = np.zeros((n, store.columns), np.float32)
        state[:, 0] = expected(keys)
        store.load(keys, state)
        serve(roles, store)   # the warm-up session
        serve(roles, store)   # the measured one
        raw_server(comm, n)
        target(comm, store, keys)


def worker_side(roles, comm: MPI.Intracomm) -> tuple:
    """Rank 1: for each size, every variant's median time per round; the busy-spell stalls."""
    rows, stalls = [], []
    for n in SIZES:
        keys = make_keys(n)
        warm = mpips_pulls(roles, keys, WARMUP)
        rounds = max(MIN_ROUNDS, int(PHASE_S / np.median(warm)))
        mpips_s = float(np.median(mpips_pulls(roles, keys, rounds)))
        raw_s = raw_rounds(comm, n, rounds)
        one_sided, stalled = origin(comm, keys, busy_test=n == SIZES[0])
        stalls += stalled
        row = {"keys": n, "mpips_rounds": rounds, "raw_us": raw_s * 1e6, "mpips_us": mpips_s * 1e6}
        for name, (seconds, count, polls) in one_sided.items():
            row[f"{name}_us"] = seconds * 1e6
            row[f"{name}_rounds"] = count
            row[f"{name}_server_polls"] = polls
        row["gen_extra_us"] = row["gen_us"] - row["indexed_us"]
        row["gen_vs_mpips"] = row["gen_us"] / row["mpips_us"]
        row["gen_vs_raw"] = row["gen_us"] / row["raw_us"]
        rows.append(row)
    return rows, stalls


def conclusion(rows: list, stall_ms: float, osc: dict) -> str:
    """Which path wins at which sizes, and why, from the numbers."""
    def sizes(test) -> str:
        chosen = [f"{r['keys']:,}" for r in rows if test(r)]
        return f"at {', '.join(chosen)} keys" if chosen else "at no size"

    def one_sided_wins(r) -> bool:
        return r["gen_us"] < r["mpips_us"]

    if not any(one_sided_wins(r) for r in rows):
        text = "The two-sided mpips pull wins at every size"
    elif all(one_sided_wins(r) for r in rows):
        text = "The one-sided read (with its generation check) wins at every size"
    else:
        text = (f"The one-sided read (with its generation check) wins "
                f"{sizes(one_sided_wins)}, the mpips pull {sizes(lambda r: not one_sided_wins(r))}")
    ratio, variant, keys = min((r[f"{v}_us"] / r["raw_us"], v, r["keys"])
                               for r in rows for v in ONE_SIDED)
    first, last = rows[0], rows[-1]
    text += (f" (one-sided / mpips: {first['gen_vs_mpips']:.1f}x at {first['keys']:,} keys, "
             f"{last['gen_vs_mpips']:.1f}x at {last['keys']:,}); a one-sided read beats the raw "
             f"two-sided ping-pong {sizes(lambda r: r['gen_us'] < r['raw_us'])} (its best: "
             f"{ratio:.1f}x raw, {variant} at {keys:,} keys). The generation check changes a "
             f"read by {first['gen_extra_us']:+.0f} us at {first['keys']:,} keys and "
             f"{last['gen_extra_us'] / 1e3:+.1f} ms at {last['keys']:,}.")
    if osc["active_message_rdma"]:
        text += (f" osc/{osc['component']} has no RDMA transport here and emulates Gets with "
                 f"active messages over btl {osc['btl']}, answered by the server's MPI progress: "
                 f"an indexed read took {first['indexed_server_polls']:.1f} server polls at "
                 f"{first['keys']:,} keys and {last['indexed_server_polls']:.0f} at "
                 f"{last['keys']:,}, and the server's loop, seeing no request, keeps its backoff "
                 f"sleeping between them.")
    stalled = stall_ms > 0.5 * BUSY_S * 1e3
    text += (f" A Get issued while the server computed {BUSY_S * 1e3:.0f} ms without calling "
             f"MPI took {stall_ms:.1f} ms: one-sided reads "
             + ("do not progress while the server is busy." if stalled else
                "progress while the server is busy."))
    return text


def report(rows: list, stalls: list) -> None:
    """Print the table, the transport and the busy-spell times; write the JSON result."""
    print(f"{'keys':>6} {'raw us':>8} {'mpips us':>9} {'get/key us':>10} {'get-idx us':>10} "
          f"{'get+gen us':>10} {'idx spin us':>11} {'gen/mpips':>9} {'gen/raw':>8} "
          f"{'idx polls':>9}")
    for r in rows:
        print(f"{r['keys']:>6,} {r['raw_us']:>8.1f} {r['mpips_us']:>9.1f} "
              f"{r['per_key_us']:>10.1f} {r['indexed_us']:>10.1f} {r['gen_us']:>10.1f} "
              f"{r['spin_us']:>11.1f} {r['gen_vs_mpips']:>8.2f}x {r['gen_vs_raw']:>7.1f}x "
              f"{r['indexed_server_polls']:>9.1f}")
    osc = osc_choice()
    stall_ms = float(np.median(stalls)) * 1e3
    print(f"osc component: {osc['component']} (btl {osc['btl']}, active-message RDMA: "
          f"{osc['active_message_rdma']})")
    print(f"a {SIZES[0]}-key indexed Get while the server computes {BUSY_S * 1e3:.0f} ms "
          f"without MPI: {', '.join(f'{s * 1e3:.1f}' for s in stalls)} ms")
    text = conclusion(rows, stall_ms, osc)
    print(text)
    save(OUT, "rma", cpus=os.cpu_count(), machine=platform.machine(),
         load_average=os.getloadavg()[0],
         mpi=MPI.Get_library_version().replace("\0", "").splitlines()[0],
         mpi4py=sys.modules["mpi4py"].__version__,
         osc=osc, key_counts=list(SIZES), warmup_rounds=WARMUP,
         note="per round: median microseconds. raw: blocking Send/Recv of a pull's bytes; "
              "mpips: KVWorker.pull + wait; per_key: one Get per row + Flush; indexed: one Get "
              "through an indexed-block datatype + Flush; gen: indexed + a Get of the "
              "generation from a second window; spin: indexed with the server polling "
              "without sleeping; the others with the server polling as mpips's Server does "
              "(Iprobe, bounded.Backoff). *_server_polls: the server's Iprobe calls per "
              "round of that variant. gen_vs_* = gen_us / that path's us; gen_extra_us = "
              "gen_us - indexed_us",
         busy={"busy_ms": BUSY_S * 1e3, "keys": SIZES[0],
               "get_ms": [s * 1e3 for s in stalls], "median_ms": stall_ms,
               "get_needs_target_mpi_calls": stall_ms > 0.5 * BUSY_S * 1e3},
         conclusion=text, results=rows)


def main() -> None:
    if MPI.COMM_WORLD.size != 2:
        raise SystemExit("run with exactly 2 ranks: mpiexec -n 2 python bench/rma.py")
    roles = split(1, MPI.COMM_WORLD)
    comm = MPI.COMM_WORLD.Dup()   # the raw ping-pong's, the windows' and the orders' own
    if roles.is_server:
        server_side(roles, comm)
    else:
        report(*worker_side(roles, comm))
    comm.Free()
    roles.free()


if __name__ == "__main__":
    main()
