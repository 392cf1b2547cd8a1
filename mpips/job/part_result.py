"""What a rank's part of a training job (a server's, a worker's, a full-batch solver's, a
pipeline stage's) hands back to the job for its summary."""
from dataclasses import dataclass, field

import numpy as np

from ..base import timeline
from ..models.lbfgs import Step
from .snapshot_scorer import SnapshotScorer

# One row per task a pipeline's stage ran, for the run's record (timeline.h5, the report's
# plot of a step): wall-clock seconds, comparable across ranks and nodes to NTP's precision.
TASK_LOG = np.dtype([("worker", "<i4"), ("clock", "<i8"), ("stage", "<i4"), ("kind", "S1"),
                     ("micro", "<i4"), ("start", "<f8"), ("end", "<f8")])


# Rows a worker trained in this launch, per epoch (the summary's rows_per_epoch).
EPOCH_ROWS = np.dtype([("worker", "<i4"), ("epoch", "<i4"), ("rows", "<i8")])


def no_epoch_rows() -> np.ndarray:
    return np.zeros(0, EPOCH_ROWS)


def epoch_rows(worker: int, counts: dict) -> np.ndarray:
    """EPOCH_ROWS of `worker`'s rows trained, {epoch: rows}."""
    return np.array([(worker, e, n) for e, n in sorted(counts.items())], EPOCH_ROWS)


def no_steps() -> np.ndarray:
    """A full-batch solver's steps, where there are none (every rank but its driver's)."""
    return np.empty((0, len(Step._fields)))


def no_tasks() -> np.ndarray:
    return np.zeros(0, TASK_LOG)


@dataclass
class PartResult:
    record: np.ndarray       # this rank's figures (summary.new_record)
    margins: np.ndarray      # the test rows it scored: their margins, ...
    labels: np.ndarray       # ... and labels
    held: np.ndarray         # a server's hold times per worker (zeros elsewhere)
    steps: np.ndarray = field(default_factory=no_steps)   # float64[k, len(Step._fields)]
    samples: np.ndarray = field(default_factory=timeline.empty)   # its timeline
    tasks: np.ndarray = field(default_factory=no_tasks)   # a pipeline's tasks (TASK_LOG)
    epoch_rows: np.ndarray = field(default_factory=no_epoch_rows)   # a worker's (EPOCH_ROWS)
    scorer: SnapshotScorer | None = None   # the lead's, scoring the snapshots (--tensorboard)
