"""Another process's memory read in place (Linux's process_vm_readv): a child reads its
parent's arrays without the pages being shared, mapped or copied first, at memory speed.

The kernel lets a process read another only if it may trace it: the same user, and where
Yama's ptrace_scope is 1 (a common default), only a process the one read named with
PR_SET_PTRACER (`allow_reader`). Where it is 2 or more, or in a container that forbids it,
a read fails with an OSError: callers find out once (a small read of a known array) and
take another way.
"""
import ctypes
import errno
import os

import numpy as np

_PR_SET_PTRACER = 0x59616D61
CHUNK = 1 << 26   # bytes a call: a large read in parts, each a call of a few ms


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.process_vm_readv.restype = ctypes.c_ssize_t
        return libc
    except (OSError, AttributeError):   # not Linux, or a C library without it
        return None


_LIBC = _libc()


def available() -> bool:
    """Whether this system has the call at all (a read may still be refused)."""
    return _LIBC is not None


def read_into(pid: int, address: int, out: np.ndarray) -> None:
    """out's bytes, read from `address` in process `pid`. OSError if the read is refused
    (EPERM), the process is gone (ESRCH), or the memory is not mapped there (EFAULT)."""
    if _LIBC is None:
        raise OSError(errno.ENOSYS, "process_vm_readv is not available on this system")
    if not out.flags.c_contiguous:
        raise ValueError("read_into needs a contiguous array to read into")
    base, total = out.ctypes.data, out.nbytes
    local, remote = _Iovec(), _Iovec()
    done = 0
    while done < total:
        part = min(CHUNK, total - done)
        local.base, local.len = base + done, part
        remote.base, remote.len = address + done, part
        got = _LIBC.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"reading {part} bytes at {address + done:#x} of process "
                                f"{pid}: {os.strerror(code)}")
        if got != part:   # (only at memory that is not mapped: nothing further is read)
            raise OSError(errno.EFAULT, f"read {got} of {part} bytes at {address + done:#x} "
                                        f"of process {pid}")
        done += part


def allow_reader(pid: int) -> None:
    """Let process `pid` read this one where Yama asks it to be named; nothing elsewhere."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0)
