"""Live curves for TensorBoard (--tensorboard DIR), written by the lead server as the job
trains: the workers' training loss and rate from their reports (each progress line), the
servers' side at most once a second (each worker's time waiting for the clocks, the lead's
bytes and busy share, the slowest clock), the run's configuration as text, and at the end
the held-out logloss and AUC of the final model. The step of every point is the examples
trained so far. A disk that fails the writes costs the curves, never the training.
"""
import glob
import logging
import os
import time

from ..storage.tfevents import EventWriter

log = logging.getLogger("mpips")

SAMPLE_EVERY_S = 1.0   # the servers' figures, at most this often (the loop samples more)


def config_text(record: dict) -> str:
    """The configuration record as a Markdown table (TensorBoard's text plugin shows it)."""
    rows = [f"| {key} | {value} |" for key, value in record.items() if value not in (None, ())]
    return "\n".join(["| option | value |", "|---|---|", *rows])


class LiveCurves:
    def __init__(self, directory: str, record: dict | None = None, suffix: str = "mpips"):
        """`record`: the run's configuration, written first as text."""
        self.directory = directory
        self._writer: EventWriter | None = None
        self._last_sample = float("-inf")
        try:
            self._writer = EventWriter(directory, suffix)
            if record is not None:
                self._writer.text("config", config_text(record))
        except OSError as e:
            self._lost(e)

    @property
    def events(self) -> int:
        return self._writer.events if self._writer else 0

    def line(self, examples: int, loss: float, rate: float, epoch: float) -> None:
        """A progress line's figures: the recent training logloss, examples/s, epochs done."""
        self.write(examples, {"train/logloss": loss, "train/examples_per_s": rate,
                              "train/epoch": epoch})

    def sample(self, examples: int, figures: dict, force: bool = False) -> None:
        """The servers' figures ({tag: value}), if a second has passed since the last (or
        `force`: the loop's last)."""
        now = time.monotonic()
        if force or now - self._last_sample >= SAMPLE_EVERY_S:
            self._last_sample = now
            self.write(examples, figures)

    def write(self, step: int, figures: dict) -> None:
        """Scalars {tag: value} at `step`."""
        if self._writer is None:
            return
        try:
            self._writer.scalars(figures, step)
        except OSError as e:
            self._lost(e)

    def _lost(self, e: OSError) -> None:
        log.warning("--tensorboard %s: the live curves cannot be written (%s); training goes "
                    "on without them", self.directory, e)
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError:
                pass
        self._writer = None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def write_final(directory: str, summary: dict) -> None:
    """The run's end, from the rank that writes its summary (in a file of its own): the final
    model's held-out logloss and AUC (if it was tested), the whole run's training logloss
    and rate."""
    figures = {"test/logloss": summary.get("test_logloss"),
               "test/auc": summary.get("test_auc"),
               "train/logloss_whole_run": summary.get("train_logloss"),
               "train/examples_per_s_whole_run": summary.get("examples_per_s")}
    curves = LiveCurves(directory, suffix="end")
    curves.write(int(summary.get("train_examples") or 0),
                 {tag: v for tag, v in figures.items() if v is not None})
    curves.close()


def snapshots_suffix(run_id: str) -> str:
    """The name's end of the event file of run `run_id`'s snapshot scores."""
    return f"snapshots-{run_id}"


def snapshot_point(scored: dict) -> tuple | None:
    """(step, {tag: value}) of a scored snapshot (evaluate.score_snapshot's entry); None for
    a snapshot of an older run, which did not record the examples it had trained."""
    if scored.get("trained_examples") is None:
        return None
    figures = {"test/logloss_snapshots": scored["logloss"],
               "test/auc_snapshots": scored.get("auc")}
    return scored["trained_examples"], {tag: v for tag, v in figures.items() if v is not None}


def write_snapshots(directory: str, curve: list, run_id: str) -> None:
    """The held-out logloss and AUC of each snapshot of run `run_id` (evaluate.score_snapshots'
    entries, as `mpips report` scores them) at the examples it had trained, in place of those
    written for it before (by the job's snapshot scorer, or an earlier report). A directory
    that cannot be written costs these points, not the report."""
    suffix = snapshots_suffix(run_id)
    try:
        for old in glob.glob(os.path.join(directory, f"events.out.tfevents.*.{suffix}")):
            os.remove(old)
    except OSError as e:
        log.warning("--tensorboard %s: the snapshots' held-out scores are not written (%s)",
                    directory, e)
        return
    curves = LiveCurves(directory, suffix=suffix)
    for scored in curve:
        point = snapshot_point(scored)
        if point:
            curves.write(*point)
    curves.close()
