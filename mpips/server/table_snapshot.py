"""A server's table as of a checkpoint's clock, copied while the server goes on serving.

Taken at the clock in no time: the copy is then made a span of rows at a time (`step`), in
each turn of the server's loop that finds no request waiting and at most every BUSY_SPAN_S
while requests keep coming, and the store logs a row's value just before it
changes it (`KVStore.update`, a key stored in an empty row: `kernels.snapshot`); the log
goes into the copy once every span is copied, a part per turn. Before the table is rebuilt
(it grows, or keys are removed), the rest is copied at once. Once complete, the copy is the
table as it was when taken, whatever was pushed since: a checkpoint's forked writer reads
it, and the live table is not copied page by page as the server writes to it (as it would
be, sharing the table with a child forked at the clock), nor are the copy's fresh pages
touched out of order.
"""
import numpy as np

from ..base.shared_memory import SharedArray, array_of
from ..kernels import snapshot

SPAN = 1 << 15   # rows copied a turn at most: at 8-40 bytes a row, 0.25-1.3 MB (0.1 ms)
TURNS = 64       # ... and a small table's copy spread over as many turns: the same path
LEAST = 256      # for every size (a row written before its span came is logged first)
LOG_SPAN = 1 << 14   # logged rows written into the copy a turn
# A span is copied in every turn of the loop that finds no request waiting, and at most this
# often while requests keep coming: the copy takes the server's idle turns first, and
# under a steady load at most about a tenth of its time (a span is about 0.1 ms).
BUSY_SPAN_S = 1e-3
WRITER_CHECK_S = 2e-3   # ... and, once copied, how often it asks whether the file is in


def next_look(now: float, copying: bool) -> float:
    """When the loop next looks at a file being written from a copy of the table: within
    BUSY_SPAN_S while the copy is made (its idle turns copy too), else WRITER_CHECK_S on."""
    return now + (BUSY_SPAN_S if copying else WRITER_CHECK_S)


class TableSnapshot:
    def __init__(self, rows: np.ndarray, meta: np.ndarray,
                 into: np.ndarray | SharedArray | None = None):
        """The table `rows` (uint32[cap + 1, words], kernels.table) and its `meta`, as now,
        copied `into` an array of its shape (a copy's given back: its pages are in memory;
        `shared` if in shared memory, which a resident writer maps) or a new one."""
        self._source: np.ndarray | None = rows
        self.shared = into if isinstance(into, SharedArray) else None
        self.rows = np.empty_like(rows) if into is None else array_of(into)
        self.meta = meta.copy()
        self._copied = np.zeros(rows.shape[0], np.uint8)
        self._at = 0
        self._log_rows = np.empty(1024, np.int64)
        self._log_values = np.empty((1024, rows.shape[1]), rows.dtype)
        self._logged = self._written = 0   # log entries, and those written into the copy

    @property
    def complete(self) -> bool:
        return self._source is None

    def step(self, rows: int | None = None) -> bool:
        """Copy the next `rows` rows (by default a turn's), or once all are, write a part of
        the log into the copy; whether the copy is complete."""
        source = self._source
        if source is None:
            return True
        if self._at < source.shape[0]:
            if rows is None:
                rows = min(SPAN, max(LEAST, source.shape[0] // TURNS))
            stop = min(self._at + rows, source.shape[0])
            snapshot.copy_span(source, self.rows, self._copied, self._at, stop)
            self._at = stop
            return False
        stop = min(self._written + (rows or LOG_SPAN), self._logged)
        snapshot.apply_log(self.rows, self._log_rows, self._log_values, self._written, stop)
        self._written = stop
        if stop == self._logged:   # the table may be freed now, if rebuilt
            self._source = None
            self._copied = self._log_rows = self._log_values = np.empty(0, np.uint8)
        return self._source is None

    def finish(self) -> None:
        """Complete the copy now (the table is about to be rebuilt)."""
        while not self.step(1 << 62):
            pass

    def end(self, complete: bool) -> None:
        """No longer kept up to date: completed first if `complete`, else given up."""
        if complete:
            self.finish()

    def before_write(self, rows: np.ndarray) -> None:
        """The table's rows `rows` are about to change (-1: none)."""
        if self._source is not None and self._at < self._source.shape[0]:
            self._room(rows.shape[0])
            self._logged = snapshot.log_before_write(
                self._source, self._copied, self._at, rows, self._log_rows, self._log_values,
                self._logged)

    def stored_in(self, rows: np.ndarray, fresh: np.ndarray) -> None:
        """Keys were just stored in rows rows[i] where fresh[i] is set: empty when taken."""
        if self._source is not None and self._at < self._source.shape[0]:
            self._room(rows.shape[0])
            self._logged = snapshot.log_empty(self._copied, self._at, rows, fresh,
                                              self._log_rows, self._log_values, self._logged)

    def _room(self, more: int) -> None:
        """Room in the log for `more` entries."""
        need = self._logged + more
        if need <= self._log_rows.shape[0]:
            return
        size = max(need, 2 * self._log_rows.shape[0])
        self._log_rows = np.resize(self._log_rows, size)
        values = np.empty((size, self._log_values.shape[1]), self._log_values.dtype)
        values[:self._logged] = self._log_values[:self._logged]
        self._log_values = values
