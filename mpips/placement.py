"""Which servers hold a key: hash the key into one of the job's key ranges; each range sits on a
ring of servers, held by its primary and the next R-1 servers on the ring (its backups).

Hashing first makes sequential or skewed feature ids spread evenly; ranges keep the map a
short sorted array of boundaries that can later move or split. Range r's primary is server r
while every server lives; its backups are the next servers on the ring, preferring servers
on other nodes, so that one node's loss leaves a copy. When servers die, each range's
first living holder becomes its primary, and the next living servers on the ring replace
the copies lost: `without(dead)` is the next version of the map.
"""
import numpy as np

from .kernels import hashing

_SALT = np.uint64(0x9E3779B97F4A7C15)  # keeps placement independent of the server's slot hash


def ring_holders(n_servers: int, replicas: int, nodes=None) -> tuple:
    """For each range r, the servers holding it: r, then the next `replicas - 1` servers
    after r on the ring, those on nodes not yet holding r first."""
    nodes = list(nodes) if nodes is not None else list(range(n_servers))
    holders = []
    for r in range(n_servers):
        ring = [(r + i) % n_servers for i in range(1, n_servers)]
        chosen, used = [r], {nodes[r]}
        for s in ring:   # distinct nodes first, in ring order ...
            if len(chosen) < replicas and nodes[s] not in used:
                chosen.append(s)
                used.add(nodes[s])
        for s in ring:   # ... then any server, if the job has too few nodes
            if len(chosen) < replicas and s not in chosen:
                chosen.append(s)
        holders.append(tuple(chosen))
    return tuple(holders)


def _living_holders(r: int, ring: tuple, n_servers: int, replicas: int, dead) -> tuple:
    """Range r's holders with `dead` servers gone: the first `replicas` living servers of its
    ring holders, then the ring from r on. The first is the primary; a server new to the
    list gets a copy from it. The same set of dead servers gives the same holders whatever
    the order the deaths were learned in."""
    order = list(ring) + [(r + i) % n_servers for i in range(1, n_servers)
                          if (r + i) % n_servers not in ring]
    return tuple([s for s in order if s not in dead][:replicas])


class Placement:
    """`version` numbers the placements of one job: a message says which one its sender used,
    so that a server can tell keys split by another (after a failure or membership change)
    apart."""

    def __init__(self, n_servers: int, replicas: int = 1, nodes=None, version: int = 0,
                 dead: frozenset = frozenset()):
        if not 1 <= replicas <= n_servers:
            raise ValueError(f"{replicas} replicas of each key need at least as many servers; "
                             f"there are {n_servers}")
        self.n_servers = n_servers
        self.replicas = replicas
        self.nodes = tuple(nodes) if nodes is not None else tuple(range(n_servers))
        self.version = version
        self.dead = frozenset(dead)
        self.bounds = np.array([(s << 64) // n_servers for s in range(n_servers)], np.uint64)
        self.holders = tuple(_living_holders(r, h, n_servers, replicas, self.dead)
                             for r, h in enumerate(ring_holders(n_servers, replicas, self.nodes)))
        self.lost = tuple(r for r, h in enumerate(self.holders) if not h)
        self._primary = np.array([h[0] if h else -1 for h in self.holders], np.int32)
        self._held = np.zeros((n_servers, n_servers), np.bool_)   # [server, range]
        for r, h in enumerate(self.holders):
            self._held[list(h), r] = True

    @property
    def n_ranges(self) -> int:
        return self.bounds.shape[0]

    def without(self, dead) -> "Placement":
        """The same ring with `dead` servers (indices) gone as well. Its version counts the
        dead servers, so that ranks that learn of two deaths in either order agree."""
        gone = self.dead | frozenset(dead)
        return Placement(self.n_servers, self.replicas, self.nodes,
                         self.version + len(gone - self.dead), gone)

    def ranges_of(self, keys: np.ndarray) -> np.ndarray:
        """Key range (int32) of each key."""
        return hashing.ranges_of(keys, self.bounds, _SALT)

    def owners(self, keys: np.ndarray) -> np.ndarray:
        """Primary server (int32) of each key: the one that answers its pulls."""
        return self._primary[self.ranges_of(keys)]

    def primary_ranges(self, server: int) -> np.ndarray:
        """bool[n_ranges]: the ranges `server` answers pulls for."""
        return self._primary == server

    def held_ranges(self, server: int) -> np.ndarray:
        """bool[n_ranges]: the ranges `server` keeps a copy of (as primary or backup)."""
        return self._held[server]

    def backup_ranges(self, server: int) -> np.ndarray:
        """bool[n_ranges]: the ranges `server` keeps a copy of without answering their pulls."""
        return self.held_ranges(server) & ~self.primary_ranges(server)

    def holds(self, keys: np.ndarray, server: int) -> np.ndarray:
        """bool per key: whether `server` keeps it."""
        return self.held_ranges(server)[self.ranges_of(keys)]

    def split(self, keys: np.ndarray):
        """(perm, offsets): keys[perm[offsets[s]:offsets[s + 1]]] have server s for primary,
        in key order. perm is None when there is one server (no reordering needed)."""
        if self.n_servers == 1:
            return None, np.array([0, keys.shape[0]], np.int64)
        return hashing.group_by_owner(self.owners(keys), self.n_servers)

    def first_misplaced(self, keys: np.ndarray, server: int,
                        as_primary: bool = True) -> tuple[int, str]:
        """(index, why) of the first key out of strictly increasing order or not `server`'s
        (as primary, for reads; as any holder, for writes); (-1, "") if every key is in
        order and `server`'s."""
        allowed = self.primary_ranges(server) if as_primary else self.held_ranges(server)
        i, why = hashing.first_misplaced(keys, self.bounds, _SALT, allowed)
        return int(i), {0: "", 1: "not in strictly increasing order",
                        2: "held by another server"}[int(why)]

    def block_owners(self, blocks: np.ndarray) -> np.ndarray:
        """Primary server (int32) of each block of a dense table: blocks go round the ranges,
        the same way for every table, so that the blocks an operation combines (y += a x)
        are on one server."""
        return self._primary[blocks % self.n_ranges]

    def describe(self) -> dict:
        """The map as plain data, for manifests and summaries."""
        return {"hash": "splitmix64 of key ^ salt, ranges of the hash",
                "bounds": [str(b) for b in self.bounds], "replicas": self.replicas,
                "holders": [list(h) for h in self.holders], "dead": sorted(self.dead),
                "version": self.version}
