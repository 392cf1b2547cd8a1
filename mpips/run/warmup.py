"""Run every numba kernel a job uses on tiny inputs before training: compiled, or loaded.

A miniature of each numeric step runs on tiny inputs, through the same code and
with the same array types as a real job, so nothing compiles once the clock runs.
`CompileWatch` checks that claim during a job.
"""
import contextlib
import os
import tempfile

import numpy as np

from ..base import checksums
from ..data.textfile import BIAS_KEY, KeyIndexer, Rows, TextShard
from ..kernels import distinct, jit
from ..kernels.csr import first_bad_label, first_bad_pointer
from ..kernels.hashing import is_sorted_unique
from ..kernels.logistic import mean_logloss, roc_auc
from ..kernels.requests import first_not_finite, pull_keys, short_push
from ..models import catalog, defaults, updates
from ..models.optimizer import NAMES, Optimizer
from ..wire import dense_request, protocol
from ..wire.placement import Placement
from ..wire.protocol import Op
from ..worker.pushfilter import PushFilter

# A server's table and the full-batch solver's dense tables are imported in the functions
# that warm them up: a rank loads no module its job does not use (start-up time).


def compile_kernels(model=None, optimizer: str | None = None,
                    full_batch: bool | None = None, push_filter: bool | None = None,
                    role: str | None = None, parquet: bool | None = None) -> None:
    """The kernels of `model` (a models.* object), `optimizer` (a name), the full-batch
    solver if `full_batch`, the push filters if `push_filter` and Parquet's reading if
    `parquet` (None: if pyarrow is installed), with the reading and
    scoring every job does; each None: all of them. `role`, "worker" or "server": only the
    kernels of a worker's minibatches or of a server's table (None: both); a server parses
    no text (a worker samples the data for the defaults). A job loads only its own: each
    kernel costs a process a few ms even from numba's cache, and every rank of every launch
    pays it."""
    batch = _tiny_batch() if role != "server" else _TINY_ROWS
    if role != "server":
        KeyIndexer(sort_entries=False)(batch, bias=True)   # the way for keys that bunch
        keys, cols, bias_col = KeyIndexer()(batch, bias=True)
        weights = np.zeros((keys.shape[0], 1), np.float32)
        lr = catalog.LogisticRegression()
        is_sorted_unique(keys)
        Placement(2).by_server(keys)
        Placement(2).ranges_of(keys)   # (a push's backed-up parts, admission, range copies)
        lr.gradient(batch, cols, bias_col, weights)
        lr.margins(batch, cols, bias_col, weights)
        wide = np.zeros((keys.shape[0], 2), np.float32)[:, :1]   # a wider row's first column
        lr.gradient(batch, cols, bias_col, wide)
        lr.margins(batch, cols, bias_col, wide)
        distinct.add(distinct.sketch(), keys)   # `convert`'s count of distinct keys
        first_bad_pointer(batch.indptr, batch.indices.shape[0])   # rows read, the sample
        mapped = batch.indptr.copy()
        mapped.setflags(write=False)   # a binary shard's rows: memory-mapped, read-only
        first_bad_pointer(mapped, batch.indices.shape[0])
        first_bad_label(batch.labels)
        defaults.measure(batch, bias=True)   # the defaults, from the data's sample
        if parquet or parquet is None:
            _parquet_rows(required=bool(parquet))
    if role != "worker":
        # The sorted unique keys a pull carries, the bias's last (as KeyIndexer gives them).
        _server_table(np.append(np.unique(batch.indices), BIAS_KEY), optimizer)
        m = np.zeros(len(batch))
        mean_logloss(m, batch.labels)   # the lead's summary (rank 0 is a server)
        roc_auc(m, batch.labels)
    if full_batch is not False:
        _full_batch(batch)
    if push_filter is not False:
        _push_filter()
    name = None if model is None else model.name
    if name in (None, "fm"):
        _factorization_machine(batch)
    if name in (None, "widedeep"):
        _wide_and_deep()


def _parquet_rows(required: bool) -> None:
    """A tiny Parquet file of every kind of column read as a worker reads one (the kernels
    see the array types pyarrow gives); nothing without pyarrow unless `required`."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        if required:
            raise
        return
    from ..data.parquet import ParquetData, ParquetShard
    pair = pa.struct([("key", pa.int64()), ("value", pa.float64())])
    table = pa.table({
        "label": pa.array([1, 0], pa.int8()), "i": pa.array([3, None], pa.int64()),
        "u": pa.array([3, 4], pa.uint64()), "s": pa.array(["a", None]),
        "d": pa.array(["x", "y"]).dictionary_encode(), "f": pa.array([0.5, None]),
        "bag": pa.array([[1, 2], None], pa.list_(pa.int64())),
        "kv": pa.array([[{"key": 1, "value": 0.5}], []], pa.list_(pair)),
        "m": pa.array([[(1, 2.0)], None], pa.map_(pa.int32(), pa.float32()))})
    fd, path = tempfile.mkstemp(suffix=".parquet")
    os.close(fd)
    try:
        pq.write_table(table, path)
        list(ParquetShard(ParquetData(path)).rows())
    finally:
        os.unlink(path)


def _tiny_batch() -> Rows:
    """Three rows of svmlight text, parsed as a worker parses its data: the first two."""
    fd, path = tempfile.mkstemp(suffix=".svm")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("1 1:1 2:0.5\n0 3:1 18446744073709551614:2\n1 2:1\n")
        batches = list(TextShard(path, chunk_bytes=16).minibatches(2))   # to the end of the file
        return batches[0]
    finally:
        os.unlink(path)


# What _tiny_batch gives, for a rank that parses nothing.
_TINY_ROWS = Rows(np.array([1, 0], np.float32), np.array([0, 2, 4], np.int64),
                  np.array([1, 2, 3, 18446744073709551614], np.uint64),
                  np.array([1, 0.5, 1, 2], np.float32), np.array([0, 12], np.int64))


def _server_table(keys: np.ndarray, optimizer: str | None) -> None:
    """A server's steps on its table: a push and pulls as they come off the wire, growing,
    the final model, its items, keys moving away."""
    from ..server.store import KVStore
    grad = np.full((keys.shape[0], 1), 0.1, np.float32)
    weights = np.zeros((keys.shape[0], 1), np.float32)
    for name in NAMES if optimizer is None else (optimizer,):
        store = KVStore(1, Optimizer(name, lr=0.1, average_from=0 if name == "sgd" else None),
                        capacity=4)
        message = protocol.pack(protocol.Header(Op.PUSH, nkeys=keys.shape[0], width=1), keys,
                                grad)
        _, wire_keys, wire_values, _ = protocol.unpack(message)
        Placement(2).first_misplaced(wire_keys, 0)
        Placement(2).first_misplaced(np.stack([keys, keys], 1)[:, 0], 0)   # a strided view
        store.push(wire_keys, wire_values, clock=1)
        store.pull(wire_keys, weights)
        many = np.arange(64, dtype=np.uint64)
        store.pull(many, np.empty((64, 1), np.float32))   # grows the table: rehash
        store.pull(wire_keys, weights, insert=False)
        pull = protocol.pack(protocol.Header(Op.PULL, nkeys=keys.shape[0]), keys)
        check = Placement(1).key_check(0, True, np.zeros(1, np.int64))
        store.find_checked(pull, protocol.HEADER_BYTES, check, np.empty_like(keys), True,
                           weights)   # the short way (hotpath)
        bounds, allowed, counts = check
        pull_keys(pull, protocol.HEADER_BYTES, bounds, allowed, counts,
                  np.empty_like(keys))   # ... of a pull the clocks hold
        short_push(message, 0, 1, 0, np.empty((keys.shape[0], 1), np.float32))   # a push's
        first_not_finite(wire_values)
        first_not_finite(np.zeros(2))   # a DENSE request's
        store.model_weights(store.find(wire_keys), clocks=2)
        store.items()
        # A pipeline stage's dense layers: contiguous state (a store's is a strided view).
        updates.update(Optimizer(name, lr=0.1), np.zeros((2, store.columns), np.float32),
                       np.arange(2), np.ones((2, 1), np.float32), 1)
    store.remove(many[:2])   # key ranges moving off a server (mpips ctl)
    _checkpoint_copy(wire_keys, wire_values)


def _checkpoint_copy(keys: np.ndarray, grad: np.ndarray) -> None:
    """A checkpoint's copy of a table made while pushes and new keys change it (rows logged
    before they change, server.table_snapshot), then read as its writer reads it."""
    from ..server.store import KVStore
    store = KVStore(1, Optimizer("adagrad", lr=0.1), capacity=256)
    store.push(keys, grad, clock=1)
    taken = store.take_snapshot()
    taken.step(1)   # a row copied: the others are logged as they change
    store.push(keys, grad, clock=2)
    store.pull(np.arange(1000, 1004, dtype=np.uint64), np.empty((4, 1), np.float32))
    while not taken.step():
        pass
    reader = store.snapshot_of(taken)
    digest = checksums.stream(checksums.Algorithm.XXH64)
    for keys, state in reader.blocks():   # a checkpoint's file, its blocks hashed
        digest.update(keys)
        digest.update(state)
    digest.hexdigest()
    for _ in reader.blocks(state=False):   # the keys of a move
        pass
    store.end_snapshot()
    store.give_back(taken)


def _factorization_machine(batch) -> None:
    from ..server.store import KVStore
    keys, cols, bias_col = KeyIndexer()(batch, bias=True)
    fm = catalog.FactorizationMachine(2)
    store = KVStore(fm.width, Optimizer("adagrad", lr=0.1), capacity=4, init=fm.init)
    pairs = store.pull(keys, np.empty((keys.shape[0], fm.width), np.float32))
    grad, _ = fm.gradient(batch, cols, bias_col, pairs)
    store.push(keys, grad, clock=1)
    fm.margins(batch, cols, bias_col, pairs)
    fm.margins(batch, cols, bias_col, pairs.astype(np.float64))   # a saved model, scored


def _wide_and_deep() -> None:
    wd = catalog.WideDeep(2, (3,))
    small = Rows(np.ones(2, np.float32), np.array([0, 2, 3]), np.array([1, 2, 3], np.uint64),
                 np.ones(3, np.float32))   # (the batch above holds a key W&D reserves)
    keys, cols, bias_col = KeyIndexer(wd.reserved_keys())(small, bias=True)
    rows = np.empty((keys.shape[0], wd.width), np.float32)
    wd.init(keys, rows)
    wd.gradient(small, cols, bias_col, rows)
    wd.margins(small, cols, bias_col, rows)   # scoring


def _push_filter() -> None:
    """A worker's push filter (error feedback's table growing once) and a server decoding
    its int8 values."""
    keys = np.arange(4000, dtype=np.uint64)
    values = np.ones((keys.shape[0], 1), np.float32)
    perm, offsets = Placement(2).by_server(keys)
    out = PushFilter(1, "int8", threshold=0.5, l1=0.1).prepare(keys, values, perm, offsets,
                                                               np.zeros_like(values))
    flags, data = out.parts[0]
    protocol.unpack(protocol.pack(protocol.Header(Op.PUSH, nkeys=out.offsets[1], width=1,
                                                  flags=flags), keys[:out.offsets[1]], data))


def _full_batch(batch) -> None:
    """A full-batch job's steps (job/fullbatch_part, server/dense_tables) on one tiny table."""
    from ..data.dense_rows import Part
    from ..kernels import elementwise
    from ..server.dense_functions import FUNCTIONS
    from ..server.dense_tables import DenseTables
    from ..wire.dense_layout import Layout, name_id
    part = Part(batch, dim=4, bias=True)
    w = np.zeros(part.coords.shape[0])
    part.loss_and_gradient(w)
    part.margins(w)
    tables = DenseTables(0, Placement(2), n_workers=1)
    x = tables.create("x", Layout(5, 1, 2))
    y = tables.create("y", Layout(5, 1, 2))
    names = [x, y, x]
    for name, f in FUNCTIONS.items():
        ints = {"map": [name_id("abs")], "zip": [name_id("multiply")],
                "scatter_add": [1, 1], "gram": [2, name_id("x"), name_id("y"), 1],
                "combine": [2, name_id("x"), name_id("y")]}.get(f.name)
        if f.name in ("create", "free", "checkpoint", "save", "load", "restore"):
            continue
        for kernel in ((elementwise.MAPS if f.name == "map" else elementwise.ZIPS)
                       if f.name in ("map", "zip") else [None]):
            if kernel is not None:
                ints = [name_id(kernel)]
            rows = np.array([0, 1], np.uint64) if f.name in ("gather", "scatter_add") else None
            fields, payload = dense_request.dense_payload(
                [name, *(name_id(t.name) for t in names[:f.tables]), *(ints or [])],
                [1.0] * (1 if f.name == "combine" else f.scalars), rows,
                np.ones(2) if f.name == "scatter_add" else None)
            message = protocol.pack(protocol.Header(Op.DENSE, **fields), *payload)
            tables.call(0, protocol.header(message), message)
    Layout(5, 1, 2).by_server(np.array([0, 3], np.uint64), Placement(2))


class CompileWatch:
    """Records the mpips kernels compiled while it watches: numba's compiles (cache loads do
    not count) and calls of kernels compiled ahead with arguments of kinds their build does
    not take (numba's JIT takes those, see kernels.jit)."""

    def __init__(self):
        self.compiled: list[str] = []

    @contextlib.contextmanager
    def watching(self):
        before = jit.missed()
        if jit.AHEAD:   # no numba loaded, none to listen to
            yield self
        else:
            with _listener(self.compiled):
                yield self
        self.compiled += [f"{name} (not in the ahead build: make kernels)"
                          for name, n in jit.missed().items() if n > before.get(name, 0)]


def _listener(into: list):
    """A numba listener putting its compiles of mpips kernels, as 'name(argument types)',
    into `into` (numba imported here: where kernels are compiled ahead, none is loaded)."""
    from numba.core import event

    class Compiles(event.Listener):
        def on_start(self, ev):
            func = ev.data["dispatcher"].py_func
            if func.__module__.startswith(("mpips.", jit.TWIN + ".")):
                into.append(f"{func.__name__}{ev.data['args']}")

        def on_end(self, ev):
            pass

    return event.install_listener("numba:compile", Compiles())
