"""Arrow columns (a Parquet row group read by pyarrow) into CSR rows: which column types
are features and how (`kind_of`), and the rows of a table (`rows_of`). The mapping is
data.parquet's docstring; the loops over entries are kernels.columns'."""
import numpy as np
import pyarrow.types as pt

from ..kernels import columns as kernels
from ..kernels.criteo import feature_key
from .textfile import Rows

ID, NUMBER, BAG, PAIRS = "categorical", "numeric", "bag", "pairs"
ACCEPTED = ("integer, bool, string or binary (categorical), floating point (numeric), a "
            "dictionary of categorical values, list<categorical> (a bag of categories), "
            "list<struct<key: categorical, value: number>> or map<categorical, number> (lists "
            "of key and value)")
NUMERIC_ID = 0   # a numeric column's one key is its field's feature_key of this id
_NO_VALUES = np.empty(0, np.float32)   # a bag's: each feature of value 1


class BadValue(ValueError):
    """A value the mapping refuses: its column and its row in the table."""

    def __init__(self, column: str, row: int, what: str):
        super().__init__(what)
        self.column, self.row, self.what = column, row, what


def _is_id(t) -> bool:
    return (pt.is_integer(t) or pt.is_boolean(t) or pt.is_string(t) or pt.is_large_string(t)
            or pt.is_binary(t) or pt.is_large_binary(t)
            or (pt.is_dictionary(t) and _is_id(t.value_type)))


def is_bytes(t) -> bool:
    """A string or binary type (not a dictionary of them)."""
    return pt.is_string(t) or pt.is_large_string(t) or pt.is_binary(t) or pt.is_large_binary(t)


def _is_number(t) -> bool:
    return pt.is_floating(t) or pt.is_integer(t) or pt.is_boolean(t)


def kind_of(t) -> str | None:
    """How a column of Arrow type `t` becomes features (ID, NUMBER, BAG, PAIRS); None if it
    cannot."""
    if _is_id(t):
        return ID
    if pt.is_floating(t):
        return NUMBER
    if pt.is_map(t):
        return PAIRS if _is_id(t.key_type) and _is_number(t.item_type) else None
    if pt.is_list(t) or pt.is_large_list(t):
        item = t.value_type
        if _is_id(item):
            return BAG
        if (pt.is_struct(item) and item.num_fields == 2 and item.field(0).name == "key"
                and item.field(1).name == "value" and _is_id(item.field(0).type)
                and _is_number(item.field(1).type)):
            return PAIRS
    return None


def is_label_type(t) -> bool:
    return _is_number(t)


def _valid(arr) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), bool)
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _filled(arr) -> np.ndarray:
    """The values of an integer, bool or floating array, a null as 0 (False)."""
    if arr.null_count:
        arr = arr.fill_null(False if pt.is_boolean(arr.type) else 0)
    return arr.to_numpy(zero_copy_only=False)


def _ids(arr) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 id, valid) of each value of a categorical array: an integer itself (two's
    complement), a bool 0 or 1, bytes their hash; a dictionary's values once."""
    if pt.is_dictionary(arr.type):
        ids, ok = _ids(arr.dictionary)
        at = _filled(arr.indices).astype(np.int64)
        return ids[at], _valid(arr) & ok[at]
    valid = _valid(arr)
    if pt.is_integer(arr.type) or pt.is_boolean(arr.type):
        values = _filled(arr)
        if values.dtype == np.uint64:
            return values, valid
        return values.astype(np.int64).view(np.uint64), valid
    wide = pt.is_large_string(arr.type) or pt.is_large_binary(arr.type)
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], np.int64 if wide else np.int32)
    offsets = offsets[arr.offset:arr.offset + len(arr) + 1].astype(np.int64)
    data = (np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None
            else np.zeros(1, np.uint8))
    return kernels.hash_bytes(offsets, data), valid


def _numbers(arr, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(float32 value, valid) of a numeric array: null and NaN are missing; an infinite or
    out of float32's range value is refused."""
    values = _filled(arr).astype(np.float64)
    valid = _valid(arr) & ~np.isnan(values)
    bad = np.flatnonzero(valid & ~(np.abs(values) <= np.finfo(np.float32).max))
    if bad.size:
        raise BadValue(name, int(bad[0]), f"value {values[bad[0]]} is not a finite float32")
    return values.astype(np.float32), valid


def _lists(arr) -> tuple:
    """(row of each element, whether its list is not null, the elements) of a list or map
    array."""
    offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    rows = np.repeat(np.arange(len(arr), dtype=np.int64), np.diff(offsets))
    return rows, _valid(arr)[rows], arr.values.slice(lo, hi - lo)


def piece(field: int, kind: str, arr, name: str) -> tuple:
    """What kernels.columns places of column `name` (field `field`, of `kind`) in `arr`,
    one Arrow array: (ID, valid, ids), (NUMBER, valid, values) or, of a list column,
    (BAG, rows, keep, ids, values: empty for 1)."""
    if kind == ID:
        ids, valid = _ids(arr)
        return ID, valid, ids
    if kind == NUMBER:
        values, valid = _numbers(arr, name)
        return NUMBER, valid, values
    rows, listed, items = _lists(arr)
    if kind == BAG:
        ids, valid = _ids(items)
        return BAG, rows, valid & listed, ids, _NO_VALUES
    key_arr, value_arr = items.flatten()   # a null struct makes both null
    ids, valid = _ids(key_arr)
    try:
        values, ok = _numbers(value_arr, name)
    except BadValue as e:
        raise BadValue(name, int(rows[e.row]), e.what) from None
    return BAG, rows, valid & ok & listed, ids, values


def _count(counts: np.ndarray, start: int, p: tuple) -> None:
    if p[0] == BAG:
        counts += np.bincount(p[1][p[2]] + start, minlength=counts.shape[0])
    else:
        counts[start:start + p[1].shape[0]] += p[1]


def _place(fill: np.ndarray, start: int, field: int, p: tuple, keys, values) -> None:
    if p[0] == ID:
        kernels.place_ids(fill[start:], p[1], field, p[2], keys, values)
    elif p[0] == NUMBER:
        kernels.place_numbers(fill[start:], p[1], feature_key(field, NUMERIC_ID), p[2], keys,
                              values)
    else:
        kernels.place_listed(fill[start:], p[1], p[2], field, p[3], p[4], keys, values)


def labels_of(arr, name: str) -> np.ndarray:
    """float32 labels of an array: BadValue at the first null or not 0 or 1."""
    values = _filled(arr).astype(np.float32)
    bad = kernels.first_bad_label(values, _valid(arr))
    if bad >= 0:
        value = "null" if arr[bad].as_py() is None else repr(arr[bad].as_py())
        raise BadValue(name, int(bad), f"label {value}, not 0 or 1")
    return values


def rows_of(table, label: int, fields: list, first_row: int) -> Rows:
    """The CSR rows of `table`: its column `label` the labels, `fields` (column index,
    kind) its features, field i the i-th; origins from `first_row` on. BadValue (its row in
    the table) at a value the mapping refuses."""
    n = table.num_rows
    names = table.column_names
    labels = np.empty(n, np.float32)
    start = 0
    for chunk in table.column(label).chunks:
        try:
            labels[start:start + len(chunk)] = labels_of(chunk, names[label])
        except BadValue as e:
            raise BadValue(e.column, start + e.row, e.what) from None
        start += len(chunk)
    pieces = []   # (field, first row, piece)
    for field, (column, kind) in enumerate(fields):
        start = 0
        for chunk in table.column(column).chunks:
            try:
                pieces.append((field, start, piece(field, kind, chunk, names[column])))
            except BadValue as e:
                raise BadValue(e.column, start + e.row, e.what) from None
            start += len(chunk)
    counts = np.zeros(n, np.int64)
    for _, start, p in pieces:
        _count(counts, start, p)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    fill = indptr[:-1].copy()
    keys = np.empty(int(indptr[-1]), np.uint64)
    values = np.empty(int(indptr[-1]), np.float32)
    for field, start, p in pieces:
        _place(fill, start, field, p, keys, values)
    return Rows(labels, indptr, keys, values,
                np.arange(first_row, first_row + n, dtype=np.int64))
