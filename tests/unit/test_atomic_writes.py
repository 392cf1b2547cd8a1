"""Files written piece by piece (synthetic data, converted shards) go through the atomic
writer: a failure leaves neither the file nor a temporary one, and names the file."""
import errno
import os

import numpy as np
import pytest

from mpips.base import files
from mpips.base.errors import SaveError
from mpips.data.convert import write_part
from mpips.data.synthetic import make_data


def _full_disk(monkeypatch):
    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(files.os, "fsync", fsync)


@pytest.mark.parametrize("options", [{}, {"fmt": "criteo"}, {"kind": "census"}])
def test_a_failed_make_data_leaves_nothing_and_names_the_file(tmp_path, monkeypatch, options):
    _full_disk(monkeypatch)
    with pytest.raises(SaveError, match=f"cannot write {tmp_path}/d.test.*: No space left"):
        make_data(str(tmp_path / "d"), rows=100, **options)
    assert os.listdir(tmp_path) == []


def test_a_converted_part_is_the_npy_numpy_writes(tmp_path):
    src = make_data(str(tmp_path / "d"), rows=300, features=50, nnz=4)["train"]["path"]
    (tmp_path / "out").mkdir()
    part = write_part(src, str(tmp_path / "out"), 0, 1, skip_bad=False)
    assert sorted(os.listdir(tmp_path / "out")) == [
        f"part-0000.{a}.npy" for a in ("indices", "indptr", "labels", "values")]
    labels = np.load(tmp_path / "out" / "part-0000.labels.npy")
    np.save(tmp_path / "again.npy", labels)
    assert (tmp_path / "again.npy").read_bytes() == \
        (tmp_path / "out" / "part-0000.labels.npy").read_bytes()
    assert labels.shape == (part["rows"],) == (300,)


def test_a_failed_part_leaves_only_its_scratch_files(tmp_path, monkeypatch):
    src = make_data(str(tmp_path / "d"), rows=300, features=50, nnz=4)["train"]["path"]
    (tmp_path / "out").mkdir()
    _full_disk(monkeypatch)
    with pytest.raises(SaveError, match="part-0000.labels.npy: No space left"):
        write_part(src, str(tmp_path / "out"), 0, 1, skip_bad=False)
    assert all(name.endswith(".raw") for name in os.listdir(tmp_path / "out"))
