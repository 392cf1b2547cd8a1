"""The Criteo TSV reader (kernels.criteo through data.TextShard) and make-data's Criteo
layout: keys per field, empty fields, log buckets, bad lines named by file and line."""
import numpy as np
import pytest

from mpips.data.textfile import CRITEO, SVMLIGHT, TextShard, sniff
from mpips.base.errors import InputError
from mpips.kernels.criteo import bucket, feature_key
from mpips.data.synthetic import make_data


def line(label="1", ints=None, cats=None) -> str:
    ints = ints if ints is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *ints, *cats]) + "\n"


def rows_of(tmp_path, text: str, **options):
    path = tmp_path / "c.tsv"
    path.write_text(text)
    return list(TextShard(str(path), fmt=CRITEO, **options).rows())


def test_every_non_empty_field_is_one_key_of_its_field_and_value(tmp_path):
    ints = ["5", "", "-3", "0", "1000", *[""] * 8]
    cats = ["68fd1e64", "", "A1B2", *[""] * 23]
    [rows] = rows_of(tmp_path, line("0", ints, cats))
    expect = [feature_key(0, bucket(5)), feature_key(2, bucket(-3)), feature_key(3, 0),
              feature_key(4, bucket(1000)), feature_key(13, 0x68fd1e64),
              feature_key(15, 0xA1B2)]
    assert rows.labels.tolist() == [0.0]
    assert rows.indices.tolist() == [int(k) for k in expect]
    assert (rows.indices >> np.uint64(56)).tolist() == [0, 2, 3, 4, 13, 15]   # the fields
    assert (rows.values == 1).all()


def test_counts_share_log_buckets_and_small_ones_keep_their_own():
    assert [bucket(v) for v in (0, 1, 2)] == [0, 1, 2]
    assert bucket(100) == bucket(104) and bucket(1000) != bucket(100)
    assert bucket(-3) == -3


@pytest.mark.parametrize("text, says", [
    (line("2"), "label must be 0 or 1"),
    (line(ints=["x", *[""] * 12]), "an integer field (2 to 14) is not an integer"),
    (line(cats=["zz", *[""] * 25]), "a categorical field (15 to 40) is not hexadecimal"),
    ("1\t2\t3\n", "expected 40 tab-separated fields"),
    (line().replace("\n", "\textra\n"), "expected 40 tab-separated fields"),
], ids=["label", "integer", "hex", "too few", "too many"])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, text, says):
    with pytest.raises(InputError) as e:
        rows_of(tmp_path, line() + text)
    assert "c.tsv:2: " + says in str(e.value)
    skipped = rows_of(tmp_path, line() + text + line("0"), skip_bad=True, log_bad=False)
    assert sum(len(r) for r in skipped) == 2


def test_make_data_writes_the_layout_the_reader_takes(tmp_path):
    files = make_data(str(tmp_path / "c"), rows=3000, test_rows=500, features=5000, seed=2,
                      fmt="criteo")
    path = files["train"]["path"]
    assert path.endswith(".train.tsv") and sniff(path) is CRITEO
    with open(path) as f:
        first = f.readline().rstrip("\n").split("\t")
    assert len(first) == 40 and first[0] in ("0", "1")
    rows = list(TextShard(path).rows())
    assert sum(len(r) for r in rows) == 3000
    per_row = np.concatenate([np.diff(r.indptr) for r in rows])
    assert 28 < per_row.mean() < 36, "about 15% of the 39 fields empty"
    assert 0.1 < files["train"]["positive_rate"] < 0.6
    assert sniff(str(tmp_path / "c.test.tsv")) is CRITEO


def test_svmlight_text_is_not_taken_for_criteo(tmp_path):
    path = tmp_path / "s.svm"
    path.write_text("1 3:1 5:0.5\n")
    assert sniff(str(path)) is SVMLIGHT


def test_small_counts_are_looked_up_as_the_log_gives_them():
    from mpips.kernels.criteo import _BUCKETS, log_bucket
    assert [int(b) for b in _BUCKETS[:3]] == [0, 1, 2]
    assert all(_BUCKETS[v] == log_bucket(v) for v in range(3, len(_BUCKETS)))
    for v in (len(_BUCKETS) - 1, len(_BUCKETS), 10**6, 10**17):
        assert bucket(v) == log_bucket(v)


HEX = ["7", "a", "F", "0f", "abc", "68fd1e64", "68FD1E64", "DeadBeef", "123456789",
       "abcdef0123456789", "123456789abcdef01", "fedcba9876543210fedc"]


@pytest.mark.parametrize("newline", ["\n", "\r\n", ""])
def test_hexadecimal_fields_of_any_length_and_case(tmp_path, newline):
    """The first categorical field is read eight digits at a time; the last, at the end of the
    text, a digit at a time: the same keys."""
    text = "".join(line(cats=[h, *[""] * 24, h]).replace("\n", newline or "\n") for h in HEX)
    [rows] = rows_of(tmp_path, text.removesuffix("\n") if not newline else text)
    for r, h in enumerate(HEX):
        value = np.uint64(int(h, 16) & (2**64 - 1))   # the last 16 digits count
        keys = rows.indices[rows.indptr[r]:rows.indptr[r + 1]][-2:]
        assert keys.tolist() == [int(feature_key(13, value)), int(feature_key(38, value))], h


@pytest.mark.parametrize("count", ["0", "7", "-7", "99", "4095", "4096", "1234567", "12345678",
                                   "-12345678", "123456789012345678"])
def test_integer_fields_of_any_length(tmp_path, count):
    [rows] = rows_of(tmp_path, line(ints=[count, *[""] * 11, count]) + line(ints=[""] * 13)
                     + line(ints=[*[""] * 12, count]).rstrip("\n"))
    v = int(count)
    expect = int(feature_key(0, bucket(v))), int(feature_key(12, bucket(v)))
    assert rows.indices[:2].tolist() == list(expect)
    assert rows.indices[rows.indptr[2]] == expect[1], "the last field at the text's end"


@pytest.mark.parametrize("field, column", [
    ("12/4", 3), ("12:4", 3), ("12@4", 3), ("12G4", 3), ("12`4", 3), ("12g4", 3),
    ("12\x104", 3), ("1234567\x19", 8), ("12345678\xc1", 9), ("12 4", 3)])
def test_bytes_beside_the_hexadecimal_digits_are_not_taken_for_them(tmp_path, field, column):
    path = tmp_path / "c.tsv"
    path.write_bytes((line() + line(cats=[field, *[""] * 25]) + line()).encode("latin-1"))
    with pytest.raises(InputError) as e:
        list(TextShard(str(path), fmt=CRITEO).rows())
    start = len("\t".join(line().split("\t")[:14])) + 1   # the bytes before the field
    assert "c.tsv:2: a categorical field (15 to 40) is not hexadecimal" in str(e.value)
    assert f"(at character {start + column})" in str(e.value)


def test_a_19_digit_integer_is_an_error(tmp_path):
    with pytest.raises(InputError, match=r"c.tsv:1: an integer field .* \(at character 21\)"):
        rows_of(tmp_path, line(ints=["1" * 19, *[""] * 12]))


@pytest.mark.parametrize("read_as, other, name, says", [
    (CRITEO, "1 3:1 7:0.5\n", "c.tsv", "this looks like a line of svmlight, but the file is "
                                       "read as Criteo TSV"),
    (SVMLIGHT, line(), "s.svm", "this looks like a line of Criteo TSV, but the file is read "
                                "as svmlight"),
])
def test_a_line_of_another_format_is_named_as_such(tmp_path, read_as, other, name, says):
    path = tmp_path / name
    path.write_text(("1 3:1\n" if read_as is SVMLIGHT else line()) + other)
    with pytest.raises(InputError) as e:
        list(TextShard(str(path), fmt=read_as).rows())
    assert f"{name}:2: {says} (--format {read_as.name}, or its first line)" in str(e.value)


def test_capacity_holds_the_densest_text():
    from mpips.kernels import svmlight
    for text, densest in ((("0" + "\t" * 39 + "\n") * 99, True), (line() * 99, False)):
        # Writable, as a job's read buffer is: a read-only one is another type to numba, and
        # would be compiled here anew (20 s on a fresh checkout) instead of loaded.
        buf = np.frombuffer(text.encode(), np.uint8).copy()
        rows_room, entries_room = svmlight.capacity(buf.shape[0], svmlight.CRITEO)
        labels = np.empty(rows_room, np.float32)
        indptr = np.empty(rows_room + 1, np.int64)
        indices = np.empty(entries_room, np.uint64)
        values = np.empty(entries_room, np.float32)
        rows, nnz, *_ = svmlight.parse_lines(buf, True, False, labels, indptr, indices, values,
                                             np.empty(rows_room, np.int64), svmlight.CRITEO)
        assert rows == 99 and rows < rows_room and nnz <= entries_room
        assert rows_room - rows <= 1 or not densest, "the bound is what the grammar allows"
