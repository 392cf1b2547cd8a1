"""Which servers hold a key: hash the key into one of the job's key ranges; each range sits on a
ring of servers, held by its primary and the next R-1 servers on the ring (its backups).

The ranges are Q equal slices of the hash (consistent hashing with fixed partitions, as
Dynamo's third strategy): each server starts with `vnodes` of them, dealt round the ring
(range r to server r mod n), so servers hold equal shares of the keys however few there
are. A server that joins takes whole ranges from the fullest servers, one at a time, and a
server that leaves deals its own out to the emptiest: only 1/n of the keys move, and
`vnodes` is what keeps the shares even after joins and leaves (a share is a whole number of
ranges). Hashing first makes sequential or skewed feature ids spread evenly.

A range's backups are the next servers met going round the ring from it, preferring servers
on other nodes, so that one node's loss leaves a copy. When servers die, each range's first
living holder becomes its primary, and the next living servers on the ring replace the
copies lost: `without(dead)` is the next version of the map.
"""
from typing import NamedTuple

import numpy as np

from ..kernels import hashing

_SALT = hashing.PLACEMENT_SALT
_NO_COUNTS = np.zeros(0, np.int64)
_MISPLACED = {0: "", 1: "not in strictly increasing order", 2: "held by another server"}


def _walk(assign: tuple, r: int, owners: int):
    """The `owners` servers that own ranges, in the order met going round the ring from
    range r (r's own first), each once."""
    seen = set()
    n = len(assign)
    for i in range(n):
        s = assign[(r + i) % n]
        if s not in seen:
            seen.add(s)
            yield s
            if len(seen) == owners:
                return


def ring_holders(n_servers: int, replicas: int, nodes=None, assign=None) -> tuple:
    """For each range r, the servers holding it: its owner (`assign[r]`; default: one range
    per server, range r on server r), then the next `replicas - 1` servers met going round
    the ring from r, those on nodes not yet holding r first."""
    nodes = list(nodes) if nodes is not None else list(range(n_servers))
    assign = tuple(assign) if assign is not None else tuple(range(n_servers))
    holders, owners = [], len(set(assign))
    for r, owner in enumerate(assign):
        chosen, used, passed = [owner], {nodes[owner]}, []
        walk = _walk(assign, r, owners)
        next(walk)
        for s in walk if replicas > 1 else ():   # distinct nodes first, in ring order ...
            if nodes[s] in used:
                passed.append(s)
                continue
            chosen.append(s)
            used.add(nodes[s])
            if len(chosen) == replicas:
                break
        # ... then any server, if the job has too few nodes (the walk went all round)
        chosen += passed[:replicas - len(chosen)]
        holders.append(tuple(chosen))
    return tuple(holders)


def _living_holders(r: int, ring: tuple, assign: tuple, replicas: int, dead,
                    stand_in: dict) -> tuple:
    """Range r's holders with `dead` servers gone: the living servers of its ring holders,
    then the spares standing in for the dead ones, then the next living servers of the ring
    from r on, `replicas` of them. The first is the primary (a spare, which has no copy yet,
    comes after the living); a server new to the list gets a copy from it. The same set of
    dead servers gives the same holders whatever the order the deaths were learned in."""
    chosen = [s for s in ring if s not in dead]
    chosen += [stand_in[s] for s in ring if s in stand_in]
    if len(chosen) < replicas and dead:
        for s in _walk(assign, r, len(set(assign))):
            if len(chosen) == replicas:
                break
            if s not in dead and s not in chosen:
                chosen.append(s)
    return tuple(chosen[:replicas])


def dealt(n_servers: int, vnodes: int) -> tuple:
    """The first owners of n_servers x vnodes ranges: dealt round the ring."""
    return tuple(r % n_servers for r in range(n_servers * vnodes))


def with_server(assign: tuple, new: int) -> tuple:
    """The ranges' owners once server `new` has joined: it takes one range at a time from
    the server owning most (the lowest numbered of equals; its last range on the ring) until
    it owns as many as the fewest any other owns, give or take one."""
    owned = _owned(assign)
    owned[new] = []
    out = list(assign)
    while True:
        fullest = max(sorted(owned), key=lambda s: len(owned[s]))
        if len(owned[fullest]) - len(owned[new]) <= 1:
            return tuple(out)
        r = owned[fullest].pop()
        owned[new].append(r)
        out[r] = new


def without_server(assign: tuple, leaving: int, servers=None) -> tuple:
    """The ranges' owners once server `leaving` has left: each of its ranges, in ring order,
    to the server then owning fewest (the lowest numbered of equals), of `servers` (default:
    those owning ranges; a server that owns none yet is one to give to)."""
    owned = _owned(assign)
    for s in servers if servers is not None else ():
        owned.setdefault(s, [])
    mine = owned.pop(leaving, [])
    if not owned:
        raise ValueError(f"server {leaving} is the last server: it cannot leave")
    out = list(assign)
    for r in mine:
        emptiest = min(sorted(owned), key=lambda s: len(owned[s]))
        owned[emptiest].append(r)
        out[r] = emptiest
    return tuple(out)


def rebalanced(assign: tuple, load, most: int = 8) -> tuple:
    """The ranges' owners with the load (per range: the keys read from it) spread more
    evenly: up to `most` times, the range of the busiest server whose move to the least busy
    one brings the larger of their loads down most, moved. A server that owns no range
    (a spare) is left out."""
    load = [float(x) for x in load]
    out = list(assign)
    for _ in range(most):
        owned = _owned(tuple(out))
        totals = {s: sum(load[r] for r in rs) for s, rs in owned.items()}
        busiest = max(sorted(totals), key=totals.__getitem__)
        idlest = min(sorted(totals), key=totals.__getitem__)
        if busiest == idlest or len(owned[busiest]) < 2:
            break
        r = min(owned[busiest], key=lambda r: max(totals[busiest] - load[r],
                                                   totals[idlest] + load[r]))
        if max(totals[busiest] - load[r], totals[idlest] + load[r]) >= totals[busiest]:
            break
        out[r] = idlest
    return tuple(out)


def load_spread(assign: tuple, load) -> float:
    """The busiest server's load over the mean (1: even), of the servers owning ranges."""
    totals: dict[int, float] = {}
    for r, s in enumerate(assign):
        totals[s] = totals.get(s, 0.0) + float(load[r])
    mean = sum(totals.values()) / len(totals)
    return max(totals.values()) / mean if mean else 1.0


def _owned(assign: tuple) -> dict[int, list[int]]:
    owned: dict[int, list[int]] = {}
    for r, s in enumerate(assign):
        owned.setdefault(s, []).append(r)
    return owned


def moved(before: tuple, after: tuple) -> float:
    """The share of the ranges (so of the keys, whose hashes spread evenly) whose owner
    changed."""
    return sum(a != b for a, b in zip(before, after)) / len(before)


def by_range(ranges: np.ndarray, n_ranges: int):
    """(order, starts): order[starts[r]:starts[r + 1]] are the positions of range r's keys,
    in their order in `ranges` (a counting sort: one pass, whatever the number of keys)."""
    narrow = ranges.astype(np.int16) if n_ranges < 1 << 15 else ranges
    order = np.argsort(narrow, kind="stable")   # a radix sort for 16 bits
    starts = np.searchsorted(ranges[order], np.arange(n_ranges + 1))
    return order, starts


def describe_ranges(ranges) -> str:
    """Key ranges for a message: all of few, the first of many."""
    ranges = sorted(int(r) for r in ranges)
    if len(ranges) <= 8:
        return str(ranges)
    return f"{len(ranges)} ranges ({', '.join(map(str, ranges[:6]))}, ...)"


class Switch(NamedTuple):
    """A change of placement under way (a range move): reads of `clock` or later routed by a
    placement older than `version` are refused."""
    clock: int
    version: int


class Placement:
    """`version` numbers the placements of one job: a message says which one its sender used,
    so that a server can tell keys split by another (after a failure or membership change)
    apart. `assign`: each range's owner (default: `vnodes` ranges per server, dealt); the
    servers that own none are spares: when servers die, the living spares stand in for them
    in the order of their numbers, receiving copies of what they held. `extra` ({range:
    servers}): holders beyond the ring's, backups that become owners when ranges move (see
    `toward`)."""

    def __init__(self, n_servers: int, replicas: int = 1, nodes=None, version: int = 0,
                 dead: frozenset = frozenset(), vnodes: int = 1, assign=None, extra=None,
                 backups_since: int | None = None):
        if not 1 <= replicas <= n_servers:
            raise ValueError(f"{replicas} replicas of each key need at least as many servers; "
                             f"there are {n_servers}")
        if vnodes < 1:
            raise ValueError(f"each server needs at least one key range, not {vnodes}")
        self.n_servers = n_servers
        self.replicas = replicas
        self.nodes = tuple(nodes) if nodes is not None else tuple(range(n_servers))
        self.version = version
        # the first version with these primaries: a backup's part of a push split by it or
        # later is a backup's still (see `Pushes.take` in the server)
        self.backups_since = version if backups_since is None else backups_since
        self.dead = frozenset(dead)
        # the servers alive, in order; the first leads (checkpoints, stopping, mpips ctl)
        self.living = tuple(s for s in range(n_servers) if s not in self.dead)
        self.assign = tuple(assign) if assign is not None else dealt(n_servers, vnodes)
        owners = set(self.assign)
        self.spares = tuple(s for s in range(n_servers) if s not in owners)
        self.stand_in = dict(zip(sorted(self.dead & owners),
                                 [s for s in self.spares if s not in self.dead]))
        q = len(self.assign)
        # (kernels.hashing.key_range finds a hash's range by this formula, without them)
        self.bounds = np.array([(r << 64) // q for r in range(q)], np.uint64)
        self.holders = tuple(
            _living_holders(r, h, self.assign, replicas, self.dead, self.stand_in)
            for r, h in enumerate(ring_holders(n_servers, replicas, self.nodes, self.assign)))
        living = {int(r): tuple(int(x) for x in s if x not in self.dead)
                  for r, s in (extra or {}).items()}
        self.extra = {r: s for r, s in living.items() if s}
        if self.extra:
            self.holders = tuple(h + tuple(x for x in self.extra.get(r, ()) if x not in h)
                                 for r, h in enumerate(self.holders))
        self.lost = tuple(r for r, h in enumerate(self.holders) if not h)
        # whether some range has more than one holder (--replicas, or a move under way)
        self.has_backups = any(len(h) > 1 for h in self.holders)
        self._primary = np.array([h[0] if h else -1 for h in self.holders], np.int32)
        self._held = np.zeros((n_servers, q), np.bool_)   # [server, range]
        self._allowed: dict = {}   # (server, as primary) -> its ranges (first_misplaced's)
        self._whole: tuple = (-1, None)   # by_server's last (count, offsets) with one server
        for r, h in enumerate(self.holders):
            self._held[list(h), r] = True

    @property
    def n_ranges(self) -> int:
        return self.bounds.shape[0]

    @property
    def lead(self) -> int:
        """The server that leads: server 0, or after it died the first living one."""
        return self.living[0]

    def others(self, server: int) -> list:
        """The living servers but `server`."""
        return [s for s in self.living if s != server]

    def without(self, dead) -> "Placement":
        """The same ring with `dead` servers (indices) gone as well. Its version counts the
        dead servers, so that ranks that learn of two deaths in either order agree."""
        gone = self.dead | frozenset(dead)
        return Placement(self.n_servers, self.replicas, self.nodes,
                         self.version + len(gone - self.dead), gone, assign=self.assign,
                         extra=self.extra)

    def toward(self, after: "Placement") -> "Placement":
        """The placement on the way to `after` (a move): owners unchanged, each range's new
        holders under `after` added as backups, so that they receive copies and pushes while
        reads go on; version between the two."""
        extra = {r: tuple(x for x in h if x not in self.holders[r])
                 for r, h in enumerate(after.holders)}
        return Placement(self.n_servers, self.replicas, self.nodes, self.version + 1,
                         self.dead, assign=self.assign, extra=extra,
                         backups_since=self.backups_since)

    def extra_fields(self) -> np.ndarray:
        """`extra` as int64[n_ranges, replicas] (-1: none), for the wire; see `extra_of`."""
        out = np.full((self.n_ranges, self.replicas), -1, np.int64)
        for r, s in self.extra.items():
            out[r, :len(s)] = s
        return out

    @staticmethod
    def extra_of(fields: np.ndarray) -> dict:
        """`extra_fields` read back."""
        return {r: tuple(int(x) for x in row if x >= 0) for r, row in enumerate(fields)
                if (row >= 0).any()}

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

    def by_server(self, keys: np.ndarray):
        """(perm, offsets): keys[perm[offsets[s]:offsets[s + 1]]] have server s for primary,
        in key order. perm is None when there is one server (no reordering needed)."""
        if self.n_servers == 1:
            # (asked of every pull: the offsets of the last count kept, read-only)
            n, offsets = self._whole
            if n != keys.shape[0]:
                offsets = np.array([0, keys.shape[0]], np.int64)
                offsets.flags.writeable = False
                self._whole = (keys.shape[0], offsets)
            return None, offsets
        return hashing.split_by_owner(keys, self.bounds, _SALT, self._primary, self.n_servers)

    def allowed(self, server: int, as_primary: bool) -> np.ndarray:
        """bool[n_ranges]: the ranges whose keys `server` takes, as primary (reads) or as
        any holder (writes); asked of every request, so made once (a placement never
        changes)."""
        allowed = self._allowed.get((server, as_primary))
        if allowed is None:
            allowed = self._allowed[(server, as_primary)] = (
                self.primary_ranges(server) if as_primary else self.held_ranges(server))
        return allowed

    def key_check(self, server: int, as_primary: bool, counts: np.ndarray | None = None):
        """What a kernel needs to check that keys are `server`'s, in the order of
        kernels.requests.checked_homes' arguments: (bounds, allowed, counts)."""
        return (self.bounds, self.allowed(server, as_primary),
                _NO_COUNTS if counts is None else counts)

    def first_misplaced(self, keys: np.ndarray, server: int, as_primary: bool = True,
                        counts: np.ndarray | None = None) -> tuple[int, str]:
        """(index, why) of the first key out of strictly increasing order or not `server`'s
        (as primary, for reads; as any holder, for writes); (-1, "") if every key is in
        order and `server`'s. `counts` (int64 per range): each key's range counted."""
        bounds, allowed, counts = self.key_check(server, as_primary, counts)
        i, why = hashing.first_misplaced(keys, bounds, _SALT, allowed, counts)
        return int(i), _MISPLACED[int(why)]

    def block_owners(self, blocks: np.ndarray) -> np.ndarray:
        """Primary server (int32) of each block of a dense table: blocks go round the ranges,
        the same way for every table, so that the blocks an operation combines (y += a x)
        are on one server."""
        return self._primary[blocks % self.n_ranges]

    def record(self) -> dict:
        """What makes this placement, as JSON (`of_record` makes it again)."""
        return {"n_servers": self.n_servers, "replicas": self.replicas,
                "nodes": list(self.nodes), "version": self.version, "dead": sorted(self.dead),
                "assign": list(self.assign), "backups_since": self.backups_since,
                "extra": {str(r): list(s) for r, s in self.extra.items()}}

    @staticmethod
    def of_record(record: dict) -> "Placement":
        return Placement(**{**record, "dead": frozenset(record["dead"])})

    def describe(self) -> dict:
        """The map as plain data, for manifests and summaries."""
        return {"hash": "splitmix64 of key ^ salt, equal ranges of the hash",
                "bounds": [str(b) for b in self.bounds], "replicas": self.replicas,
                "owners": list(self.assign),
                "holders": [list(h) for h in self.holders], "dead": sorted(self.dead),
                "spares": list(self.spares),
                **({"moving_to": {str(r): list(x) for r, x in sorted(self.extra.items())}}
                   if self.extra else {}),
                "stand_in": {str(d): s for d, s in sorted(self.stand_in.items())},
                "version": self.version}
