"""Cold backup: the servers' shards and the workers' places in their data, at one clock.

    CKPT_DIR/clock-000000001200/server-0000.h5   keys (uint64), state (float32: weights, then
                                                 optimizer state), one file per server
    CKPT_DIR/clock-000000001200/manifest.json    clock, configuration, key placement, where
                                                 each worker stands, an XXH64 per dataset

One HDF5 file per server, because each server writes its own shard at its own pace
(no parallel HDF5 needed, no server waits for another to write), and a resume with
a different number of servers can read any subset of the files. A checkpoint exists
only once server 0 has written its manifest (to a temporary name, fsynced, renamed)
after every server reported its file: a half-written checkpoint has no manifest.

Workers draw no random numbers (they read their rows in file order, every epoch), so a
worker's epoch and offset are its whole state; the manifest records that as
"worker_random_state": null.
"""
import glob
import json
import logging
import mmap
import os
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..base import checksums
from ..base.checksums import Algorithm
from ..base.errors import DamagedFile
from ..base.files import atomic_file, open_hdf5, write_hdf5, write_json
from ..data.workplan import Handover
from ..wire.position import Position
from .dense_files import read_blocks
from .rundir import remove_checkpoint

log = logging.getLogger("mpips")
MANIFEST = "manifest.json"
FORMAT = "mpips-checkpoint"
VERSION = 2       # 2: datasets checked by XXH64 (1: SHA-256)
CHECKSUM = Algorithm.XXH64


def clock_dir(root: str, clock: int) -> str:
    return os.path.join(root, f"clock-{clock:012d}")


def shard_path(root: str, clock: int, server: int) -> str:
    return os.path.join(clock_dir(root, clock), f"server-{server:04d}.h5")


def write_shard(root: str, clock: int, server: int, store, attrs: dict,
                ranges: list | None = None, midway: Callable[[], object] | None = None) -> dict:
    """Write one server's shard of checkpoint `clock` (the key `ranges` it is primary for);
    returns its entry for the manifest. `midway`: see files.write_bytes."""
    keys, state = store.items()
    path = shard_path(root, clock, server)
    name = os.path.basename(path)
    write_hdf5(path, {"keys": keys, "state": state},
               {"clock": clock, "server": server, "width": store.width,
                "optimizer": store.optimizer.name, **attrs}, midway=midway)
    return {"file": name, "server": server, "keys": int(keys.shape[0]),
            "ranges": [server] if ranges is None else ranges,
            CHECKSUM.value: {"keys": checksums.of(keys, CHECKSUM),
                             "state": checksums.of(state, CHECKSUM)}}


# Set by the server when it must wait for the file being written (a stop, the job's end, the
# next checkpoint due): a paced write (stream_shard's `spread`) goes on at full speed. A page
# shared with the writers the server forks (made at import, before any fork).
_HURRY = mmap.mmap(-1, 1)
PACE_CHECK_S = 0.02   # a paced writer looks at the flag this often


def hurry(on: bool = True) -> None:
    """A paced write in progress (in a writer forked from this process) to go at full speed
    (`on`), or the next to keep its pace."""
    _HURRY[0] = 1 if on else 0


def _pace(until: float) -> None:
    """Wait until `until` (a paced write's next block), unless told to hurry."""
    while not _HURRY[0] and (left := until - time.monotonic()) > 0:
        time.sleep(min(left, PACE_CHECK_S))


def stream_shard(root: str, clock: int, server: int, store, attrs: dict,
                 ranges: list | None = None, midway: Callable[[], object] | None = None,
                 rows: int = 1 << 15, spread: float = 0.0) -> dict:
    """`write_shard`'s file and entry (the same datasets, attributes and checksums), written
    straight to disk `rows` table rows at a time: a forked writer then holds a block, not
    the shard twice (its copy and the file's image). Blocks of 32K rows (0.25-1.3 MB) are
    hashed while still in the core's cache after their write: the ranks serving beside the
    writer then lost 5-10% fewer clocks than with blocks of 256K rows (bench/checkpoint.py).
    HDF5 makes the file, its datasets contiguous and their space allocated; the blocks are
    written into that space (pwrite: one copy, hashed as they go). `spread`: seconds the
    blocks are paced over at least, so that a writer sharing the node's cores with the ranks
    takes a core a little at a time (until its server says `hurry`).
    Not in a process that goes on after a failure: HDF5, when a write fails under it, leaves
    objects that crash that process at exit (see files.write_hdf5)."""
    import h5py  # not at the top: as in base.files
    began = time.monotonic()
    n = len(store)
    path = shard_path(root, clock, server)
    digests = {"keys": checksums.stream(CHECKSUM), "state": checksums.stream(CHECKSUM)}
    with atomic_file(path, "w+b", size=n * (8 + 4 * store.columns)) as f:
        with h5py.File(f, "w") as h5:
            space = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            space.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)   # where the blocks go, now
            space.set_fill_time(h5py.h5d.FILL_TIME_NEVER)     # and no fill written first
            datasets = {"keys": h5.create_dataset("keys", (n,), "<u8", dcpl=space),
                        "state": h5.create_dataset("state", (n, store.columns), "<f4",
                                                   dcpl=space)}
            for name, value in {"clock": clock, "server": server, "width": store.width,
                                "optimizer": store.optimizer.name, **attrs}.items():
                h5.attrs[name] = str(value) if isinstance(value, str) else value
            offsets = {name: d.id.get_offset() for name, d in datasets.items()}
        row_bytes = {"keys": 8, "state": 4 * store.columns}
        at, half = 0, (n + 1) // 2
        for keys, state in store.blocks(rows):
            for name, block in (("keys", keys), ("state", state)):
                data = np.ascontiguousarray(block).reshape(-1).view(np.uint8).data
                if data.nbytes:
                    _write_at(f.fileno(), data, offsets[name] + row_bytes[name] * at)
                    digests[name].update(data)
            if midway is not None and at < half <= at + keys.shape[0]:
                midway()
            at += keys.shape[0]
            if spread > 0:
                _pace(began + spread * at / max(n, 1))
        if at != n:
            raise RuntimeError(f"the table changed while written ({at:,} keys, not {n:,})")
    return {"file": os.path.basename(path), "server": server, "keys": n,
            "ranges": [server] if ranges is None else ranges,
            CHECKSUM.value: {name: d.hexdigest() for name, d in digests.items()}}


def _write_at(fd: int, data: memoryview, offset: int) -> None:
    """All of `data` at `offset` of file `fd` (OSError if the disk refuses it)."""
    while data.nbytes:
        done = os.pwrite(fd, data, offset)
        data, offset = data[done:], offset + done


def write_dense_shard(root: str, clock: int, server: int, datasets: dict, attrs: dict) -> dict:
    """A full-batch job's checkpoint at iteration `clock`: one server's blocks of the dense
    tables (DenseTables.datasets), and beside it its manifest entry as JSON, for the solver's
    driver (a worker) to gather; returns the entry."""
    name = f"server-{server:04d}.h5"
    directory = clock_dir(root, clock)
    write_hdf5(os.path.join(directory, name), datasets,
               {"clock": clock, "server": server, **attrs})
    entry = {"file": name, "server": server, "keys": 0, "ranges": [],
             CHECKSUM.value: {k: checksums.of(v, CHECKSUM) for k, v in datasets.items()}}
    write_json(os.path.join(directory, f"server-{server:04d}.json"), entry)
    return entry


def dense_entries(root: str, clock: int, servers: list) -> list:
    """The manifest entries servers `servers` (indices) wrote beside their files of
    checkpoint `clock`."""
    entries = []
    for server in servers:
        with open(os.path.join(clock_dir(root, clock), f"server-{server:04d}.json")) as f:
            entries.append(json.load(f))
    return entries


def load_dense(directory: str, manifest: dict, tables) -> int:
    """Create in `tables` (a server's DenseTables) every table of the checkpoint, with the
    blocks the server holds now read from whichever file has them; returns the blocks
    loaded. The checkpoint may have been written by another number of servers."""
    return read_blocks([os.path.join(directory, shard["file"]) for shard in manifest["shards"]],
                       tables)


def write_manifest(root: str, clock: int, shards: list, **fields) -> str:
    """Make checkpoint `clock` complete: its manifest, written last and atomically."""
    directory = clock_dir(root, clock)
    manifest = {"format": FORMAT, "version": VERSION, "clock": clock,
                "shards": sorted(shards, key=lambda s: s["server"]), **fields}
    write_json(os.path.join(directory, MANIFEST), manifest)
    return directory


def read_manifest(directory: str) -> dict:
    with open(os.path.join(directory, MANIFEST)) as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"format is {manifest.get('format')!r}, not {FORMAT!r}")
    version = manifest.get("version")
    if not isinstance(version, int) or not 1 <= version <= VERSION:
        raise ValueError(f"version {version!r}: this mpips reads checkpoints of versions 1 to "
                         f"{VERSION} (a newer mpips wrote it? resume with that one)")
    return manifest


def verify(directory: str) -> str | None:
    """None if the checkpoint is complete and every dataset matches its checksum, else why not."""
    try:
        manifest = read_manifest(directory)
        shards = {s["file"]: (algorithm := checksums.algorithm_of(s), dict(s[algorithm.value]))
                  for s in manifest["shards"]}
        missing = [f for f in ("clock", "positions", "config") if f not in manifest]
        if missing:
            return f"manifest lacks {', '.join(missing)}"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"no readable manifest ({type(e).__name__}: {e})"
    try:
        read_positions(manifest)
    except ValueError as e:
        return f"{MANIFEST}: {e}"
    for file, (algorithm, digests) in shards.items():
        try:
            with open_hdf5(os.path.join(directory, file)) as f:
                problem = checksums.mismatched(f, digests, algorithm)
            if problem:
                return f"{file}: {problem}"
        except DamagedFile as e:
            return str(e)
        except Exception as e:   # noqa: BLE001 -- whatever else a damaged file raises, it is unusable
            return f"{file}: unreadable ({e})"
    return None


def all_checkpoints(root: str) -> list:
    """Checkpoint directories under `root`, newest first (complete or not)."""
    return sorted(glob.glob(os.path.join(root, "clock-*")), reverse=True)


def complete_checkpoints(root: str) -> list:
    """The checkpoints under `root` whose manifest was written (the last step of a
    checkpoint), newest first, without reading their shards: for advice and pruning, not for
    loading (see latest_valid)."""
    return [d for d in all_checkpoints(root) if os.path.exists(os.path.join(d, MANIFEST))]


def latest_valid(root: str) -> tuple[str, dict] | None:
    """The newest checkpoint that verifies, saying which newer ones were passed over and why."""
    for directory in all_checkpoints(root):
        problem = verify(directory)
        if problem is None:
            return directory, read_manifest(directory)
        log.warning("checkpoint %s is damaged or incomplete (%s); trying the one before it",
                    directory, problem)
    return None


def prune(root: str, keep: int, newest: str) -> None:
    """Keep `newest` (just written) and the complete checkpoints before it, `keep` in all;
    remove older ones, complete or not. Later ones are left alone: they can only be damaged
    checkpoints that a resume passed over."""
    before = [d for d in all_checkpoints(root) if d <= newest]
    complete = [d for d in complete_checkpoints(root) if d <= newest]
    if len(complete) <= keep:
        return
    oldest_kept = complete[keep - 1]
    for directory in before:
        if directory < oldest_kept:
            foreign = remove_checkpoint(directory)
            if foreign:
                log.warning("left in %s what mpips did not write there: %s", directory,
                            ", ".join(foreign))


def load_shards(directory: str, manifest: dict, store, placement, server: int) -> int:
    """Put into `store` every key of the checkpoint that `placement` gives to `server` (as
    primary or backup); returns how many. Written with as many key ranges, the checkpoint
    holds them in the files of the ranges this server holds (the ranges are equal slices of
    the hash: as many, the same); otherwise (re-sharding) every file is read and
    filtered."""
    bounds = manifest.get("placement", {}).get("bounds")
    same = (len(bounds) if bounds else manifest["servers"]) == placement.n_ranges
    held = placement.held_ranges(server)
    loaded = 0
    for shard in manifest["shards"]:
        if same and not any(held[r] for r in shard.get("ranges", [shard["server"]])):
            continue
        with open_hdf5(os.path.join(directory, shard["file"])) as f:
            keys, state = f["keys"][:], f["state"][:]
        mine = placement.holds(keys, server)
        store.load(keys[mine], state[mine])
        loaded += int(mine.sum())
    return loaded


class Resume(NamedTuple):
    """The checkpoint a job resumes from: its directory and its manifest."""
    directory: str
    manifest: dict


def positions(resume: Resume | None) -> dict:
    """Worker -> where it stood in a checkpoint (a Position), or {} when not resuming."""
    return read_positions(resume.manifest) if resume else {}


def read_positions(manifest: dict) -> dict:
    """Worker -> the Position a manifest keeps of it; ValueError naming the worker and the
    field of one it does not hold."""
    positions = manifest["positions"]
    if not isinstance(positions, dict):
        raise ValueError(f"positions is a {type(positions).__name__}, not a JSON object")
    out = {}
    for w, p in positions.items():
        if not w.isdigit():
            raise ValueError(f"positions names worker {w!r}, not a number")
        try:
            out[int(w)] = Position.from_dict(p)
        except ValueError as e:
            raise ValueError(f"worker {w}'s position: {e}") from None
    return out


def deaths(resume: Resume | None) -> tuple:
    """The hand-overs a checkpoint records (Handover, in order); () when not resuming or there
    were none."""
    return (tuple(Handover.from_dict(d) for d in resume.manifest.get("deaths", []))
            if resume else ())


def describe(root: str, every: bool = False) -> tuple[str, bool]:
    """A readable account of the checkpoints in `root`, and whether any of them is complete
    and undamaged: all of them, or (by default) the one `--resume` would take and the
    damaged ones newer than it, which a resume passes over."""
    found = all_checkpoints(root)
    if not found:
        raise ValueError(f"{root}: no checkpoints (clock-* directories)")
    lines, any_valid = [f"{root}: {len(found)} checkpoint(s), newest first"], False
    for directory in found:
        if any_valid and not every:
            break
        problem = verify(directory)
        name = os.path.basename(directory)
        if problem:
            lines.append(f"{name}  NOT USABLE: {problem}")
            continue
        if not any_valid and not every:
            lines.append(f"--resume {root} takes:")
        any_valid = True
        m = read_manifest(directory)
        c = m["config"]
        replicas = m["placement"].get("replicas", 1)
        copies = f", each key on {replicas} servers (written once)" if replicas > 1 else ""
        lines.append(f"{name}  complete, checksums match  (written {m['written']}, run "
                     f"{m['run_id']}, {m['servers']} server(s){copies}, {m['workers']} "
                     f"worker(s), {m['consistency']})")
        for shard in m["shards"]:
            with open_hdf5(os.path.join(directory, shard["file"])) as f:
                weights = f["state"][:, :int(f.attrs["width"])]
            norm = float(np.linalg.norm(weights)) if weights.size else 0.0
            biggest = float(np.abs(weights).max()) if weights.size else 0.0
            held = m["placement"].get("holders")
            ranges = shard.get("ranges", [shard["server"]])
            backups = sorted({s for r in ranges for s in held[r][1:]}) if held else []
            copied = f", backed up on server(s) {backups}" if backups else ""
            lines.append(f"  server {shard['server']}: {shard['keys']:,} keys, weights L2 norm "
                         f"{norm:.4g}, largest {biggest:.4g}{copied}  ({shard['file']})")
        for worker, p in sorted(read_positions(m).items()):
            where = ("done" if p.epoch >= c["epochs"] else
                     f"epoch {p.epoch}, next minibatch at "
                     f"{'its start' if p.offset < 0 else p.offset}")
            lines.append(f"  worker {worker}: clock {p.clock}, {p.examples:,} examples, "
                         f"{where}")
        o = c["optimizer"]
        lines.append(f"  config: --train {c['train']} --epochs {c['epochs']} --batch-size "
                     f"{c['batch_size']} --optimizer {o['name']} --lr {o['lr']:.4g} "
                     f"--l1 {o['l1']} --l2 {o['l2']} --consistency {c['consistency']}")
    if not any_valid:
        lines.append(f"none of them can be resumed: --resume {root} would stop with an error")
    return "\n".join(lines), any_valid
