"""A server's store holds every key range the placement gives it, as primary or as backup.
What it writes (checkpoints, the model, snapshots) is only what it is primary for, so that
each key is written once whatever the number of copies."""
import numpy as np


class PrimaryKeys:
    """The keys of `store` that `server` is primary for, read as the writers read a store."""

    def __init__(self, store, placement, server: int):
        self.store = store
        self.placement = placement   # replaced when the job's placement changes
        self.server = server

    @property
    def width(self) -> int:
        return self.store.width

    @property
    def optimizer(self):
        return self.store.optimizer

    def weights(self, state: np.ndarray, clocks: int) -> np.ndarray:
        return self.store.weights(state, clocks)

    def ranges(self) -> list:
        """The key ranges this server answers for (its own, and a dead server's it took)."""
        return np.flatnonzero(self.placement.primary_ranges(self.server)).tolist()

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        keys, state = self.store.items()
        if not self.placement.has_backups:   # a server then holds nothing but its own keys
            return keys, state
        mine = self.placement.owners(keys) == self.server
        return keys[mine], state[mine]

    @property
    def columns(self) -> int:
        return self.store.columns

    def blocks(self, rows: int = 1 << 18, state: bool = True):
        """`items` a block of table rows at a time (see KVStore.blocks)."""
        for keys, values in self.store.blocks(rows, state):
            if self.placement.has_backups:
                mine = self.placement.owners(keys) == self.server
                keys, values = keys[mine], (values[mine] if state else None)
            yield keys, values

    def __len__(self) -> int:
        if not self.placement.has_backups:
            return len(self.store)
        return int((self.placement.owners(self.store.stored()[1]) == self.server).sum())
