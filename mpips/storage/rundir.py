"""What mpips writes in a run directory and in a checkpoint directory, and the lock that keeps
a second job out of either.

mpips removes only files whose names it writes, never a whole directory: anything else found
in its directories is named and left in place. The lock is a file created with O_EXCL (which
network file systems honour), holding who took it (the job's lead) and, when the job can
outlive its lead (hot failover), every process that may lead it: the server that leads next
takes the lock over. The holder refreshes its modification time while it runs, so a lock left
by a job that died is recognised and taken over: at once when none of the job's processes on
this host runs, else once it has not been refreshed for STALE_AFTER_S.
"""
import json
import logging
import os
import re
import socket
import threading
import time

from ..base.errors import ConfigError, SaveError
from ..base.files import write_json
from ..base.processes import Process

log = logging.getLogger("mpips")

LOCK = "mpips.lock"
HEARTBEAT_S = 10.0     # how often the holder refreshes its lock
STALE_AFTER_S = 60.0   # a lock not refreshed for this long belongs to a job that is gone
LINGER_S = 5.0         # how long a lock's holder on this host may take to end

# Files a run writes in RUN_DIR, and those of checkpoints in CKPT_DIR (relative paths), with
# the temporary names they have while being written.
_TMP = r"(\.tmp(-\d+)?)?"
RUN_FILES = re.compile(rf"(summary\.json|timeline\.h5|report\.html){_TMP}|"
                       rf"(model|pulls|snapshots/(\d{{4,}}|final))/"
                       rf"server-\d{{4,}}\.h5{_TMP}|test-events/[0-9a-f]{{16}}\.fired{_TMP}")
RUN_DIRS = re.compile(r"model|pulls|snapshots(/(\d{4,}|final))?|test-events")
CHECKPOINT_FILES = re.compile(rf"clock-\d{{12}}/(server-\d{{4,}}\.(h5|json)|manifest\.json){_TMP}")
CHECKPOINT_DIRS = re.compile(r"clock-\d{12}")


def _walk(root: str, dirs: re.Pattern):
    """(relative path, is a directory) of everything inside the directories of `root` that
    match `dirs`, and those directories, deepest first."""
    found = []
    for top in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        path = os.path.join(root, top)
        if not (dirs.fullmatch(top) and os.path.isdir(path)):
            continue
        for here, _subdirs, files in os.walk(path, topdown=False):
            rel = os.path.relpath(here, root)
            found += [(os.path.join(rel, f), False) for f in sorted(files)]
            found.append((rel, True))
    return found


def written(root: str, files: re.Pattern, dirs: re.Pattern, top: tuple = ()) -> list:
    """Relative paths of the files under `root` that mpips writes (of the pattern `files`)."""
    inside = [p for p, is_dir in _walk(root, dirs) if not is_dir and files.fullmatch(p)]
    return [t for t in top if os.path.isfile(os.path.join(root, t))] + inside


def remove_written(root: str, files: re.Pattern, dirs: re.Pattern, top: tuple = ()) -> list:
    """Remove what mpips wrote under `root`, and its directories once empty. Returns the
    relative paths of everything else found in those directories, which stays."""
    foreign = []
    for t in top:
        for name in os.listdir(root) if os.path.isdir(root) else []:
            if name == t or re.fullmatch(re.escape(t) + _TMP, name):
                os.remove(os.path.join(root, name))
    for rel, is_dir in _walk(root, dirs):
        path = os.path.join(root, rel)
        if is_dir:
            if dirs.fullmatch(rel):
                try:
                    os.rmdir(path)
                except OSError:
                    pass   # it still holds someone else's files
        elif files.fullmatch(rel):
            os.remove(path)
        else:
            foreign.append(rel)
    return foreign


def run_outputs(out: str) -> list:
    return written(out, RUN_FILES, RUN_DIRS, ("summary.json",))


def checkpoint_files(root: str) -> list:
    return written(root, CHECKPOINT_FILES, CHECKPOINT_DIRS)


def remove_run_outputs(out: str) -> list:
    return remove_written(out, RUN_FILES, RUN_DIRS, ("summary.json",))


def remove_checkpoints(root: str) -> list:
    return remove_written(root, CHECKPOINT_FILES, CHECKPOINT_DIRS)


def remove_checkpoint(directory: str) -> list:
    """Remove one checkpoint (clock-N) directory's files; returns what else it held."""
    root, name = os.path.split(directory.rstrip(os.sep))
    return remove_written(root, CHECKPOINT_FILES, re.compile(re.escape(name)))


def runs_in(out: str, checkpoints: str) -> set:
    """The run ids of the outputs in `out` and the checkpoints in `checkpoints` (None for an
    output whose run cannot be told)."""
    import h5py  # not at the top: ranks that open no HDF5 file skip its import (start-up time)
    ids = set()
    for rel in run_outputs(out):
        path = os.path.join(out, rel)
        try:
            if rel == "summary.json":
                with open(path) as f:
                    ids.add(json.load(f).get("run_id"))
            elif rel.endswith(".h5"):
                with h5py.File(path, "r") as f:
                    ids.add(str(f.attrs["run_id"]) if "run_id" in f.attrs else None)
        except (OSError, ValueError, KeyError):
            ids.add(None)
    for rel in checkpoint_files(checkpoints):
        if rel.endswith("manifest.json"):
            try:
                with open(os.path.join(checkpoints, rel)) as f:
                    ids.add(json.load(f).get("run_id"))
            except (OSError, ValueError):
                ids.add(None)
    return ids


def _describe(paths: list, limit: int = 5) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def check_outputs(out: str, checkpoints: str, overwrite: bool, continuing: str | None) -> None:
    """ConfigError unless this job may write `out` and `checkpoints`: nothing of another run
    is there, or `overwrite`. `continuing`: the run id of the checkpoint resumed, whose own
    outputs a resume replaces."""
    if overwrite:
        return
    outputs, ckpts = run_outputs(out), checkpoint_files(checkpoints)
    if not outputs and not ckpts:
        return
    if continuing is not None:
        others = runs_in(out, checkpoints) - {continuing}
        if not others:
            return
        named = ", ".join(sorted(str(r) for r in others if r)) or "an unidentified run"
        raise ConfigError(
            f"--resume: the checkpoint is of run {continuing}, but --out {out} or "
            f"--checkpoint-dir {checkpoints} holds {named} "
            f"({_describe(outputs + [os.path.join(checkpoints, c) for c in ckpts])}); "
            f"a resume replaces only its own run's outputs: choose another --out, or pass "
            f"--overwrite to replace them")
    if outputs:
        tops = list(dict.fromkeys(p.split(os.sep)[0] for p in outputs))
        raise ConfigError(f"--out {out} already holds a run ({', '.join(tops)}); choose another "
                          f"--out, or pass --overwrite to replace it (--resume continues it)")
    raise ConfigError(f"--checkpoint-dir {checkpoints} already holds checkpoints; continue them "
                      f"with --resume {checkpoints}, choose another directory, or pass "
                      f"--overwrite to remove them")


def _holder(run_id: str, what: str, job: tuple = ()) -> dict:
    """What a lock says: its holder (this process), and `job`, the processes of the job that
    may hold it (by default, this one)."""
    me = Process.this()
    return {"run_id": run_id, "host": me.host, "pid": me.pid, "started": me.started,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "taken": time.strftime("%Y-%m-%d %H:%M:%S"), "what": what,
            "job": [p._asdict() for p in job or (me,)]}


def _job(holder: dict) -> list:
    """The processes of a lock's job (a lock without the list: its holder's only)."""
    try:
        return [Process(str(p["host"]), int(p["pid"]), p.get("started"))
                for p in holder.get("job") or [holder]]
    except (KeyError, TypeError, ValueError):
        return []


def _pids(processes: list) -> str:
    return ", ".join(str(p.pid) for p in processes)


def _why_stale(holder: dict, age: float) -> str | None:
    """Why the job that holds a lock is gone, or None if it may be running: it is, while any
    of its processes on this host runs, and, if it has processes elsewhere, while its lead
    refreshes the lock."""
    host = socket.gethostname()
    slurm = os.environ.get("SLURM_JOB_ID")
    if holder.get("slurm_job_id") and holder.get("slurm_job_id") == slurm:
        return f"an earlier run of Slurm job {slurm} (requeued)"
    job = _job(holder)
    here = [p for p in job if p.host == host]
    if here and len(here) == len(job) and not any(p.running() for p in here):
        return (f"process {here[0].pid} on this host is no longer running" if len(here) == 1
                else f"its processes on this host ({_pids(here)}) are no longer running")
    if age > STALE_AFTER_S:
        return f"not refreshed for {age:.0f} s"
    return None


def _describe_job(holder: dict) -> str:
    """A lock's job for a person: its run, its lead, the processes it may go on in."""
    host = socket.gethostname()
    lead = (holder.get("host"), holder.get("pid"))
    others = [p for p in _job(holder)
              if (p.host, p.pid) != lead and (p.host != host or p.running())]
    hosts = sorted({p.host for p in others})
    rest = "; ".join(f"{_pids([p for p in others if p.host == h])} on {h}" for h in hosts)
    return (f"run {holder.get('run_id', '?')} on host {holder.get('host', '?')} (pid "
            f"{holder.get('pid', '?')}, since {holder.get('taken', '?')}"
            + (f"; its other servers: pids {rest}" if rest else "") + ")")


def _read(path: str) -> dict:
    """What a lock says ({} if it is not a JSON object)."""
    with open(path) as f:
        holder = json.load(f)
    return holder if isinstance(holder, dict) else {}


def running_job(directory: str) -> tuple[dict | None, str | None]:
    """The job holding `directory`'s lock (None if none does), and why it is not running
    (None if it may be)."""
    path = os.path.join(directory, LOCK)
    try:
        with open(path) as f:
            holder = json.load(f)
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return None, "no job holds it"
    except (OSError, ValueError) as e:
        return None, f"its lock {path} cannot be read ({e})"
    return holder, _why_stale(holder, age) if isinstance(holder, dict) else "a damaged lock"


class DirectoryLock:
    """A lock on a directory for one job. Taken with `acquire` (or `take_over` by the job's
    next lead), refreshed by `refresh`, dropped by `release`."""

    def __init__(self, directory: str, run_id: str, what: str, job: tuple = ()):
        """`job`: the processes that may lead the job after this one (Process)."""
        self.directory = directory
        self.path = os.path.join(directory, LOCK)
        self.holder = _holder(run_id, what, job)
        self.held = False

    def acquire(self) -> None:
        """Take the lock, or raise ConfigError naming the job that holds it."""
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{self.holder['what']} {self.directory}: cannot create the "
                              f"directory ({e.strerror})") from None
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            except OSError as e:
                raise ConfigError(f"{self.holder['what']} {self.directory}: cannot write there "
                                  f"({e.strerror})") from None
            with os.fdopen(fd, "w") as f:
                json.dump(self.holder, f)
            self.held = True
            return
        raise ConfigError(f"{self.path}: another job took the lock at the same moment")

    def _take_over_if_stale(self) -> None:
        try:
            with open(self.path) as f:
                holder = json.load(f)
            age = time.time() - os.stat(self.path).st_mtime
        except FileNotFoundError:
            return   # released meanwhile: try again
        except (OSError, ValueError):
            holder, age = {}, time.time() - os.stat(self.path).st_mtime
        why = _why_stale(holder, age)
        if why is None and any(p.host == self.holder["host"] for p in _job(holder)):
            # A job killed a moment ago (a resume right after a failed launch) may still be
            # ending its ranks: give its process a bounded while to go.
            deadline = time.monotonic() + LINGER_S
            while why is None and time.monotonic() < deadline:
                time.sleep(0.1)
                why = _why_stale(holder, age)
        if why is None:
            raise ConfigError(
                f"{self.holder['what']} {self.directory} is in use by {_describe_job(holder)}; "
                f"wait for it to end or choose another directory. If that job is gone, its "
                f"lock ({self.path}) is taken over once none of those processes runs, or "
                f"{STALE_AFTER_S:.0f} s after its last refresh")
        log.warning("taking over the lock of run %s in %s: %s", holder.get("run_id", "?"),
                    self.directory, why)
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass

    def take_over(self, why: str) -> None:
        """This process leads the job now (`why`): the lock names it, unless it is another
        run's (taken over meanwhile: then left alone, and said)."""
        try:
            run = _read(self.path).get("run_id")
        except FileNotFoundError:
            run = self.holder["run_id"]
        except (OSError, ValueError) as e:
            run = f"? ({self.path} cannot be read: {e})"
        if run != self.holder["run_id"]:
            log.error("%s: the lock is run %s's, not this run's: it is not taken over (%s)",
                      self.path, run, why)
            return
        try:
            write_json(self.path, self.holder)
        except SaveError as e:
            log.error("could not take over the lock %s (%s): %s", self.path, why, e)
            return
        self.held = True
        log.warning("took over the lock %s: %s", self.path, why)

    def _mine(self) -> bool:
        """Whether the lock still names this process (a lead taken for dead, that comes
        back, finds it the next lead's)."""
        try:
            holder = _read(self.path)
        except (OSError, ValueError):
            return False
        return (holder.get("host"), holder.get("pid")) == (self.holder["host"],
                                                           self.holder["pid"])

    def refresh(self) -> None:
        if self.held:
            try:
                os.utime(self.path)
            except OSError as e:
                log.warning("could not refresh the lock %s: %s", self.path, e.strerror)

    def release(self) -> None:
        if self.held:
            self.held = False
            if self._mine():
                try:
                    os.remove(self.path)
                except OSError:
                    pass


class RunLocks:
    """The locks of one job's directories, held by its lead and refreshed every HEARTBEAT_S
    from a daemon thread (no MPI in it). Rank 0 takes them; under hot failover, the server
    that leads after the lead died takes them over."""

    def __init__(self, locks: list):
        self.locks = locks
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take every lock, or none (ConfigError naming the job that holds one)."""
        try:
            for lock in self.locks:
                lock.acquire()
        except ConfigError:
            self.stop()
            raise
        self._refresh()

    def take_over(self, why: str) -> None:
        for lock in self.locks:
            lock.take_over(why)
        self._refresh()

    def _refresh(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mpips-lock", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            for lock in self.locks:
                lock.refresh()

    def stop(self) -> None:
        self._stop.set()
        for lock in self.locks:
            lock.release()
