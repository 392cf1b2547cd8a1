"""Bounded waits, on real MPI requests in one process."""
import numpy as np
import pytest
from mpi4py import MPI

from mpips.ranks.bounded import wait_all
from mpips.base.errors import WaitTimeout


def test_a_wait_that_never_completes_fails_and_says_what_it_waited_for():
    buf = np.empty(1, np.int64)
    req = MPI.COMM_SELF.Irecv(buf, 0, tag=7)
    with pytest.raises(WaitTimeout, match=r"waited 0 s \(--timeout 0.2\) for the answer from x"):
        wait_all([req], 0.2, lambda: "the answer from x")
    MPI.COMM_SELF.Send(np.ones(1, np.int64), 0, tag=7)   # let the receive finish
    req.Wait()


def test_progress_restarts_the_bound():
    buf = np.empty(1, np.int64)
    req = MPI.COMM_SELF.Irecv(buf, 0, tag=8)
    calls = []

    def progress():   # makes progress on every call, completes the request on the 8th
        calls.append(1)
        if len(calls) == 8:
            MPI.COMM_SELF.Isend(np.full(1, 42, np.int64), 0, tag=8).Wait()
        return len(calls)

    # 8 progress checks 0.05 s apart take longer than the 0.2 s bound, yet never 0.2 s idle.
    wait_all([req], 0.2, lambda: "x", progress=progress, check_every=0.05)
    assert buf[0] == 42 and len(calls) >= 8


def test_no_progress_fails_even_with_a_progress_check():
    buf = np.empty(1, np.int64)
    req = MPI.COMM_SELF.Irecv(buf, 0, tag=9)
    with pytest.raises(WaitTimeout, match="without progress"):
        wait_all([req], 0.2, lambda: "x", progress=lambda: "same", check_every=0.05)
    MPI.COMM_SELF.Send(np.ones(1, np.int64), 0, tag=9)
    req.Wait()
