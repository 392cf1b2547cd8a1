"""The test file in chunks, handed out by the lead server to whichever rank asks (see
job.scoring): the file opened once (`HeldOutFile`), the sizes of the chunks (`Chunks`), and
under ULFM who holds the scores of which (`HandOut`); the scores of a rank's batches put
together (`concatenated`). Pure but for opening the file.
"""
import logging
import math
from typing import NamedTuple

import numpy as np

from ..base.errors import InputError, ProtocolError
from ..data.inputs import is_dataset
from ..data.parquet import ParquetShard
from ..data.shards import CsrShard, counts_rows, open_shard, spans
from ..data.textfile import TextShard

log = logging.getLogger("mpips")

EVAL_BATCH = 10000     # test rows a worker's batch (a binary file's chunks are whole ones)
SMALLEST = 8           # the smallest chunk: a rank's share over this many (the last ones)
NONE = (0, 0)    # the lead's answer once no chunk is left (any start == stop)
LOST = (-1, -1)  # a new lead's, once the lead that handed out the chunks died


def shared(cfg) -> bool:
    """Whether the lead hands out --test in chunks (see the module's docstring)."""
    return bool(cfg.data.test) and cfg.pipeline.stages == 1 and not cfg.solver.full_batch


def covered(cfg, units: int) -> bool:
    """Whether `units` (rows or bytes) scored over the ranks make the whole --test file once,
    as chunks handed out do unless a rank died with its scores or the hand-out was lost."""
    return not shared(cfg) or units == spans(cfg.data.test, 1)[0][1]


class Chunks:
    """The lead's hand-out of [0, total): each chunk half of an even share of what is left
    among `ranks`, at least `smallest`, in whole `multiple`s (a batch's rows) but the last.
    Pure."""

    def __init__(self, total: int, ranks: int, multiple: int = 1):
        self.total, self.ranks, self.multiple = total, max(ranks, 1), max(multiple, 1)
        self.smallest = max(1, math.ceil(total / (SMALLEST * self.ranks)))
        self.taken = 0

    def take(self, small: bool = False) -> tuple[int, int]:
        """(start, stop) of the next chunk (`small`: of the smallest size); start == stop
        once all are handed out."""
        left = self.total - self.taken
        size = self.smallest if small else max(self.smallest, math.ceil(left / (2 * self.ranks)))
        size = math.ceil(size / self.multiple) * self.multiple
        start, self.taken = self.taken, min(self.total, self.taken + size)
        return start, self.taken


class HeldOutFile:
    """--test, opened once; its chunks as shards."""

    def __init__(self, cfg):
        self.path = cfg.data.test
        self.binary = counts_rows(cfg.data.test)   # spans of rows; else of bytes
        try:
            # A chunk's rows are checked as it is opened (`chunk`), not the whole file on
            # every rank.
            self._whole = (CsrShard(cfg.data.test, check=False) if is_dataset(cfg.data.test) else
                           open_shard(cfg.data.test, 0, 1, skip_bad=cfg.data.skip_bad_lines))
            self.total = spans(cfg.data.test, 1)[0][1]
        except OSError as e:
            raise InputError(f"--test {cfg.data.test}: {e.strerror or e}") from None

    def chunks(self, ranks: int) -> Chunks:
        return Chunks(self.total, ranks, EVAL_BATCH if self.binary else 1)

    def chunk(self, span, sender: str) -> CsrShard | TextShard | ParquetShard | None:
        """The shard of chunk `span` (start, stop) handed out by `sender`; None for none left
        (or LOST)."""
        start, stop = (int(x) for x in span)
        if (start, stop) == LOST:
            log.warning("the lead server that handed out the test file died: this worker "
                        "scores no more of it")
            return None
        if not 0 <= start <= stop <= self.total:
            raise ProtocolError(f"{sender} handed out chunk [{start}, {stop}) of the test file "
                                f"{self.path}, which has {self.total} "
                                f"{'rows' if self.binary else 'bytes'}")
        return self._whole.over(start, stop) if start < stop else None


class Asked(NamedTuple):
    """A worker's request for a chunk, not yet answered."""
    source: int   # its rank
    ts: int       # the request's


class HandOut:
    """Under ULFM, the lead's chunks and who was handed which (see the module's docstring).
    Pure."""

    def __init__(self, chunks: Chunks):
        self.chunks = chunks
        # worker -> the chunks (start, stop) whose scores it holds
        self.handed: dict[int, list[tuple[int, int]]] = {}
        self.returned: list[tuple[int, int]] = []   # dead workers' chunks, handed out first
        self.asking: dict[int, Asked] = {}          # worker -> its request
        self.over = False    # every living worker has been told that none is left

    def worker_died(self, worker: int) -> int:
        """Its chunks go to the next that ask; how many it held."""
        lost = self.handed.pop(worker, [])
        self.returned += lost
        self.asking.pop(worker, None)
        return len(lost)

    def answers(self, living: set) -> list:
        """(Asked, chunk) for each request that can be answered now: a chunk while any is
        left; NONE to all once every `living` worker asks and none is."""
        out = []
        for worker in sorted(self.asking):
            if not self._left():
                break
            span = self.returned.pop(0) if self.returned else self.chunks.take()
            self.handed.setdefault(worker, []).append(span)
            out.append((self.asking.pop(worker), span))
        if not self._left() and (self.over or living <= set(self.asking)):
            self.over = True
            out += [(asked, NONE) for asked in self.asking.values()]
            self.asking.clear()
        return out

    def _left(self) -> bool:
        return bool(self.returned) or self.chunks.taken < self.chunks.total


def concatenated(scored: list) -> tuple[np.ndarray, np.ndarray]:
    """(margins, labels) of batches scored, as (margins, labels) each."""
    if not scored:
        return np.empty(0), np.empty(0, np.float32)
    margins, labels = zip(*scored)
    return np.concatenate(margins), np.concatenate(labels)
