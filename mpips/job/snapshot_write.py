"""A checkpoint's shard written from a copy of the table taken at its clock: the copy is made
a span of rows per turn of the server's loop (server.table_snapshot), then a forked child
writes the file from it (base.forked). The server is held only as long as a span's copy and
a fork take; the live table is kept out of the child (base.memory.keep_from_children), so
the server's writes after the fork copy no pages.
"""
import os
import time
from collections.abc import Callable

from ..base.budget import OverBudget
from ..base.forked import ForkedWrite, keep_from_children
from ..server.store import KVStore
from ..server.table_snapshot import TableSnapshot


class SnapshotWrite:
    """A ShardWrite (server.context): `write(store)` run in a forked child over a store that
    reads the table as it was when this was made; `forked()` is called in this process once
    the child runs."""

    def __init__(self, store: KVStore, write: Callable[[KVStore], dict], what: str,
                 cleanup: Callable[[int], None], forked: Callable[[], None]):
        self.started = time.monotonic()   # the state is the table's now
        self.pid = os.getpid()            # the writer's, once forked
        self._store, self._write, self._what = store, write, what
        self._cleanup, self._forked = cleanup, forked
        self._file: ForkedWrite | None = None
        self._entry: dict | None = None
        self._taken: TableSnapshot | None = None   # the copy, given back once not read
        try:
            self._taken = store.take_snapshot()
        except (OverBudget, MemoryError) as e:
            self._entry = {"error": f"no memory for a copy of this server's table to write "
                                    f"{what} from ({e or 'the machine refused it'}); "
                                    f"training goes on, the checkpoint is not complete"}

    @property
    def copying(self) -> bool:
        """Whether the table is still being copied (the loop then polls every turn)."""
        return self._file is None and self._entry is None

    def poll(self) -> dict | None:
        if self._file is None:
            if self._entry is not None:
                return self._entry
            assert self._taken is not None, "a copy is being made"
            if not self._taken.step():
                return None
            self._fork()
        assert self._file is not None, "forked once the copy is complete"
        return self._ended(self._file.poll())

    def wait(self, timeout: float) -> dict:
        if self.copying:
            assert self._taken is not None, "a copy is being made"
            self._taken.finish()
            self._fork()
        if self._file is None:
            assert self._entry is not None, "stopped before it was forked"
            return self._entry
        return self._ended(self._file.wait(timeout))

    def stop(self, why: str) -> dict:
        if self._file is not None:
            return self._ended(self._file.stop(why))
        if self._entry is None:
            self._release(complete=False)   # given up: what is left need not be copied
            self._entry = {"error": why}
        return self._ended(self._entry)

    def _ended(self, entry):
        """`entry`, and if the write has ended, the copy given back to the store."""
        if entry is not None and self._taken is not None:
            self._release()
            self._store.give_back(self._taken)
            self._taken = None
        return entry

    def _fork(self) -> None:
        assert self._taken is not None, "a copy was made"
        view = self._store.snapshot_of(self._taken)
        self._release()
        # (the copy's pages are the child's and this process's alike until one writes them:
        # neither does, and this one reuses them once the child has ended; no other child
        # gets them: see KVStore.take_snapshot)
        keep_from_children(self._taken.rows, keep=False)
        self._file = ForkedWrite(lambda: self._write(view), self._what, self._cleanup)
        keep_from_children(self._taken.rows)
        self.pid = self._file.pid
        self._forked()

    def _release(self, complete: bool = True) -> None:
        """The store no longer keeps the copy up to date (see KVStore.end_snapshot)."""
        if self._taken is not None and self._store.snapshot is self._taken:
            self._store.end_snapshot(complete)
