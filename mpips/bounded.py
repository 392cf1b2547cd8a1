"""Bounded waits: poll MPI requests with backoff, and fail loudly when time runs out.

Open MPI and MPICH busy-poll inside blocking calls; polling with short sleeps
leaves the cores to computation when ranks outnumber them.
"""
import time
from typing import Callable, Sequence

from mpi4py import MPI

from .errors import WaitTimeout


class Backoff:
    """Sleep a little longer each idle round, from `first` up to `longest` seconds."""

    def __init__(self, first: float = 2e-5, longest: float = 1e-3, spins: int = 50):
        self.first, self.longest, self.spins = first, longest, spins
        self.reset()

    def reset(self) -> None:
        self._round = 0
        self._delay = self.first

    def idle(self) -> None:
        self._round += 1
        if self._round <= self.spins:
            return
        time.sleep(self._delay)
        self._delay = min(self._delay * 2, self.longest)


def wait_all(requests: Sequence[MPI.Request], timeout: float, what: Callable[[], str],
             progress: Callable[[], object] | None = None, check_every: float = 1.0) -> float:
    """Complete all requests or raise WaitTimeout naming `what()`. Returns seconds waited.

    With `progress`, the bound is on time without progress: about every `check_every`
    seconds progress() is called, and the deadline restarts whenever its value changes.
    """
    start = time.monotonic()
    if MPI.Request.Testall(requests):
        return 0.0
    backoff = Backoff()
    since = start
    last_check, seen = start, progress() if progress else None
    while not MPI.Request.Testall(requests):
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
