"""svmlight parsing and byte-range splitting."""
import numpy as np
import pytest

from mpips.data.textfile import KeyIndexer, Rows, TextShard, byte_range
from mpips.base.errors import InputError
from mpips.kernels import svmlight


def parse(text: bytes, final=True, skip_bad=False):
    # Writable, as a job's read buffer is: a read-only one is another type to numba, and the
    # parser would be compiled anew for it (seconds) instead of loaded from numba's cache.
    buf = np.frombuffer(text, np.uint8).copy()
    n_lines, n_entries = svmlight.capacity(buf.shape[0], svmlight.SVMLIGHT)
    labels = np.empty(n_lines, np.float32)
    indptr = np.empty(n_lines + 1, np.int64)
    indices = np.empty(n_entries, np.uint64)
    values = np.empty(n_entries, np.float32)
    starts = np.empty(n_lines, np.int64)
    rows, nnz, used, lines, n_bad, bad, code, col = svmlight.parse_lines(
        buf, final, skip_bad, labels, indptr, indices, values, starts, svmlight.SVMLIGHT)
    return dict(rows=Rows(labels[:rows], indptr[:rows + 1], indices[:nnz], values[:nnz],
                          starts[:rows]),
                used=used, lines=lines, n_bad=n_bad, bad=bad, code=code, col=col)


def test_parses_labels_indices_values():
    r = parse(b"1 3:0.5 18446744073709551615:2e-3\n-1 7:1\n0 qid:4 9:-1.25E+1 # comment\n"
              b"+1 0:10\n1.0\n")
    rows = r["rows"]
    assert rows.labels.tolist() == [1, 0, 0, 1, 1]
    assert rows.indptr.tolist() == [0, 2, 3, 4, 5, 5]
    assert rows.indices.tolist() == [3, 2**64 - 1, 7, 9, 0]
    np.testing.assert_array_equal(rows.values, np.float32([0.5, 2e-3, 1, -12.5, 10]))
    assert r["bad"] == -1


def test_skips_blank_and_comment_lines_and_handles_crlf():
    rows = parse(b"\n# header\n1 1:1\r\n   \n0 2:3\r\n")["rows"]
    assert rows.labels.tolist() == [1, 0]
    assert rows.indices.tolist() == [1, 2]
    assert rows.origins.tolist() == [10, 21], "the byte offset where each row's line starts"


def test_last_line_without_newline_needs_final():
    assert len(parse(b"1 1:1\n0 2:1", final=False)["rows"]) == 1
    assert parse(b"1 1:1\n0 2:1", final=False)["used"] == 6
    assert len(parse(b"1 1:1\n0 2:1", final=True)["rows"]) == 2


@pytest.mark.parametrize("line, code", [
    (b"x 1:1", svmlight.BAD_LABEL),
    (b"2 1:1", svmlight.LABEL_NOT_BINARY),
    (b"1 a:1", svmlight.BAD_INDEX),
    (b"1 -3:1", svmlight.BAD_INDEX),
    (b"1 18446744073709551616:1", svmlight.INDEX_OVERFLOW),
    (b"1 99999999999999999999:1", svmlight.INDEX_OVERFLOW),
    (b"1 5", svmlight.MISSING_COLON),
    (b"1 5:", svmlight.BAD_VALUE),
    (b"1 5:abc", svmlight.BAD_VALUE),
    (b"1 5:1e", svmlight.BAD_VALUE),
    (b"1 5:1e999", svmlight.BAD_VALUE),
    (b"1 5:1e39", svmlight.BAD_VALUE),      # finite in float64, inf in float32
    (b"1 5:-4e38", svmlight.BAD_VALUE),
    (b"1 5:0.5x", svmlight.BAD_VALUE),
])
def test_reports_each_kind_of_bad_line(line, code):
    r = parse(b"1 1:1\n" + line + b"\n0 2:2\n")
    assert (r["bad"], r["code"]) == (1, code)
    assert len(r["rows"]) == 1, "parsing stops before the bad line"
    skipped = parse(b"1 1:1\n" + line + b"\n0 2:2\n", skip_bad=True)
    assert len(skipped["rows"]) == 2 and skipped["n_bad"] == 1


def test_floats_match_python():
    texts = ["0", "1", "-0.5", "3.14159", "1e-7", "2.5E+3", "123456789012345678901234", "0.000001",
             "3.4e38", "-1e-50"]
    r = parse(("1 " + " ".join(f"{i}:{t}" for i, t in enumerate(texts)) + "\n").encode())
    np.testing.assert_array_equal(r["rows"].values, np.float32([float(t) for t in texts]))


KEYS = ["0", "7", "1234567", "12345678", "123456789", "1234567890123456", "12345678901234567",
        "1234567890123456789", "9999999999999999999", "10000000000000000000",
        "18446744073709551614", "18446744073709551615", "000000000000000000000000042",
        "0000018446744073709551615"]
# A key is read eight digits at a time unless the buffer ends within 24 bytes of it.
TAILS = {"at the buffer's end": "", "well inside it": " " + "#" * 40}


@pytest.mark.parametrize("tail", TAILS.values(), ids=TAILS.keys())
def test_keys_of_every_length_up_to_2_to_the_64(tail):
    rows = parse(("1 " + " ".join(f"{k}:1" for k in KEYS) + tail).encode())["rows"]
    assert rows.indices.tolist() == [int(k) for k in KEYS]


@pytest.mark.parametrize("tail", TAILS.values(), ids=TAILS.keys())
@pytest.mark.parametrize("key", ["18446744073709551616", "18446744073709551620",
                                 "18446744073709551700", "20000000000000000000",
                                 "99999999999999999999", "100000000000000000000",
                                 "0018446744073709551616", "1844674407370955161500"])
def test_keys_above_2_to_the_64_minus_1_are_rejected(key, tail):
    r = parse(f"1 1:1\n0 {key}:1 2:1{tail}\n".encode())
    assert (r["bad"], r["code"], r["col"]) == (1, svmlight.INDEX_OVERFLOW, 2)


@pytest.mark.parametrize("tail", TAILS.values(), ids=TAILS.keys())
@pytest.mark.parametrize("end", ["\n", "\r\n", "\t\n", " \r\n"])
def test_value_1_reads_as_1_0_does(end, tail):
    for text in ["1", "1.0", "1e0", "+1", "10", "1.5", "0.4445"]:
        got = parse(f"0 5:{text}{tail}{end}1 6:{text}{end}0 7:{text}".encode())
        assert got["rows"].values.tolist() == [np.float32(text)] * 3, text
        assert got["rows"].labels.tolist() == [0, 1, 0] and got["bad"] == -1


@pytest.mark.parametrize("line, code", [
    (b"1 5:1x", svmlight.BAD_VALUE), (b"1 5:1\r2:1", svmlight.BAD_VALUE),
    (b"1 5:1:1", svmlight.BAD_VALUE), (b"1\r 5:1", svmlight.BAD_LABEL),
    (b"1x 5:1", svmlight.BAD_LABEL), (b"12 5:1", svmlight.LABEL_NOT_BINARY),
    (b"1 5x:1", svmlight.BAD_INDEX), (b"1 " + b"1" * 19 + b"x:1", svmlight.BAD_INDEX),
])
def test_the_common_case_shortcuts_keep_the_errors(line, code):
    for text in (line + b"\n", line + b" " + b"#" * 40 + b"\n"):
        r = parse(b"1 1:1\n" + text)
        assert (r["bad"], r["code"]) == (1, code), text


def test_crlf_and_tabs_around_the_usual_labels_and_values():
    rows = parse(b"1\r\n0\t5:1\r\n1 6:1\t7:1 \r\n\r\n0 8:1\r")["rows"]
    assert rows.labels.tolist() == [1, 0, 1, 0]
    assert rows.indptr.tolist() == [0, 0, 1, 3, 4]
    assert rows.indices.tolist() == [5, 6, 7, 8] and (rows.values == 1).all()


@pytest.mark.parametrize("text, tight", [
    (b"1\n" * 999, "rows"), (b"1" + b"\n1" * 999, "rows"), (b"1" + b" 0:1" * 999, "entries"),
    (b"0" + b"\t0:1" * 999 + b"\r\n", "entries")])
def test_capacity_holds_the_densest_text(text, tight):
    room = dict(zip(("rows", "entries"), svmlight.capacity(len(text), svmlight.SVMLIGHT)))
    rows = parse(text)["rows"]
    used = {"rows": len(rows), "entries": rows.indices.shape[0]}
    assert used["rows"] < room["rows"] and used["entries"] <= room["entries"]
    assert room[tight] - used[tight] <= 1, "the bound is what the grammar allows"


@pytest.mark.parametrize("size", [0, 1, 7, 100, 12345])
def test_byte_ranges_tile_the_file(size):
    for nparts in (1, 2, 3, 7):
        ranges = [byte_range(size, p, nparts) for p in range(nparts)]
        assert ranges[0][0] == 0 and ranges[-1][1] == size
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def _write(tmp_path, lines, name="d.svm", newline_at_end=True):
    path = tmp_path / name
    text = "\n".join(lines) + ("\n" if newline_at_end else "")
    path.write_text(text)
    return str(path)


def _all_rows(shard):
    labels, keys = [], []
    for rows in shard.rows():
        labels += rows.labels.tolist()
        keys += rows.indices.tolist()
    return labels, keys


@pytest.mark.parametrize("newline_at_end", [True, False])
def test_shards_cover_every_line_once(tmp_path, newline_at_end):
    rng = np.random.default_rng(0)
    lines = [f"{i % 2} " + " ".join(f"{int(k)}:1" for k in rng.integers(0, 2**63, i % 5))
             for i in range(300)]
    path = _write(tmp_path, lines, newline_at_end=newline_at_end)
    whole = _all_rows(TextShard(path))
    for nparts in (1, 2, 3, 5, 16, 400):
        labels, keys = [], []
        for part in range(nparts):
            got = _all_rows(TextShard(path, part, nparts, chunk_bytes=64))
            labels += got[0]
            keys += got[1]
        assert (labels, keys) == whole, f"nparts={nparts}"
    assert len(whole[0]) == 300


def test_rows_kept_are_not_overwritten_by_later_chunks(tmp_path):
    path = _write(tmp_path, [f"{i % 2} {i}:1 {i + 1}:{i}" for i in range(500)])
    chunks = list(TextShard(path, chunk_bytes=64).rows())
    assert len(chunks) > 100
    rows = Rows.concat(chunks)
    assert rows.labels.tolist() == [i % 2 for i in range(500)]
    assert rows.indices.tolist() == [k for i in range(500) for k in (i, i + 1)]
    assert rows.values[1::2].tolist() == list(range(500))
    assert all(c.indices.base is None for c in chunks), "each chunk owns exactly its entries"


def test_line_longer_than_chunk(tmp_path):
    long_line = "1 " + " ".join(f"{i}:1" for i in range(2000))
    path = _write(tmp_path, ["0 1:1", long_line, "1 2:2"])
    labels, keys = _all_rows(TextShard(path, chunk_bytes=32))
    assert labels == [0, 1, 1] and len(keys) == 2002


def test_minibatches_have_the_requested_size(tmp_path):
    path = _write(tmp_path, [f"1 {i}:1" for i in range(1000)])
    sizes = [len(b) for b in TextShard(path, chunk_bytes=100).minibatches(64)]
    assert sizes == [64] * 15 + [40]
    keys = np.concatenate([b.indices for b in TextShard(path, chunk_bytes=100).minibatches(64)])
    assert keys.tolist() == list(range(1000))


def test_error_names_file_and_line(tmp_path):
    lines = [f"1 {i}:1" for i in range(5000)]
    lines[3456] = "1 12:0.5 13:oops"
    path = _write(tmp_path, lines)
    for part, nparts in ((0, 1), (1, 2)):
        with pytest.raises(InputError) as e:
            _all_rows(TextShard(path, part, nparts, chunk_bytes=1000))
        assert f"{path}:3457:" in str(e.value)
        assert "feature value" in str(e.value) and "13:oops" in str(e.value)


def test_skip_bad_lines_counts(tmp_path):
    lines = ["1 1:1", "bad", "0 2:1", "1 3:x", "1 4:1"]
    shard = TextShard(_write(tmp_path, lines), skip_bad=True)
    labels, keys = _all_rows(shard)
    assert keys == [1, 2, 4] and shard.bad_lines == 2


def test_key_indexer_adds_the_bias():
    index = KeyIndexer()
    rows = Rows(np.float32([1, 0]), np.array([0, 2, 3]), np.uint64([9, 3, 9]), np.float32([1, 1, 1]))
    keys, cols, bias_col = index(rows, bias=True)
    assert keys.tolist() == [3, 9, 2**64 - 1] and cols.tolist() == [1, 0, 1] and bias_col == 2
    keys, cols, bias_col = index(rows, bias=False)
    assert keys.tolist() == [3, 9] and bias_col == -1
    clash = Rows(np.float32([1]), np.array([0, 1]), np.uint64([2**64 - 1]), np.float32([1]))
    with pytest.raises(InputError, match=r"f.svm: feature index 18446744073709551615 .*--no-bias"):
        index(clash, bias=True, source="f.svm")
    assert index(clash, bias=False)[0].tolist() == [2**64 - 1]


@pytest.mark.parametrize("size, space", [(0, 10), (1, 10), (50, 7), (3000, 2**64 - 1),
                                         (20000, 2**40), (70000, 5000)])
def test_key_indexer_equals_numpy_unique(size, space):
    index = KeyIndexer()
    rng = np.random.default_rng(size)
    for _ in range(3):   # reuses its scratch space, and grows it
        indices = rng.integers(0, space, size, dtype=np.uint64, endpoint=True)
        if size > 10:
            indices[:5] = [0, 2**32, 2**63, space, 1]   # digits that differ in a single pass
        rows = Rows(np.zeros(1, np.float32), np.array([0, size]), indices,
                    np.ones(size, np.float32))
        keys, cols, _ = index(rows, bias=False)
        expect_keys, expect_cols = np.unique(indices, return_inverse=True)
        np.testing.assert_array_equal(keys, expect_keys)
        np.testing.assert_array_equal(cols, expect_cols)


def test_skipped_lines_are_named_and_counted_per_pass(tmp_path, caplog):
    lines = [f"1 {i}:1" for i in range(3000)]
    for n in (10, 1500, 2999):
        lines[n - 1] = "1 1:x"
    shard = TextShard(_write(tmp_path, lines), chunk_bytes=500, skip_bad=True)
    for _ in range(2):
        labels, _ = _all_rows(shard)
        assert shard.bad_lines == 3 and len(labels) == 2997
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3, "each bad line is logged once, not once per pass"
    for text, n in zip(warned, (10, 1500, 2999)):
        assert f":{n}: feature value" in text


def test_features_per_row_samples_the_whole_file(tmp_path, caplog):
    from mpips.data.samples import features_per_row
    sparse_head = ["0"] * 500 + ["1 " + " ".join(f"{k}:1" for k in range(30))] * 500
    path = _write(tmp_path, sparse_head + ["oops"])
    assert 12 < features_per_row(path) < 18, "about half the rows have 30 features"
    assert not caplog.records, "sampling does not report bad lines"


@pytest.mark.parametrize("binary", [False, True])
def test_minibatches_resume_from_where_a_minibatch_starts(tmp_path, binary):
    from mpi4py import MPI

    from mpips.data.convert import convert
    from mpips.data.shards import CsrShard
    lines = [f"{i % 2} {i}:1 {i + 1}:0.5" for i in range(1000)]
    path = _write(tmp_path, lines)
    if binary:
        convert(path, str(tmp_path / "bin"), MPI.COMM_SELF)
        open_part = lambda part: CsrShard(str(tmp_path / "bin"), part, 3)   # noqa: E731
    else:
        open_part = lambda part: TextShard(path, part, 3, chunk_bytes=200)   # noqa: E731
    for part in range(3):
        whole = list(open_part(part).minibatches(64))
        for k in (0, 1, len(whole) - 1):
            resumed = list(open_part(part).minibatches(64, start=whole[k].start))
            assert len(resumed) == len(whole) - k
            for a, b in zip(whole[k:], resumed):
                assert a.indices.tolist() == b.indices.tolist()
                assert a.origins.tolist() == b.origins.tolist()


@pytest.mark.parametrize("kind", ["hashed", "small ints", "one field's", "fields in the top byte",
                                  "two bunches", "sequential", "near 2^64"])
def test_key_indexer_equals_numpy_unique_however_the_keys_spread(kind):
    """The bucket sort for keys that spread, the radix sort for keys that bunch: both give
    numpy's order."""
    rng = np.random.default_rng(7)
    n = 40000
    indices = {
        "hashed": lambda: rng.integers(0, 2**64 - 1, n, dtype=np.uint64),
        "small ints": lambda: rng.integers(0, 1 << 20, n, dtype=np.uint64),
        "one field's": lambda: (np.uint64(3) << np.uint64(56)) | rng.integers(0, 1 << 40, n, dtype=np.uint64),
        "fields in the top byte": lambda: (rng.integers(0, 39, n, dtype=np.uint64) << np.uint64(56))
        | rng.integers(0, 1 << 56, n, dtype=np.uint64),
        "two bunches": lambda: np.where(rng.random(n) < 0.5, rng.integers(0, 1000, n, dtype=np.uint64),
                                        rng.integers(2**63, 2**63 + 1000, n, dtype=np.uint64)),
        "sequential": lambda: np.arange(n, dtype=np.uint64) * np.uint64(3),
        "near 2^64": lambda: np.uint64(2**64 - 1) - rng.integers(0, 5000, n, dtype=np.uint64),
    }[kind]()
    index = KeyIndexer()
    for a, b in ((0, n), (0, 1000), (0, 2), (5, 6)):
        rows = Rows(np.zeros(1, np.float32), np.array([0, b - a]), indices[a:b],
                    np.ones(b - a, np.float32))
        keys, cols, _ = index(rows, bias=False)
        expect_keys, expect_cols = np.unique(indices[a:b], return_inverse=True)
        np.testing.assert_array_equal(keys, expect_keys)
        np.testing.assert_array_equal(cols, expect_cols)
