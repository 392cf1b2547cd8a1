"""Checksums of a file's datasets, which say whether the file was damaged since it was
written: SHA-256 (a model's files, checkpoints before manifest version 2) and XXH64
(checkpoints since; kernels.checksum). A set of them is kept as {dataset name: hex digest}
under the algorithm's name (`Algorithm`), in a manifest or an HDF5 attribute.

XXH64 detects damage as SHA-256 does (neither is a signature: who can write the file can
write its checksum) at a fifth of the CPU, which a checkpoint's writer takes from the ranks
serving beside it (docs/performance.md).
"""
import hashlib

import numpy as np

from .choices import Choice


class Algorithm(Choice):
    SHA256 = "sha256"
    XXH64 = "xxh64"   # seed 0, as `xxhsum -H64` prints it


class Xxh64:
    """hashlib's interface (`update`, `hexdigest`) to XXH64, for a stream of blocks."""
    def __init__(self):
        from ..kernels import checksum  # (numba: only a process that hashes so loads it)
        self._kernels = checksum
        self._acc, self._pending = checksum.start()

    def update(self, data) -> None:
        """Feed `data`, a contiguous buffer or array (as hashlib's `update` takes)."""
        self._kernels.update(self._acc, self._pending, np.frombuffer(data, np.uint8))

    def hexdigest(self) -> str:
        return f"{int(self._kernels.digest(self._acc, self._pending)):016x}"


def stream(algorithm: Algorithm):
    """A new stream of `algorithm` (update, hexdigest)."""
    return hashlib.sha256() if algorithm is Algorithm.SHA256 else Xxh64()


def of(array: np.ndarray, algorithm: Algorithm = Algorithm.SHA256) -> str:
    """The hex digest of `array`'s bytes in C order."""
    digest = stream(algorithm)
    digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return digest.hexdigest()


def algorithm_of(entry: dict) -> Algorithm:
    """The algorithm whose name keys the checksums in `entry` (a manifest's file entry);
    KeyError if it has none of them."""
    for algorithm in Algorithm:
        if algorithm.value in entry:
            return algorithm
    raise KeyError(f"checksums (one of {', '.join(a.value for a in Algorithm)})")


def mismatched(f, digests: dict, algorithm: Algorithm = Algorithm.SHA256) -> str | None:
    """What of the open HDF5 file `f` does not match `digests` (dataset name -> hex digest
    of `algorithm`), or None if every dataset named matches."""
    for name, digest in digests.items():
        if name not in f:
            return f"dataset {name} is missing"
        if of(f[name][()], algorithm) != digest:
            return f"dataset {name} does not match its checksum"
    return None
