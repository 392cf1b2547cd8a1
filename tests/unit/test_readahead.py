"""A binary shard read from a cold page cache: its rows ahead of the reader are asked for
(posix_fadvise WILLNEED), so they are in memory before the reader reaches them."""
import ctypes
import mmap
import os

import numpy as np
import pytest
from mpi4py import MPI
from support import cannot

from mpips.data import shards
from mpips.ranks.bounded import wait_until
from mpips.data.convert import convert
from mpips.data.shards import CsrShard

PAGE = mmap.PAGESIZE


def resident_pages(path: str) -> np.ndarray:
    """Per page of the file, whether it is in the page cache (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        pages = (size + PAGE - 1) // PAGE
        vec = np.zeros(pages, np.uint8)
        address = np.frombuffer(m, np.uint8).ctypes.data
        if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size),
                        vec.ctypes.data_as(ctypes.c_void_p)) != 0:
            cannot(f"mincore failed: errno {ctypes.get_errno()}")
        return (vec & 1).astype(bool)


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def dataset(tmp_path):
    rng = np.random.default_rng(0)
    src = tmp_path / "d.svm"
    with open(src, "w") as f:
        for i in range(20000):
            keys = rng.integers(0, 2**63, 30, dtype=np.uint64)
            f.write(f"{i % 2} " + " ".join(f"{k}:1" for k in keys) + "\n")
    convert(str(src), str(tmp_path / "bin"), MPI.COMM_SELF)
    return str(tmp_path / "bin")


def test_rows_ahead_of_the_reader_are_read_into_memory(dataset, monkeypatch):
    indices = os.path.join(dataset, "part-0000.indices.npy")
    evict(indices)
    if resident_pages(indices)[4:].any():
        cannot("this file system keeps the file in memory (posix_fadvise DONTNEED ignored)")
    monkeypatch.setattr(shards, "READAHEAD_BYTES", 1 << 20)   # a window of ~2,700 rows
    shard = CsrShard(dataset)
    window = shard.readahead_rows
    assert 1000 < window < 5000
    batches = shard.minibatches(100)
    next(batches)
    # The reader is at row 100; rows up to the window's end were asked for, not beyond.
    ahead_end = shard.parts[0].indptr[window] * 8 + 128
    first_page, last_page = 1, ahead_end // PAGE - 1
    wait_until(lambda: resident_pages(indices)[first_page:last_page].all(), 10.0,
               lambda: "the pages read ahead to come into the page cache")
    far = (shard.parts[0].indptr[3 * window] * 8 + 128) // PAGE
    assert not resident_pages(indices)[far:].any(), "it reads a window ahead, not the file"
    # As the reader moves on, the next window is asked for before the reader reaches it.
    for batch in batches:
        if batch.start >= window:
            break
    further = (shard.parts[0].indptr[min(2 * window, len(shard.parts[0]))] * 8 + 128) // PAGE
    wait_until(lambda: resident_pages(indices)[last_page:further - 1].all(), 10.0,
               lambda: "the next window's pages to come into the page cache")


def test_a_file_removed_while_mapped_is_still_read_and_the_readahead_says_nothing(dataset,
                                                                                   monkeypatch):
    monkeypatch.setattr(shards, "READAHEAD_BYTES", 1 << 20)
    shard = CsrShard(dataset)
    expected = [batch.indices.copy() for batch in CsrShard(dataset).minibatches(500)]
    os.remove(os.path.join(dataset, "part-0000.indices.npy"))   # the mapping keeps it
    got = [batch.indices for batch in shard.minibatches(500)]
    assert len(got) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected))
