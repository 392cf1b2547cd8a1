"""One server's shard of the model: keys and their state in an open-addressing table.

Only keys that were pushed or pulled are stored; a new key starts at zero, or where the
model's `init` puts its weights (factorization machines' latent vectors). A key,
its weights and its optimizer state share one row, so a lookup and an update
touch one cache line. A large table grows by 25% when 90% full, so it stays
72-90% full: 12 bytes a key for SGD with width 1 use 13.3-16.7 bytes of table.
"""
import copy

import numpy as np

from ..base.budget import Budget
from ..base.forked import keep_from_children, small_pages
from ..base.shared_memory import SharedArray, array_of
from ..kernels import requests, table
from ..models import updates
from ..models.optimizer import Optimizer
from .live_snapshot import LiveSnapshot
from .table_snapshot import TableSnapshot


class KVStore:
    def __init__(self, width: int, optimizer: Optimizer, capacity: int = 1 << 10,
                 max_load: float = 0.9, growth: float = 1.25, budget: Budget | None = None,
                 init=None):
        """`budget`: counts the table's bytes (--max-rank-memory); `init(keys, out)`: the
        first weights of new keys (default zero), as `models` give them."""
        self.width = width
        self.init = init
        self.budget = budget or Budget()
        self.optimizer = optimizer
        self._apply = updates.applier(optimizer)
        self.max_load = max_load
        self.growth = growth
        self.columns = optimizer.state_columns(width)
        self.generation = 0          # rows are renumbered when this changes (the table grew)
        self._fresh = np.empty(1 << 10, np.uint8)   # per key looked up: whether it was stored
        self._meta = np.zeros(2, np.int64)
        # the table as at a checkpoint's clock: a copy being made (take_snapshot), or read in
        # place by another process (take_live)
        self.snapshot: TableSnapshot | LiveSnapshot | None = None
        # a LiveSnapshot's log (rows, values) and flags, kept for the next (see take_live)
        self._live_log: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # a copy's array given back, for the next (in shared memory if it could be made)
        self._spare: SharedArray | np.ndarray | None = None
        self._allocate(max(int(capacity), 16))

    def _allocate(self, cap: int) -> None:
        shape = (cap + 1, table.KEY_WORDS + self.columns)
        self._rows = self.budget.allocate(shape[0] * shape[1] * 4,
                                          f"the key-value table of {cap:,} rows",
                                          lambda: np.zeros(shape, np.uint32))
        self._rows[:, :table.KEY_WORDS] = 0xFFFFFFFF
        # A checkpoint's forked writer reads a copy (TableSnapshot): the live table is not
        # shared with it, and the server's writes after the fork copy no pages.
        keep_from_children(self._rows)
        self._state = self._rows.view(np.float32)[:, table.KEY_WORDS:]
        self._limit = int(self.max_load * cap)   # keys stored before the table grows

    def __len__(self) -> int:
        return int(self._meta[0])

    def take_snapshot(self) -> TableSnapshot:
        """The table as it is now, copied while it goes on changing (server.table_snapshot);
        `snapshot_of` reads it once complete. One at a time. The copy goes into the array a
        copy before gave back (`give_back`), else into a new one, in shared memory (a
        resident writer maps it; a fork copies none of its page tables) or, if none can be
        made, private; it counts against the budget until given back and dropped
        (OverBudget: none is taken)."""
        self.end_snapshot()
        spare, self._spare = self._spare, None
        if spare is not None and array_of(spare).shape != self._rows.shape:
            self.budget.release(spare.nbytes)   # the table grew since
            spare = None
        if spare is None:
            spare = self.budget.allocate(self._rows.nbytes,
                                         "a checkpoint's copy of the key-value table",
                                         self._copy_array)
        # Out of other children too (another writer forked meanwhile would share its pages,
        # and the copy's writes would copy them): only its own writer's fork takes it.
        keep_from_children(array_of(spare))
        self.snapshot = TableSnapshot(self._rows, self._meta, into=spare)
        return self.snapshot

    def take_live(self, wait_read) -> LiveSnapshot:
        """The table as it is now, for a writer that reads it in place (server.live_snapshot;
        `wait_read` as LiveSnapshot's); until it has, the rows that change are logged first.
        One at a time. The log has room for every row (each is logged once at most): its
        pages are reserved, not touched, but those of the longest log so far, kept for the
        next with the flags of the rows logged (cleared again). OSError if the shared block
        cannot be made."""
        self.end_snapshot()
        rows = self._rows
        log = self._live_log
        if log is None or log[1].shape != rows.shape:
            log = self._live_log = (np.empty(rows.shape[0], np.int64), np.empty_like(rows),
                                    np.zeros(rows.shape[0], np.uint8))
            for array in log:   # touched as rows are logged, in the server's turns
                small_pages(array)
                keep_from_children(array)
        self.snapshot = LiveSnapshot(rows, self._meta, *log, wait_read)
        return self.snapshot

    def _copy_array(self) -> SharedArray | np.ndarray:
        """An array for a copy of the table: in shared memory if it can be made."""
        try:
            return SharedArray(self._rows.shape, self._rows.dtype)
        except OSError:   # no memfd (not Linux), or tmpfs full: a private one serves too
            return np.empty_like(self._rows)

    def give_back(self, taken: TableSnapshot) -> None:
        """A snapshot no longer read (its writer ended): its array is kept for the next copy,
        whose pages are then in memory already (a fresh array's pages, first touched as it is
        copied, held the loop up to hundreds of ms at 10^7 keys); one is kept at most."""
        if self._spare is None and taken.rows.shape == self._rows.shape:
            self._spare = taken.shared or taken.rows
        else:
            self.budget.release(taken.rows.nbytes)

    def end_snapshot(self, complete: bool = True) -> None:
        """The store no longer keeps the copy being made up to date; `complete`: what is left
        of it is copied first (its writer will read it), else it is given up. (A table read in
        place logs nothing more.)"""
        if self.snapshot is not None:
            self.snapshot.end(complete)
            self.snapshot = None

    def snapshot_of(self, taken: TableSnapshot) -> "KVStore":
        """A store over a complete snapshot's rows, to read as this one is read (`blocks`,
        `items`, `stored`); nothing may be stored in it."""
        assert taken.complete, "a snapshot is read once its copy is complete"
        return self.reading(taken.rows, taken.meta)

    def reading(self, rows: np.ndarray, meta: np.ndarray) -> "KVStore":
        """A store like this one over a table's `rows` and `meta` (a snapshot's, maybe
        mapped from another process), to read as this one is read; nothing may be stored
        in it."""
        view = copy.copy(self)
        view.reads(rows, meta)
        return view

    def reads(self, rows: np.ndarray, meta: np.ndarray) -> None:
        """This store (a copy, see `reading`) reads `rows` and `meta` from now on."""
        self.snapshot = None
        self._rows, self._meta = rows, meta
        self._state = rows.view(np.float32)[:, table.KEY_WORDS:]

    def _settle_snapshot(self) -> None:
        """The table is about to be rebuilt or its rows moved: a copy being made is made now,
        a writer reading it in place is waited for."""
        if self.snapshot is not None:
            self.snapshot.finish()

    @property
    def capacity(self) -> int:
        return self._rows.shape[0] - 1

    @property
    def nbytes(self) -> int:
        return self._rows.nbytes

    @property
    def layout(self) -> tuple[tuple, np.dtype]:
        """The shape and type of the table's rows (what a writer reading it in place holds)."""
        return self._rows.shape, self._rows.dtype

    def find(self, keys: np.ndarray, insert: bool = True, out: np.ndarray | None = None):
        """Row of each key (new array); unknown keys are stored if `insert`, else -1. Rows stay
        valid while `generation` is unchanged. With `out`, also reads the keys' weights into
        out[len(keys), width] in the same pass (zeros for keys not found)."""
        return self._find(keys, insert, out, None)[0]

    def find_checked(self, buf: np.ndarray, start: int, check: tuple, keys: np.ndarray,
                     insert: bool, out: np.ndarray) -> tuple:
        """`find` of the len(keys) uint64 keys at buf[start:], copied into `keys` and checked
        first in the same pass, as a placement's `check` asks (Placement.key_check: each key
        after the one before and in a range this server may take): (rows, -1), or (None, i)
        if key i fails (nothing is stored)."""
        return self._find(keys, insert, out, (buf, start, check))

    def _find(self, keys: np.ndarray, insert: bool, out: np.ndarray | None, src) -> tuple:
        n = keys.shape[0]
        slots = np.empty(n, np.int64)
        fresh = self._fresh   # (the kernels set fresh[:n] only: not made anew each request)
        if fresh.shape[0] < n:
            fresh = self._fresh = np.empty(max(n, 2 * fresh.shape[0]), np.uint8)
        inserted = None   # over the passes a growth restarts
        if out is None:
            out = np.empty((n, 0), np.float32)
        while True:
            limit = self._limit
            if src is None:
                done = table.find_and_read(self._rows, self._meta, keys, insert, limit, slots,
                                           out, fresh)
            else:   # then keys holds the keys: a pass after a growth finds them there
                buf, start, (bounds, allowed, counts) = src
                done = requests.pull_rows(buf, start, bounds, allowed, counts, self._rows,
                                          self._meta, insert, limit, keys, slots, out, fresh)
                if done < 0:
                    return None, -1 - done
                src = None
            if insert and self.snapshot is not None:
                self.snapshot.stored_in(slots[:done], fresh[:done])
            if self.init is not None or done < n:
                inserted = np.zeros(n, np.uint8) if inserted is None else inserted
                inserted[:done] |= fresh[:done]
            if done == n:
                if inserted is not None and self.init is not None and inserted.any():
                    new = np.flatnonzero(inserted)
                    first = np.empty((new.shape[0], self.width), np.float32)
                    self.init(keys[new], first)
                    self._state[slots[new], :self.width] = first
                    out[new] = first[:, :out.shape[1]]
                return slots, -1
            # Rows found so far have moved: look them up again, with room for all the keys
            # not yet looked at, so that a large batch (a resume) rebuilds the table once.
            # Sized for them alone, it would be as full as it may be (its probes longest,
            # twice those at 72%) and grow again at the next new key: it is left as full as
            # `growth` leaves a table.
            self._grow(at_least=len(self) + n - done, spare=self.growth)

    def _grow(self, at_least: int, spare: float = 1.0) -> None:
        """Room for `at_least` keys, `spare` times over, or as a growth makes (rows
        renumbered)."""
        self._settle_snapshot()
        cap = self.capacity
        # Small tables double (fewer rebuilds); large ones grow by `growth` (less memory).
        grown = int(cap * (2.0 if cap < 1 << 20 else self.growth)) + 1
        old = self._rows
        self._allocate(max(grown, int(at_least * spare / self.max_load) + 1))
        table.rehash(old, self._rows)
        self.budget.release(old.nbytes)
        self.generation += 1

    def reserve(self, keys: int) -> None:
        """Room for `keys` keys without growing on the way (rows renumbered if it grows)."""
        if keys > self.max_load * self.capacity:
            self._grow(at_least=keys)

    def update(self, slots: np.ndarray, grads: np.ndarray, clock: int) -> None:
        """Apply the optimizer to the rows with gradients grads[len(slots), width], pushed
        at a worker's `clock`."""
        if self.snapshot is not None:
            self.snapshot.before_write(slots)
        self._apply(self._state, slots, grads, clock)

    def pull(self, keys: np.ndarray, out: np.ndarray, insert: bool = True) -> np.ndarray:
        """Weights of `keys` into out[len(keys), width]. Unknown keys are stored (at zero)
        if `insert`, else read as zero."""
        self.find(keys, insert, out)
        return out

    def push(self, keys: np.ndarray, grads: np.ndarray, clock: int) -> None:
        """Apply the optimizer to `keys` with gradients grads[len(keys), width], pushed at a
        worker's `clock`."""
        self.update(self.find(keys), grads, clock)

    def weights(self, state: np.ndarray, clocks: int) -> np.ndarray:
        """The model's weights of these state rows (of `items`) once `clocks` clocks are
        done (see `updates.weights`)."""
        return updates.weights(self.optimizer, state, self.width, clocks)

    def model_weights(self, slots: np.ndarray, clocks: int) -> np.ndarray:
        """The model's weights of these rows (-1: zeros) once `clocks` clocks are done."""
        weights = self.weights(self._state[slots], clocks)
        weights[slots < 0] = 0   # keys not stored (a read that does not insert)
        return weights

    def load(self, keys: np.ndarray, state: np.ndarray) -> None:
        """Store keys with these state rows (weights first), as a checkpoint saved them."""
        if state.shape != (keys.shape[0], self.columns):
            raise ValueError(f"state of shape {state.shape} for {keys.shape[0]} keys; this "
                             f"{self.optimizer.name} store keeps {self.columns} columns a key")
        slots = self.find(keys)   # may grow the table: look up before touching _state
        if self.snapshot is not None:
            self.snapshot.before_write(slots)
        self._state[slots] = state

    def keep(self, kept: np.ndarray) -> None:
        """Keep only the rows whose `kept` (bool, in the order of `items`) is set: the table is
        rebuilt, its rows renumbered."""
        self._settle_snapshot()
        keys, state = self.items()
        old = self._rows
        self._meta[:] = 0
        self._allocate(max(16, int(int(kept.sum()) / self.max_load) + 1))
        self.budget.release(old.nbytes)
        self.generation += 1
        slots = self.find(keys[kept])
        self._state[slots] = state[kept]

    def remove(self, keys: np.ndarray) -> None:
        """Delete these keys (those stored) in place: rows renumbered, the table's size
        kept. Cheaper than `keep` when few keys go."""
        if keys.shape[0]:
            self._settle_snapshot()
            table.remove(self._rows, self._meta, np.ascontiguousarray(keys, np.uint64))
            self.generation += 1

    def stored(self):
        """(rows, keys) of everything stored; `state(rows)` reads their state while
        `generation` is unchanged."""
        return table.stored(self._rows, self._meta)

    def state(self, rows: np.ndarray) -> np.ndarray:
        return self._state[rows]

    def items(self):
        """(keys, state rows) of everything stored; state columns start with the weights."""
        slots, keys = self.stored()
        return keys, self._state[slots]

    def blocks(self, rows: int = 1 << 18, state: bool = True):
        """`items` a block of `rows` table rows at a time, in the same order (the state rows
        only if `state`, else None): to write the table without a copy of all of it."""
        cap = self.capacity
        for start in range(0, cap, rows):
            stop = min(start + rows, cap)
            keys = np.empty(stop - start, np.uint64)
            words = np.empty((stop - start, self.columns if state else 0), np.uint32)
            n = table.gather(self._rows, start, stop, keys, words)
            yield keys[:n], (words[:n].view(np.float32) if state else None)
        if self._meta[1]:   # the key that equals EMPTY, in its own row (see kernels.table)
            yield (np.array([table.EMPTY], np.uint64),
                   self._state[cap:cap + 1].copy() if state else None)
