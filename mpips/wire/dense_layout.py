"""How a dense table is cut: `n` rows of `width` float64 values, in blocks of `block_rows`
rows; block b belongs to key range b mod (the number of ranges), whatever the table, so that
tables of one shape have their rows on the same servers, and it has that range's holders (a
primary and, with --replicas, backups). The client uses it to send each server the rows it
holds, the server to know which it holds."""
import hashlib
from dataclasses import dataclass

import numpy as np

from ..kernels.hashing import group_by_owner

BLOCK_ROWS = 1 << 16   # 512 KiB of one-wide rows: long runs for the kernels, many blocks
MAX_ROWS = 1 << 40
NAME_LIMIT = 64        # bytes of a table's name
MAX_LISTED = 4096      # tables one operation may name (gram, combine)


def name_id(name: str) -> int:
    """The 63-bit number that stands for a table's or a server-side function's name on the
    wire (the same on every rank, no registry to agree on)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def name_words(name: str) -> np.ndarray:
    """A name as int64 words (UTF-8, NUL-padded), for a request's integer fields."""
    raw = name.encode()
    return np.frombuffer(raw + b"\0" * (-len(raw) % 8), np.int64)


def name_of(words: np.ndarray) -> str:
    return np.ascontiguousarray(words, np.int64).tobytes().rstrip(b"\0").decode("utf-8",
                                                                              "replace")


@dataclass(frozen=True)
class Layout:
    n: int
    width: int = 1
    block_rows: int = BLOCK_ROWS

    @property
    def n_blocks(self) -> int:
        return -(-self.n // self.block_rows)

    def rows(self, block: int) -> int:
        """Rows of block `block` (the last one may be short)."""
        return min(self.block_rows, self.n - block * self.block_rows)

    def blocks_of(self, placement, server: int) -> np.ndarray:
        """The blocks `server` answers for (as primary), in order."""
        blocks = np.arange(self.n_blocks, dtype=np.int64)
        return blocks[placement.block_owners(blocks) == server]

    def blocks_held(self, placement, server: int) -> np.ndarray:
        """The blocks `server` keeps a copy of (as primary or backup), in order."""
        blocks = np.arange(self.n_blocks, dtype=np.int64)
        return blocks[placement.held_ranges(server)[blocks % placement.n_ranges]]

    def blocks_in(self, range_: int, n_ranges: int) -> np.ndarray:
        """The blocks of key range `range_`, in order."""
        return np.arange(range_, self.n_blocks, n_ranges, dtype=np.int64)

    def by_server(self, indices: np.ndarray, placement):
        """(perm, offsets): indices[perm[offsets[s]:offsets[s + 1]]] are rows server s
        answers for, in the order given."""
        owners = placement.block_owners(indices.astype(np.int64) // self.block_rows)
        return group_by_owner(owners, placement.n_servers)

    def holders_of(self, indices: np.ndarray, placement, server: int) -> np.ndarray:
        """Positions of the rows in `indices` that `server` keeps a copy of, in order."""
        ranges = (indices.astype(np.int64) // self.block_rows) % placement.n_ranges
        return np.flatnonzero(placement.held_ranges(server)[ranges])
