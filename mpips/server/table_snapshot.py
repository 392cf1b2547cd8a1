"""A server's table as of a checkpoint's clock, copied while the server goes on serving.

Taken at the clock in no time: the copy is then made a span of rows at a time, one span a
turn of the server's loop (`step`), and the store copies a row out of turn just before it
changes it (`KVStore.update`, a key stored in an empty row, `kernels.snapshot`). Before the
table is rebuilt (it grows, or keys are removed), the rest is copied at once. Once complete,
the copy is the table as it was when taken, whatever was pushed since: a checkpoint's forked
writer reads it, and the live table is not copied page by page as the server writes to it
(`base.forked`), which held the server for the first clocks after each fork.
"""
import numpy as np

from ..kernels import snapshot

SPAN = 1 << 15   # rows copied a turn at most: at 8-40 bytes a row, 0.25-1.3 MB (0.1 ms)
TURNS = 64       # ... and a small table's copy spread over as many turns: the same path
LEAST = 256      # for every size (a row written before its span came is copied first)


class TableSnapshot:
    def __init__(self, rows: np.ndarray, meta: np.ndarray):
        """The table `rows` (uint32[cap + 1, words], kernels.table) and its `meta`, as now."""
        self._source: np.ndarray | None = rows
        self.rows = np.empty_like(rows)
        self.meta = meta.copy()
        self._copied: np.ndarray | None = np.zeros(rows.shape[0], np.uint8)
        self._at = 0

    @property
    def complete(self) -> bool:
        return self._source is None

    def step(self, rows: int | None = None) -> bool:
        """Copy the next `rows` rows (by default a turn's); whether the copy is complete."""
        if self._source is None or self._copied is None:
            return True
        if rows is None:
            rows = min(SPAN, max(LEAST, self._source.shape[0] // TURNS))
        stop = min(self._at + rows, self._source.shape[0])
        snapshot.copy_span(self._source, self.rows, self._copied, self._at, stop)
        self._at = stop
        if stop == self._source.shape[0]:
            self._source = self._copied = None   # the table may be freed, if rebuilt
        return self._source is None

    def finish(self) -> None:
        """Copy what is left, now (the table is about to be rebuilt)."""
        if self._source is not None:
            self.step(self._source.shape[0])

    def before_write(self, rows: np.ndarray) -> None:
        """The table's rows `rows` are about to change (-1: none)."""
        if self._source is not None and self._copied is not None:
            snapshot.copy_before_write(self._source, self.rows, self._copied, self._at, rows)

    def stored_in(self, rows: np.ndarray, fresh: np.ndarray) -> None:
        """Keys were just stored in rows rows[i] where fresh[i] is set: empty when taken."""
        if self._source is not None and self._copied is not None:
            snapshot.mark_empty(self.rows, self._copied, self._at, rows, fresh)
