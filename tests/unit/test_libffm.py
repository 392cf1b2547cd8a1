"""libffm text (label field:idx:val ...): a feature's field goes into its key's top byte, the
file is told from svmlight by its first line, each kind of bad token is named with its file
and line, and make-data writes the same rows as its svmlight with their fields."""
import numpy as np
import pytest

from mpips.data.textfile import LIBFFM, SVMLIGHT, TextShard, sniff
from mpips.base.errors import InputError
from mpips.kernels import svmlight
from mpips.data.synthetic import make_data
from mpips.data.inputs import fields_of


def rows_of(tmp_path, text: str, **options):
    path = tmp_path / "d.ffm"
    path.write_text(text)
    return str(path), list(TextShard(str(path), **options).rows())


def test_a_key_is_its_field_in_the_top_byte_and_its_index_below(tmp_path):
    path, [rows] = rows_of(tmp_path, "1 0:5:1 3:72057594037927935:0.5\n0 254:0:2 # note\n")
    assert sniff(path) is LIBFFM
    assert rows.labels.tolist() == [1.0, 0.0]
    assert rows.indices.tolist() == [5, 3 << 56 | (1 << 56) - 1, 254 << 56]
    np.testing.assert_array_equal(rows.values, np.float32([1, 0.5, 2]))
    assert fields_of(path) == 0, "libffm text says its fields line by line: --fields is asked"


def test_svmlight_is_not_taken_for_libffm(tmp_path):
    path = tmp_path / "d.svm"
    path.write_text("1 3:1 5:0.5\n")
    assert sniff(str(path)) is SVMLIGHT


@pytest.mark.parametrize("token, says", [
    ("255:1:1", "field is not an integer from 0 to 254"),
    ("x:1:1", "field is not an integer from 0 to 254"),
    ("3:1", "expected field:idx:value"),
    ("3", "expected field:idx:value"),
    ("3:72057594037927936:1", "feature index exceeds 2^56-1"),
    ("3:5:abc", "feature value is not a decimal"),
])
def test_each_bad_token_is_named_with_its_file_and_line(tmp_path, token, says):
    with pytest.raises(InputError) as e:
        rows_of(tmp_path, f"1 0:1:1\n0 1:2:1 {token}\n")
    assert f"d.ffm:2: {says}" in str(e.value) and token in str(e.value)


def test_make_data_writes_the_svmlight_rows_with_their_fields(tmp_path):
    for fmt in ("svmlight", "libffm"):
        make_data(str(tmp_path / fmt), 300, nnz=5, features=50, fmt=fmt, interactions=2)
    [svm] = list(TextShard(str(tmp_path / "svmlight.train.svm")).rows())
    [ffm] = list(TextShard(str(tmp_path / "libffm.train.ffm")).rows())
    np.testing.assert_array_equal(svm.labels, ffm.labels)
    np.testing.assert_array_equal(svm.values, ffm.values)
    fields = (ffm.indices >> np.uint64(56)).reshape(300, 5)
    assert (fields == np.arange(5)).all(), "field f is each row's f-th feature"
    # distinct keys stay distinct with their fields
    assert len(np.unique(svm.indices)) == len(np.unique(ffm.indices))


def test_parse_lines_knows_libffm_by_its_number():
    assert svmlight.LIBFFM not in (svmlight.SVMLIGHT, svmlight.CRITEO, svmlight.AVAZU)
