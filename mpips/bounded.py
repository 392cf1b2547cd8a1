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


def wait_all(requests: Sequence[MPI.Request], timeout: float, what: Callable[[], str]) -> float:
    """Complete all requests or raise WaitTimeout naming `what()`. Returns seconds waited."""
    start = time.monotonic()
    if MPI.Request.Testall(requests):
        return 0.0
    backoff = Backoff()
    while not MPI.Request.Testall(requests):
        waited = time.monotonic() - start
        if waited > timeout:
            raise WaitTimeout(f"waited {waited:.0f} s (--timeout {timeout:g}) for {what()}")
        backoff.idle()
    return time.monotonic() - start
