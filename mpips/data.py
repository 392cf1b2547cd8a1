"""A rank's share of an svmlight file: the lines whose first byte lies in its byte range.

Each of `nparts` ranks reads only its own range, in chunks, so no rank reads
the whole file and memory stays bounded by the chunk size.
"""
import logging
import os
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError, InputError
from .kernels.svmlight import ERROR_TEXT, count_byte, parse_svmlight

log = logging.getLogger("mpips")

BIAS_KEY = np.uint64(0xFFFFFFFFFFFFFFFF)  # the always-on feature that carries the intercept


@dataclass
class Rows:
    """Labelled sparse rows in CSR form."""
    labels: np.ndarray    # float32[n], 0 or 1
    indptr: np.ndarray    # int64[n + 1]
    indices: np.ndarray   # uint64[nnz], feature keys
    values: np.ndarray    # float32[nnz]

    def __len__(self) -> int:
        return self.labels.shape[0]

    def slice(self, a: int, b: int) -> "Rows":
        lo, hi = self.indptr[a], self.indptr[b]
        return Rows(self.labels[a:b], self.indptr[a:b + 1] - lo,
                    self.indices[lo:hi], self.values[lo:hi])

    @staticmethod
    def concat(x: "Rows", y: "Rows") -> "Rows":
        return Rows(np.concatenate([x.labels, y.labels]),
                    np.concatenate([x.indptr, y.indptr[1:] + x.indptr[-1]]),
                    np.concatenate([x.indices, y.indices]),
                    np.concatenate([x.values, y.values]))

    def unique_keys(self, bias: bool):
        """(keys, cols, bias_col): the sorted unique keys of these rows, each entry's
        position among them, and the bias key's position (-1 without bias)."""
        keys, cols = np.unique(self.indices, return_inverse=True)
        if not bias:
            return keys, cols, -1
        if keys.shape[0] == 0 or keys[-1] != BIAS_KEY:
            keys = np.append(keys, BIAS_KEY)
        return keys, cols, keys.shape[0] - 1


def check_file(path: str, flag: str) -> None:
    """ConfigError unless `path` is a readable, non-empty file."""
    if not os.path.exists(path):
        raise ConfigError(f"{flag} {path}: no such file")
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path}: not a regular file")
    if os.path.getsize(path) == 0:
        raise ConfigError(f"{flag} {path}: the file is empty")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{flag} {path}: not readable")


def byte_range(size: int, part: int, nparts: int) -> tuple[int, int]:
    """Part `part` of `nparts` near-equal byte ranges of a file of `size` bytes."""
    return size * part // nparts, size * (part + 1) // nparts


def _line_start(f, pos: int, size: int) -> int:
    """The first line start at or after byte `pos`."""
    if pos <= 0:
        return 0
    f.seek(pos - 1)
    while True:
        block = f.read(1 << 16)
        if not block:
            return size
        nl = block.find(b"\n")
        if nl >= 0:
            return f.tell() - len(block) + nl + 1


class SvmlightShard:
    """The lines of `path` that start in byte range `part` of `nparts`."""

    def __init__(self, path: str, part: int = 0, nparts: int = 1,
                 chunk_bytes: int = 4 << 20, skip_bad: bool = False):
        self.path = path
        self.skip_bad = skip_bad
        self.chunk_bytes = chunk_bytes
        self.bad_lines = 0
        self.size = os.path.getsize(path)
        lo, hi = byte_range(self.size, part, nparts)
        with open(path, "rb") as f:
            self.start = _line_start(f, lo, self.size)
            self.stop = _line_start(f, hi, self.size)
        self.position = self.start   # first byte not yet handed out as rows

    @property
    def fraction_done(self) -> float:
        span = self.stop - self.start
        return 1.0 if span <= 0 else (self.position - self.start) / span

    def _line_number(self, offset: int) -> int:
        """1-based line number of the line starting at byte `offset` (reads the prefix)."""
        lines = 0
        with open(self.path, "rb") as f:
            todo = offset
            while todo > 0:
                block = f.read(min(todo, 1 << 22))
                lines += block.count(b"\n")
                todo -= len(block)
        return lines + 1

    def _line_text(self, offset: int) -> str:
        with open(self.path, "rb") as f:
            f.seek(offset)
            line = f.readline(200).rstrip(b"\r\n")
        return line.decode("utf-8", "replace")

    def _bad_line(self, data, chunk_pos, line_idx, code, col) -> str:
        nl = np.flatnonzero(data == 10)
        offset = chunk_pos + (0 if line_idx == 0 else int(nl[line_idx - 1]) + 1)
        return (f"{self.path}:{self._line_number(offset)}: {ERROR_TEXT[code]} "
                f"(at character {col + 1}): {self._line_text(offset)!r}")

    def rows(self):
        """Yield the shard's rows chunk by chunk."""
        self.position = self.start
        buf = np.empty(self.chunk_bytes, np.uint8)
        filled = 0
        with open(self.path, "rb") as f:
            f.seek(self.start)
            while self.position < self.stop:
                want = min(buf.shape[0], self.stop - self.position) - filled
                if want > 0:
                    filled += f.readinto(memoryview(buf)[filled:filled + want])
                final = self.position + filled >= self.stop
                data = buf[:filled]
                n_lines = count_byte(data, 10) + 1
                n_entries = count_byte(data, 58)
                labels = np.empty(n_lines, np.float32)
                indptr = np.empty(n_lines + 1, np.int64)
                indices = np.empty(n_entries, np.uint64)
                values = np.empty(n_entries, np.float32)
                n, nnz, used, _, n_bad, bad_idx, code, col = parse_svmlight(
                    data, final, self.skip_bad, labels, indptr, indices, values)
                if bad_idx >= 0:
                    where = self._bad_line(data, self.position, bad_idx, code, col)
                    if not self.skip_bad:
                        raise InputError(where)
                    if self.bad_lines < 5:
                        log.warning("skipping bad line %s", where)
                    self.bad_lines += n_bad
                if used == 0 and not final:
                    buf = np.concatenate([buf, np.empty_like(buf)])  # a line longer than the buffer
                    continue
                buf[:filled - used] = buf[used:filled]
                filled -= used
                self.position += used
                if n:
                    yield Rows(labels[:n], indptr[:n + 1], indices[:nnz], values[:nnz])

    def minibatches(self, batch_size: int):
        """Yield Rows of `batch_size` rows (the last may be smaller)."""
        carry = None
        for rows in self.rows():
            if carry is not None:
                rows = Rows.concat(carry, rows)
            full = len(rows) // batch_size * batch_size
            for a in range(0, full, batch_size):
                yield rows.slice(a, a + batch_size)
            carry = rows.slice(full, len(rows)) if full < len(rows) else None
        if carry is not None:
            yield carry
