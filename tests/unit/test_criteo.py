"""The Criteo TSV reader (kernels.criteo through data.TextShard) and make-data's Criteo
layout: keys per field, empty fields, log buckets, bad lines named by file and line."""
import numpy as np
import pytest

from mpips.data import CRITEO, SVMLIGHT, TextShard, sniff
from mpips.errors import InputError
from mpips.kernels.criteo import bucket, feature_key
from mpips.makedata import make_data


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
