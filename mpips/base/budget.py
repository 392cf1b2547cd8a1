"""--max-rank-memory: the bytes a rank may hold in its own large allocations (a server's
tables, a full-batch worker's rows), counted as they are made and refused with a message
naming what asked and what is held, before the machine runs out instead."""
import re

from .errors import MpipsError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class OverBudget(MpipsError):
    """An allocation would take a rank past --max-rank-memory."""


def parse_bytes(text: str) -> int:
    """'300M', '2G', '1.5G', '4096' (bytes; K, M, G, T are powers of 1024); ValueError
    otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)i?B?\s*", text, re.I)
    if not m:
        raise ValueError(f"{text!r} is not a size such as 512M or 2G")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


class Budget:
    """What a rank holds, against `limit` bytes (None: no limit). The refusal does not name
    the rank: the line that logs it does, and so does a relay of it (errors.said_by)."""

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self.held = self.peak = 0

    def take(self, nbytes: int, what: str) -> None:
        if self.limit is not None and self.held + nbytes > self.limit:
            raise OverBudget(f"{what} needs {mib(nbytes)}, and it holds "
                             f"{mib(self.held)} already: --max-rank-memory {mib(self.limit)} "
                             f"would be exceeded. Spread the model over more servers, or "
                             f"raise the limit")
        self.held += nbytes
        self.peak = max(self.peak, self.held)

    def allocate(self, nbytes: int, what: str, make):
        """make(), an allocation of `nbytes`, taken as `take` does; if the machine refuses it
        (MemoryError), nothing is counted."""
        held, peak = self.held, self.peak
        self.take(nbytes, what)
        try:
            return make()
        except MemoryError:
            self.held, self.peak = held, peak
            raise

    def release(self, nbytes: int) -> None:
        self.held -= nbytes
