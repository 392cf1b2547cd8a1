"""The Parquet reader on small files written here with pyarrow: keys as the Criteo reader
makes them for the same values, every column type of the mapping (nulls, dictionaries,
lists, maps), and the division of row groups among workers."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mpips.data import fingerprint, parquet
from mpips.data.samples import sample_rows
from mpips.data.inputs import check_input, data_format, fields_of, format_mismatch
from mpips.data.shards import check_examples, counts_rows, open_shard, spans
from mpips.data.textfile import TextShard
from mpips.kernels import criteo, shapes
from mpips.kernels.columns import hash_bytes
from mpips.models.evaluate import read_rows


def key(field, value) -> int:
    return int(criteo.feature_key(field, np.uint64(value)))


def text_hash(s: bytes) -> int:
    return int(hash_bytes(np.array([0, len(s)], np.int64),
                          np.frombuffer(s or b"\0", np.uint8))[0])


def criteo_lines(n: int, seed: int) -> tuple[list, list]:
    """(lines, [labels, integer columns, hexadecimal columns]) of `n` Criteo rows, a fifth
    of the fields empty (None in the columns)."""
    rng = np.random.default_rng(seed)
    ints = [[None if rng.random() < 0.2 else int(rng.integers(-3, 5000)) for _ in range(n)]
            for _ in range(shapes.CRITEO_INTEGERS)]
    hexes = [[None if rng.random() < 0.2 else int(rng.integers(0, 2**32)) for _ in range(n)]
             for _ in range(shapes.CRITEO_CATEGORICALS)]
    labels = rng.integers(0, 2, n)
    lines = []
    for r in range(n):
        cells = [str(labels[r])] + ["" if c[r] is None else str(c[r]) for c in ints]
        cells += ["" if c[r] is None else f"{c[r]:08x}" for c in hexes]
        lines.append("\t".join(cells))
    return lines, [labels, ints, hexes]


def test_criteo_values_in_parquet_give_the_criteo_readers_keys(tmp_path):
    lines, (labels, ints, hexes) = criteo_lines(300, 1)
    tsv = tmp_path / "c.tsv"
    tsv.write_text("\n".join(lines) + "\n")
    text, = TextShard(str(tsv)).rows()
    columns = {"label": pa.array(labels, pa.int64())}
    for i, col in enumerate(ints):   # Criteo buckets its counts; the bucket is the id
        columns[f"I{i + 1}"] = pa.array([None if v is None else int(criteo.bucket(v))
                                         for v in col], pa.int64())
    for i, col in enumerate(hexes):
        columns[f"C{i + 1}"] = pa.array(col, pa.uint32())
    pq.write_table(pa.table(columns), tmp_path / "c.parquet", row_group_size=64)
    rows = read_rows(str(tmp_path / "c.parquet"))
    for name in ("labels", "indptr", "indices", "values"):
        np.testing.assert_array_equal(getattr(rows, name), getattr(text, name))
    assert fields_of(str(tmp_path / "c.parquet")) == shapes.CRITEO_FIELDS
    np.testing.assert_array_equal(rows.origins, np.arange(300))


def every_kind() -> pa.Table:
    return pa.table({
        "cat": pa.array([5, None, -7, 5], pa.int64()),
        "label": pa.array([True, False, True, False]),
        "s": pa.array(["a", "bb", None, "a somewhat longer string"]),
        "d": pa.array(["x", "y", "x", None]).dictionary_encode(),
        "f": pa.array([0.5, float("nan"), None, 2.0], pa.float32()),
        "bag": pa.array([[1, 2], None, [], [3, None]], pa.list_(pa.int32())),
        "kv": pa.array([[{"key": 1, "value": 0.5}], None, [{"key": 2, "value": None}], []],
                       pa.list_(pa.struct([("key", pa.int64()), ("value", pa.float64())]))),
        "m": pa.array([[(1, 2.0)], [(3, 4.0), (5, 1.0)], None, []],
                      pa.map_(pa.int32(), pa.float32())),
        "b": pa.array([b"\x00\x01", None, b"", b"xyz"], pa.binary()),
        "flag": pa.array([None, True, False, True]),
    })


def test_each_column_type_maps_to_its_keys_and_nulls_are_missing(tmp_path):
    path = str(tmp_path / "k.parquet")
    pq.write_table(every_kind(), path, row_group_size=3)
    rows = read_rows(path)
    # fields in schema order without the label: cat 0, s 1, d 2, f 3, bag 4, kv 5, m 6,
    # b 7, flag 8
    want = [
        [(key(0, 5), 1), (key(1, text_hash(b"a")), 1), (key(2, text_hash(b"x")), 1),
         (key(3, 0), 0.5), (key(4, 1), 1), (key(4, 2), 1), (key(5, 1), 0.5), (key(6, 1), 2),
         (key(7, text_hash(b"\x00\x01")), 1)],
        [(key(1, text_hash(b"bb")), 1), (key(2, text_hash(b"y")), 1), (key(6, 3), 4),
         (key(6, 5), 1), (key(8, 1), 1)],
        [(key(0, np.int64(-7).view(np.uint64)), 1), (key(2, text_hash(b"x")), 1),
         (key(7, text_hash(b"")), 1), (key(8, 0), 1)],
        [(key(0, 5), 1), (key(1, text_hash(b"a somewhat longer string")), 1),
         (key(3, 0), 2.0), (key(4, 3), 1), (key(7, text_hash(b"xyz")), 1), (key(8, 1), 1)],
    ]
    np.testing.assert_array_equal(rows.labels, [1, 0, 1, 0])
    for r, expected in enumerate(want):
        a, b = rows.indptr[r], rows.indptr[r + 1]
        got = list(zip(rows.indices[a:b].tolist(), rows.values[a:b].tolist()))
        assert got == [(int(k), float(v)) for k, v in expected], r
    assert data_format(path) == "parquet" and fields_of(path) == 9 and counts_rows(path)


def test_byte_hashes_differ_by_length_and_content():
    values = [b"", b"\0", b"\0\0", b"a", b"ab", b"abcdefgh", b"abcdefgh\0", b"abcdefghi"]
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int64)
    hashes = hash_bytes(offsets, np.frombuffer(b"".join(values), np.uint8))
    assert len(set(hashes.tolist())) == len(values)


def write_groups(folder, files: int, groups: int, rows_each: int) -> str:
    """A folder of `files` Parquet files of `groups` row groups of `rows_each` rows each;
    row r has label r % 2 and one categorical feature r."""
    folder.mkdir()
    r = 0
    for f in range(files):
        n = groups * rows_each
        ids = np.arange(r, r + n)
        pq.write_table(pa.table({"label": ids % 2, "id": ids}), folder / f"part-{f}.parquet",
                       row_group_size=rows_each)
        r += n
    return str(folder)


@pytest.mark.parametrize(("files", "groups", "rows_each"), [(1, 7, 5), (3, 2, 4), (2, 1, 3)])
def test_row_groups_are_divided_among_workers_every_row_once(tmp_path, monkeypatch, files,
                                                             groups, rows_each):
    path = write_groups(tmp_path / "d", files, groups, rows_each)
    n = files * groups * rows_each
    read = []
    original = parquet.ParquetData.group
    monkeypatch.setattr(parquet.ParquetData, "group",
                        lambda self, g, limit=None: read.append(g) or original(self, g, limit))
    for parts in range(1, 6):
        seen = []
        bounds = spans(path, parts)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        for part in range(parts):
            read.clear()
            shard = open_shard(path, part, parts)
            start, stop = bounds[part]
            assert (shard.start, shard.stop) == (start, stop)
            for batch in shard.minibatches(4):
                seen += batch.origins.tolist()
                np.testing.assert_array_equal(batch.indices,
                                              [key(0, r) for r in batch.origins])
            assert shard.fraction_done == 1.0
            for g in read:   # no row group outside the part is read
                assert g * rows_each < stop and (g + 1) * rows_each > start
            if files * groups >= parts:   # at row-group boundaries
                assert start % rows_each == 0 and stop % rows_each == 0
        assert seen == list(range(n)), parts


def test_a_shard_resumes_at_a_row_and_its_chunks_span_row_groups(tmp_path):
    path = write_groups(tmp_path / "d", 2, 3, 10)
    shard = open_shard(path, 0, 1)
    assert shard.next_row_at(17) == 17 and shard.next_row_at(60) is None
    batches = list(shard.minibatches(7, start=17))
    assert [len(b) for b in batches] == [7, 7, 7, 7, 7, 7, 1]
    assert batches[0].origins.tolist() == list(range(17, 24))
    part = shard.over(25, 41)
    assert [b.origins[0] for b in part.minibatches(100)] == [25]
    assert sum(len(b) for b in part.minibatches(100)) == 16


def test_checks_samples_and_fingerprint_of_a_folder(tmp_path):
    path = write_groups(tmp_path / "d", 2, 2, 50)
    check_input(path, "--train")
    check_examples(path, "--train", False)
    sample = sample_rows(path, 3)
    assert sample.exact and sum(sample.per_part) == 200 and len(sample.rows) == 200
    assert sample_rows(path, 1, sample_rows_each=10).rows.labels.shape == (40,)
    files = fingerprint.of_input(path)["files"]
    assert sorted(files) == ["part-0.parquet", "part-1.parquet"]
    svm = tmp_path / "x.svm"
    svm.write_text("1 1:1\n")
    assert "trained on parquet data" in format_mismatch(str(svm), "parquet", "the model")
    assert "is parquet data" in format_mismatch(path, "svmlight", "the model")
    assert format_mismatch(path, "parquet", "the model") is None


WARMED = """
import json, sys
import mpips.data.convert, mpips.job.scoring, mpips.job.training
from mpips.data.inputs import check_input
from mpips.data.shards import open_shard
check_input(sys.argv[2], "--train")
list(open_shard(sys.argv[2], 0, 1).rows())
text_imports_pyarrow = "pyarrow" in sys.modules
from mpips.kernels import columns
from mpips.models import catalog
from mpips.run.warmup import compile_kernels
def typed():   # compiled ahead: [called at all, calls the build did not take]; else numba's forms
    kernels = [getattr(columns, name) for name in
               ("hash_bytes", "place_ids", "place_numbers", "place_listed", "first_bad_label")]
    return {k.__name__ if hasattr(k, "__name__") else k.name:
            [int(k.hits > 0), k.misses] if hasattr(k, "hits") else [len(k.signatures), 0]
            for k in kernels}
compile_kernels(model=catalog.LogisticRegression(), optimizer="sgd", full_batch=False,
                push_filter=False, role="worker", parquet=True)
warmed = typed()
list(open_shard(sys.argv[1], 0, 1).minibatches(2))
print(json.dumps([text_imports_pyarrow, warmed, typed()]))
"""


def test_a_warmed_up_worker_compiles_nothing_reading_parquet_and_text_needs_no_pyarrow(
        tmp_path):
    """Every kernel of the reading has its signatures from the warm-up, and reading every
    kind of column adds none (a kernel numba would compile once the clock runs); reading
    text imports no pyarrow (it is an optional extra)."""
    import json
    import subprocess
    import sys
    path = str(tmp_path / "k.parquet")
    pq.write_table(every_kind(), path, row_group_size=3)
    svm = tmp_path / "x.svm"
    svm.write_text("1 1:1\n0 2:1\n")
    done = subprocess.run([sys.executable, "-c", WARMED, path, str(svm)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text_imports_pyarrow, warmed, read = json.loads(done.stdout.strip().splitlines()[-1])
    assert not text_imports_pyarrow
    assert warmed == read and min(used for used, _ in warmed.values()) >= 1, warmed
    assert not any(missed for _, missed in read.values()), read
