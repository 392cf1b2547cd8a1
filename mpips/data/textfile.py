"""A rank's share of an svmlight file: the lines whose first byte lies in its byte range.

Each of `nparts` ranks reads only its own range, in chunks, so no rank reads
the whole file and memory stays bounded by the chunk size.
"""
import logging
import os
from dataclasses import dataclass

import numpy as np

from ..base.errors import InputError
from ..kernels import avazu, criteo, svmlight
from ..kernels.keys import sorted_entries, sorted_unique_inverse
from ..kernels.shapes import AVAZU_COLUMNS
from ..kernels.svmlight import capacity, parse_lines
from .batching import in_minibatches
from .inputs import criteo_line, text_format

log = logging.getLogger("mpips")

BIAS_KEY = np.uint64(0xFFFFFFFFFFFFFFFF)  # the always-on feature that carries the intercept
_NO_KEYS = np.empty(0, np.uint64)


@dataclass(frozen=True)
class TextFormat:
    """A line-per-example text format: its name (as --format gives it), its number for
    kernels.svmlight.parse_lines, its error texts and its name for people."""
    name: str
    code: int
    errors: dict
    title: str


SVMLIGHT = TextFormat("svmlight", svmlight.SVMLIGHT, svmlight.ERROR_TEXT, "svmlight")
LIBFFM = TextFormat("libffm", svmlight.LIBFFM, svmlight.LIBFFM_ERROR_TEXT, "libffm")
CRITEO = TextFormat("criteo", svmlight.CRITEO, criteo.ERROR_TEXT, "Criteo TSV")
AVAZU = TextFormat("avazu", svmlight.AVAZU, avazu.ERROR_TEXT, "Avazu CSV")
FORMATS = {f.name: f for f in (SVMLIGHT, LIBFFM, CRITEO, AVAZU)}


def sniff(path: str) -> TextFormat:
    """The format of a text file, from its first line (inputs.text_format)."""
    return FORMATS[text_format(path)]


def looks_like(line: bytes) -> TextFormat | None:
    """The format a line of text is plainly in (every feature of svmlight's or libffm's
    form, Criteo's tabs, Avazu's columns), or None: to name a line of another format than
    its file's."""
    if criteo_line(line):
        return CRITEO
    if line.count(b",") == AVAZU_COLUMNS - 1 and b"\t" not in line:
        return AVAZU
    colons = {t.count(b":") for t in line.split(b"#", 1)[0].split()[1:]}
    if colons == {1}:
        return SVMLIGHT
    return LIBFFM if colons == {2} else None
MAX_LINE_BYTES = 256 << 20   # a longer "line" is not svmlight text (or a newline is missing)


@dataclass
class Rows:
    """Labelled sparse rows in CSR form, and where each came from in its dataset."""
    labels: np.ndarray    # float32[n], 0 or 1
    indptr: np.ndarray    # int64[n + 1]
    indices: np.ndarray   # uint64[nnz], feature keys
    values: np.ndarray    # float32[nnz]
    origins: np.ndarray | None = None   # int64[n]: byte offset of the line, or row number

    def __len__(self) -> int:
        return self.labels.shape[0]

    @property
    def start(self) -> int:
        """Where the first row came from: a byte offset in text, a row in binary shards."""
        assert self.origins is not None, "rows read from a file know where they came from"
        return int(self.origins[0])

    def slice(self, a: int, b: int) -> "Rows":
        lo, hi = self.indptr[a], self.indptr[b]
        return Rows(self.labels[a:b], self.indptr[a:b + 1] - lo, self.indices[lo:hi],
                    self.values[lo:hi], None if self.origins is None else self.origins[a:b])

    @staticmethod
    def concat(parts: list) -> "Rows":
        shifts = np.cumsum([0] + [p.indptr[-1] for p in parts[:-1]])
        origins = None
        if all(p.origins is not None for p in parts):
            origins = np.concatenate([p.origins for p in parts])
        return Rows(np.concatenate([p.labels for p in parts]),
                    np.concatenate([parts[0].indptr[:1]] +
                                   [p.indptr[1:] + shift for p, shift in zip(parts, shifts)]),
                    np.concatenate([p.indices for p in parts]),
                    np.concatenate([p.values for p in parts]), origins)



class KeyIndexer:
    """Sorted unique keys of minibatches (plus the model's reserved keys and the bias key),
    with scratch space reused from one minibatch to the next."""

    def __init__(self, reserved: np.ndarray = _NO_KEYS,
                 sort_entries: bool = True):
        """`reserved`: keys every minibatch pulls (a model's own rows, just below the bias
        key, ascending); data may not use them. `sort_entries`: try sorting the entries
        first (see kernels.keys), until keys bunch; else the hash pass at once."""
        self.reserved = reserved
        self._sort_entries = sort_entries
        self._grow_scratch(1 << 12)
        self._grow_table(1 << 12)

    def _grow_scratch(self, entries: int) -> None:
        self._ids = np.empty(entries + 1, np.int64)
        self._scratch_keys = np.empty(entries, np.uint64)
        self._scratch_ids = np.empty(entries, np.int64)
        self._entries = np.empty((entries, 2), np.uint64)

    def _grow_table(self, unique: int) -> None:
        """A hash table with room for `unique` keys at most half full."""
        self._table = np.zeros((1 << (2 * unique - 1).bit_length(), 2), np.uint64)
        self._stamp = 0

    def __call__(self, rows: Rows, bias: bool, source: str = "the data"):
        """(keys, cols, bias_col): the sorted unique keys of the rows, each entry's position
        among them, and the bias key's position (-1 without bias)."""
        n = rows.indices.shape[0]
        if n >= self._ids.shape[0]:
            self._grow_scratch(max(n, 2 * self._ids.shape[0]))
        extra = self.reserved.shape[0]
        keys = np.empty(n + extra + 1, np.uint64)
        cols = np.empty(n, np.int64)
        m = -1
        if self._sort_entries:
            m = sorted_entries(rows.indices, keys, cols, self._ids.view(np.int32),
                               self._entries)
            self._sort_entries = m >= 0
        while m < 0:
            if self._stamp == 2**32 - 1:
                self._grow_table(self._table.shape[0] // 2)
            self._stamp += 1
            m = sorted_unique_inverse(rows.indices, self._table, self._stamp, keys, cols,
                                      self._ids, self._scratch_keys, self._scratch_ids)
            if m < 0:
                self._grow_table(self._table.shape[0])   # more unique keys than fit: double it
        if extra:
            if m and keys[m - 1] >= self.reserved[0]:
                raise InputError(f"{source}: feature index {keys[m - 1]} is among the keys "
                                 f"{self.reserved[0]} to {BIAS_KEY} that hold the model's own "
                                 f"weights; renumber it")
            keys[m:m + extra] = self.reserved
            m += extra
        if not bias:
            return keys[:m], cols, -1
        if m and keys[m - 1] == BIAS_KEY:
            raise InputError(f"{source}: feature index {BIAS_KEY} (2^64-1) is reserved for the "
                             f"bias feature; renumber it, or train with --no-bias")
        keys[m] = BIAS_KEY
        return keys[:m + 1], cols, m


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


class TextParser:
    """Chunks of text in one format into Rows. The kernel writes into scratch arrays as large
    as the grammar allows (so it makes one pass and never runs out of room), kept from chunk
    to chunk so that their pages are touched once; a chunk's Rows are copies of its part."""

    def __init__(self, fmt: TextFormat, skip_bad: bool):
        self.fmt = fmt
        self.skip_bad = skip_bad
        self._scratch: tuple[np.ndarray, ...] = ()
        self._room = -1   # the bytes of text the scratch arrays hold the rows of

    def __call__(self, data: np.ndarray, final: bool) -> tuple:
        """(Rows, origins as offsets in `data`, or None if no row; bytes used, lines seen,
        lines skipped, the first bad line's index among them or -1, its error code, its
        column) of the complete lines of `data` (and a last one without newline if `final`).
        """
        if data.shape[0] > self._room:
            rows, entries = capacity(data.shape[0], self.fmt.code)
            self._scratch = (np.empty(rows, np.float32), np.empty(rows + 1, np.int64),
                             np.empty(entries, np.uint64), np.empty(entries, np.float32),
                             np.empty(rows, np.int64))
            self._room = data.shape[0]
        labels, indptr, indices, values, starts = self._scratch
        n, nnz, used, lines, n_bad, bad_idx, code, col = parse_lines(
            data, final, self.skip_bad, labels, indptr, indices, values, starts, self.fmt.code)
        rows = None
        if n:
            rows = Rows(labels[:n].copy(), indptr[:n + 1].copy(), indices[:nnz].copy(),
                        values[:nnz].copy(), starts[:n].copy())
        return rows, used, lines, n_bad, bad_idx, code, col


class TextShard:
    """The lines of `path` that start in byte range `part` of `nparts`: svmlight text or
    Criteo TSV (see `sniff`)."""

    def __init__(self, path: str, part: int = 0, nparts: int = 1,
                 chunk_bytes: int = 4 << 20, skip_bad: bool = False, log_bad: bool = True,
                 span: tuple[int, int] | None = None, fmt: TextFormat | None = None):
        """`span`: the lines that start in bytes [start, stop) instead of in part `part`;
        `fmt`: the format (default: as the file's first line says)."""
        self.path = path
        self.fmt = fmt or sniff(path)
        self.skip_bad = skip_bad
        self.log_bad = log_bad
        self.chunk_bytes = chunk_bytes
        self.bad_lines = 0           # in the latest pass
        self.size = os.path.getsize(path)
        lo, hi = byte_range(self.size, part, nparts) if span is None else span
        with open(path, "rb") as f:
            self.start = _line_start(f, lo, self.size)
            self.stop = _line_start(f, hi, self.size)
        self.position = self.start   # first byte not yet parsed into rows
        self.handed_out = self.start   # first byte of the rows not yet in a minibatch
        # Shared with the shards `over` makes: line numbers found, bad lines said.
        self.line_numbers = {0: 1}   # byte offset of a line -> its number
        self.warned = [0]
        self._passes = 0

    def over(self, start: int, stop: int) -> "TextShard":
        """The same file's lines that start in bytes [start, stop): line numbers found and
        the budget of warnings are shared with this shard."""
        other = TextShard(self.path, chunk_bytes=self.chunk_bytes, skip_bad=self.skip_bad,
                          log_bad=self.log_bad, span=(start, stop), fmt=self.fmt)
        other.line_numbers, other.warned = self.line_numbers, self.warned
        return other

    @property
    def fraction_done(self) -> float:
        span = self.stop - self.start
        return 1.0 if span <= 0 else (self.handed_out - self.start) / span

    def next_row_at(self, offset: int) -> int | None:
        """The first line of this shard that starts at or after byte `offset` (None if
        there is none)."""
        if offset >= self.stop:
            return None
        if offset <= self.start:
            return self.start
        with open(self.path, "rb") as f:
            start = _line_start(f, offset, self.size)
        return start if start < self.stop else None

    def _line_number(self, offset: int) -> int:
        """1-based line number of the line starting at byte `offset`: the lines counted from
        the nearest offset before it whose number is known (remembered: only a pass's first
        offset is asked)."""
        if offset not in self.line_numbers:
            known = max(k for k in self.line_numbers if k <= offset)
            lines = self.line_numbers[known]
            with open(self.path, "rb") as f:
                f.seek(known)
                todo = offset - known
                while todo > 0:
                    block = f.read(min(todo, 1 << 22))
                    lines += block.count(b"\n")
                    todo -= len(block)
            self.line_numbers[offset] = lines
        return self.line_numbers[offset]

    def _describe(self, data, chunk_pos, pass_start, lines_before, line_idx, code, col) -> str:
        """'file:line: what is wrong (at character c): 'the line'' for a bad line in a chunk,
        `lines_before` lines after the pass's first byte `pass_start`."""
        nl = np.flatnonzero(data == 10)
        start = 0 if line_idx == 0 else int(nl[line_idx - 1]) + 1
        end = int(nl[line_idx]) if line_idx < nl.shape[0] else data.shape[0]
        line = data[start:end].tobytes().rstrip(b"\r")
        text = line[:200].decode("utf-8", "replace")
        number = self._line_number(pass_start) + lines_before + line_idx
        other = looks_like(line)
        if other is not None and other != self.fmt:
            return (f"{self.path}:{number}: this looks like a line of {other.title}, but the "
                    f"file is read as {self.fmt.title} (--format {self.fmt.name}, or its first "
                    f"line): {text!r}")
        return (f"{self.path}:{number}: {self.fmt.errors[code]} (at character {col + 1}): "
                f"{text!r}")

    def rows(self, start: int | None = None):
        """Yield the shard's rows chunk by chunk, from byte `start` (a line's first byte in
        the shard; default: its beginning). Each call is one pass over the shard."""
        if start is not None and not self.start <= start <= self.stop:
            raise InputError(f"{self.path}: byte {start} is outside this part "
                             f"[{self.start}, {self.stop})")
        self.position = pass_start = self.start if start is None else start
        self.bad_lines = 0
        self._passes += 1
        lines_done = 0
        parse = TextParser(self.fmt, self.skip_bad)
        buf = np.empty(self.chunk_bytes, np.uint8)
        filled = 0
        with open(self.path, "rb") as f:
            f.seek(self.position)
            while self.position < self.stop:
                want = min(buf.shape[0], self.stop - self.position) - filled
                if want > 0:
                    got = f.readinto(buf.data[filled:filled + want])
                    if got == 0:
                        raise InputError(
                            f"{self.path}: ends at byte {self.position + filled:,}, but was "
                            f"{self.size:,} bytes long when the job opened it: it changed "
                            f"while being read")
                    filled += got
                final = self.position + filled >= self.stop
                data = buf[:filled]
                rows, used, lines, n_bad, bad_idx, code, col = parse(data, final)
                if bad_idx >= 0 and not self.skip_bad:
                    raise InputError(self._describe(data, self.position, pass_start, lines_done,
                                                    bad_idx, code, col))
                if bad_idx >= 0 and self.log_bad and self._passes == 1 and self.warned[0] < 5:
                    self.warned[0] += 1
                    log.warning("skipping bad line %s", self._describe(
                        data, self.position, pass_start, lines_done, bad_idx, code, col))
                self.bad_lines += n_bad
                if used == 0 and not final:   # a line longer than the buffer
                    if buf.shape[0] >= MAX_LINE_BYTES:
                        number = self._line_number(pass_start) + lines_done
                        raise InputError(f"{self.path}:{number}: a line longer than "
                                         f"{MAX_LINE_BYTES >> 20} MiB (no newline in it): "
                                         f"not {self.fmt.name} text")
                    buf = np.concatenate([buf, np.empty_like(buf)])
                    continue
                buf[:filled - used] = buf[used:filled]
                filled -= used
                self.position += used
                lines_done += lines
                if rows is not None:
                    rows.origins += self.position - used
                    yield rows

    def minibatches(self, batch_size: int, start: int | None = None):
        """Yield Rows of `batch_size` rows (the last may be smaller), from byte `start`."""
        return in_minibatches(self, batch_size, start)
