"""A DENSE request's payload (a dense table's operation, run on the servers): int64 fields
(the function's and the tables' names), float64 scalars, the uint64 rows it names (the
header's `arg`), then float64 values; the header's `nkeys` and `width` count the fields and
scalars."""
import numpy as np

from .protocol import HEADER_BYTES, Header


def dense_payload(ints, scalars=(), rows=None, values=None) -> tuple:
    """(header fields, payload arrays) of a DENSE request."""
    ints = np.asarray(ints, np.int64)
    scalars = np.asarray(scalars, np.float64)
    rows = np.empty(0, np.uint64) if rows is None else np.asarray(rows, np.uint64)
    values = np.empty(0) if values is None else np.asarray(values, np.float64).reshape(-1)
    return ({"nkeys": ints.shape[0], "width": scalars.shape[0], "arg": rows.shape[0]},
            (ints, scalars, rows, values))


def dense_rows(h: Header) -> int:
    """How many uint64 rows a DENSE request names (its header's `arg`)."""
    return h.arg


def dense_fixed_bytes(h: Header) -> int:
    """A DENSE request's bytes before its values."""
    return HEADER_BYTES + 8 * (h.nkeys + h.width + h.arg)


def dense_fields(buf: np.ndarray, h: Header):
    """(ints, scalars, rows, values) of a DENSE request: views of `buf`."""
    pos = HEADER_BYTES
    ints = buf[pos:pos + 8 * h.nkeys].view(np.int64)
    pos += 8 * h.nkeys
    scalars = buf[pos:pos + 8 * h.width].view(np.float64)
    pos += 8 * h.width
    rows = buf[pos:pos + 8 * h.arg].view(np.uint64)
    return ints, scalars, rows, buf[pos + 8 * h.arg:].view(np.float64)
