"""Collectives every rank of a communicator takes part in, each with a bound: agreeing on a
check (all stop together if one fails), and text broadcast or gathered as numpy buffers."""
import numpy as np
from mpi4py import MPI

from ..base.errors import ConfigError, MpipsError
from .bounded import wait_all


def agree(comm: MPI.Intracomm, check, timeout: float,
          what: str = "every rank to check the configuration") -> None:
    """Run `check()` on every rank; if it raises MpipsError anywhere, raise ConfigError
    everywhere, so that all ranks stop together before any waits for another.

    The lowest failing rank keeps its message and `reported = True`; the others
    raise with `reported = False`, so the message is printed once.
    """
    error = None
    try:
        check()
    except MpipsError as e:
        error = e if isinstance(e, ConfigError) else ConfigError(str(e))
    first = np.array([comm.rank if error else comm.size], np.int64)
    result = np.empty(1, np.int64)
    req = comm.Iallreduce(first, result, op=MPI.MIN)
    wait_all([req], timeout, lambda: what)
    if result[0] < comm.size:
        if error is None:
            error = ConfigError(f"rank {result[0]} could not go on")
        error.reported = comm.rank == result[0]
        raise error


def broadcast_text(comm: MPI.Intracomm, text: str | None, timeout: float,
                   limit: int = 4096, root: int = 0) -> str:
    """Rank `root`'s `text` (up to `limit` bytes of UTF-8), on every rank."""
    buf = np.zeros(limit, np.uint8)
    if comm.rank == root:
        assert text is not None, "the root rank broadcasts a text"
        data = text.encode()
        if len(data) > limit:
            raise ValueError(f"{len(data)} bytes of text; at most {limit} can be broadcast")
        buf[:len(data)] = np.frombuffer(data, np.uint8)
    wait_all([comm.Ibcast(buf, root=root)], timeout, lambda: f"rank {root} to broadcast")
    return buf.tobytes().rstrip(b"\0").decode()


def gather_text(comm: MPI.Intracomm, text: str, timeout: float, what: str,
                limit: int = 256) -> list:
    """Every rank's `text` (up to `limit` bytes of UTF-8), on every rank, in rank order."""
    data = text.encode()
    if len(data) > limit:
        raise ValueError(f"{len(data)} bytes of text; at most {limit} can be gathered")
    mine = np.zeros(limit, np.uint8)
    mine[:len(data)] = np.frombuffer(data, np.uint8)
    every = np.empty((comm.size, limit), np.uint8)
    wait_all([comm.Iallgather(mine, every)], timeout, lambda: what)
    return [row.tobytes().rstrip(b"\0").decode() for row in every]
