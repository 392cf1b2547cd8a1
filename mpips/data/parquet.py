"""Parquet input: a .parquet file, or a folder of *.parquet files (read in name order, one
schema), read with pyarrow a row group at a time. pyarrow is an optional extra
(`pip install mpips[parquet]`), imported only when Parquet is read.

Rows are numbered across the files in order; worker w of W reads the rows of its span
(`spans`), which start and end at row-group boundaries when there are at least W row
groups, and reads no row group outside it.

The mapping of columns to a row (data.columns):

    label        the column named `label`: 0 or 1 (integer, floating point or bool); a
                 null or any other value is an error
    fields       every other column, in the schema's order, is field 0, 1, ... (at most
                 255): a key carries its field in its top byte and a 56-bit hash of
                 (field, id), as the Criteo reader makes them (kernels.criteo.feature_key)
    categorical  integer, bool, string, binary, and dictionaries of them: one feature of
                 value 1 whose id is the integer (bool 0 or 1) or a 64-bit hash of the
                 bytes. An integer column holding Criteo's integer buckets or its
                 hexadecimal values as numbers gives the Criteo reader's keys
    numeric      floating point: one key per field (id 0), the value the number
    bag          list<categorical>: one feature of value 1 per element
    pairs        list<struct<key: categorical, value: number>> and map<categorical,
                 number>: one feature per pair, the key's id hashed with the field, the
                 value the number

A null (a value, a list, an element, a pair's key or value) or a NaN is a missing feature;
an infinite number is an error.
"""
import os
from itertools import pairwise

import numpy as np

from ..base.errors import ConfigError, InputError
from ..kernels.shapes import MAX_FIELDS
from .batching import RowSpan, in_minibatches
from .inputs import SUFFIX
from .textfile import Rows

LABEL = "label"
INSTALL = "pip install 'mpips[parquet]' (or pip install pyarrow)"


def files_of(path: str) -> list:
    """The Parquet files of `path`: itself, or a folder's *.parquet in name order."""
    if not os.path.isdir(path):
        return [path]
    names = sorted(n for n in os.listdir(path) if n.endswith(SUFFIX) and not n.startswith("."))
    if not names:
        raise ConfigError(f"{path}: a folder with no *{SUFFIX} files (and no meta.json of a "
                          f"converted dataset): nothing to read")
    return [os.path.join(path, n) for n in names]


def _pyarrow(path: str):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{path} is Parquet, and reading Parquet needs pyarrow, which is not "
                          f"installed: {INSTALL}") from None
    return pq


class ParquetData:
    """The files of a Parquet input, their schema mapped to a label and fields (ConfigError
    naming the file and column if it cannot be), and their row groups. Reads the footers
    only."""

    def __init__(self, path: str):
        self.pq = _pyarrow(path)
        import pyarrow as pa

        from . import columns
        self._columns = columns
        self.path = path
        self.files = files_of(path)
        schema, first = None, ""
        sizes = []   # (file, group, rows)
        for f, name in enumerate(self.files):
            try:
                meta = self.pq.ParquetFile(name).metadata
                this = meta.schema.to_arrow_schema()
            except (pa.ArrowException, OSError) as e:
                raise ConfigError(f"{name}: not a readable Parquet file ({e}): damaged, "
                                  f"truncated or not Parquet") from None
            if schema is None:
                schema, first = this, name
            else:
                _same_schema(first, schema, name, this)
            sizes += [(f, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
        assert schema is not None, "files_of gives one file at least"
        self.schema = schema
        self.groups = np.array(sizes, np.int64).reshape(-1, 3)
        self.starts = np.concatenate([[0], np.cumsum(self.groups[:, 2])]).astype(np.int64)
        self.rows = int(self.starts[-1])
        self.label, self.fields = self._mapping(first, schema)
        self._open: tuple = (-1, None)   # (file, its ParquetFile)
        # String and binary columns read as their dictionary and indices, as Parquet stores
        # them: each distinct value is hashed once per row group, not once per row.
        self._as_dictionary = [schema.names[i] for i, kind in self.fields
                               if kind == self._columns.ID and self._columns.is_bytes(
                                   schema.types[i])]

    def _mapping(self, name: str, schema) -> tuple[int, list]:
        """(label column, [(column, kind)] of the fields) of `schema`, the schema of `name`."""
        c = self._columns
        names = schema.names
        if LABEL not in names:
            raise ConfigError(f"{name}: no column named {LABEL!r} (its columns: "
                              f"{', '.join(names)}): the label must be a column named "
                              f"{LABEL!r} holding 0 or 1; rename yours")
        label = names.index(LABEL)
        if not c.is_label_type(schema.types[label]):
            raise ConfigError(f"{name}: column {LABEL!r} is {schema.types[label]}: a label is "
                              f"an integer, floating point or bool column of 0 and 1")
        fields = []
        for i, (col, t) in enumerate(zip(names, schema.types)):
            if i == label:
                continue
            kind = c.kind_of(t)
            if kind is None:
                raise ConfigError(f"{name}: column {col!r} is {t}, which mpips cannot make "
                                  f"features of; accepted: {c.ACCEPTED}. Drop or cast it")
            fields.append((i, kind))
        if len(fields) > MAX_FIELDS:
            raise ConfigError(f"{name}: {len(fields)} feature columns, more than the "
                              f"{MAX_FIELDS} fields a key can carry: merge some (a list or map "
                              f"column holds many features in one field)")
        return label, fields

    def spans(self, nparts: int) -> list:
        """(start, stop) rows of each of `nparts` parts: at row-group boundaries (the nearest
        to an even share) when there are at least `nparts` row groups."""
        n = self.rows
        cuts = [n * k // nparts for k in range(nparts + 1)]
        if self.groups.shape[0] >= nparts:
            at = np.searchsorted(self.starts, cuts)
            lower = self.starts[np.maximum(at - 1, 0)]
            upper = self.starts[np.minimum(at, self.starts.shape[0] - 1)]
            cuts = [int(lo if c - lo < up - c else up) for c, lo, up in zip(cuts, lower, upper)]
        return list(pairwise(cuts))

    def _file(self, f: int):
        """The ParquetFile of file `f`: one kept open at a time."""
        if self._open[0] != f:
            self._open = (f, self.pq.ParquetFile(self.files[f],
                                                 read_dictionary=self._as_dictionary))
        return self._open[1]

    def group(self, g: int, limit: int | None = None) -> Rows:
        """The rows of row group `g` (across the files; its first `limit` rows if given)."""
        import pyarrow as pa
        f, local, _ = (int(x) for x in self.groups[g])
        name = self.files[f]
        try:
            pf = self._file(f)
            # One thread: a rank is one core's worth of a node the job fills with ranks.
            if limit is None:
                table = pf.read_row_group(local, use_threads=False)
            else:
                batch = next(pf.iter_batches(batch_size=max(limit, 1), row_groups=[local],
                                             use_threads=False))
                table = pa.Table.from_batches([batch])
        except (pa.ArrowException, OSError, StopIteration) as e:
            raise InputError(f"{name}: row group {local} cannot be read ({e}): the file is "
                             f"damaged or truncated") from None
        try:
            return self._columns.rows_of(table, self.label, self.fields, int(self.starts[g]))
        except self._columns.BadValue as e:
            raise InputError(f"{name}: row group {local}, row {e.row} (row "
                             f"{int(self.starts[g]) + e.row} of {self.path}), column "
                             f"{e.column!r}: {e.what}") from None


def _same_schema(first: str, a, second: str, b) -> None:
    """ConfigError naming both files and the first column where schemas `a` and `b` differ."""
    for i in range(max(len(a), len(b))):
        fa = a.field(i) if i < len(a) else None
        fb = b.field(i) if i < len(b) else None
        if fa is not None and fb is not None and fa.name == fb.name and fa.type == fb.type:
            continue
        what = (f"column {i + 1} is {_describe(fa)} in {first} but {_describe(fb)} in "
                f"{second}")
        raise ConfigError(f"{first} and {second} have different schemas: {what}; the files of "
                          f"a folder must have the same columns, in the same order, of the "
                          f"same types")


def _describe(field) -> str:
    return "missing" if field is None else f"{field.name!r} ({field.type})"


class ParquetShard(RowSpan):
    """Rows [start, stop) of a Parquet input: the row groups that hold them, a group at a
    time; the shard interface of data.shards (over, next_row_at, fraction_done, rows,
    minibatches)."""

    bad_lines = 0   # a bad value stops the job

    def __init__(self, data: ParquetData, part: int = 0, nparts: int = 1,
                 span: tuple[int, int] | None = None):
        self.data, self.path = data, data.path
        start, stop = span if span is not None else data.spans(nparts)[part]
        self.start, self.stop = int(start), int(stop)
        self.position = self.handed_out = self.start

    def over(self, start: int, stop: int) -> "ParquetShard":
        return ParquetShard(self.data, span=(start, stop))

    @property
    def fraction_done(self) -> float:
        return self.fraction_at(self.handed_out)

    def rows(self, start: int | None = None):
        """Yield the shard's rows a row group at a time, from row `start`."""
        first = self.start if start is None else start
        if not self.start <= first <= self.stop:
            raise InputError(f"{self.path}: row {first} is outside this part "
                             f"[{self.start}, {self.stop})")
        starts = self.data.starts
        g = int(np.searchsorted(starts, first, side="right")) - 1
        while first < self.stop and g < self.data.groups.shape[0]:
            lo, hi = int(starts[g]), int(starts[g + 1])
            if hi > first:
                rows = self.data.group(g)
                self.position = min(hi, self.stop)
                if lo < first or hi > self.stop:
                    rows = rows.slice(first - lo, min(hi, self.stop) - lo)
                first = self.position
                if len(rows):
                    yield rows
            g += 1

    def minibatches(self, batch_size: int, start: int | None = None):
        """Yield Rows of `batch_size` rows (the last may be smaller), from row `start`."""
        return in_minibatches(self, batch_size, start)


def sample(data: ParquetData, samples: int = 8, rows_each: int = 4000) -> Rows | None:
    """The first `rows_each` rows of `samples` evenly spaced row groups (None if no rows)."""
    groups = data.groups.shape[0]
    n = min(samples, groups)
    picked = [groups * i // n for i in range(n)]
    pieces = [data.group(g, rows_each) for g in picked if data.groups[g, 2]]
    pieces = [p for p in pieces if len(p)]
    return Rows.concat(pieces) if pieces else None
