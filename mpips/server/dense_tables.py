"""A server's dense tables and the operations it runs on them, by name.

Each table is a set of float64 blocks (see `wire/dense_layout.Layout`): the blocks this
server keeps a copy of, as their primary or (with --replicas) as a backup. An operation (a
DENSE request) names a registered function and the tables it works on; it runs on this
server's blocks only. Writes (fill, axpy, scatter_add, ...) run on every copy, so that the
copies keep the same bits; reads answer for the blocks this server is primary of: one
partial per block (a reduction: the client adds them in a fixed way, so the sum's bits do
not depend on how many servers there are), the rows asked for (gather), or nothing. A
read's reply starts with the server's placement version: one routed by an older placement
is asked again.

When a server dies, its backups answer for its blocks at once; a server that holds a range
anew gets its blocks from the range's primary when a worker asks for `restore` (at a moment
no worker writes), and drops writes to them until then.

Functions are registered by name, in the spirit of Angel's PS functions: a request carries
the name's number (`dense_layout.name_id`), never code. The registry and the vector
operations are `dense_functions`'; those that manage tables (create, free, checkpoint,
restore, save, load) are here.

No MPI here: the server's loop hands requests to `DenseTables.handlers()`, and lends it a
link to other servers for `restore`.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..base.budget import Budget
from ..base.errors import ProtocolError, SaveError
from ..base.files import write_hdf5
from ..storage.dense_files import index_of, read_blocks
from ..wire import dense_request
from ..wire.dense_layout import MAX_LISTED, MAX_ROWS, NAME_LIMIT, Layout, name_id, name_of
from ..wire.placement import describe_ranges
from ..wire.protocol import Op
from .dense_functions import FUNCTIONS, NOTHING, Call, register

if TYPE_CHECKING:
    from .context import ServerContext

log = logging.getLogger("mpips")


@dataclass
class Table:
    name: str
    layout: Layout
    blocks: dict   # block number -> float64[rows * width] (a flat view of its rows)

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.blocks.values())


class DenseTables:
    """This server's dense tables, and the DENSE operation for the server's loop."""

    def __init__(self, server_index: int, placement, n_workers: int,
                 budget: Budget | None = None):
        """`budget`: counts the blocks' bytes (--max-rank-memory)."""
        self.index = server_index
        self.budget = budget or Budget()
        self.placement = placement
        self.n_workers = n_workers
        self.tables: dict = {}    # table id -> Table
        # Writes this server's blocks at an iteration (job/server_part); whether it could.
        self.checkpointer: Callable[[int], bool] | None = None
        self.link: ServerContext | None = None   # the server's context: send_copy,
                                                 # receive_copy
        self.rounds: dict = {}    # (table id, round) -> {worker: (rows, values)}
        self.incoming: set = set()   # ranges held anew, their blocks not copied here yet
        self.outgoing: list = []     # (range, server): copies this server owes
        self.restored = lambda ranges, blocks, seconds: None   # told of the copies received
        self.changed_at = 0.0      # when the placement last changed (monotonic)

    def answers(self, table: Table) -> list:
        """The blocks of `table` this server answers reads for, in order."""
        primary = self.placement.primary_ranges(self.index)
        n_ranges = self.placement.n_ranges
        return [b for b in sorted(table.blocks) if primary[b % n_ranges]]

    def placement_changed(self, after, now: float | None = None) -> None:
        """Servers died: the copies this server now owes, and the ranges it holds anew (it
        waits for their blocks; see restore)."""
        before, self.placement = self.placement, after
        self.changed_at = time.monotonic() if now is None else now
        for r, holders in enumerate(after.holders):
            new = [s for s in holders if s not in before.holders[r]]
            if holders and holders[0] == self.index:
                self.outgoing += [(r, s) for s in new if s != self.index]
            if self.index in new:
                self.incoming.add(r)
        self.outgoing = [(r, s) for r, s in self.outgoing if s in after.holders[r]]

    def nbytes(self) -> int:
        return sum(t.nbytes() for t in self.tables.values())

    def datasets(self, only=None) -> dict:
        """The blocks of every table this server answers for (the servers' files together
        hold each block once), as HDF5 datasets: dense/NAME/shape (rows, width, block
        rows), dense/NAME/blocks (their numbers), dense/NAME/values (their rows, one block
        after another). `only`: the numbers of the tables wanted (default every one)."""
        out: dict[str, np.ndarray] = {}
        for tid, table in sorted(self.tables.items(), key=lambda t: t[1].name):
            if only is not None and tid not in only:
                continue
            layout, numbers = table.layout, self.answers(table)
            out[f"dense/{table.name}/shape"] = np.array(
                [layout.n, layout.width, layout.block_rows], np.int64)
            out[f"dense/{table.name}/blocks"] = np.array(numbers, np.int64)
            out[f"dense/{table.name}/values"] = (np.concatenate([table.blocks[b] for b in numbers])
                                                 if numbers else np.empty(0))
        return out

    def create(self, name: str, layout: Layout) -> Table:
        tid = name_id(name)
        held = self.tables.get(tid)
        if held is not None:
            if held.layout != layout:
                raise ProtocolError(f"table {name!r} of {layout.n} rows of width "
                                    f"{layout.width}, which exists with {held.layout.n} rows "
                                    f"of width {held.layout.width}")
            return held
        numbers = [b for b in layout.blocks_held(self.placement, self.index).tolist()
                   if b % self.placement.n_ranges not in self.incoming]
        self.budget.take(8 * layout.width * sum(layout.rows(b) for b in numbers),
                         f"table {name!r} ({len(numbers)} blocks of its {layout.n:,} rows)")
        # Written now, not on first use: the memory is the rank's from the start.
        blocks = {b: np.full(layout.rows(b) * layout.width, 0.0) for b in numbers}
        self.tables[tid] = table = Table(name, layout, blocks)
        return table

    def handlers(self, ctx: ServerContext) -> dict:
        """The operation dense tables bring to a server's loop; `ctx`: the server's context
        (what a handler may read and do)."""
        self.link = ctx

        def restored(ranges: list, blocks: int, seconds: float) -> None:
            log.warning("key range(s) %s of the dense tables have their copies again: %d "
                        "blocks copied here %.2f s after the failure", describe_ranges(ranges),
                        blocks, seconds)
            if ctx.takeover and ctx.takeover.failures:
                ctx.takeover.failures[-1].setdefault("rebuilt", []).append(
                    {"ranges": ranges, "blocks": blocks, "seconds": round(seconds, 4)})
        self.restored = restored

        def on_dense(source: int, r, buf) -> None:
            try:
                out = self.call(ctx.roles.worker_index(source), r.header, buf)
            except ProtocolError as e:
                raise ProtocolError(f"{ctx.sender(source)} sent a bad request: {e}; it was "
                                    f"not applied, and the job stops") from None
            ctx.reply(out, source, r.header.ts)
        return {Op.DENSE: on_dense}

    def call(self, worker: int, header, buf: np.ndarray) -> np.ndarray:
        """Run one admitted DENSE request of `worker`; its reply (float64)."""
        ints, scalars, indices, values = dense_request.dense_fields(buf, header)
        function = FUNCTIONS.get(int(ints[0])) if ints.shape[0] else None
        if function is None:
            raise ProtocolError(f"DENSE naming no registered function "
                                f"({int(ints[0]) if ints.shape[0] else 'none'})")
        named = ints[1:1 + function.tables]
        args = ints[1 + function.tables:]
        listed: list = []
        if function.listed:   # the integers: the count of tables, them, then its own
            listed, args = self.listed(args, function.name)
        if named.shape[0] != function.tables or (function.ints >= 0
                                                 and args.shape[0] != function.ints) \
                or (function.scalars >= 0 and scalars.shape[0] != function.scalars):
            raise ProtocolError(f"DENSE {function.name} with {named.shape[0]} table(s), "
                                f"{args.shape[0]} integer(s) and {scalars.shape[0]} "
                                f"scalar(s); it takes {function.tables}, {function.ints} and "
                                f"{function.scalars}")
        tables = listed
        for tid in named.tolist():
            if tid not in self.tables and function.name != "create":
                raise ProtocolError(f"DENSE {function.name} of table {tid}, which does not "
                                    f"exist on this server")
            tables.append(self.tables.get(tid))
        if indices.shape[0] and not (np.diff(indices.astype(np.int64)) > 0).all():
            raise ProtocolError(f"DENSE {function.name} of rows not in strictly increasing "
                                f"order")
        call = Call(worker, int(header.placement), named.tolist(), tables, args, scalars,
                    indices, values)
        if function.reads and call.version != self.placement.version:
            return np.array([float(self.placement.version)])   # the worker asks again
        return function.run(self, call)

    def listed(self, ints: np.ndarray, what: str) -> tuple[list, np.ndarray]:
        """(the tables, the integers after them) of a `listed` function's integers: [k, k
        table numbers, its own integers]; the tables exist here, all of one shape."""
        k = int(ints[0]) if ints.shape[0] else 0
        if not 0 < k < ints.shape[0] or k > MAX_LISTED:
            raise ProtocolError(f"DENSE {what} of {k} tables in {ints.shape[0]} integers (at "
                                f"most {MAX_LISTED} tables)")
        tables = []
        for tid in ints[1:1 + k].tolist():
            if tid not in self.tables:
                raise ProtocolError(f"DENSE {what} of table {tid}, which does not exist on "
                                    f"this server")
            tables.append(self.tables[tid])
        first = tables[0].layout
        for t in tables[1:]:
            if (t.layout.n, t.layout.width, t.layout.block_rows) != (first.n, first.width,
                                                                       first.block_rows):
                raise ProtocolError(f"DENSE {what} of tables {tables[0].name!r} and {t.name!r}"
                                    f", which differ in shape")
        return tables, ints[1 + k:]

    def rows_here(self, table: Table, indices: np.ndarray, what: str,
                  drop_incoming: bool = False) -> list:
        """[(block, first, end, offsets in the block)] for the runs of sorted `indices` in
        each block; refuses rows this server lacks (or, `drop_incoming`, passes over those
        of ranges whose copy it waits for)."""
        layout = table.layout
        if indices.shape[0] and int(indices[-1]) >= layout.n:
            raise ProtocolError(f"DENSE {what} of row {int(indices[-1])} of table "
                                f"{table.name!r}, which has {layout.n}")
        rows = indices.astype(np.int64)
        blocks = rows // layout.block_rows
        starts: np.ndarray | list = (np.flatnonzero(np.diff(blocks, prepend=-1)) if rows.shape[0]
                                     else [])
        runs = []
        for first, end in zip(list(starts), [*starts[1:], rows.shape[0]]):
            b = int(blocks[first])
            if b % self.placement.n_ranges in self.incoming:
                if drop_incoming:
                    continue
                raise ProtocolError(f"DENSE {what} of rows of table {table.name!r} in block "
                                    f"{b}, whose copy this server waits for")
            if b not in table.blocks:
                raise ProtocolError(f"DENSE {what} of rows of table {table.name!r} in block "
                                    f"{b}, which another server holds")
            runs.append((b, first, end, rows[first:end] - b * layout.block_rows))
        return runs


@register("create", tables=1, ints=-1)
def _create(tables: DenseTables, call: Call) -> np.ndarray:
    if call.ints.shape[0] < 3:
        raise ProtocolError("DENSE create without rows, width and block rows")
    n, width, block_rows = (int(x) for x in call.ints[:3])
    name = name_of(call.ints[3:])
    if not (0 < n <= MAX_ROWS and 0 < width <= 1 << 20 and 0 < block_rows <= 1 << 30
            and 0 < len(name.encode()) <= NAME_LIMIT):
        raise ProtocolError(f"DENSE create of {n} rows of width {width} in blocks of "
                            f"{block_rows} named {name!r}")
    tid = call.ids[0]
    if tid != name_id(name):
        raise ProtocolError(f"DENSE create of table {tid} named {name!r}, whose number is "
                            f"{name_id(name)}")
    tables.create(name, Layout(n, width, block_rows))
    return NOTHING


@register("checkpoint", tables=0, ints=1, reads=True)
def _checkpoint(tables: DenseTables, call: Call) -> np.ndarray:
    """Write the blocks this server answers for, of every table, as checkpoint `ints[0]`
    (see checkpoint.write_dense_shard); answers [version, 1] if written, [version, 0] if
    not (the server says why)."""
    if tables.checkpointer is None:
        raise ProtocolError("DENSE checkpoint to a server that writes no checkpoints")
    written = tables.checkpointer(int(call.ints[0]))
    return np.array([float(tables.placement.version), 1.0 if written else 0.0])


@register("restore", tables=0, reads=True)
def _restore(tables: DenseTables, call: Call) -> np.ndarray:
    """After servers died: send the copies this server owes, then wait for those owed to
    it (a range's primary sends each table's blocks of the range, tables in order of
    their numbers). Asked for by a worker at a moment no worker writes; answers [version,
    blocks received]."""
    placement = tables.placement
    ordered = sorted(tables.tables.items())
    link = tables.link
    assert link is not None, "the server registered this handler through handlers(ctx)"
    for r, to in tables.outgoing:
        for _, table in ordered:
            numbers = table.layout.blocks_in(r, placement.n_ranges).tolist()
            link.send_copy(np.concatenate([table.blocks[b] for b in numbers])
                           if numbers else np.empty(0), to)
    tables.outgoing = []
    received = 0
    for r in sorted(tables.incoming):
        source = placement.holders[r][0]
        for _, table in ordered:
            layout = table.layout
            numbers = layout.blocks_in(r, placement.n_ranges).tolist()
            sizes = [layout.rows(b) * layout.width for b in numbers]
            tables.budget.take(8 * sum(sizes), f"the copy of table {table.name!r}'s blocks "
                                               f"of range {r}")
            values = np.empty(sum(sizes))
            link.receive_copy(values, source, f"server {source} to send its copy of table "
                                              f"{table.name!r}'s blocks of range {r}")
            for b, at, size in zip(numbers, np.cumsum([0, *sizes]).tolist(), sizes):
                table.blocks[b] = values[at:at + size]
            received += len(numbers)
    if tables.incoming:
        tables.restored(sorted(tables.incoming), received,
                        time.monotonic() - tables.changed_at)
    tables.incoming = set()
    return np.array([float(placement.version), float(received)])


@register("free", tables=1)
def _free(tables: DenseTables, call: Call) -> np.ndarray:
    tables.budget.release(tables.tables.pop(call.ids[0]).nbytes())
    return NOTHING


PATH_LIMIT = 4096   # bytes of a directory's path in a request


def _directory(words: np.ndarray, what: str) -> str:
    path = name_of(words)
    if not (0 < len(path.encode()) <= PATH_LIMIT and os.path.isabs(path) and "\0" not in path):
        raise ProtocolError(f"DENSE {what} to {path!r}, which is not an absolute path")
    return path


@register("save", tables=0, ints=-1, reads=True)
def _save(tables: DenseTables, call: Call) -> np.ndarray:
    """Integers: k, the numbers of k tables, a directory's path (words). Writes the blocks
    of those tables this server answers for to DIRECTORY/server-NNNN.h5 (see storage/dense_files);
    answers [version, 1], or [version, 0] if it could not (the server says why)."""
    k = int(call.ints[0]) if call.ints.shape[0] else 0
    if not 0 < k < call.ints.shape[0]:
        raise ProtocolError(f"DENSE save of {k} tables in {call.ints.shape[0]} integers")
    ids = call.ints[1:1 + k].tolist()
    for tid in ids:
        if tid not in tables.tables:
            raise ProtocolError(f"DENSE save of table {tid}, which does not exist on this "
                                f"server")
    directory = _directory(call.ints[1 + k:], "save")
    path = os.path.join(directory, f"server-{tables.index:04d}.h5")
    try:
        write_hdf5(path, tables.datasets(only=set(ids)), {"server": tables.index})
    except SaveError as e:
        log.error("could not save dense tables: %s", e)
        return np.array([float(tables.placement.version), 0.0])
    return np.array([float(tables.placement.version), 1.0])


@register("load", tables=0, ints=-1)
def _load(tables: DenseTables, call: Call) -> np.ndarray:
    """Integers: a directory's path (words) that DenseClient.save wrote: every table of it,
    created unless it exists (with that shape), on every block this server holds; answers
    [1], or [0] if it could not (the server says why)."""
    directory = _directory(call.ints, "load")
    try:
        files = index_of(directory)["files"]
        read_blocks([os.path.join(directory, str(f)) for f in files], tables)
    except (OSError, ValueError, KeyError) as e:
        log.error("could not load dense tables from %s: %s", directory, e)
        return np.array([0.0])
    return np.array([1.0])
