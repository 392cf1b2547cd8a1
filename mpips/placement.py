"""Which server owns a key: hash the key, then give each server a range of hashes.

Hashing first makes sequential or skewed feature ids spread evenly; ranges keep
the map a short sorted array of boundaries that can later move or split.
"""
import numpy as np

from .kernels.hashing import first_misplaced, group_by_owner, owners

_SALT = np.uint64(0x9E3779B97F4A7C15)  # keeps placement independent of the server's slot hash


class Placement:
    """`version` numbers the placements of one job: a message says which one its sender used,
    so that a server can tell keys split by another (after a membership change) apart."""

    def __init__(self, n_servers: int, version: int = 0):
        self.n_servers = n_servers
        self.version = version
        self.bounds = np.array([(s << 64) // n_servers for s in range(n_servers)], np.uint64)

    def owners(self, keys: np.ndarray) -> np.ndarray:
        """Server index (int32) of each key."""
        return owners(keys, self.bounds, _SALT)

    def split(self, keys: np.ndarray):
        """(perm, offsets): keys[perm[offsets[s]:offsets[s + 1]]] belong to server s.

        perm is None when there is one server (no reordering needed).
        """
        if self.n_servers == 1:
            return None, np.array([0, keys.shape[0]], np.int64)
        return group_by_owner(self.owners(keys), self.n_servers)

    def first_misplaced(self, keys: np.ndarray, server: int) -> tuple[int, str]:
        """(index, why) of the first key out of strictly increasing order or not owned by
        `server`; (-1, "") if every key is in order and `server`'s."""
        i, why = first_misplaced(keys, self.bounds, _SALT, server)
        return int(i), {0: "", 1: "not in strictly increasing order", 2: "owned by another server"}[int(why)]
