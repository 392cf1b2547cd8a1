"""The held-out logloss and AUC of each snapshot while the job trains (--tensorboard with
--snapshot-every and --test): a process of its own, started by the lead server, scores
each snapshot once every server has written its file and adds the points to the live
curves. It reads files only (the snapshots, the test file: no MPI), runs at a lower
priority than the ranks, and ends once told that training is over (or when the lead is
gone), having scored the snapshots complete by then. `mpips report` scores them again,
the same way, in place of these points.

    python -m mpips.job.snapshot_scorer RUN_DIR TENSORBOARD_DIR TEST RUN_ID
"""
import glob
import logging
import os
import select
import subprocess
import sys
import time

log = logging.getLogger("mpips")

POLL_S = 0.25     # between looks at RUN_DIR/snapshots/
PATIENCE_S = 5.0  # once training is over: how long a snapshot some server has not yet
                  # written is waited for (a server that died never writes it)
NICENESS = 10     # the ranks keep the cores they need


class SnapshotScorer:
    """The lead's handle on the process that scores the snapshots."""

    def __init__(self, process: subprocess.Popen):
        self.process = process

    @classmethod
    def start(cls, run_dir: str, directory: str, test: str, run_id: str
              ) -> "SnapshotScorer | None":
        """The scorer, started; None (with a warning) if it cannot be."""
        # Not a process of the MPI job: nothing of the launcher's reaches it.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "MPIPS_TEST_EVENTS"))}
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "mpips.job.snapshot_scorer", run_dir, directory, test,
                 run_id], stdin=subprocess.PIPE, env=env, close_fds=True)
        except OSError as e:
            log.warning("--tensorboard %s: the snapshots' held-out scores will not be written "
                        "as the job trains (%s); `mpips report` writes them", directory, e)
            return None
        return cls(process)

    def training_over(self) -> None:
        """No snapshot comes after those written now: the scorer scores them and ends."""
        stdin = self.process.stdin
        if stdin is not None and not stdin.closed:
            stdin.close()

    def finish(self, bound: float) -> None:
        """Training is over: wait up to `bound` seconds for the scorer to end (stopped, with
        a warning, after that)."""
        self.training_over()
        try:
            status = self.process.wait(bound)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            log.warning("the scorer of the snapshots (process %d) was still at work after "
                        "%.0f s, half of --timeout: stopped; `mpips report` scores the "
                        "snapshots it left", self.process.pid, bound)
            return
        if status != 0:
            log.warning("the scorer of the snapshots (process %d) ended with status %d: "
                        "`mpips report` scores the snapshots it left", self.process.pid,
                        status)


def _told_over(wait_s: float) -> bool:
    """Whether the lead said that training is over (closed our stdin, or is gone), waiting
    up to `wait_s` seconds for it."""
    readable, _, _ = select.select([sys.stdin], [], [], wait_s)
    return bool(readable) and not os.read(sys.stdin.fileno(), 1)


def score_as_they_come(run_dir: str, directory: str, test: str, run_id: str) -> int:
    """The scorer's life (see the module); returns the snapshots scored."""
    from ..models.evaluate import read_rows, score_snapshot
    from .livecurves import LiveCurves, snapshot_point, snapshots_suffix
    rows = read_rows(test)
    curves = LiveCurves(directory, suffix=snapshots_suffix(run_id))
    done: set = set()
    over_since: float | None = None
    try:
        while True:
            if over_since is None and _told_over(POLL_S):
                over_since = time.monotonic()
            waiting = False
            for snap in sorted(glob.glob(os.path.join(run_dir, "snapshots", "*"))):
                if snap in done:
                    continue
                try:
                    scored = score_snapshot(snap, rows, test)
                except (ValueError, KeyError, OSError) as e:
                    log.warning("snapshot %s not scored: %s", os.path.basename(snap), e)
                    done.add(snap)
                    continue
                if scored is None:   # some server has not written it yet
                    waiting = True
                    continue
                done.add(snap)
                point = snapshot_point(scored)
                if point:
                    curves.write(*point)
            if over_since is not None and (not waiting or
                                           time.monotonic() - over_since > PATIENCE_S):
                return len(done)
            if over_since is not None:
                time.sleep(POLL_S)
    finally:
        curves.close()


def main(argv: list) -> int:
    from ..base.log import setup
    setup("snapshot scorer")
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    os.nice(NICENESS)
    try:
        score_as_they_come(*argv)
    except OSError as e:   # the test file cannot be read: the job says so too
        log.warning("the snapshots are not scored as the job trains: cannot read %s: %s",
                    e.filename or argv[2], e.strerror or e)
        return 1
    except ValueError as e:   # a damaged test file (its reader names the file and line)
        log.warning("the snapshots are not scored as the job trains: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
