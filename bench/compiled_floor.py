"""What a compiled request path (issue 32, item 1) could reach: a fused pull + push round of
mpips beside the same round with either side's handling done by one compiled call.

    mpiexec -n 2 python bench/compiled_floor.py [--keys 10] [--rounds 20000]

Rank 0 serves, rank 1 times fused rounds (the next clock's pull travels with this clock's
push, one message and one reply, as training sends them), each row a session of `--rounds`
after 2,000 to warm up, interleaved over 3 passes (the median of each row's medians):

  mpips        KVWorker against mpips' Server (its loop, AdaGrad, ASP): today's round;
  server       KVWorker against a server whose handling of a message is one compiled call:
               the push's values applied to the rows of the pull they answer, the next
               pull's keys checked and looked up in a real table (KVStore's arrays, the
               kernels the Server runs: requests.pull_rows, optim.adagrad_update), the
               reply sent (no clocks, admission or replication: what a compiled path keeps
               of them costs more);
  both         a worker whose message is packed by one compiled call into a buffer it
               keeps, sent with Isend and its reply received with Irecv, against that server:
               the floor of the design, Python left to post the sends and receives;
  raw          blocking Send/Recv of buffers of the same sizes (no packing, no table).

Prints the rounds in us and what each side's Python adds, and writes
bench/results/compiled_floor.json.
"""
import argparse
import os
import time

import numpy as np
from mpi4py import MPI
from numba import njit

import checkout  # noqa: F401  (this checkout's mpips: see checkout.py)
from mpips.kernels.jit import twin
from mpips.models.optimizer import Optimizer
from mpips.ranks.roles import split
from mpips.server.loop import Server
from mpips.server.store import KVStore
from mpips.wire import messages, protocol, tags
from mpips.wire.clocks import ClockTable
from mpips.wire.placement import Placement
from mpips.wire.protocol import HEADER_BYTES, REPORT_BYTES, Header, Op, Report
from comm import mpips_rounds
from report import save

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "compiled_floor.json")
ROWS = ("mpips", "server", "both", "raw")
PASSES, WARMUP, TIMEOUT = 3, 2000, 120.0
LR, EPS = 0.05, 0.1
SERVER, WORKER = 0, 1
REPORT = Report(epoch=0, offset=7, examples=64, loss=3.0, progress=0.25)
WITH_PUSH = protocol.WITH_PUSH
# The Server's kernels as numba compiles them (the ahead build's cannot be called from a kernel).
optim, requests = twin("optim"), twin("requests")


@njit(cache=True, nogil=True)
def handle(buf, rows, meta, state, limit, fresh, bounds, allowed, counts, last, keys, slots,
           out):
    """One request in `buf`, handled: a PULL's keys checked and looked up (weights into
    `out`, their rows kept in `last`), a PUSH behind it (WITH_PUSH) applied first to the
    rows of the pull it answers. Returns (op, flags, ts, nkeys); nkeys < 0 if the table is
    full or a key fails its checks."""
    words = buf[:HEADER_BYTES].view(np.int64)
    op, flags, ts, n = words[0] & 0xffffffff, words[0] >> 32, words[1], words[3]
    if op != 1:
        return op, flags, ts, 0
    if flags & WITH_PUSH:
        at = HEADER_BYTES + 8 * n
        m = buf[at:at + HEADER_BYTES].view(np.int64)[3]
        start = at + HEADER_BYTES
        values = buf[start:start + 4 * m].view(np.float32).reshape(m, 1)
        optim.adagrad_update(state, last[:m], values, LR, 0.0, EPS)
    done = requests.pull_rows(buf, HEADER_BYTES, bounds, allowed, counts, rows, meta, True,
                              limit, keys[:n], slots[:n], out[:n], fresh)
    if done != n:
        return op, flags, ts, -1
    last[:n] = slots[:n]
    return op, flags, ts, n


@njit(cache=True, nogil=True)
def pack(template, push_at, values_at, grads, clock, buf):
    """A worker's fused message of `clock` into buf[:len(template)]: `template`'s bytes
    (the keys, the report), its two headers' request numbers and clock, `grads` behind the
    push's header."""
    n = template.shape[0]
    buf[:n] = template
    pull = buf[:HEADER_BYTES].view(np.int64)
    pull[1] = 2 * clock + 2
    pull[2] = clock + 1
    push = buf[push_at:push_at + HEADER_BYTES].view(np.int64)
    push[1] = 2 * clock + 1
    push[2] = clock
    g = grads.reshape(-1)
    buf[values_at:values_at + 4 * g.shape[0]] = g.view(np.uint8)
    return n


def compiled_server(roles, n_keys: int, sessions: int) -> None:
    """Serve `sessions` worker sessions (until each one's BYE) with `handle`, on a table that
    holds the keys (AdaGrad, width 1)."""
    store = KVStore(width=1, optimizer=Optimizer("adagrad", lr=LR, eps=EPS))
    store.reserve(4 * n_keys)
    bounds, allowed, counts = Placement(1).key_check(0, True, None)
    buf = np.empty(2 * HEADER_BYTES + 16 * n_keys + REPORT_BYTES + 64, np.uint8)
    keys, slots = np.empty(n_keys, np.uint64), np.empty(n_keys, np.int64)
    last, out = np.zeros(n_keys, np.int64), np.empty((n_keys, 1), np.float32)
    fresh = np.empty(n_keys, np.uint8)
    status, comm = MPI.Status(), roles.comm
    n_tags = protocol.reply_tags(comm.Get_attr(MPI.TAG_UB))
    while sessions:
        comm.Recv(buf, MPI.ANY_SOURCE, tags.REQUEST_TAG, status)
        op, _, ts, n = handle(buf, store._rows, store._meta, store._state, store._limit, fresh,
                              bounds, allowed, counts, last, keys, slots, out)
        if op == Op.PULL:
            if n < 0:
                raise SystemExit("compiled_floor: the table is full or a key failed its check")
            comm.Send(out[:n], status.Get_source(), protocol.reply_tag(ts, n_tags))
        sessions -= op == Op.BYE


def template_of(keys: np.ndarray) -> tuple:
    """The bytes of a fused message as KVWorker sends one (clock 0), where its pull's and
    push's headers and the push's values are."""
    n = keys.shape[0]
    grads = np.zeros((n, 1), np.float32)
    pull = protocol.message(Header(Op.PULL, ts=2, clock=1, nkeys=n), keys)
    flags = protocol.SAME_KEYS | protocol.CLOCK | protocol.REPORT
    push = Header(Op.PUSH, ts=1, nkeys=n, width=1, flags=flags, **messages.same_keys_push(0))
    whole = np.frombuffer(protocol.bundled(pull, push, grads, report=REPORT), np.uint8).copy()
    push_at = HEADER_BYTES + 8 * n
    return whole, push_at, push_at + HEADER_BYTES


def packed_rounds(roles, keys: np.ndarray, rounds: int) -> np.ndarray:
    """Fused rounds packed by `pack` and sent with Isend, their replies received with Irecv:
    seconds each."""
    comm, n = roles.comm, keys.shape[0]
    n_tags = protocol.reply_tags(comm.Get_attr(MPI.TAG_UB))
    grads = np.full((n, 1), 1e-3, np.float32)
    template, push_at, values_at = template_of(keys)
    buf = np.empty(template.shape[0], np.uint8)
    reply = np.empty((n, 1), np.float32)
    first = protocol.message(Header(Op.PULL, ts=0, nkeys=n), keys)
    comm.Send(first, SERVER, tags.REQUEST_TAG)
    comm.Recv(reply, SERVER, protocol.reply_tag(0, n_tags))
    times = np.empty(rounds)
    for c in range(rounds):
        start = time.perf_counter()
        size = pack(template, push_at, values_at, grads, c, buf)
        receive = comm.Irecv(reply, SERVER, protocol.reply_tag(2 * c + 2, n_tags))
        MPI.Request.Waitall([comm.Isend(buf[:size], SERVER, tags.REQUEST_TAG), receive])
        times[c] = time.perf_counter() - start
    comm.Send(protocol.message(Header(Op.BYE)), SERVER, tags.REQUEST_TAG)
    return times


def raw_rounds(comm, n: int, rounds: int) -> np.ndarray:
    """Blocking Send/Recv of a fused message's and its reply's sizes: seconds each."""
    out = np.zeros(2 * HEADER_BYTES + 12 * n + REPORT_BYTES, np.uint8)
    back = np.zeros(4 * n, np.uint8)
    times = np.empty(rounds)
    for i in range(rounds):
        start = time.perf_counter()
        comm.Send(out, SERVER)
        comm.Recv(back, SERVER)
        times[i] = time.perf_counter() - start
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()
    if MPI.COMM_WORLD.size != 2:
        raise SystemExit("run with exactly 2 ranks: mpiexec -n 2 python bench/compiled_floor.py")
    roles = split(1, MPI.COMM_WORLD)
    raw = MPI.COMM_WORLD.Dup()
    rng = np.random.default_rng(0)
    keys = np.sort(rng.choice(1 << 40, args.keys, replace=False).astype(np.uint64))
    total = WARMUP + args.rounds
    medians: dict = {row: [] for row in ROWS}
    for _ in range(PASSES):
        for row in ROWS:
            if roles.is_server:
                if row == "mpips":
                    Server(roles, KVStore(width=1, optimizer=Optimizer("adagrad", lr=LR, eps=EPS)),
                           ClockTable(1, staleness=None), timeout=TIMEOUT).run()
                elif row == "raw":
                    out = np.zeros(2 * HEADER_BYTES + 12 * args.keys + REPORT_BYTES, np.uint8)
                    back = np.zeros(4 * args.keys, np.uint8)
                    for _ in range(total):
                        raw.Recv(out, WORKER)
                        raw.Send(back, WORKER)
                else:
                    compiled_server(roles, args.keys, sessions=1)
                continue
            times = (mpips_rounds(roles, keys, "fused", total) if row in ("mpips", "server") else
                     packed_rounds(roles, keys, total) if row == "both" else
                     raw_rounds(raw, args.keys, total))
            medians[row].append(float(np.median(times[WARMUP:])) * 1e6)
    if roles.is_server:
        return
    us = {row: float(np.median(m)) for row, m in medians.items()}
    print(f"fused {args.keys}-key rounds, median of {PASSES} passes' medians "
          f"({args.rounds:,} rounds each):")
    said = {"mpips": "KVWorker and mpips' Server (today)",
            "server": "KVWorker and a server of one compiled call",
            "both": "a compiled pack and that server (the floor)",
            "raw": "blocking Send/Recv of the same bytes"}
    for row in ROWS:
        print(f"  {row:>6}  {us[row]:7.2f} us  {said[row]}  (passes: "
              f"{', '.join(f'{m:.2f}' for m in medians[row])})")
    print(f"the server's Python beyond one compiled call: {us['mpips'] - us['server']:.2f} us; "
          f"the worker's beyond a compiled pack: {us['server'] - us['both']:.2f} us")
    save(OUT, bench="compiled_floor", keys=args.keys, rounds=args.rounds, passes=PASSES,
         us=us, passes_us=medians)
    raw.Free()
    roles.free()


if __name__ == "__main__":
    main()
