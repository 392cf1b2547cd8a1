"""What membership reads and does of the server it runs in: a narrow view of the server's
context (server.context.ServerContext), described here because membership sits below the
server and beside recovery, and imports neither.
"""
from collections.abc import Callable
from typing import Protocol

import numpy as np

from ..data.workplan import Handover
from ..ranks.roles import Roles
from ..wire.clocks import ClockTable
from ..wire.placement import Placement, Switch
from ..wire.position import Position


class Gate(Protocol):
    """The server's read gate (server.readgate.ReadGate)."""
    ceiling: int | None
    moving: Switch | None

    @property
    def highest(self) -> int: ...


class Positions(Protocol):
    """Where each worker stands (server.checkpoint_clocks.Checkpoints)."""
    @property
    def positions(self) -> dict[int, Position]: ...
    @property
    def stop_at(self) -> int | None: ...
    def place(self, worker: int, position: Position, /) -> None: ...


class Store(Protocol):
    """The server's rows (server.store.KVStore)."""
    def stored(self): ...
    def keep(self, kept: np.ndarray, /) -> None: ...
    def remove(self, keys: np.ndarray, /) -> None: ...


class Copies(Protocol):
    """Ranges copied to their new holders (recovery.rangecopies.RangeCopies)."""
    keys_sent: int
    keys_received: int
    send_s: float
    load_s: float
    on_whole: list[Callable[[], None]]

    def plan(self, before: Placement, after: Placement, /) -> None: ...
    def awaited(self) -> list: ...
    def send_copies(self) -> None: ...


class Losses(Protocol):
    """Rows of workers gone, handed over (recovery.workerloss.WorkerLosses)."""
    @property
    def epochs(self) -> int: ...
    def training(self, but: int) -> tuple: ...
    def announce(self, death: Handover, /) -> None: ...
    def finished(self, worker: int, clock: int, place: Position, /) -> Handover | None: ...


class DenseHolder(Protocol):
    """The server's dense tables (server.dense_tables.DenseTables)."""
    placement: Placement

    @property
    def tables(self) -> dict: ...


class Asked(Protocol):
    """Whether a stop was asked for (server.stopping.Stopping)."""
    @property
    def asked(self) -> bool: ...


class Heard(Protocol):
    """The server's watch on workers' silence (server.watchdog.Watchdog)."""
    def message_from(self, worker: int, /) -> None: ...


class Releases(Protocol):
    """The server's reads (server.reads.Reads)."""
    def release(self) -> None: ...


class BackupPushes(Protocol):
    """The server's pushes (server.pushes.Pushes)."""
    def apply_backups(self) -> None: ...


class Told(Protocol):
    """What the job around the server is told (server.context.Hooks)."""
    @property
    def placement_changed(self) -> Callable[[Placement], None]: ...
    @property
    def reached(self) -> Callable[[str, int, bool], bool]: ...


class RowsHandedOut(Protocol):
    """The lead's hand-out of training rows (server.rowhandout.RowHandOut)."""
    @property
    def dynamic(self) -> bool: ...
    def rows_left(self) -> int: ...
    def worker_joins(self, worker: int, place: Position, /) -> Position: ...


class MembershipContext(Protocol):
    """What membership's parts read and do of their server."""
    placement: Placement   # replaced when key ranges move

    @property
    def roles(self) -> Roles: ...
    @property
    def clocks(self) -> ClockTable: ...
    @property
    def hooks(self) -> Told: ...
    @property
    def gate(self) -> Gate: ...
    @property
    def ckpt(self) -> Positions: ...
    @property
    def store(self) -> Store: ...
    @property
    def copies(self) -> Copies: ...
    @property
    def losses(self) -> Losses | None: ...
    @property
    def handout(self) -> RowsHandedOut | None: ...
    @property
    def dense(self) -> DenseHolder: ...
    @property
    def stopping(self) -> Asked: ...
    @property
    def watchdog(self) -> Heard: ...
    @property
    def reads(self) -> Releases: ...
    @property
    def pushes(self) -> BackupPushes: ...
    @property
    def lead(self) -> bool: ...
    @property
    def lead_rank(self) -> int: ...

    def register(self, handlers: dict, /) -> None: ...
    def others(self) -> list: ...
    def sender(self, source: int, /) -> str: ...
    def send(self, buf: np.ndarray, dest: int, tag: int = ..., /) -> None: ...
    def reply(self, buf: np.ndarray, dest: int, ts: int, /) -> None: ...
