"""Arrays in memory shared with other processes: a memfd (Linux), which has no name to leave
behind when a process dies, mapped MAP_SHARED. A fork copies none of such a mapping's page
tables (there is no copy-on-write to prepare), and a process that is handed the file
descriptor (over a Unix socket) maps the same pages.
"""
import contextlib
import mmap
import os

import numpy as np

_NAME = "mpips-table-copy"
_OPEN: set[int] = set()   # this process's descriptors of SharedArrays


class SharedArray:
    """An array in a memfd of its own: `array`, and `fd` to hand to another process."""

    def __init__(self, shape: tuple, dtype):
        """OSError when the memfd cannot be made or sized (no memfd_create, no memory in
        tmpfs), MemoryError if it cannot be mapped."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        self.fd = -1
        if not hasattr(os, "memfd_create"):
            raise OSError(f"no memfd_create on {os.uname().sysname}")
        self.fd = os.memfd_create(_NAME, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, max(nbytes, 1))
            self._map = mmap.mmap(self.fd, max(nbytes, 1))
        except BaseException:
            os.close(self.fd)
            raise
        _OPEN.add(self.fd)
        self.array = np.frombuffer(self._map, dtype, int(np.prod(shape))).reshape(shape)

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def close(self) -> None:
        """The descriptor closed; the pages go once no process maps them."""
        if self.fd in _OPEN:   # (not in a child that forgot it: the number may be reused)
            _OPEN.discard(self.fd)
            os.close(self.fd)
        self.fd = -1

    def __del__(self):
        self.close()


def array_of(memory: "SharedArray | np.ndarray") -> np.ndarray:
    """The array of `memory`: a SharedArray's, or `memory` itself."""
    return memory.array if isinstance(memory, SharedArray) else memory


def forget_inherited() -> None:
    """In a child just forked: the descriptors of its parent's shared arrays closed, so that
    a long-lived child does not keep memory its parent has let go."""
    for fd in _OPEN:
        with contextlib.suppress(OSError):
            os.close(fd)
    _OPEN.clear()


def mapped(fd: int, shape: tuple, dtype, shared: bool = False) -> np.ndarray:
    """The array another process shares through memfd `fd`, copy-on-write here: what this
    process writes stays its own (numba's kernels take it as any array, not a read-only
    one); with `shared`, what it writes the other process sees. The mapping keeps the pages
    once `fd` is closed."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    view = mmap.mmap(fd, max(count * dtype.itemsize, 1),
                     access=mmap.ACCESS_WRITE if shared else mmap.ACCESS_COPY)
    return np.frombuffer(view, dtype, count).reshape(shape)
