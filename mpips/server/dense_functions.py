"""The operations on dense tables a server runs by name (see `dense_tables`, which holds the
tables and runs a DENSE request): the registry, and the vector operations, block by block
on this server's blocks. Writes run on every copy of a block, reads answer for the blocks
this server is primary of: one partial per block, summed by the client in a fixed way.

To add an operation: write `def f(tables, call) -> np.ndarray` and `@register` it with the
numbers of tables, integers and scalars it takes, and whether it reads. No MPI here.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..base.errors import ProtocolError
from ..kernels import dense, elementwise
from ..wire.dense_layout import name_id

if TYPE_CHECKING:
    from .dense_tables import DenseTables, Table


@dataclass
class Call:
    """One DENSE request, as read from the wire."""
    worker: int
    version: int        # the placement the worker split the request by
    ids: list           # the tables' numbers
    tables: list        # Table objects named (create: None)
    ints: np.ndarray    # the function's integer arguments
    scalars: np.ndarray
    indices: np.ndarray  # rows (gather, scatter_add), sorted
    values: np.ndarray


@dataclass(frozen=True)
class Function:
    name: str
    tables: int      # how many tables it names
    ints: int        # integer arguments (-1: any number)
    scalars: int     # scalar arguments (-1: any number)
    run: Callable
    reads: bool      # answers for the blocks this server is primary of (see module doc)
    listed: bool     # names any number of tables: the integers are their count, then them


FUNCTIONS: dict = {}
MAP_IDS = {name_id(n): f for n, f in elementwise.MAPS.items()}
ZIP_IDS = {name_id(n): f for n, f in elementwise.ZIPS.items()}


def register(name: str, tables: int, ints: int = 0, scalars: int = 0, reads: bool = False,
             listed: bool = False):
    def add(run):
        FUNCTIONS[name_id(name)] = Function(name, tables, ints, scalars, run, reads, listed)
        return run
    return add


def _same_shape(call: Call, what: str) -> None:
    first = call.tables[0].layout
    for t in call.tables[1:]:
        if (t.layout.n, t.layout.width) != (first.n, first.width):
            raise ProtocolError(f"DENSE {what} of tables {call.tables[0].name!r} "
                                f"({first.n} x {first.width}) and {t.name!r} "
                                f"({t.layout.n} x {t.layout.width})")


NOTHING = np.empty(0)


@register("fill", tables=1, scalars=1)
def _fill(tables: DenseTables, call: Call) -> np.ndarray:
    for block in call.tables[0].blocks.values():
        block.fill(call.scalars[0])
    return NOTHING


@register("copy", tables=2)
def _copy(tables: DenseTables, call: Call) -> np.ndarray:
    """tables[0] = tables[1]."""
    _same_shape(call, "copy")
    out, src = call.tables
    for b, block in out.blocks.items():
        np.copyto(block, src.blocks[b])
    return NOTHING


@register("scale", tables=1, scalars=1)
def _scale(tables: DenseTables, call: Call) -> np.ndarray:
    for block in call.tables[0].blocks.values():
        dense.scale(call.scalars[0], block)
    return NOTHING


@register("axpy", tables=2, scalars=1)
def _axpy(tables: DenseTables, call: Call) -> np.ndarray:
    """tables[0] += a * tables[1]."""
    _same_shape(call, "axpy")
    y, x = call.tables
    for b, block in y.blocks.items():
        dense.axpy(call.scalars[0], x.blocks[b], block)
    return NOTHING


def _partials(tables: DenseTables, table: Table, per_block) -> np.ndarray:
    """[placement version, one partial per block this server answers for, in order]."""
    return np.array([float(tables.placement.version),
                     *(per_block(b) for b in tables.answers(table))])


@register("dot", tables=2, reads=True)
def _dot(tables: DenseTables, call: Call) -> np.ndarray:
    _same_shape(call, "dot")
    x, y = call.tables
    return _partials(tables, x, lambda b: dense.dot(x.blocks[b], y.blocks[b]))


@register("nrm2", tables=1, reads=True)
def _nrm2(tables: DenseTables, call: Call) -> np.ndarray:
    """Sums of squares (the client takes the root of the total)."""
    x = call.tables[0]
    return _partials(tables, x, lambda b: dense.dot(x.blocks[b], x.blocks[b]))


@register("sum", tables=1, reads=True)
def _sum(tables: DenseTables, call: Call) -> np.ndarray:
    x = call.tables[0]
    return _partials(tables, x, lambda b: dense.total(x.blocks[b]))


@register("gram", tables=0, ints=1, reads=True, listed=True)
def _gram(tables: DenseTables, call: Call) -> np.ndarray:
    """The dot products of the first p = ints[0] tables listed (the rows) with every table
    listed (the columns): [version, then per block this server answers for, rows x columns
    partials, row-major]. Each entry is the partial `dot` gives: the client's sum has the
    bits of `dot`."""
    listed = call.tables
    p = int(call.ints[0])
    if not 0 < p <= len(listed):
        raise ProtocolError(f"DENSE gram of {p} rows of {len(listed)} tables")
    rows = listed[:p]
    parts = [float(tables.placement.version)]
    for b in tables.answers(listed[0]):
        for r in rows:
            parts += [dense.dot(r.blocks[b], c.blocks[b]) for c in listed]
    return np.array(parts)


@register("combine", tables=0, ints=0, scalars=-1, listed=True)
def _combine(tables: DenseTables, call: Call) -> np.ndarray:
    """tables[0] = sum of scalars[j] * tables[j + 1], block by block, terms in order (the
    first a product, the others axpy): the bits do not depend on the blocks' servers."""
    out, *terms = call.tables
    aliased = any(t is out for t in terms)
    if len(terms) != call.scalars.shape[0] or not terms or aliased:
        raise ProtocolError(f"DENSE combine of {len(terms)} tables with "
                            f"{call.scalars.shape[0]} coefficients into {out.name!r}"
                            f"{' (one of them)' if aliased else ''}")
    for b, block in out.blocks.items():
        np.multiply(terms[0].blocks[b], call.scalars[0], out=block)
        for a, x in zip(call.scalars[1:].tolist(), terms[1:]):
            dense.axpy(a, x.blocks[b], block)
    return NOTHING


def _elementwise(call: Call, kernels: dict, what: str) -> np.ndarray:
    """tables[0] = f(tables[1:], a), block by block, f the kernel `ints[0]` names."""
    kernel = kernels.get(int(call.ints[0]))
    if kernel is None:
        raise ProtocolError(f"DENSE {what} with no function numbered {int(call.ints[0])}")
    _same_shape(call, what)
    out, *inputs = call.tables
    for b, block in out.blocks.items():
        kernel(*(t.blocks[b] for t in inputs), block, call.scalars[0])
    return NOTHING


@register("map", tables=2, ints=1, scalars=1)
def _map(tables: DenseTables, call: Call) -> np.ndarray:
    """tables[0] = f(tables[1], a) for a function of elementwise.MAPS."""
    return _elementwise(call, MAP_IDS, "map")


@register("zip", tables=3, ints=1, scalars=1)
def _zip(tables: DenseTables, call: Call) -> np.ndarray:
    """tables[0] = f(tables[1], tables[2], a) for a function of elementwise.ZIPS."""
    return _elementwise(call, ZIP_IDS, "zip")


@register("gather", tables=1, reads=True)
def _gather(tables: DenseTables, call: Call) -> np.ndarray:
    """[placement version, the rows asked for]."""
    table = call.tables[0]
    width = table.layout.width
    out = np.empty(1 + call.indices.shape[0] * width)
    out[0] = tables.placement.version
    rows = out[1:].reshape(-1, width)
    for b, first, end, offsets in tables.rows_here(table, call.indices, "gather"):
        rows[first:end] = table.blocks[b].reshape(-1, width)[offsets]
    return out


@register("scatter_add", tables=1, ints=2)
def _scatter_add(tables: DenseTables, call: Call) -> np.ndarray:
    """tables[0][rows] += values. Integers: the round and how many workers add to it; a
    round's additions apply once all have arrived, in worker order, so that the sum has
    the same bits whatever order they arrived in."""
    table = call.tables[0]
    round_, contributors = (int(x) for x in call.ints)
    if not 0 < contributors <= tables.n_workers:
        raise ProtocolError(f"DENSE scatter_add awaiting {contributors} workers; the job has "
                            f"{tables.n_workers}")
    if call.values.shape[0] != call.indices.shape[0] * table.layout.width:
        raise ProtocolError(f"DENSE scatter_add of {call.indices.shape[0]} rows with "
                            f"{call.values.shape[0]} values; table {table.name!r} has width "
                            f"{table.layout.width}")
    runs = tables.rows_here(table, call.indices, "scatter_add", drop_incoming=True)
    key = (name_id(table.name), round_)
    pending = tables.rounds.setdefault(key, {})
    if call.worker in pending:
        raise ProtocolError(f"DENSE scatter_add to round {round_} of table {table.name!r} "
                            f"twice")
    pending[call.worker] = (runs, call.values.copy())
    if len(pending) == contributors:
        width = table.layout.width
        for worker in sorted(pending):
            runs, values = pending[worker]
            values = values.reshape(-1, width)
            for b, first, end, offsets in runs:
                table.blocks[b].reshape(-1, width)[offsets] += values[first:end]
        del tables.rounds[key]
    return NOTHING
