"""Parquet input that cannot be read as rows: each error names the file (and the row group,
row and column where there is one) and says what to do."""
import re
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import run_mpips

from mpips.base.errors import ConfigError, InputError
from mpips.data.inputs import check_input
from mpips.data.shards import open_shard


def write(path, table, **kw) -> str:
    pq.write_table(table, path, **kw)
    return str(path)


def read_all(path: str) -> None:
    for _ in open_shard(path, 0, 1).rows():
        pass


def test_no_label_column_names_the_file_and_its_columns(tmp_path):
    path = write(tmp_path / "x.parquet", pa.table({"click": [0, 1], "site": ["a", "b"]}))
    with pytest.raises(ConfigError) as e:
        check_input(path, "--train")
    assert str(e.value).startswith(f"--train {path}: no column named 'label'")
    assert "(its columns: click, site)" in str(e.value) and "rename" in str(e.value)


@pytest.mark.parametrize(("label", "says"), [(2, "label 2, not 0 or 1"),
                                             (None, "label null, not 0 or 1"),
                                             (0.5, "label 0.5, not 0 or 1")])
def test_a_label_not_0_or_1_names_file_row_group_and_row(tmp_path, label, says):
    labels = [0, 1, 1, 0, 1, 0, 1]
    labels[5] = label
    kind = pa.float64() if isinstance(label, float) else pa.int64()
    path = write(tmp_path / "x.parquet", pa.table({"label": pa.array(labels, kind),
                                                   "id": np.arange(7)}), row_group_size=3)
    check_input(path, "--train")   # the schema is fine: the values are read by the workers
    with pytest.raises(InputError) as e:
        read_all(path)
    assert str(e.value) == f"{path}: row group 1, row 2 (row 5 of {path}), column 'label': {says}"


def test_an_infinite_number_names_its_column_and_row(tmp_path):
    path = write(tmp_path / "x.parquet", pa.table({"label": [0, 1],
                                                   "price": [1.0, float("inf")]}))
    with pytest.raises(InputError, match=r"row group 0, row 1 .*column 'price': value inf"):
        read_all(path)


@pytest.mark.parametrize(("column", "kind"), [
    (pa.array([[0.5], [1.5]], pa.list_(pa.float32())), "list<element: float>"),
    (pa.array([1, 2], pa.timestamp("ms")), "timestamp[ms]"),
    (pa.array([{"a": 1}, {"a": 2}]), "struct<a: int64>")])
def test_a_column_of_an_unsupported_type_is_named_with_its_type(tmp_path, column, kind):
    path = write(tmp_path / "x.parquet", pa.table({"label": [0, 1], "ok": [3, 4],
                                                   "odd": column}))
    with pytest.raises(ConfigError) as e:
        check_input(path, "--test")
    assert f"--test {path}: column 'odd' is {kind}, which mpips cannot" in str(e.value)
    assert "accepted: integer, bool, string" in str(e.value) and "Drop or cast it" in str(e.value)


def test_a_label_of_another_type_and_too_many_fields_are_refused(tmp_path):
    path = write(tmp_path / "s.parquet", pa.table({"label": ["yes", "no"]}))
    with pytest.raises(ConfigError, match="column 'label' is string: a label is an integer"):
        check_input(path, "--train")
    wide = {"label": [0, 1], **{f"c{i}": [i, i] for i in range(256)}}
    path = write(tmp_path / "w.parquet", pa.table(wide))
    with pytest.raises(ConfigError, match="256 feature columns, more than the 255 fields"):
        check_input(path, "--train")


def test_a_truncated_or_damaged_file_is_named(tmp_path):
    path = write(tmp_path / "x.parquet", pa.table({"label": [0, 1] * 100, "id": range(200)}))
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])
    with pytest.raises(ConfigError, match=re.escape(f"--train {path}: not a readable Parquet")):
        check_input(path, "--train")
    with open(path, "wb") as f:   # the footer whole, a data page overwritten
        f.write(data[:4] + b"\xff" * 60 + data[64:])
    with pytest.raises((InputError, ConfigError), match=re.escape(path)):
        check_input(path, "--train")
        read_all(path)


def test_an_empty_folder_and_a_folder_of_other_files_say_there_is_nothing(tmp_path):
    (tmp_path / "e").mkdir()
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("x")
    for folder in ("e", "o"):
        with pytest.raises(ConfigError, match=r"nor a folder of Parquet files .*nothing to read"):
            check_input(str(tmp_path / folder), "--train")


def test_files_of_different_schemas_name_both_files_and_the_column(tmp_path):
    (tmp_path / "d").mkdir()
    a = write(tmp_path / "d" / "a.parquet", pa.table({"label": [0, 1], "id": [1, 2]}))
    b = write(tmp_path / "d" / "b.parquet", pa.table({"label": [0, 1], "id": ["1", "2"]}))
    with pytest.raises(ConfigError) as e:
        check_input(str(tmp_path / "d"), "--train")
    assert (f"{a} and {b} have different schemas: column 2 is 'id' (int64) in {a} but 'id' "
            f"(string) in {b}") in str(e.value)


def test_without_pyarrow_parquet_input_says_what_to_install(tmp_path, monkeypatch):
    path = write(tmp_path / "x.parquet", pa.table({"label": [0, 1]}))
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ConfigError, match=r"needs pyarrow, which is not installed: pip "
                                          r"install 'mpips\[parquet\]'"):
        check_input(path, "--train")


def test_a_text_format_given_for_parquet_and_convert_of_a_bad_schema(tmp_path):
    path = write(tmp_path / "x.parquet", pa.table({"label": [0, 1], "id": [1, 2]}))
    with pytest.raises(ConfigError, match="Parquet, but --format criteo names a text format"):
        check_input(path, "--train", "criteo")
    bad = write(tmp_path / "y.parquet", pa.table({"y": [0, 1]}))
    job = run_mpips("convert", bad, tmp_path / "out")
    assert job.returncode == 2 and f"IN {bad}: no column named 'label'" in job.stderr, job.output
    assert "Traceback" not in job.output
