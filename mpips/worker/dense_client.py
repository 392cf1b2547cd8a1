"""Dense tables for a worker, as small and numpy-like as KVWorker: vectors (or matrices of
fixed row width) cut in blocks across the servers, and operations the servers run on their
own blocks, so no rank ever holds a whole table.

    ps = DenseClient(kv)                    # beside a KVWorker, sharing its link
    w, g = ps.dense("w", n), ps.dense("g", n)
    w.fill(0.0)
    w.axpy(-0.1, g)                         # w += -0.1 g, on every server's blocks
    w.dot(g), w.nrm2(), w.sum()             # one partial per server, one float back
    w.gather(rows)                          # the rows a worker's data touches
    g.scatter_add(rows, values, workers=4)  # one of 4 workers' parts of a sum
    w.map("sign", g); w.zip("multiply", g, d)   # named kernels (kernels/elementwise)
    d.combine([0.5, -2.0], [w, g])          # d = 0.5 w - 2 g, in one request
    ps.gram([w, g], [w, g, d])              # the 2 x 3 dot products, in one request
    ps.save("out/tables", w, g)             # one HDF5 file per server, and tables.json
    ps.load("out/tables")                   # {"w": w, "g": g}, on any number of servers

Every call waits for the servers' answers: when it returns, the operation has been applied
(a later call of any worker sees it once that worker knows this one returned).

With --replicas and failover, a write reaches every copy of a block; a read is asked again
of the living servers when one died meanwhile; `restore_copies()`, called when no worker
writes, gives the servers that hold ranges anew their blocks.
"""
import math
import os
import time

import numpy as np

from ..base.errors import InputError, SaveError, WaitTimeout
from ..base.files import write_json
from ..kernels import elementwise
from ..storage.dense_files import INDEX, INDEX_FORMAT, index_of
from ..wire import dense_request
from ..wire.dense_layout import (
    BLOCK_ROWS,
    MAX_LISTED,
    MAX_ROWS,
    NAME_LIMIT,
    Layout,
    name_id,
    name_words,
)
from ..wire.protocol import Op


class DenseClient:
    def __init__(self, kv):
        """`kv`: this worker's KVWorker (its servers, placement and request numbers)."""
        self.kv = kv
        self._restored = kv.placement.version   # the placement whose copies are whole

    def dense(self, name: str, n: int, width: int = 1, block_rows: int = BLOCK_ROWS) -> "Dense":
        """Table `name` of n rows of `width`, created zero on the servers unless it exists
        (with this shape: every worker may ask for it)."""
        if not 0 < len(name.encode()) <= NAME_LIMIT:
            raise ValueError(f"a table's name has 1 to {NAME_LIMIT} bytes, not {name!r}")
        if not (0 < n <= MAX_ROWS and 0 < width <= 1 << 20 and 0 < block_rows <= 1 << 30):
            raise ValueError(f"table {name!r}: {n} rows of width {width} (at most 2^40 rows "
                             f"of width 2^20)")
        table = Dense(self, name, Layout(n, width, block_rows))
        table.run_everywhere("create", [table], ints=[n, width, block_rows, *name_words(name)])
        return table

    def checkpoint(self, iteration: int) -> list:
        """Every server writes the blocks it answers for, of every table, as checkpoint
        `iteration`; the servers that did (indices), or [] if any could not."""
        replies = self.read("checkpoint", [], self._one_each, ints=[iteration])
        return sorted(replies) if all(r[0] == 1.0 for r in replies.values()) else []

    def save(self, directory: str, *tables: "Dense") -> str:
        """Write `tables` to `directory` (seen by every rank): each server the blocks it
        answers for, in DIRECTORY/server-NNNN.h5 (plain HDF5: dense/NAME/shape, blocks,
        values), then tables.json naming the files. Returns the directory's absolute path;
        SaveError if a server could not write (it says why)."""
        if not tables:
            raise ValueError("save which tables? none given")
        directory = os.path.abspath(directory)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise SaveError(f"{directory}: {e.strerror}") from None
        ids = [t.id for t in tables]
        replies = self.read("save", [], self._one_each,
                             ints=[len(ids), *ids, *name_words(directory)])
        failed = sorted(s for s, r in replies.items() if r[0] != 1.0)
        if failed:
            raise SaveError(f"{directory}: server(s) {failed} could not write their files "
                            f"(their errors above)")
        write_json(os.path.join(directory, INDEX), {
            "format": INDEX_FORMAT, "files": [f"server-{s:04d}.h5" for s in sorted(replies)],
            "tables": {t.name: [t.layout.n, t.layout.width, t.layout.block_rows]
                       for t in tables}})
        return directory

    def load(self, directory: str) -> dict:
        """The tables `save` wrote to `directory`, on the servers (created unless they
        exist with the same shape) with the saved values, whatever the number of servers
        then and now: {name: Dense}. InputError naming what is wrong."""
        directory = os.path.abspath(directory)
        try:
            index = index_of(directory)
            layouts = {str(name): Layout(*(int(x) for x in shape))
                       for name, shape in index["tables"].items()}
        except (ValueError, TypeError) as e:
            raise InputError(f"cannot load dense tables: {e}") from None
        replies = self.run("load", [], ints=name_words(directory),
                            sizes=dict.fromkeys(self.kv.living(), 1))
        failed = sorted(s for s, r in replies.items() if r[0] != 1.0)
        if failed:
            raise InputError(f"{directory}: server(s) {failed} could not load the tables "
                             f"(their errors above)")
        return {name: Dense(self, name, layout) for name, layout in layouts.items()}

    def restore_copies(self) -> int:
        """After servers died: every range held anew gets its blocks from its primary. Call
        it when no worker writes to any table (the copies are taken as they are then);
        returns the blocks copied."""
        if self._restored == self.kv.placement.version:
            return 0
        replies = self.read("restore", [], self._one_each)
        self._restored = self.kv.placement.version
        return int(sum(r[0] for r in replies.values()))

    def gram(self, rows: list, columns: list) -> np.ndarray:
        """float64[len(rows), len(columns)]: the dot product of each table of `rows` with
        each of `columns` (all of one shape), in one request; each entry has the bits
        `rows[i].dot(columns[j])` gives."""
        listed = rows + [c for c in columns if all(c is not r for r in rows)]
        at = [next(k for k, t in enumerate(listed) if t is c) for c in columns]
        if not rows or len(listed) > MAX_LISTED:
            raise ValueError(f"gram of {len(rows)} row table(s) and {len(listed)} in all "
                             f"(at least one row, at most {MAX_LISTED} tables)")
        rows[0].with_same_shape(*listed[1:])
        p, k = len(rows), len(listed)
        replies = self.read("gram", [], self.per_block(rows[0].layout, p * k),
                            ints=[k, *(t.id for t in listed), p])
        partials = np.concatenate([r.reshape(-1, p * k) for r in replies.values()])
        out = np.array([math.fsum(partials[:, i].tolist()) for i in range(p * k)])
        return out.reshape(p, k)[:, at]

    def per_block(self, layout: Layout, partials: int):
        """The plan of a read answered by `partials` float64s per block of `layout` each
        server is primary of (see `read`)."""
        def plan(placement):
            return None, {s: layout.blocks_of(placement, s).shape[0] * partials
                          for s in self.kv.living()}
        return plan

    def _one_each(self, placement) -> tuple:
        return None, dict.fromkeys(self.kv.living(), 1)

    def run(self, function: str, tables: list, ints=(), scalars=(), parts=None,
            sizes=None) -> dict:
        """Function `function` on every living server, or on those in `parts`
        ({server: (rows, values)}); {server: its reply, `sizes[server]` float64s (default
        none)}: servers that died meanwhile left out."""
        servers = self.kv.living() if parts is None else list(parts)
        head = [name_id(function), *(t.id for t in tables), *ints]
        requests, replies = {}, {}
        for s in servers:
            rows, values = parts[s] if parts is not None else (None, None)
            requests[s] = dense_request.dense_payload(head, scalars, rows, values)
            replies[s] = np.empty((sizes or {}).get(s, 0))
        self.kv.call(Op.DENSE, requests, replies,
                     f"the servers to run {function}"
                     f"{' on table(s) ' if tables else ''}"
                     f"{', '.join(repr(t.name) for t in tables)}")
        return replies

    def read(self, function: str, tables: list, plan, ints=()) -> dict:
        """A function that answers for the blocks each server is primary of, split by
        `plan(placement)` -> (parts or None, {server: reply size}), until every server
        answered by that placement (if a server died meanwhile, or the servers learned of
        a death before this worker, it is asked again of the living). {server: its reply
        without the placement version that starts it}."""
        deadline = time.monotonic() + self.kv.timeout
        while True:
            placement = self.kv.placement
            parts, sizes = plan(placement)
            replies = self.run(function, tables, ints, parts=parts,
                                sizes={s: n + 1 for s, n in sizes.items()})
            if self.kv.placement is placement and len(replies) == len(sizes) and all(
                    r[0] == placement.version for r in replies.values()):
                return {s: r[1:] for s, r in replies.items()}
            if time.monotonic() > deadline:
                raise WaitTimeout(f"the servers to answer {function} by one placement "
                                  f"within --timeout {self.kv.timeout:g} s (placement "
                                  f"{placement.version} here, "
                                  f"{sorted({int(r[0]) for r in replies.values()})} there)")


class Dense:
    """A handle on one dense table; every method runs on the servers."""

    def __init__(self, client: DenseClient, name: str, layout: Layout):
        self.client, self.name, self.layout = client, name, layout
        self.id = name_id(name)
        self._rounds = 0

    @property
    def shape(self) -> tuple:
        return (self.layout.n, self.layout.width) if self.layout.width > 1 else (self.layout.n,)

    def __repr__(self) -> str:
        return f"Dense({self.name!r}, shape={self.shape})"

    def run_everywhere(self, function: str, tables: list, ints=(), scalars=()) -> None:
        """A write: on every copy of every block."""
        self.client.run(function, tables, ints, scalars)

    def _reduce(self, function: str, tables: list) -> float:
        """The sum of each block's partial, rounded once (math.fsum): its bits do not depend
        on which server answers for which blocks."""
        replies = self.client.read(function, tables, self.client.per_block(self.layout, 1))
        return math.fsum(np.concatenate(list(replies.values())).tolist())

    def with_same_shape(self, *others: "Dense") -> list:
        """[self, *others], every one of self's shape and blocks (ValueError otherwise)."""
        for o in others:
            if o.layout != self.layout:
                raise ValueError(f"{o!r} and {self!r} differ in shape"
                                 f"{' or blocks' if o.shape == self.shape else ''}")
        return [self, *others]

    def fill(self, value: float) -> "Dense":
        self.run_everywhere("fill", [self], scalars=[value])
        return self

    def copy(self, x: "Dense") -> "Dense":
        """self = x."""
        self.run_everywhere("copy", self.with_same_shape(x))
        return self

    def scale(self, a: float) -> "Dense":
        self.run_everywhere("scale", [self], scalars=[a])
        return self

    def axpy(self, a: float, x: "Dense") -> "Dense":
        """self += a * x."""
        self.run_everywhere("axpy", self.with_same_shape(x), scalars=[a])
        return self

    def dot(self, x: "Dense") -> float:
        return self._reduce("dot", self.with_same_shape(x))

    def nrm2(self) -> float:
        return float(np.sqrt(self._reduce("nrm2", [self])))

    def sum(self) -> float:
        return self._reduce("sum", [self])

    def map(self, function: str, x: "Dense", a: float = 0.0) -> "Dense":
        """self = f(x, a), f one of kernels.elementwise.MAPS."""
        if function not in elementwise.MAPS:
            raise ValueError(f"no element-wise function {function!r}; there are "
                             f"{sorted(elementwise.MAPS)}")
        self.run_everywhere("map", self.with_same_shape(x), ints=[name_id(function)], scalars=[a])
        return self

    def zip(self, function: str, x: "Dense", y: "Dense", a: float = 0.0) -> "Dense":
        """self = f(x, y, a), f one of kernels.elementwise.ZIPS."""
        if function not in elementwise.ZIPS:
            raise ValueError(f"no element-wise function {function!r}; there are "
                             f"{sorted(elementwise.ZIPS)}")
        self.run_everywhere("zip", self.with_same_shape(x, y), ints=[name_id(function)],
                            scalars=[a])
        return self

    def combine(self, coefficients, tables: list) -> "Dense":
        """self = sum of coefficients[j] * tables[j] (self not among them), in one request:
        the first term a product, the others added in order as `axpy` adds."""
        coefficients = [float(a) for a in coefficients]
        if not tables or len(coefficients) != len(tables) or any(t is self for t in tables):
            raise ValueError(f"combine of {len(tables)} tables with {len(coefficients)} "
                             f"coefficients into {self!r} (at least one table, not {self!r})")
        if not all(math.isfinite(a) for a in coefficients):
            raise ValueError(f"combine into {self!r} with a coefficient that is not finite")
        listed = self.with_same_shape(*tables)
        self.run_everywhere("combine", [], ints=[len(listed), *(t.id for t in listed)],
                            scalars=coefficients)
        return self

    def _rows(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows)
        if rows.ndim != 1 or rows.dtype.kind not in "iu":
            raise TypeError(f"rows of {self!r} must be a 1-d integer array, got {rows.dtype} "
                            f"{rows.shape}")
        rows = rows.astype(np.uint64)
        if rows.shape[0] and (int(rows[-1]) >= self.layout.n
                              or not (np.diff(rows.astype(np.int64)) > 0).all()):
            raise ValueError(f"rows of {self!r} must be sorted, unique and below "
                             f"{self.layout.n}")
        return rows

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """float64[len(rows)] (or [len(rows), width]): the table's rows, sorted and unique."""
        rows = self._rows(rows)
        width = self.layout.width
        split = {}

        def plan(placement):
            perm, offsets = split["perm"], split["offsets"] = self.layout.by_server(rows, placement)
            parts = {s: (rows[perm[offsets[s]:offsets[s + 1]]], None)
                     for s in range(offsets.shape[0] - 1) if offsets[s] < offsets[s + 1]}
            return parts, {s: int(offsets[s + 1] - offsets[s]) * width for s in parts}
        replies = self.client.read("gather", [self], plan)
        perm, offsets = split["perm"], split["offsets"]
        out = np.empty((rows.shape[0], width))
        for s, values in replies.items():
            out[perm[offsets[s]:offsets[s + 1]]] = values.reshape(-1, width)
        return out if width > 1 else out.reshape(-1)

    def scatter_add(self, rows: np.ndarray, values: np.ndarray, workers: int = 1) -> None:
        """self[rows] += values. With `workers` = k > 1 this is one of k workers' parts of a
        sum (each worker calls it once, in the same sequence of calls on this table): the
        servers apply the parts once all k have arrived, in worker order, so the sum has
        the same bits whatever the order of arrival."""
        rows = self._rows(rows)
        values = np.asarray(values, np.float64).reshape(rows.shape[0], self.layout.width)
        if not np.isfinite(values).all():
            raise ValueError(f"values added to {self!r} must be finite")
        self._rounds += 1
        placement = self.client.kv.placement
        parts = {}
        for s in self.client.kv.living():   # every copy of a row's block
            part = self.layout.holders_of(rows, placement, s)
            if part.shape[0] or workers > 1:   # every server counts the round's parts
                parts[s] = (rows[part], values[part])
        self.client.run("scatter_add", [self], ints=[self._rounds, workers], parts=parts)

    def free(self) -> None:
        self.run_everywhere("free", [self])
