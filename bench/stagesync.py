"""Keeping a pipeline stage's weights alike in D data-parallel copies: on the servers (what
`train --stages` does) beside an allgather among the copies, for the same weights.

    mpiexec -n 3 python bench/stagesync.py

Rank 0 is a server (BSP, AdaGrad), ranks 1 and 2 are the same stage in two copies of a
pipeline. For a stage holding the layers of Wide & Deep networks of growing width, each
step is, per copy:
  servers    pull the stage's rows (keys reserved for its layers), push their gradients as
             a clock, and wait for the next pull (which BSP holds until the other copy's
             push is in): the servers add the copies' gradients and run AdaGrad;
  allgather  Iallgather the flat float64 gradient among the copies, add the copies' parts in
             copy order, run the same AdaGrad update locally (numpy).
Prints the median time per step of each and their ratio; writes
bench/results/stagesync.json. Both keep every copy's weights the same bits.
"""
import os
import platform
import time

import numpy as np
from mpi4py import MPI

import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from mpips.ranks.bounded import wait_all
from mpips.worker.kvworker import KVWorker
from mpips.wire.clocks import ClockTable
from mpips.models.catalog import WideDeep
from mpips.models.optimizer import Optimizer
from mpips.ranks.roles import split
from mpips.server.loop import Server
from mpips.server.store import KVStore
from report import save

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "stagesync.json")
# (embedding dim, hidden widths, stage's layers): the second half of each network.
NETWORKS = [(8, (64, 32), range(1, 3)), (16, (256, 256), range(1, 3)),
            (16, (512, 512, 512), range(2, 4)), (32, (1024, 1024, 1024), range(2, 4))]
STEPS, WARMUP, TIMEOUT = 40, 5, 120.0


def serve(roles, width: int) -> None:
    store = KVStore(width, Optimizer("adagrad", lr=0.05, eps=1e-3))
    Server(roles, store, ClockTable(len(roles.workers), staleness=0), timeout=TIMEOUT).run()


def through_servers(roles, keys: np.ndarray, grads: np.ndarray) -> np.ndarray:
    kv = KVWorker(roles, width=grads.shape[1], timeout=TIMEOUT)
    times = np.empty(WARMUP + STEPS)
    pull = kv.pull(keys)
    for i in range(times.shape[0]):
        start = time.perf_counter()
        kv.wait(pull)
        kv.wait(kv.push(keys, grads, clock=True))
        pull = kv.pull(keys)   # held by BSP until the other copy has pushed this clock
        times[i] = time.perf_counter() - start
    kv.wait(pull)
    kv.finish()
    kv.close()
    return times[WARMUP:]


def through_allgather(copies: MPI.Intracomm, grads: np.ndarray) -> np.ndarray:
    flat = grads.astype(np.float64).ravel()
    every = np.empty((copies.size, flat.shape[0]))
    w, acc = np.zeros(flat.shape[0]), np.full(flat.shape[0], 1e-3)
    times = np.empty(WARMUP + STEPS)
    for i in range(times.shape[0]):
        start = time.perf_counter()
        wait_all([copies.Iallgather(flat, every)], TIMEOUT, lambda: "the other copy")
        g = every.sum(axis=0)
        acc += g * g
        w -= 0.05 * g / np.sqrt(acc)
        times[i] = time.perf_counter() - start
    return times[WARMUP:]


def main() -> None:
    roles = split(1, MPI.COMM_WORLD)
    copies = roles.group   # the two workers: one stage, two copies
    rows = []
    for dim, hidden, layers in NETWORKS:
        model = WideDeep(dim, hidden)
        if roles.is_server:
            serve(roles, model.width)
            continue
        keys = model.reserved_keys(layers)
        grads = np.random.default_rng(roles.index).normal(
            0, 1e-3, (keys.shape[0], model.width)).astype(np.float32)
        servers = float(np.median(through_servers(roles, keys, grads)))
        allgather = float(np.median(through_allgather(copies, grads)))
        params = sum(model.layers[i].inputs * model.layers[i].outputs +
                     model.layers[i].outputs for i in layers)
        rows.append({"hidden": ",".join(map(str, hidden)), "stage_layers": f"{layers.start}-"
                     f"{layers.stop - 1}", "params": params, "bytes": params * 4,
                     "servers_ms": servers * 1e3, "allgather_ms": allgather * 1e3,
                     "ratio": servers / allgather})
    if roles.is_server or roles.index != 0:
        return
    print(f"{'hidden':>16} {'params':>9} {'servers ms':>11} {'allgather ms':>13} {'ratio':>6}")
    for r in rows:
        print(f"{r['hidden']:>16} {r['params']:>9,} {r['servers_ms']:>11.3f} "
              f"{r['allgather_ms']:>13.3f} {r['ratio']:>6.2f}")
    save(OUT, "stagesync", cpus=os.cpu_count(), machine=platform.machine(), copies=2,
         steps=STEPS, results=rows)


if __name__ == "__main__":
    main()
