"""Binary CSR shards: svmlight converted once, then memory-mapped by every worker.

A dataset is a directory:

    meta.json                     rows, nnz, parts, distinct_keys (an estimate); written last:
                                  its presence means complete
    part-NNNN.labels.npy          float32[rows]      0 or 1
    part-NNNN.indptr.npy          int64[rows + 1]    row starts within the part, from 0
    part-NNNN.indices.npy         uint64[nnz]        feature keys
    part-NNNN.values.npy          float32[nnz]

`convert` (data/convert.py) writes one part per converting rank; `CsrShard` gives worker w
of W the rows [N*w/W, N*(w+1)/W) without reading anything else.

The functions below the shards (open_shard, spans, check_examples, ...) are the interface
of every input that reads rows: svmlight-style text, a converted dataset, or Parquet
(data.parquet, told apart first by `is_parquet`); what is checked before any row is read is
data.inputs'.
"""
import contextlib
import copy
import logging
import os

import numpy as np

from ..base.errors import ConfigError, InputError
from ..kernels.csr import first_bad_label, first_bad_pointer
from . import parquet
from .batching import RowSpan
from .inputs import ARRAYS, check_parts, is_dataset, is_parquet, part_file, read_meta
from .textfile import Rows, TextShard

log = logging.getLogger("mpips")

READAHEAD_BYTES = 64 << 20   # of the shard's files asked for ahead of the rows being read


def distinct_keys(path: str) -> int | None:
    """The distinct keys `convert` estimated a dataset holds, at most its parts' keys on disk
    (a damaged meta.json cannot ask for more memory than the data could fill); None for
    text, a dataset converted before the estimate was kept, or an unreadable one (the
    workers that read it say why)."""
    try:
        meta = read_meta(path) if is_dataset(path) else {}
        n = meta.get("distinct_keys")
        if not (isinstance(n, int) and n >= 0):
            return None
        on_disk = sum(np.load(part_file(path, p["name"], "indices"), mmap_mode="r").shape[0]
                      for p in meta["parts"])
    except (ConfigError, OSError, ValueError, KeyError, TypeError):
        return None
    return min(n, on_disk)


class CsrShard(RowSpan):
    """Rows [N*part/nparts, N*(part+1)/nparts) of a converted dataset, memory-mapped. The row
    pointers and labels of those rows are checked when it is opened: the kernels index with
    them unchecked, and a damaged file must not send them outside the arrays."""

    bad_lines = 0   # bad lines were handled when converting

    def __init__(self, path: str, part: int = 0, nparts: int = 1, check: bool = True):
        """`check`: its rows now (else each `over` checks its own)."""
        self.path = path
        meta = read_meta(path)
        check_parts(path, meta)
        self.parts = []
        for p in meta["parts"]:
            # Copy-on-write maps: writable array types, so the same compiled kernels apply.
            arrays = {a: np.load(part_file(path, p["name"], a), mmap_mode="c")
                      for a, _ in ARRAYS}
            self.parts.append(Rows(arrays["labels"], arrays["indptr"], arrays["indices"],
                                   arrays["values"]))
        self.part_starts = np.cumsum([0] + [len(p) for p in self.parts])
        n = int(self.part_starts[-1])
        nnz = sum(p.indices.shape[0] for p in self.parts)
        bytes_per_row = (nnz * 12 + n * 12) / n if n else 1.0
        self.readahead_rows = max(int(READAHEAD_BYTES / bytes_per_row), 1)
        self.start, self.stop = n * part // nparts, n * (part + 1) // nparts
        self.position = self.start
        self._meta = meta
        if check:
            self.check_rows(meta)

    def over(self, start: int, stop: int) -> "CsrShard":
        """The same dataset's rows [start, stop), checked (the files are mapped once)."""
        other = copy.copy(self)
        other.start, other.stop = start, stop
        other.position = start
        other.check_rows(self._meta)
        return other

    def check_rows(self, meta: dict) -> None:
        """InputError naming the file and row if the rows this shard serves are damaged."""
        for p, rows in enumerate(self.parts):
            lo = max(self.start - int(self.part_starts[p]), 0)
            hi = min(self.stop - int(self.part_starts[p]), len(rows))
            if lo >= hi and not (lo == 0 and len(rows) == 0):
                continue
            name = meta["parts"][p]["name"]
            ends = (rows.indptr[0], rows.indptr[-1])
            if ends != (0, rows.indices.shape[0]):
                raise InputError(f"{part_file(self.path, name, 'indptr')}: starts at {ends[0]} "
                                 f"and ends at {ends[1]}, not 0 and {rows.indices.shape[0]} "
                                 f"(the number of values): the file is damaged")
            bad = first_bad_pointer(rows.indptr[lo:hi + 1], rows.indices.shape[0])
            if bad >= 0:
                raise InputError(f"{part_file(self.path, name, 'indptr')}: row pointer "
                                 f"{lo + bad} is {int(rows.indptr[lo + bad])}, out of order or "
                                 f"outside 0..{rows.indices.shape[0]}: the file is damaged")
            bad = first_bad_label(rows.labels[lo:hi])
            if bad >= 0:
                raise InputError(f"{part_file(self.path, name, 'labels')}: label of row "
                                 f"{lo + bad} is {rows.labels[lo + bad]}, not 0 or 1: the file "
                                 f"is damaged")

    @property
    def fraction_done(self) -> float:
        return self.fraction_at(self.position)

    def _rows(self, a: int, b: int) -> Rows:
        """Global rows [a, b), as views unless they span parts."""
        pieces = []
        first = a
        while a < b:
            p = int(np.searchsorted(self.part_starts, a, side="right")) - 1
            end = min(b, int(self.part_starts[p + 1]))
            lo = a - int(self.part_starts[p])
            pieces.append(self.parts[p].slice(lo, lo + end - a))
            a = end
        rows = pieces[0] if len(pieces) == 1 else Rows.concat(pieces)
        rows.origins = np.arange(first, b, dtype=np.int64)
        return rows

    def minibatches(self, batch_size: int, start: int | None = None):
        """Yield Rows of `batch_size` rows (the last may be smaller), from row `start`."""
        if start is not None and not self.start <= start <= self.stop:
            raise ValueError(f"{self.path}: row {start} is outside this part "
                             f"[{self.start}, {self.stop})")
        asked = self.start if start is None else start   # rows asked for ahead up to here
        for a in range(self.start if start is None else start, self.stop, batch_size):
            b = min(a + batch_size, self.stop)
            if b > asked - self.readahead_rows // 2 and asked < self.stop:
                until = min(max(asked, b) + self.readahead_rows, self.stop)
                self._read_ahead(max(asked, a), until)
                asked = until
            self.position = b
            yield self._rows(a, b)

    def _read_ahead(self, a: int, b: int) -> None:
        """Ask the kernel to read global rows [a, b) into the page cache, in the background
        (posix_fadvise WILLNEED): shards not yet cached are then read while the rows before
        them train, instead of a page at a time as the kernels reach them."""
        if not hasattr(os, "posix_fadvise"):
            return
        for p, rows in enumerate(self.parts):
            lo = min(max(a - int(self.part_starts[p]), 0), len(rows))
            hi = min(max(b - int(self.part_starts[p]), 0), len(rows))
            if lo >= hi:
                continue
            entries = int(rows.indptr[lo]), int(rows.indptr[hi])
            for array, (first, last) in ((rows.labels, (lo, hi)), (rows.indptr, (lo, hi + 1)),
                                         (rows.indices, entries), (rows.values, entries)):
                _will_need(array, first, last)


def _will_need(array: np.ndarray, first: int, last: int) -> None:
    """posix_fadvise WILLNEED for elements [first, last) of a memory-mapped .npy array."""
    size = array.dtype.itemsize
    if last <= first or not isinstance(array, np.memmap) or array.filename is None:
        return   # last <= first: posix_fadvise would take length 0 for the whole file
    with contextlib.suppress(OSError):
        fd = os.open(array.filename, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, array.offset + first * size, (last - first) * size,
                             os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)


def check_examples(path: str, flag: str, skip_bad: bool) -> None:
    """ConfigError unless the data at `path` holds an example: of text, the lines are read up
    to the first one (all of them if there is none); of a converted dataset, its rows are
    counted. Of the whole, not of a worker's part, which may hold none."""
    if is_parquet(path):
        if not parquet.ParquetData(path).rows:
            raise ConfigError(f"{flag} {path}: no examples (Parquet of 0 rows): nothing to "
                              f"train on")
        return
    if os.path.isdir(path):
        if not sum(p["rows"] for p in read_meta(path)["parts"]):
            raise ConfigError(f"{flag} {path}: no examples (a dataset of 0 rows): nothing to "
                              f"train on")
        return
    shard = TextShard(path, chunk_bytes=1 << 16, skip_bad=True, log_bad=False)
    if next(shard.rows(), None) is not None:
        return
    if not shard.bad_lines:
        raise ConfigError(f"{flag} {path}: no examples, only blank lines and comments: nothing "
                          f"to train on")
    if skip_bad:
        raise ConfigError(f"{flag} {path}: no examples: its {shard.bad_lines:,} line(s) are "
                          f"all bad {shard.fmt.name} lines (--skip-bad-lines skips them)")
    try:
        next(TextShard(path, chunk_bytes=1 << 16).rows(), None)
    except InputError as e:   # the first bad line, as a worker would have said it
        raise ConfigError(str(e)) from None


def open_shard(path: str, part: int, nparts: int, skip_bad: bool = False):
    """Part `part` of `nparts` of a dataset: svmlight text, a directory from `convert`, or
    Parquet."""
    if is_parquet(path):
        return parquet.ParquetShard(parquet.ParquetData(path), part, nparts)
    if os.path.isdir(path):
        return CsrShard(path, part, nparts)
    return TextShard(path, part, nparts, skip_bad=skip_bad)


def spans(path: str, nparts: int) -> list:
    """(start, stop) of each of the `nparts` parts of a dataset: bytes of text (a reader
    takes the lines that start in them) or rows of binary shards or Parquet."""
    if is_parquet(path):
        return parquet.ParquetData(path).spans(nparts)
    if os.path.isdir(path):
        n = sum(int(p["rows"]) for p in read_meta(path)["parts"])
    else:
        n = os.path.getsize(path)
    return [(n * k // nparts, n * (k + 1) // nparts) for k in range(nparts)]


def counts_rows(path: str) -> bool:
    """Whether spans of the data at `path` are rows (binary shards, Parquet), not bytes."""
    return os.path.isdir(path) or is_parquet(path)
