"""The files a server writes for its job beside serving: a checkpoint's shard (by its resident
writer, a forked one, or inline) and, on the lead, its manifest (the server's writer hooks);
the model as it stands for learning curves (--snapshot-every, by a forked writer but the
last); under ULFM, the key ranges of servers that died as the model was saved, written again
by their new primaries; and where the model is kept as of an earlier clock, for messages.
"""
import contextlib
import functools
import glob
import logging
import os
import shutil
import time
from collections.abc import Callable

import numpy as np

from ..base.errors import SaveError
from ..base.forked import Written
from ..base.log import say
from ..data import fingerprint
from ..ranks.roles import Roles
from ..ranks.ulfm import agreed_dead
from ..run import testevents
from ..run.config import TrainConfig
from ..server.checkpoint_clocks import Standing
from ..server.context import ShardWrite
from ..server.dense_tables import DenseTables
from ..server.replicas import PrimaryKeys
from ..storage import checkpoint
from ..storage.model_files import save_shard, shard_path, written_whole
from ..wire.clocks import FINISHED, ClockTable
from ..wire.placement import Placement, describe_ranges
from .snapshot_write import READ_WAIT_S, Resident, SnapshotWrite

log = logging.getLogger("mpips")
SPREAD_SHARE = 0.5    # of the time between periodic checkpoints (see spread_of)
SPREAD_MOST_S = 10.0  # ... and at most this long (a stop or the end makes it hurry)


def resident_writer(cfg: TrainConfig, roles: Roles, name: str, own: PrimaryKeys) -> Resident:
    """The server's resident writer (job.snapshot_write.Resident): a checkpoint's shard, or a
    snapshot's (task["kind"]), from the copy of the table a task hands it. Forked as the server
    starts when checkpoints are periodic, else at its first file."""
    def work(task: dict, table) -> dict:
        placement = Placement.of_record(task["placement"])   # the ranges as at the copy
        keys = PrimaryKeys(table, placement, roles.index)
        if task["kind"] == "snapshot":
            return _snapshot_file(task, roles, keys)
        return _checkpoint_file(cfg, roles, name, task["clock"], task["writer"], keys, True,
                                task["spread"])

    def before_read(task: dict) -> None:
        if task["kind"] == "checkpoint":
            testevents.reached("reading", task["writer"])

    resident = Resident(own.store, work, before_read=before_read)
    if cfg.checkpointing.on and not cfg.checkpointing.inline:
        resident.ready()   # before the table is filled or loaded
    return resident


def _checkpoint_file(cfg: TrainConfig, roles: Roles, name: str, clock: int, writer: int,
                     keys: PrimaryKeys, forked: bool, spread: float = 0.0) -> dict:
    """Checkpoint `clock`'s file of `keys`, in the process that writes it (test events at its
    midpoint); a writer beside the loop streams it, block by block, over `spread` seconds at
    least, which only a process about to end may do."""
    how = (functools.partial(checkpoint.stream_shard, spread=spread) if forked
           else checkpoint.write_shard)
    try:
        return how(cfg.checkpoints, clock, roles.index, keys, {"run_id": name},
                   ranges=keys.ranges(), midway=lambda: testevents.reached("writing", writer))
    except SaveError as e:
        return {"server": roles.index, "error": str(e)}


def _snapshot_file(task: dict, roles: Roles, keys: PrimaryKeys) -> dict:
    """A snapshot's file of `keys`: weights only, as the task says (its directory, the
    file's attributes, the clocks done; "meta" is the copy's, job.snapshot_write)."""
    try:
        path = save_shard(task["directory"], roles.index, len(roles.servers), keys,
                          task["attrs"], task["longest"], weights_only=True,
                          ranges=keys.ranges(), n_ranges=keys.placement.n_ranges)
    except SaveError as e:
        return {"error": str(e)}
    return {"file": path}


def spread_of(seconds: float | None) -> float:
    """Seconds a periodic checkpoint's file is written over, at least, for checkpoints every
    `seconds` (0 or None: by clocks, not spread): SPREAD_SHARE of the time to the next, at
    most SPREAD_MOST_S. The writer takes its blocks' CPU a little at a time, so the ranks on a
    node with no core to spare are held for it less (as PostgreSQL spreads a checkpoint over
    checkpoint_completion_target of its interval). A checkpoint that stops the job, or the
    last one at its end, is written at once."""
    return min(SPREAD_SHARE * seconds, SPREAD_MOST_S) if seconds and seconds > 0 else 0.0


def checkpoint_writers(cfg: TrainConfig, roles: Roles, name: str, own: PrimaryKeys,
                       trained_on: str | None, resident: Resident) -> dict:
    """The server's hooks that write a checkpoint: its shard (by `resident` if idle), and
    (the lead) the manifest (`trained_on`: the training data's format)."""
    root = cfg.checkpoints
    keep = cfg.checkpointing.keep
    assert keep is not None, "the job fills in --keep-checkpoints before any server starts"
    # What the workers read, as it was when this launch started: a resume compares it.
    inputs = {"train": fingerprint.of_input(cfg.data.train)}   # any server may come to lead
    started = []

    def cleanup(clock: int, pid: int) -> None:
        """What a writer that did not finish left: its temporary file."""
        with contextlib.suppress(OSError):
            os.remove(f"{checkpoint.shard_path(root, clock, roles.index)}.tmp-{pid}")

    def handed_over(writer: int) -> None:
        for point in ("reading", "writing"):
            testevents.handed_over(point, writer)

    def write_shard(clock: int, paced: bool) -> ShardWrite:
        started.append(clock)
        writer = len(started)
        if cfg.checkpointing.inline:
            start = time.monotonic()
            return Written(_checkpoint_file(cfg, roles, name, clock, writer, own, False), start)
        task = {"kind": "checkpoint", "clock": clock, "writer": writer,
                "placement": own.placement.record(),
                "spread": spread_of(cfg.checkpointing.seconds) if paced else 0.0}
        return SnapshotWrite(
            own.store, lambda table: resident.work(task, table), f"server-{roles.index:04d}.h5",
            lambda pid: cleanup(clock, pid),
            # the events at its start and midpoint fire in the writer (a copy of this process as
            # it was when forked, with this one's events), not here
            forked=lambda: handed_over(writer), resident=resident, task=task,
            read_within=min(READ_WAIT_S, cfg.faults.timeout / 10))

    def write_manifest(clock: int, shards: list, standing: Standing,
                       deaths: list) -> str | None:
        try:
            directory = checkpoint.write_manifest(
                root, clock, shards, run_id=name, config=cfg.to_record(),
                servers=len(roles.servers), workers=len(roles.workers),
                consistency=cfg.consistency.mode, inputs=inputs, data_format=trained_on,
                placement=own.placement.describe(),
                positions={str(w): p.as_dict() for w, p in sorted(standing.positions.items())},
                deaths=deaths, **(standing.handed_out or {}),
                worker_random_state=None,   # workers draw no random numbers (file order)
                written=time.strftime("%Y-%m-%d %H:%M:%S"))
        except SaveError as e:
            return str(e)
        checkpoint.prune(root, keep, directory)
        say(f"checkpoint at clock {clock}: {directory}")
        return None

    return {"write_shard": write_shard, "write_manifest": write_manifest}


def snapshot_writer(cfg: TrainConfig, roles: Roles, own: PrimaryKeys, attrs: dict,
                    clocks: ClockTable, examples: Callable[[], int], started: float,
                    resident: Resident) -> Callable[[bool], ShardWrite | None]:
    """The server's hook that writes the model as it is now, for learning curves
    (--snapshot-every): weights only, to RUN_DIR/snapshots/NNNN, from a copy of the table
    taken now, by `resident` if idle or else a forked child (job.snapshot_write); the last one
    (`final`, every worker has finished) to snapshots/final, in the loop. `examples()`: those
    trained so far."""
    taken: list[float] = []

    def snapshot(final: bool) -> ShardWrite | None:
        taken.append(time.monotonic() - started)
        slowest = clocks.slowest()
        label = "final" if final else f"{len(taken) - 1:04d}"
        directory = os.path.join(cfg.run_dir, "snapshots", label)
        task = {"kind": "snapshot", "directory": directory,
                "attrs": {**attrs, "complete": True, "elapsed_s": taken[-1],
                         "slowest_clock": -1 if slowest == FINISHED else slowest,
                         "examples": examples()},
                "longest": clocks.longest, "placement": own.placement.record()}   # as now
        if final:
            entry = _snapshot_file(task, roles, own)
            if "error" in entry:
                log.warning("snapshot %s not written: %s", label, entry["error"])
            return None
        return SnapshotWrite(
            own.store, lambda table: resident.work(task, table), f"snapshot {label}",
            lambda pid: _remove(f"{shard_path(directory, roles.index)}.tmp-{pid}"),
            forked=lambda: None, resident=resident, task=task)

    return snapshot


def drop_unfinished_snapshots(run_dir: str, taken: np.ndarray) -> list[str]:
    """At the job's end (rank 0): the numbered snapshots past the last one every server took
    (`taken`: each live server's count) that lack some server's file, removed. Each server
    takes its numbered snapshots by its own timer, so one may take a last snapshot that
    another, whose workers finished first, never does: no reader could use it. Those a
    server's failure left incomplete earlier stay, for the readers to name. The removed."""
    first = int(taken.min()) if taken.size else 0
    removed = []
    for directory in sorted(glob.glob(os.path.join(run_dir, "snapshots", "[0-9]*"))):
        label = os.path.basename(directory)
        if label.isdigit() and int(label) >= first and not written_whole(directory):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(label)
    if removed:
        log.info("snapshot%s %s removed: taken by some servers only, as training ended",
                 "s" * (len(removed) > 1), ", ".join(removed))
    return removed


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def write_for_the_dead(roles: Roles, own: PrimaryKeys, dense: DenseTables, model_dir: str,
                        save: Callable[[], None]) -> int:
    """Under ULFM, once every living server has written its part of the model: the key ranges
    of the servers that died meanwhile (their file written or not), written again by their
    new primaries from their copies, as a failover places them (each writes its own file again,
    with them); a dead server's file, if any, goes. Returns how many key ranges no living
    server has a copy of (the model is short of them: the job must not end as if whole)."""
    dead = agreed_dead(roles.group)
    if not dead:
        return 0
    before = own.placement
    after = before.without(dead)
    lost = set(after.lost) | {r for r, h in enumerate(after.holders)
                              if h and not before.held_ranges(h[0])[r]}
    first = roles.index == after.lead   # the first living server
    if lost:
        if first:
            log.error("every copy of key range(s) %s died with server(s) %s before it was "
                      "written to the model", describe_ranges(lost), sorted(dead))
        return len(lost)
    took = np.flatnonzero(after.primary_ranges(roles.index) & ~before.primary_ranges(roles.index))
    if took.shape[0]:
        own.placement = after
        dense.placement_changed(after)
        save()
        log.warning("server(s) %s died before writing their part of the model: key range(s) %s "
                    "are written from the living copies here", sorted(dead), describe_ranges(took))
    if first:   # a file one wrote before it died holds ranges the survivors' files hold now
        for server in dead:
            with contextlib.suppress(FileNotFoundError):
                os.remove(shard_path(model_dir, server))
    return 0


def checkpoints_hint(cfg: TrainConfig) -> str:
    """Where the model is kept as of an earlier clock, if anywhere."""
    found = checkpoint.complete_checkpoints(cfg.checkpoints)
    return (f"; the newest checkpoint, {found[0]}, holds it as of its clock" if found else
            "; there is no checkpoint of it")
