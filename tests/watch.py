"""Watching a running job from a test: its output as it comes, its ranks' processes, its
checkpoints. Every wait here is woken by the job's output (or rechecks what the output does
not announce, such as a file), has a deadline, and fails the test naming what it waited for
when the deadline passes or the job ends first."""
import glob
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from support import Job, mpiexec_path


def complete_checkpoints(ckpt) -> list:
    return sorted(glob.glob(os.path.join(ckpt, "clock-*", "manifest.json")))


def rank_pids(out_dir) -> list:
    """PIDs of the job's Python ranks (not the launcher), found by their --out argument."""
    ps = subprocess.run(["pgrep", "-f", "--", f"-m mpips train .*--out {out_dir}"],
                        capture_output=True, text=True).stdout.split()
    ranks = []
    for pid in map(int, ps):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                program = f.read().split(b"\0")[0]
        except FileNotFoundError:
            continue
        if b"python" in os.path.basename(program):
            ranks.append(pid)
    return ranks


class WatchedJob:
    """`mpiexec -n N python -m mpips ARGS`, its output (stdout and stderr together) read as it
    comes, so that a test can act when the job says something."""

    def __init__(self, n_ranks: int, *args, launcher=()):
        """`launcher`: options of mpiexec itself (e.g. ULFM's)."""
        cmd = [mpiexec_path(), *launcher, "-n", str(n_ranks), sys.executable, "-m", "mpips",
               *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines = []
        self._said = threading.Condition()   # notified at each line and at the output's end
        self._ended = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._said:
                self.lines.append(line)
                self._said.notify_all()
        with self._said:
            self._ended = True
            self._said.notify_all()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_until(self, found, what: str, timeout: float, recheck: float | None = None):
        """The first truthy value of `found()`, asked again at each line the job says and, with
        `recheck`, every `recheck` s (for what its output does not announce). Fails the test,
        saying it waited for `what`, if the job's output ends first or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while True:
            with self._said:
                got, ended = found(), self._ended
                left = deadline - time.monotonic()
                if not got and not ended and left > 0:
                    self._said.wait(left if recheck is None else min(left, recheck))
                    continue
            if got:
                return got
            if ended:
                self.finish(timeout=60)
                pytest.fail(f"the job ended before {what}:\n{self.output}")
            self.kill()
            pytest.fail(f"{what}: not within {timeout} s:\n{self.output}")

    def wait_for(self, text: str, timeout: float = 120) -> str:
        """Wait until a line of the output contains `text`; returns that line."""
        return self.wait_until(lambda: next((line for line in self.lines if text in line), None),
                               f"a line saying {text!r}", timeout)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass

    def finish(self, timeout: float = 180) -> Job:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
            self._reader.join(5)
            pytest.fail(f"job did not finish within {timeout} s: {' '.join(self.proc.args)}\n"
                        f"{self.output}")
        self._reader.join(10)
        return Job(self.proc.returncode, self.output, "")


def wait_fired(job, event: str, timeout: float = 300) -> str:
    """Wait until `job` says it fired `--test-event EVENT` (a point the job is certain to
    reach); returns that line."""
    return job.wait_for(f"test event: {event} (reached", timeout=timeout)


def _kill_rank_process(pid: int, out_dir) -> None:
    """SIGKILL `pid` if it is still a rank of the job writing to `out_dir` (the launcher may
    have ended it already)."""
    if pid in rank_pids(out_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def frozen_by_event_to_the_end(job, out_dir, rank: int, event: str, timeout: float = 300):
    """Rank `rank` of `job` froze itself for good (`--test-event "freeze rank N at ..."`, no
    thaw) under ULFM: wait until it says so, then for the launch to end by itself. The
    survivors must end the frozen rank (the launcher waits for every process it started) and
    say so; a launch still waiting for it after `timeout` fails the test. Returns the ended
    job."""
    wait_fired(job, event, timeout)
    ended = job.finish(timeout=timeout)
    assert (f"rank {rank} (pid " in ended.output and "was declared dead by the failure "
            "detector while frozen (stopped): ended it" in ended.output), ended.output
    return ended


def ended_with_a_frozen_rank(job, out_dir, event: str, timeout: float = 300):
    """A rank of `job` froze itself for good (`--test-event "freeze rank N at ..."`): wait
    until it says so, then for the job to end (without hot failover the others fail it within
    their bound, and the launcher ends the frozen rank). Returns the ended job; a rank process
    of it still there after (the frozen one) is SIGKILLed."""
    try:
        wait_fired(job, event, timeout)
        return job.finish(timeout=timeout)
    finally:
        for pid in rank_pids(out_dir):
            _kill_rank_process(pid, out_dir)


def wait_for_file(job, path, timeout: float = 300) -> None:
    """Wait until `path` exists (e.g. FILE.reached, written by a rank that pauses at
    `--test-event "pause rank N until FILE at ..."`), while `job` runs."""
    job.wait_until(lambda: os.path.exists(path), f"{path} to exist", timeout, recheck=0.05)


def wait_for_lines(job, text: str, n: int, timeout: float = 120) -> list:
    """Wait until `n` lines of `job`'s output contain `text` (e.g. each of several ranks
    saying that it is parked somewhere); returns those lines."""
    def enough():
        lines = [line for line in job.lines if text in line]
        return lines if len(lines) >= n else None
    return job.wait_until(enough, f"{n} lines saying {text!r}", timeout)
