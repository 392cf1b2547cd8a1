"""One launch of bench/checkpoint.py's serving part: 1 server holding N keys (AdaGrad, BSP)
and 2 workers pulling and pushing 10,000 of them a clock, with a timed checkpoint every few
seconds, written as a job writes it (`resident`: by the server's resident writer, forked at
the start and kept, which reads the live table in place, the server logging the rows it
changes until it has), by the resident from a copy of the table made a span at a time
between requests into shared memory (`copied`, what jobs did before, and still do where a
process may not read another's memory), from that copy by a child forked for each file
(`snapshot`), by a child forked at the clock from the live table (`fork`: copy-on-write
pages) or in the server's loop (`inline`); or parts of the resident's write (`only_part`:
`sleep`, none; `gather`, the table read, no file; `hash`, read and hashed, no file).

    mpiexec -n 3 python bench/checkpoint_serving.py MODE KEYS SECONDS EVERY OUT_DIR

Each rank writes its figures to OUT_DIR/rank-R.json (time.monotonic, the same clock for
every process of a node): a worker the start and end of each clock (pull, push); the server,
for each checkpoint, when it took the state, when the state was taken (the server serves
again), when the copy was complete or the writer had read the table, when the file was in,
the longest turn of the loop spent on it (a span's copy) and
the turn that started its writer (the fork, or the task sent); every rank the kernels it
compiled while serving (none where the ahead build is current: `make kernels`); and the
server its pid in OUT_DIR/server.pid, for bench/checkpoint.py to read the memory of server
and writer from /proc.
"""
import gc
import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from mpips.base import checksums, forked
from mpips.base.forked import ForkedWrite, Written, keep_from_children
from mpips.job.server_files import spread_of
from mpips.job.snapshot_write import Resident, SnapshotWrite
from mpips.models.optimizer import Optimizer
from mpips.ranks.bounded import wait_all
from mpips.ranks.roles import split
from mpips.run.warmup import CompileWatch
from mpips.server.checkpoint_clocks import Checkpoints
from mpips.server.live_snapshot import LiveSnapshot
from mpips.server.loop import Hooks, Server
from mpips.server.store import KVStore
from mpips.storage import checkpoint
from mpips.wire.clocks import ClockTable
from mpips.worker.kvworker import KVWorker

PULL = 10_000      # keys a worker reads and updates each clock
TIMEOUT = 300.0


def keys_of(n: int) -> np.ndarray:
    """The server's keys (every rank makes the same)."""
    return np.unique(np.random.default_rng(0).integers(0, 2**64 - 1, n, dtype=np.uint64))


def pss_kb(pid: int) -> int:
    """Proportional set size: shared pages counted once over the processes sharing them."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


class Timed:
    """A ShardWrite whose end is noted (its memory is read from outside: bench/checkpoint.py
    reads /proc, which costs the server nothing); `live`: the table read in place, whose read
    ends the server's part (as a copy's last span does)."""

    def __init__(self, file, record: dict, live: LiveSnapshot | None = None):
        self.file, self.record, self.live = file, record, live
        self.started = file.started

    @property
    def pid(self) -> int:
        return self.file.pid

    @property
    def copying(self) -> bool:
        return self.file.copying

    def poll(self):
        if self.live is not None and self.live.read and "copied" not in self.record:
            self.record["copied"] = time.monotonic()
        copying, start = self.file.copying, time.monotonic()
        entry = self.file.poll()
        took = time.monotonic() - start
        if copying:   # a span copied; the last one also starts the writer
            key = "copy_turn_s" if self.file.copying else "start_writer_s"
            self.record[key] = max(self.record.get(key, 0.0), took)
            if not self.file.copying:
                self.record["copied"] = time.monotonic()
        if entry is not None and "done" not in self.record:
            self.record["done"] = time.monotonic()
            self.record["error"] = entry.get("error")
            self.record["writer_cpu_s"] = entry.get("cpu_s")
        return entry

    def wait(self, timeout: float):
        entry = self.file.wait(timeout)
        return self.poll() or entry

    def stop(self, why: str):
        return self.file.stop(why)


def with_cpu(write) -> dict:
    """`write()`'s entry, with the CPU seconds the process that wrote it spent on it."""
    start = time.process_time()
    entry = write()
    return {**entry, "cpu_s": time.process_time() - start}


def only_part(part: str, task: dict, table) -> dict:
    """What the resident's work costs without the rest of a file's write: `sleep`, none (it
    waits its spread: the copy's cost alone); `gather`, the blocks read from the copy as
    `stream_shard` reads them, paced as it paces them, nothing hashed or written; `hash`,
    those blocks also hashed as it hashes them."""
    began, at, n = time.monotonic(), 0, len(table)
    if part == "sleep":
        time.sleep(task["spread"])
    else:
        digests = [checksums.stream(checkpoint.CHECKSUM) for _ in range(2)]
        for keys, state in table.blocks(1 << 15):
            if part == "hash":
                digests[0].update(np.ascontiguousarray(keys).reshape(-1).view(np.uint8).data)
                digests[1].update(np.ascontiguousarray(state).reshape(-1).view(np.uint8).data)
            at += keys.shape[0]
            checkpoint._pace(began + task["spread"] * at / max(n, 1))
    return {"file": "-", "server": 0, "keys": n, "ranges": [0], checkpoint.CHECKSUM.value: {}}


def serve(roles, mode: str, n_keys: int, every: float, root: str) -> dict:
    store = KVStore(width=1, optimizer=Optimizer("adagrad", lr=0.1), capacity=2 * n_keys)
    part = mode if mode in ("sleep", "gather", "hash") else None
    copied = mode == "copied"
    mode = "resident" if part or copied else mode
    resident = Resident(store, lambda task, table: with_cpu(
        lambda: only_part(part, task, table) if part else checkpoint.stream_shard(
            root, task["clock"], 0, table, {}, spread=task["spread"])), live=not copied)
    if mode == "resident":   # as a job's server does, before its table is filled
        resident.ready()
    keys = keys_of(n_keys)
    store.push(keys, np.random.default_rng(1).normal(size=(keys.shape[0], 1)).astype(
        np.float32), 0)
    del keys
    resident.prepare()   # as a job's server does once its table is reserved or loaded
    if mode == "fork":   # the child reads the live table (store.py leaves it out)
        keep_from_children(store._rows, keep=False)
    import h5py  # noqa: F401 -- as a job's server does, before the first checkpoint
    records: list = []

    def write_shard(clock: int, paced: bool = False):
        record = {"clock": clock, "take": time.monotonic()}
        records.append(record)
        if mode == "inline":
            file = Written(with_cpu(lambda: checkpoint.write_shard(root, clock, 0, store, {})),
                           record["take"])
        elif mode in ("resident", "snapshot"):
            # spread out as a job's periodic checkpoint is (job.server_files.spread_of)
            task = {"clock": clock, "spread": spread_of(every) if paced else 0.0}
            record["spread_s"] = task["spread"]
            file = SnapshotWrite(store, lambda table: resident.work(task, table),
                                 "server-0000.h5", lambda pid: None,
                                 forked=lambda: record.update(forked=time.monotonic()),
                                 resident=resident if mode == "resident" else None, task=task)
        else:
            file = ForkedWrite(lambda: with_cpu(lambda: checkpoint.stream_shard(
                root, clock, 0, store, {})), "server-0000.h5")
        record["taken"] = time.monotonic()
        live = store.snapshot if isinstance(store.snapshot, LiveSnapshot) else None
        return Timed(file, record, live)

    def write_manifest(clock, shards, positions, deaths):
        checkpoint.write_manifest(root, clock, shards, servers=1, positions={}, config={})
        checkpoint.prune(root, 2, checkpoint.clock_dir(root, clock))

    with open(os.path.join(os.path.dirname(root), "server.pid"), "w") as f:
        f.write(str(os.getpid()))
    ready(roles)
    rss = pss_kb(os.getpid())
    server = Server(roles, store, ClockTable(len(roles.workers), 0), TIMEOUT,
                    hooks=Hooks(write_shard=write_shard, write_manifest=write_manifest),
                    checkpoints=Checkpoints(0, every, 1, bsp=True))
    server.run()
    resident.close()
    return {"role": "server", "keys": len(store), "table_bytes": store.nbytes,
            "pss_kb": rss, "checkpoints": records}


def work(roles, n_keys: int, seconds: float) -> dict:
    keys = keys_of(n_keys)
    rng = np.random.default_rng(10 + roles.index)
    kv = KVWorker(roles, timeout=TIMEOUT)
    ready(roles)
    steps = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        chosen = np.unique(keys[rng.integers(0, keys.shape[0], PULL)])
        start = time.monotonic()
        kv.wait(kv.pull(chosen))
        kv.wait(kv.push(chosen, np.full((chosen.shape[0], 1), 0.01, np.float32), clock=True))
        steps.append((start, time.monotonic()))
    # FINISH first: a worker that stops a clock before the other would hold its pulls (BSP)
    kv.finish()
    kv.close()
    return {"role": "worker", "steps": steps}


def ready(roles) -> None:
    """Every rank set up (the server's table filled) before the workers start the clock; what
    set-up made kept out of later collections, as a job's ranks do (run.startup.ready)."""
    wait_all([roles.comm.Ibarrier()], TIMEOUT, lambda: "every rank to have set up")
    gc.freeze()


def main() -> None:
    mode, n_keys, seconds, every, out = sys.argv[1:6]
    if "MPIPS_WRITER_NICE" in os.environ:   # to measure the writer's priority
        forked.NICE = int(os.environ["MPIPS_WRITER_NICE"])
    roles = split(1, MPI.COMM_WORLD)
    root = os.path.join(out, "checkpoints")
    watch = CompileWatch()   # a kernel compiled while serving holds its rank that long
    with watch.watching():
        if roles.is_server:
            figures = serve(roles, mode, int(n_keys), float(every), root)
        else:
            figures = work(roles, int(n_keys), float(seconds))
    figures["compiled"] = watch.compiled
    with open(os.path.join(out, f"rank-{MPI.COMM_WORLD.rank}.json"), "w") as f:
        json.dump(figures, f)


if __name__ == "__main__":
    main()
