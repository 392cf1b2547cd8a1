"""The XXH64 kernel that checks a checkpoint's datasets (kernels.checksum, base.checksums):
the reference implementation's digest for every length around its stripes and tail, however
the stream is cut into blocks, and for a table's blocks as a writer feeds them."""
import numpy as np
import pytest
import xxhash

from mpips.base import checksums
from mpips.kernels import checksum


def ours(data: np.ndarray, cuts=()) -> int:
    acc, pending = checksum.start()
    at = 0
    for cut in [*cuts, data.shape[0]]:
        checksum.update(acc, pending, data[at:cut])
        at = cut
    return int(checksum.digest(acc, pending))


def test_known_digests_of_the_reference():
    # xxhsum -H64's digests of these strings (and of no byte at all); writable arrays, as a
    # checkpoint's blocks are (a read-only one is another type: numba would compile for it)
    assert ours(np.frombuffer(bytearray(b""), np.uint8)) == 0xEF46DB3751D8E999
    assert ours(np.frombuffer(bytearray(b"abc"), np.uint8)) == 0x44BC2CF5AD770999


@pytest.mark.parametrize("n", [*range(0, 70), 127, 128, 129, 1000, 4099])
def test_the_digest_of_every_length_is_the_reference_one(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    assert ours(data) == xxhash.xxh64(data.tobytes()).intdigest()


def test_a_stream_cut_anywhere_has_the_digest_of_the_whole():
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 5000, dtype=np.uint8)
    whole = xxhash.xxh64(data.tobytes()).intdigest()
    for _ in range(50):
        cuts = np.sort(rng.integers(0, data.shape[0] + 1, rng.integers(1, 12)))
        assert ours(data, cuts) == whole
    # a digest asked midway does not end the stream
    acc, pending = checksum.start()
    checksum.update(acc, pending, data[:77])
    assert int(checksum.digest(acc, pending)) == xxhash.xxh64(data[:77].tobytes()).intdigest()
    checksum.update(acc, pending, data[77:])
    assert int(checksum.digest(acc, pending)) == whole


def test_a_tables_blocks_fed_as_a_writer_feeds_them():
    keys = np.arange(1, 10_001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    state = np.random.default_rng(1).normal(size=(10_000, 3)).astype(np.float32)
    for data in (keys, state):
        digest = checksums.Xxh64()
        for at in range(0, 10_000, 4096):
            block = data[at:at + 4096]
            digest.update(np.ascontiguousarray(block).reshape(-1).view(np.uint8).data)
        assert digest.hexdigest() == xxhash.xxh64(data.tobytes()).hexdigest()
        assert checksums.of(data, checksums.Algorithm.XXH64) == digest.hexdigest()


def test_a_changed_bit_changes_the_digest():
    data = np.random.default_rng(3).integers(0, 256, 1 << 16, dtype=np.uint8)
    before = ours(data)
    for at in (0, 31, 32, 1 << 15, (1 << 16) - 1):
        changed = data.copy()
        changed[at] ^= 1
        assert ours(changed) != before
