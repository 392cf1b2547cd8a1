"""One server's shard of the model: keys and their state in an open-addressing table.

Only keys that were pushed or pulled are stored; a new key starts at zero.
Weights and optimizer state share a row, so one update touches one cache line.
"""
import numpy as np

from .kernels import optim, table
from .optimizer import Optimizer


class KVStore:
    def __init__(self, width: int, optimizer: Optimizer, capacity: int = 1 << 10,
                 max_load: float = 0.75):
        self.width = width
        self.optimizer = optimizer
        self.max_load = max_load
        self.columns = optimizer.state_columns(width)
        cap = 1 << max(4, int(capacity - 1).bit_length())
        self._keys = np.full(cap + 1, table.EMPTY, np.uint64)
        self._state = np.zeros((cap + 1, self.columns), np.float32)
        self._meta = np.zeros(2, np.int64)
        self._slots = np.empty(0, np.int64)

    def __len__(self) -> int:
        return int(self._meta[0])

    @property
    def capacity(self) -> int:
        return self._keys.shape[0] - 1

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self._state.nbytes

    def _find(self, keys: np.ndarray, insert: bool) -> np.ndarray:
        n = keys.shape[0]
        if insert:
            self._reserve(len(self) + n)
        if self._slots.shape[0] < n:
            self._slots = np.empty(max(n, 2 * self._slots.shape[0]), np.int64)
        slots = self._slots[:n]
        table.find_slots(self._keys, self._meta, keys, insert, slots)
        return slots

    def _reserve(self, n_keys: int) -> None:
        cap = self.capacity
        if n_keys < self.max_load * cap:
            return
        while n_keys >= self.max_load * cap:
            cap *= 2
        keys = np.full(cap + 1, table.EMPTY, np.uint64)
        state = np.zeros((cap + 1, self.columns), np.float32)
        table.rehash(self._keys, self._state, keys, state)
        self._keys, self._state = keys, state

    def pull(self, keys: np.ndarray, out: np.ndarray, insert: bool = True) -> np.ndarray:
        """Weights of `keys` into out[len(keys), width]. Unknown keys are stored (at zero)
        if `insert`, else read as zero."""
        slots = self._find(keys, insert)  # may grow the table: look up before reading _state
        optim.gather_weights(self._state, slots, self.width, out)
        return out

    def push(self, keys: np.ndarray, grads: np.ndarray) -> None:
        """Apply the optimizer to `keys` with gradients grads[len(keys), width]."""
        slots = self._find(keys, True)
        self.optimizer.update(self._state, slots, grads)

    def items(self):
        """(keys, state rows) of everything stored; state columns start with the weights."""
        slots = table.occupied_slots(self._keys, self._meta)
        return self._keys[slots], self._state[slots]
