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

Every call waits for the servers' answers: when it returns, the operation has been applied
(a later call of any worker sees it once that worker knows this one returned).
"""
import numpy as np

from . import protocol
from .blocks import BLOCK_ROWS, MAX_ROWS, NAME_LIMIT, Layout, name_id, name_words
from .kernels import elementwise
from .protocol import Op


class DenseClient:
    def __init__(self, kv):
        """`kv`: this worker's KVWorker (its servers, placement and request numbers)."""
        self.kv = kv

    def dense(self, name: str, n: int, width: int = 1, block_rows: int = BLOCK_ROWS) -> "Dense":
        """Table `name` of n rows of `width`, created zero on the servers unless it exists
        (with this shape: every worker may ask for it)."""
        if not 0 < len(name.encode()) <= NAME_LIMIT:
            raise ValueError(f"a table's name has 1 to {NAME_LIMIT} bytes, not {name!r}")
        if not (0 < n <= MAX_ROWS and 0 < width <= 1 << 20 and 0 < block_rows <= 1 << 30):
            raise ValueError(f"table {name!r}: {n} rows of width {width} (at most 2^40 rows "
                             f"of width 2^20)")
        table = Dense(self, name, Layout(n, width, block_rows))
        table._everywhere("create", [table], ints=[n, width, block_rows, *name_words(name)])
        return table

    def checkpoint(self, iteration: int) -> bool:
        """Every server writes its blocks of every table as checkpoint `iteration`; whether
        all did."""
        replies = self._run("checkpoint", [], ints=[iteration])
        return all(r[0] == 1.0 for r in replies.values())

    def _run(self, function: str, tables: list, ints=(), scalars=(), parts=None,
             reply_rows=None, width: int = 1) -> dict:
        """Function `function` on every living server, or on those in `parts`
        ({server: (rows, values)}); {server: its reply}, `reply_rows[server]` rows of
        `width` (default: one partial, or nothing)."""
        servers = self.kv.living() if parts is None else list(parts)
        head = [name_id(function), *(t.id for t in tables), *ints]
        requests, replies = {}, {}
        for s in servers:
            rows, values = parts[s] if parts is not None else (None, None)
            fields, payload = protocol.dense_payload(head, scalars, rows, values)
            requests[s] = (fields, payload)
            size = reply_rows[s] * width if reply_rows is not None else (
                1 if function in _REDUCTIONS else 0)
            replies[s] = np.empty(size)
        self.kv.call(Op.DENSE, requests, replies,
                     f"the servers to run {function}"
                     f"{' on table(s) ' if tables else ''}"
                     f"{', '.join(repr(t.name) for t in tables)}")
        return replies


_REDUCTIONS = {"dot", "nrm2", "sum", "checkpoint"}   # one number from each server


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

    def _everywhere(self, function: str, tables: list, ints=(), scalars=()) -> float:
        replies = self.client._run(function, tables, ints, scalars)
        return float(sum(r.sum() for _, r in sorted(replies.items())))

    def _like(self, *others: "Dense") -> list:
        for o in others:
            if (o.layout.n, o.layout.width) != (self.layout.n, self.layout.width):
                raise ValueError(f"{o!r} and {self!r} differ in shape")
        return [self, *others]

    def fill(self, value: float) -> "Dense":
        self._everywhere("fill", [self], scalars=[value])
        return self

    def copy(self, x: "Dense") -> "Dense":
        """self = x."""
        self._everywhere("copy", self._like(x))
        return self

    def scale(self, a: float) -> "Dense":
        self._everywhere("scale", [self], scalars=[a])
        return self

    def axpy(self, a: float, x: "Dense") -> "Dense":
        """self += a * x."""
        self._everywhere("axpy", self._like(x), scalars=[a])
        return self

    def dot(self, x: "Dense") -> float:
        return self._everywhere("dot", self._like(x))

    def nrm2(self) -> float:
        return float(np.sqrt(self._everywhere("nrm2", [self])))

    def sum(self) -> float:
        return self._everywhere("sum", [self])

    def map(self, function: str, x: "Dense", a: float = 0.0) -> "Dense":
        """self = f(x, a), f one of kernels.elementwise.MAPS."""
        if function not in elementwise.MAPS:
            raise ValueError(f"no element-wise function {function!r}; there are "
                             f"{sorted(elementwise.MAPS)}")
        self._everywhere("map", self._like(x), ints=[name_id(function)], scalars=[a])
        return self

    def zip(self, function: str, x: "Dense", y: "Dense", a: float = 0.0) -> "Dense":
        """self = f(x, y, a), f one of kernels.elementwise.ZIPS."""
        if function not in elementwise.ZIPS:
            raise ValueError(f"no element-wise function {function!r}; there are "
                             f"{sorted(elementwise.ZIPS)}")
        self._everywhere("zip", self._like(x, y), ints=[name_id(function)], scalars=[a])
        return self

    def _split(self, rows: np.ndarray) -> tuple:
        rows = np.asarray(rows)
        if rows.ndim != 1 or rows.dtype.kind not in "iu":
            raise TypeError(f"rows of {self!r} must be a 1-d integer array, got {rows.dtype} "
                            f"{rows.shape}")
        rows = rows.astype(np.uint64)
        if rows.shape[0] and (int(rows[-1]) >= self.layout.n
                              or not (np.diff(rows.astype(np.int64)) > 0).all()):
            raise ValueError(f"rows of {self!r} must be sorted, unique and below "
                             f"{self.layout.n}")
        perm, offsets = self.layout.split(rows, self.client.kv.placement)
        return rows, perm, offsets

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """float64[len(rows)] (or [len(rows), width]): the table's rows, sorted and unique."""
        rows, perm, offsets = self._split(rows)
        parts, counts = {}, {}
        for s in range(offsets.shape[0] - 1):
            a, b = offsets[s], offsets[s + 1]
            if a < b:
                parts[s] = (rows[perm[a:b]], None)
                counts[s] = b - a
        replies = self.client._run("gather", [self], parts=parts, reply_rows=counts,
                                   width=self.layout.width)
        out = np.empty((rows.shape[0], self.layout.width))
        for s, values in replies.items():
            out[perm[offsets[s]:offsets[s + 1]]] = values.reshape(-1, self.layout.width)
        return out if self.layout.width > 1 else out.reshape(-1)

    def scatter_add(self, rows: np.ndarray, values: np.ndarray, workers: int = 1) -> None:
        """self[rows] += values. With `workers` = k > 1 this is one of k workers' parts of a
        sum (each worker calls it once, in the same sequence of calls on this table): the
        servers apply the parts once all k have arrived, in worker order, so the sum has
        the same bits whatever the order of arrival."""
        rows, perm, offsets = self._split(rows)
        values = np.asarray(values, np.float64).reshape(rows.shape[0], self.layout.width)
        if not np.isfinite(values).all():
            raise ValueError(f"values added to {self!r} must be finite")
        self._rounds += 1
        parts = {}
        for s in self.client.kv.living():
            part = perm[offsets[s]:offsets[s + 1]]
            if part.shape[0] or workers > 1:   # every server counts the round's parts
                parts[s] = (rows[part], values[part])
        self.client._run("scatter_add", [self], ints=[self._rounds, workers], parts=parts)

    def free(self) -> None:
        self._everywhere("free", [self])
