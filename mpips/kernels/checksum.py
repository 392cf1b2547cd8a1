"""XXH64 (seed 0), the 64-bit xxHash of a byte stream fed a block at a time: the checksum
of a checkpoint's datasets. Pure numba, the same digest as the reference implementation
(`xxhsum -H64`, Python's `xxhash.xxh64`) at a sixth of SHA-256's CPU here: a writer hashes
each block while it is still in the core's cache.

The stream's state is two arrays a caller holds: `acc` (uint64[6]: the four lanes, the
bytes fed so far, the bytes waiting in `pending`) and `pending` (uint8[32]: the start of a
stripe not yet complete).
"""
import numpy as np

from .jit import njit

P1 = np.uint64(0x9E3779B185EBCA87)
P2 = np.uint64(0xC2B2AE3D27D4EB4F)
P3 = np.uint64(0x165667B19E3779F9)
P4 = np.uint64(0x85EBCA77C2B2AE63)
P5 = np.uint64(0x27D4EB2F165667C5)
STRIPE = 32


@njit(cache=True, nogil=True, inline="always")
def _rotl(x, r):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(cache=True, nogil=True, inline="always")
def _round(acc, word):
    return _rotl(acc + word * P2, 31) * P1


@njit(cache=True, nogil=True, inline="always")
def _merge(h, lane):
    return (h ^ _round(np.uint64(0), lane)) * P1 + P4


@njit(cache=True, nogil=True, inline="always")
def _word(data, at, size):
    """The little-endian word of `size` bytes at `at` of `data` (uint8)."""
    word = np.uint64(0)
    for b in range(size):
        word |= np.uint64(data[at + b]) << np.uint64(8 * b)
    return word


def start() -> tuple[np.ndarray, np.ndarray]:
    """A stream's state before any byte: (acc, pending)."""
    lanes = [int(P1) + int(P2), int(P2), 0, -int(P1)]   # (+ the seed, 0)
    acc = np.array([v % (1 << 64) for v in lanes] + [0, 0], np.uint64)
    return acc, np.zeros(STRIPE, np.uint8)


@njit(cache=True, nogil=True)
def _stripes(acc, words):
    """The lanes through `words` (uint64, a multiple of 4 long)."""
    v1, v2, v3, v4 = acc[0], acc[1], acc[2], acc[3]
    for i in range(0, words.shape[0], 4):
        v1 = _round(v1, words[i])
        v2 = _round(v2, words[i + 1])
        v3 = _round(v3, words[i + 2])
        v4 = _round(v4, words[i + 3])
    acc[0], acc[1], acc[2], acc[3] = v1, v2, v3, v4


@njit(cache=True, nogil=True)
def update(acc, pending, data):
    """Feed `data` (uint8, contiguous) to the stream."""
    n = data.shape[0]
    acc[4] += np.uint64(n)
    have = int(acc[5])
    at = 0
    if have:
        take = min(STRIPE - have, n)
        pending[have:have + take] = data[:take]
        have += take
        at = take
        if have < STRIPE:
            acc[5] = have
            return
        _stripes(acc, pending.view(np.uint64))
        have = 0
    whole = (n - at) // STRIPE * STRIPE
    if whole:   # the stripes read as native uint64: XXH64's little-endian words on x86, ARM
        _stripes(acc, data[at:at + whole].view(np.uint64))
    at += whole
    pending[:n - at] = data[at:]
    acc[5] = n - at


@njit(cache=True, nogil=True)
def digest(acc, pending):
    """The XXH64 of every byte fed so far (the stream may go on)."""
    total = acc[4]
    if total >= np.uint64(STRIPE):
        h = _rotl(acc[0], 1) + _rotl(acc[1], 7) + _rotl(acc[2], 12) + _rotl(acc[3], 18)
        for lane in range(4):
            h = _merge(h, acc[lane])
    else:
        h = P5   # (+ the seed, 0)
    h += total
    left = int(acc[5])
    i = 0
    while i + 8 <= left:
        h = _rotl(h ^ _round(np.uint64(0), _word(pending, i, 8)), 27) * P1 + P4
        i += 8
    if i + 4 <= left:
        h = _rotl(h ^ (_word(pending, i, 4) * P1), 23) * P2 + P3
        i += 4
    while i < left:
        h = _rotl(h ^ (np.uint64(pending[i]) * P5), 11) * P1
        i += 1
    h ^= h >> np.uint64(33)
    h *= P2
    h ^= h >> np.uint64(29)
    h *= P3
    h ^= h >> np.uint64(32)
    return h
