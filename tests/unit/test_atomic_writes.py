"""Files written piece by piece (synthetic data, converted shards) go through the atomic
writer: a failure leaves neither the file nor a temporary one, and names the file."""
import errno
import os
import re

import numpy as np
import pytest

from mpips.base import files
from mpips.base.errors import SaveError
from mpips.data.convert import write_part
from mpips.data.synthetic import make_data


def _full_disk(monkeypatch):
    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(files, "DURABLE", True)   # the suite runs with MPIPS_FSYNC=0
    monkeypatch.setattr(files.os, "fsync", fsync)


def _fsyncs(monkeypatch, durable: bool) -> list:
    """The descriptors os.fsync is called on from now, with files.DURABLE set to `durable`."""
    synced: list = []
    monkeypatch.setattr(files, "DURABLE", durable)
    monkeypatch.setattr(files.os, "fsync", synced.append)
    return synced


@pytest.mark.parametrize("durable", [True, False])
def test_a_file_and_its_directory_are_fsynced_unless_mpips_fsync_is_0(tmp_path, monkeypatch,
                                                                      durable):
    """By default a file written is fsynced, then its directory after the rename (2 calls);
    with MPIPS_FSYNC=0 (files.DURABLE false) neither is, and the file is still whole under
    its name, with no temporary file left."""
    synced = _fsyncs(monkeypatch, durable)
    files.write_bytes(str(tmp_path / "f.bin"), b"abc")
    with files.atomic_file(str(tmp_path / "g.bin")) as f:
        f.write(b"de")
    assert len(synced) == (4 if durable else 0)
    assert sorted(os.listdir(tmp_path)) == ["f.bin", "g.bin"]
    assert (tmp_path / "f.bin").read_bytes() == b"abc"


@pytest.mark.parametrize("value, durable", [(None, True), ("1", True), ("0", False)])
def test_mpips_fsync_is_read_from_the_environment_at_import(value, durable):
    """A fresh interpreter: the setting as a job's ranks read it."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != files.FSYNC}
    if value is not None:
        env[files.FSYNC] = value
    done = subprocess.run([sys.executable, "-c", "from mpips.base import files; "
                           "print(files.DURABLE)"], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == str(durable), done.stderr


@pytest.mark.parametrize("value", ["yes", "", "2"])
def test_a_value_of_mpips_fsync_other_than_0_or_1_is_refused_naming_it(value):
    from mpips.base.errors import ConfigError
    with pytest.raises(ConfigError, match=re.escape(f"MPIPS_FSYNC={value!r} in the "
                                                    f"environment: set it to 1")):
        files.check_fsync_setting(value)
    files.check_fsync_setting("0")
    files.check_fsync_setting("1")


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
