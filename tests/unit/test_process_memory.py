"""Another process's memory read in place (base.process_memory): a forked child reads its
parent's array bit for bit, in parts larger than one call takes; a bad address, a process
that is gone and an array it cannot read into are refused with what went wrong."""
import errno
import os

import numpy as np
import pytest

from mpips.base import process_memory


def in_child(check) -> str:
    """`check()` run in a forked child: what it returned (a short text), or its error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            said = check()
        except BaseException as e:   # noqa: BLE001 -- the parent is told whatever it is
            said = f"{type(e).__name__}: {e}"
        os.write(write, said.encode()[:4000])
        os._exit(0)
    os.close(write)
    said = os.read(read, 4096).decode()
    os.close(read)
    os.waitpid(pid, 0)
    return said


def test_a_child_reads_its_parents_array_as_the_parent_changed_it(monkeypatch):
    monkeypatch.setattr(process_memory, "CHUNK", 1 << 16)   # several calls for one read
    parent = os.getpid()
    values = np.arange(100_003, dtype=np.uint32)
    read, write = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(go_r, 1)   # once the parent has changed its array (the child's is as forked)
        seen = np.empty_like(values)
        process_memory.read_into(parent, values.ctypes.data, seen)
        os.write(write, b"1" if seen[7] == 7_000_000 and seen[8] == 8 else b"0")
        os._exit(0)
    values[7] = 7_000_000
    os.write(go_w, b"g")
    assert os.read(read, 1) == b"1", "the parent's values, not the child's own"
    os.waitpid(pid, 0)


def test_a_bad_address_or_a_gone_process_is_refused_with_its_reason():
    parent = os.getpid()
    assert "Bad address" in in_child(
        lambda: process_memory.read_into(parent, 8, np.empty(16, np.uint8)) or "read")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)   # gone and reaped: no such process
    with pytest.raises(OSError) as e:
        process_memory.read_into(pid, np.zeros(4).ctypes.data, np.empty(4))
    assert e.value.errno == errno.ESRCH and f"process {pid}" in str(e.value)


def test_it_reads_into_a_contiguous_array_only():
    with pytest.raises(ValueError, match="contiguous"):
        process_memory.read_into(os.getpid(), 0, np.empty((4, 4))[:, 0])
