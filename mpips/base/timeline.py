"""One rank's figures over time, for the report: sampled every so often during training, kept
in bounded memory, gathered to rank 0 at the end and written to RUN_DIR/timeline.h5.

Every field is cumulative since the rank started training (the report takes differences),
so that a thinned-out timeline still adds up. A worker fills examples, train_loss, wait_s,
bytes_sent and clock; a server fills busy_s, bytes_sent, held_s, pulls_held, pushes, clock
(the slowest worker's) and gap (fastest minus slowest clock of the workers still training)."""
import logging
import os

import numpy as np

from .errors import InputError, SaveError
from .files import write_hdf5

log = logging.getLogger("mpips")

_FIELDS = [
    ("t", "<f8"), ("examples", "<i8"), ("train_loss", "<f8"), ("wait_s", "<f8"),
    ("busy_s", "<f8"), ("bytes_sent", "<i8"), ("held_s", "<f8"), ("pulls_held", "<i8"),
    ("pushes", "<i8"), ("clock", "<i8"), ("gap", "<i8"),
]
SAMPLE = np.dtype(_FIELDS)
NAMES = tuple(name for name, _ in _FIELDS)   # SAMPLE's fields, in order


class Timeline:
    """Samples at least `every` seconds apart. When `capacity` are held, every other one is
    dropped and the interval doubles: a run of any length keeps between capacity/2 and
    capacity samples, evenly spread."""

    def __init__(self, every: float = 0.25, capacity: int = 512):
        if capacity < 2 or capacity % 2:
            raise ValueError(f"capacity must be even and at least 2, got {capacity}")
        self.every = every
        self._rows = np.zeros(capacity, SAMPLE)
        self._n = 0
        self._next = 0.0

    def due(self, t: float) -> bool:
        return t >= self._next

    @property
    def next_due(self) -> float:
        """When (seconds, as `add` counts them) the next sample is due."""
        return self._next

    def add(self, t: float, force: bool = False, **figures) -> None:
        """Record `figures` (SAMPLE's fields) at `t` seconds if a sample is due (or `force`:
        the last one, at the end of training)."""
        if not (force or self.due(t)):
            return
        if self._n == self._rows.shape[0]:
            kept = self._rows[1::2].copy()   # keeps the newest
            self._rows[:kept.shape[0]] = kept
            self._n = kept.shape[0]
            self.every *= 2
        i = self._n
        self._rows[i:i + 1] = np.zeros(1, SAMPLE)
        self._rows["t"][i] = t
        for name, value in figures.items():
            self._rows[name][i] = value
        self._n += 1
        self._next = t + self.every

    def samples(self) -> np.ndarray:
        return self._rows[:self._n].copy()


def empty() -> np.ndarray:
    return np.zeros(0, SAMPLE)


FILE = "timeline.h5"


def write(run_dir: str, samples: np.ndarray, counts: np.ndarray, n_servers: int,
          run_id: str, tasks: np.ndarray | None = None) -> None:
    """RUN_DIR/timeline.h5: one dataset per field, and `rank` (servers are ranks 0 to
    n_servers - 1); a pipeline's logged tasks (job/part_result.TASK_LOG), one dataset per field
    in the group `tasks`. A timeline that cannot be written is only a warning."""
    ranks = np.repeat(np.arange(counts.shape[0]), counts)
    logged = {} if tasks is None or not tasks.shape[0] else {
        f"tasks/{name}": tasks[name] for name in tasks.dtype.names or ()}
    try:
        write_hdf5(os.path.join(run_dir, FILE),
                   {"rank": ranks, **{name: samples[name] for name in NAMES}, **logged},
                   {"run_id": run_id, "servers": n_servers, "ranks": counts.shape[0]})
    except SaveError as e:
        log.warning("%s not written (the report will lack its plots over time): %s", FILE, e)


def read(run_dir: str) -> tuple:
    """(samples, rank of each, number of servers) from RUN_DIR/timeline.h5; InputError
    naming the file and what is wrong with it."""
    import h5py  # not at the top: ranks that open no HDF5 file skip its import (start-up time)
    path = os.path.join(run_dir, FILE)
    try:
        with h5py.File(path, "r") as f:
            missing = [n for n in ("rank", *NAMES) if n not in f]
            if missing:
                raise InputError(f"{path}: no dataset {missing[0]!r}")
            ranks = f["rank"][()]
            samples = np.zeros(ranks.shape[0], SAMPLE)
            for name in NAMES:
                column = f[name][()]
                if column.shape != ranks.shape:
                    raise InputError(f"{path}: {name!r} holds {column.shape[0]} values, "
                                     f"'rank' {ranks.shape[0]}")
                samples[name] = column
            return samples, ranks, int(f.attrs["servers"])
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise InputError(f"{path}: not a readable timeline ({e})") from None


def read_tasks(run_dir: str) -> dict | None:
    """A pipeline's logged tasks from RUN_DIR/timeline.h5, field -> array (None: the run had
    no pipeline); InputError naming the file if they cannot be read."""
    import h5py  # not at the top: ranks that open no HDF5 file skip its import (start-up time)
    path = os.path.join(run_dir, FILE)
    try:
        with h5py.File(path, "r") as f:
            if "tasks" not in f:
                return None
            tasks = {name: f["tasks"][name][()] for name in f["tasks"]}
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise InputError(f"{path}: not a readable timeline ({e})") from None
    needed = ("worker", "clock", "stage", "kind", "micro", "start", "end")
    missing = [n for n in needed if n not in tasks]
    if missing or len({tasks[n].shape for n in needed}) != 1:
        raise InputError(f"{path}: the pipeline's tasks lack {missing[0]!r}" if missing else
                         f"{path}: the pipeline's task fields differ in length")
    return tasks
