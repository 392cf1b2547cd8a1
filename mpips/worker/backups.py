"""Which parts of a push each server keeps a backup copy of (with replicas): the rows it gets
beside its own, as slices of the push's rows grouped by primary when it backs up whole
primaries, key by key otherwise.
"""
import numpy as np

from ..wire.placement import Placement


class BackupParts:
    """The parts of pushes each server backs up, under a worker's current placement."""

    def __init__(self):
        self._version: int | None = None    # the placement `_backs` was found for
        self._backs: dict[int, list[int]] | None = None

    def of(self, p: Placement, living: list, keys: np.ndarray, values: np.ndarray,
           skeys: np.ndarray, svalues: np.ndarray, offsets: np.ndarray) -> dict:
        """{server: [(keys, values)]}: the parts of a push each server keeps a backup copy
        of, each in key order. Keys come grouped by primary (`skeys`, `offsets`): when each
        server backs up whole primaries' parts, as it does until a server dies, its parts are
        slices of them."""
        backs = self._backs_up(p, living)
        parts = {}
        if backs is None:   # a primary whose ranges have different backups: key by key
            ranges = p.ranges_of(keys)
            for t in living:
                mine = np.flatnonzero(p.backup_ranges(t)[ranges])
                if mine.shape[0]:
                    parts[t] = [(keys[mine], values[mine])]
            return parts
        for t, primaries in backs.items():
            slices = [(offsets[s], offsets[s + 1]) for s in primaries]
            parts[t] = [(skeys[a:b], svalues[a:b]) for a, b in slices if a < b]
        return {t: p for t, p in parts.items() if p}

    def _backs_up(self, p: Placement, living: list) -> dict[int, list[int]] | None:
        """{server: the primaries whose every range it backs up}, for placement `p`; None if
        some server backs up part of a primary's ranges only."""
        if self._version == p.version:
            return self._backs
        backs: dict[int, list[int]] = {t: [] for t in living}
        for s in living:
            mine = p.primary_ranges(s)
            for t, primaries in backs.items():
                held = p.backup_ranges(t)[mine]
                if held.any() and not held.all():
                    self._version, self._backs = p.version, None
                    return None
                if held.any():
                    primaries.append(s)
        self._version, self._backs = p.version, backs
        return backs
