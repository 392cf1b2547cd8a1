"""Rows sampled from a training set, and how many each worker will read: what the defaults
are chosen by (models.defaults, job.training), from text, a converted dataset or Parquet."""
import os
from dataclasses import dataclass

import numpy as np

from ..base.errors import InputError
from ..kernels.csr import first_bad_pointer
from . import parquet
from .inputs import ARRAYS, is_parquet, part_file, read_meta
from .textfile import Rows, TextShard, byte_range


def features_per_row(path: str, samples: int = 8, sample_bytes: int = 1 << 17) -> float:
    """Mean non-zeros per row: exact for a converted dataset; for text, from the first
    `sample_bytes` of each of `samples` evenly spaced parts of the file (a sorted file, or
    one whose first rows are unusual, is still measured fairly)."""
    if os.path.isdir(path):
        meta = read_meta(path)
        return meta["nnz"] / max(meta["rows"], 1)
    rows = nnz = 0
    for part in range(samples):
        shard = TextShard(path, part, samples, chunk_bytes=sample_bytes, skip_bad=True,
                              log_bad=False)
        chunk = next(shard.rows(), None)
        if chunk is not None:
            rows += len(chunk)
            nnz += int(chunk.indptr[-1])
    return nnz / rows if rows else 0.0


@dataclass
class Sample:
    """Rows read from a training set to choose defaults, and how many rows each of the
    workers will read (exact for a converted dataset or a file read whole, else estimated)."""
    rows: Rows
    per_part: list
    exact: bool


def _empty_rows() -> Rows:
    return Rows(np.empty(0, np.float32), np.zeros(1, np.int64), np.empty(0, np.uint64),
                np.empty(0, np.float32))


def _checked_rows(path: str, part: str, a: int, b: int) -> Rows | None:
    """Rows [a, b) of a part of a converted dataset, or None if their pointers are damaged
    (the checks every rank agrees on report that; a sample only passes it by)."""
    arrays = {name: np.load(part_file(path, part, name), mmap_mode="r") for name, _ in ARRAYS}
    indptr = np.asarray(arrays["indptr"][a:b + 1])
    if indptr.shape[0] < 2 or first_bad_pointer(indptr, arrays["indices"].shape[0]) >= 0:
        return None
    lo, hi = int(indptr[0]), int(indptr[-1])
    return Rows(np.asarray(arrays["labels"][a:b]), indptr - lo,
                np.asarray(arrays["indices"][lo:hi]), np.asarray(arrays["values"][lo:hi]))


def sample_rows(path: str, parts: int, whole_bytes: int = 64 << 20, samples: int = 8,
                sample_rows_each: int = 4000, sample_bytes: int = 1 << 19) -> Sample:
    """Rows to measure `path` by, for `parts` workers: a text file up to `whole_bytes` is read
    whole (every worker's row count is then exact); beyond that, the first `sample_bytes` of
    `samples` evenly spaced parts of it. From a converted dataset, `samples` evenly spaced
    runs of `sample_rows_each` rows; from Parquet, the first rows of `samples` evenly spaced
    row groups."""
    if is_parquet(path):
        data = parquet.ParquetData(path)
        rows = parquet.sample(data, samples, sample_rows_each)
        return Sample(_empty_rows() if rows is None else rows,
                      [b - a for a, b in data.spans(parts)], True)
    if os.path.isdir(path):
        meta = read_meta(path)
        n = sum(p["rows"] for p in meta["parts"])
        pieces = []
        for p in meta["parts"]:
            share = -(-p["rows"] * samples // max(n, 1))   # runs, spread as the rows are
            for i in range(share):
                a = p["rows"] * i // share
                rows = _checked_rows(path, p["name"], a, min(a + sample_rows_each, p["rows"]))
                if rows is not None:
                    pieces.append(rows)
        return Sample(Rows.concat(pieces) if pieces else _empty_rows(),
                      [n * (w + 1) // parts - n * w // parts for w in range(parts)], True)
    size = os.path.getsize(path)
    try:
        if size <= whole_bytes:
            chunks = list(TextShard(path, skip_bad=True, log_bad=False).rows())
            rows = Rows.concat(chunks) if chunks else _empty_rows()
            bounds = [byte_range(size, w, parts)[0] for w in range(parts)] + [size]
            origins = rows.origins if chunks else np.empty(0, np.int64)
            assert origins is not None, "text rows carry their lines' byte offsets"
            at = np.searchsorted(origins, bounds)
            return Sample(rows, np.diff(at).tolist(), True)
        chunks, spanned = [], 0
        for part in range(samples):
            shard = TextShard(path, part, samples, chunk_bytes=sample_bytes, skip_bad=True,
                                  log_bad=False)
            chunk = next(shard.rows(), None)
            if chunk is not None and len(chunk) > 1:
                chunks.append(chunk)
                spanned += int(chunk.origins[-1] - chunk.origins[0])
    except InputError:   # the workers' reading reports it; the sample passes it by
        return Sample(_empty_rows(), [], False)
    if not chunks:
        return Sample(_empty_rows(), [0] * parts, False)
    rows = Rows.concat(chunks)
    total = size * (len(rows) - len(chunks)) / max(spanned, 1)   # from bytes per line
    return Sample(rows, [int(total / parts)] * parts, False)
