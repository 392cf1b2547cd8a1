"""The pure parts of reading a model back: checksums of HDF5 datasets, a dense table put
together from its servers' files, the test data's format against the training data's, and
the fraction of the test's keys a model knows."""
import json

import h5py
import numpy as np
import pytest

from mpips.data.textfile import Rows
from mpips.storage.dense_files import read_table
from mpips.models.evaluate import known_fraction
from mpips.base import checksums
from mpips.base.files import write_hdf5
from mpips.data.inputs import data_format, format_mismatch

CRITEO_LINE = "1\t" + "\t".join(["5"] * 13 + ["68fd1e64"] * 26) + "\n"


@pytest.mark.parametrize("algorithm", list(checksums.Algorithm))
def test_a_dataset_changed_after_its_checksum_is_named(tmp_path, algorithm):
    data = {"keys": np.arange(5, dtype=np.uint64), "weights": np.ones((5, 2), np.float32)}
    digests = {name: checksums.of(v, algorithm) for name, v in data.items()}
    write_hdf5(str(tmp_path / "a.h5"), data, {})
    with h5py.File(tmp_path / "a.h5", "r+") as f:
        assert checksums.mismatched(f, digests, algorithm) is None
        f["weights"][0, 0] = np.float32(1.9e37)
        assert (checksums.mismatched(f, digests, algorithm)
                == "dataset weights does not match its checksum")
        assert (checksums.mismatched(f, {"state": digests["keys"]}, algorithm)
                == "dataset state is missing")


def blocks_file(path, blocks: list, n: int = 10, block_rows: int = 4) -> None:
    """A server's file of table w (n rows, value = row number) holding `blocks`, and of a
    table g beside it."""
    values = np.concatenate([np.arange(b * block_rows, min(n, (b + 1) * block_rows), dtype=float)
                             for b in blocks])
    tables = {}
    for name in ("w", "g"):
        tables.update({f"dense/{name}/shape": np.array([n, 1, block_rows], np.int64),
                       f"dense/{name}/blocks": np.array(blocks, np.int64),
                       f"dense/{name}/values": values})
    write_hdf5(str(path), tables, {})


def test_a_dense_table_is_put_together_from_every_servers_blocks(tmp_path):
    blocks_file(tmp_path / "a.h5", [0, 2])
    blocks_file(tmp_path / "b.h5", [1])
    w = read_table([str(tmp_path / "a.h5"), str(tmp_path / "b.h5")], "w")
    np.testing.assert_array_equal(w.reshape(-1), np.arange(10.0))
    with pytest.raises(ValueError, match="holds block 1 of table 'w'"):
        read_table([str(tmp_path / "a.h5")], "w")
    with pytest.raises(ValueError, match="holds table 'z'"):
        read_table([str(tmp_path / "a.h5")], "z")


def test_test_data_of_another_format_is_named_with_both_formats(tmp_path):
    svm, criteo = tmp_path / "t.svm", tmp_path / "t.tsv"
    svm.write_text("1 3:1 7:0.5\n0 2:1\n")
    criteo.write_text(CRITEO_LINE * 2)
    assert (data_format(str(svm)), data_format(str(criteo))) == ("svmlight", "criteo")
    assert format_mismatch(str(svm), "svmlight", "the model") is None
    assert format_mismatch(str(svm), None, "the model") is None, "a format not recorded"
    assert format_mismatch(str(criteo), "svmlight", "the model in m").startswith(
        f"{criteo} is criteo data, but the model in m was trained on svmlight data")
    old = tmp_path / "old.bin"   # converted before the format was recorded
    old.mkdir()
    (old / "meta.json").write_text(json.dumps({"format": "mpips-csr", "parts": []}))
    assert data_format(str(old)) is None and format_mismatch(str(old), "criteo", "m") is None


def rows_of(keys: list) -> Rows:
    keys = np.array(keys, np.uint64)
    return Rows(np.zeros(1, np.float32), np.array([0, keys.shape[0]], np.int64), keys,
                np.ones(keys.shape[0], np.float32))


def test_the_fraction_of_known_keys_counts_distinct_keys():
    model = np.array([2, 5, 9], np.uint64)
    assert known_fraction(model, rows_of([5, 5, 5, 7])) == 0.5
    assert known_fraction(model, rows_of([1, 10**12])) == 0.0
    assert known_fraction(np.empty(0, np.uint64), rows_of([1])) == 0.0
    assert known_fraction(model, rows_of([])) == 1.0
