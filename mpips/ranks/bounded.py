"""Bounded waits: poll MPI requests with backoff, and fail loudly when time runs out.

Open MPI and MPICH busy-poll inside blocking calls. Polling here first polls again at
once a few times (a small request's reply comes in microseconds, and a yield is a system
call: a fused 10-key round of a worker and a server took 2 us less), then yields the core
between polls (another rank on the same core runs; an idle core answers at once), then,
once a wait has lasted a while, sleeps a little longer each round, which leaves the cores
to computation when ranks outnumber them. A wait that has lasted 50 ms (a rank waiting for
another's start-up, reading or scoring, or for the failure detector to take a frozen rank
for dead) sleeps up to a millisecond a round: a reply a millisecond late is little to such
a wait, and five times fewer polls leave the cores to the ranks at work. The server's loop
keeps the short sleeps (its Backoff is never patient): a request after a quiet spell is
answered as fast as any.
"""
import os
import time
from collections.abc import Callable, Sequence

from mpi4py import MPI

from ..base.errors import WaitTimeout


class Backoff:
    """Poll again at once for the first `busy` polls of a wait; then yield between polls up
    to `spin` seconds into it, then sleep from `first` up to `longest` seconds, doubling;
    past `patient_after` seconds of waiting, up to `patient_longest`."""

    def __init__(self, busy: int = 16, spin: float = 2e-3, first: float = 5e-5,
                 longest: float = 2e-4, patient_after: float = 0.05,
                 patient_longest: float = 1e-3):
        self.busy, self.spin, self.first, self.longest = busy, spin, first, longest
        self.patient_after, self.patient_longest = patient_after, max(patient_longest, longest)
        self.reset()

    def reset(self) -> None:
        self._since: float | None = None
        self._delay = self.first
        self._polls = 0

    def eager(self) -> bool:
        """Whether the wait is in its busy polls."""
        return self._polls < self.busy

    def idle(self) -> None:
        # A reply due in microseconds (a server's answer to a small request) is seen as soon
        # as it comes: a yield is a system call, longer than a poll.
        if self._polls < self.busy:
            self._polls += 1
            return
        now = time.monotonic()
        if self._since is None:
            self._since = now
        waited = now - self._since
        if waited < self.spin:
            os.sched_yield()
            return
        time.sleep(self._delay)
        most = self.patient_longest if waited >= self.patient_after else self.longest
        self._delay = min(self._delay * 2, most)


def wait_all(requests: Sequence[MPI.Request], timeout: float, what: Callable[[], str],
             progress: Callable[[], object] | None = None, check_every: float = 1.0,
             statuses: list | None = None) -> float:
    """Complete all requests or raise WaitTimeout naming `what()`. Returns seconds waited.
    `progress` and `check_every` as for wait_until. With `statuses` (MPI.Status objects, one
    per request), they are filled in."""
    return wait_until(lambda: MPI.Request.Testall(requests, statuses), timeout, what,
                      progress, check_every)


def wait_until(done: Callable[[], bool], timeout: float, what: Callable[[], str],
               progress: Callable[[], object] | None = None, check_every: float = 1.0,
               backoff: Backoff | None = None) -> float:
    """Poll done() with backoff until it is true, or raise WaitTimeout naming `what()`.
    Returns seconds waited.

    With `progress`, the bound is on time without progress: about every `check_every`
    seconds progress() is called, and the deadline restarts whenever its value changes.
    """
    start = time.monotonic()
    if done():
        return 0.0
    backoff = backoff or Backoff()
    since = last_check = start
    seen = progress() if progress else None
    while not done():
        now = time.monotonic()
        if progress and now - last_check >= check_every:
            last_check, value = now, progress()
            if value != seen:
                since, seen = now, value
        if now - since > timeout:
            stalled = " without progress" if progress else ""
            raise WaitTimeout(f"waited {now - since:.0f} s{stalled} (--timeout {timeout:g}) "
                              f"for {what()}")
        backoff.idle()
    return time.monotonic() - start
