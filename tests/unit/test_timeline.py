"""A rank's timeline: bounded, evenly thinned, and read back naming what is damaged."""
import h5py
import numpy as np
import pytest

from mpips.base import timeline
from mpips.base.errors import InputError
from mpips.base.timeline import SAMPLE, Timeline


def test_samples_are_taken_when_due_and_the_last_one_always():
    tl = Timeline(every=1.0, capacity=8)
    for t in np.arange(0, 3.01, 0.25):
        tl.add(float(t), examples=int(t * 100))
    tl.add(3.1, force=True, examples=310)
    s = tl.samples()
    assert list(s["t"]) == [0.0, 1.0, 2.0, 3.0, 3.1]
    assert list(s["examples"]) == [0, 100, 200, 300, 310]
    assert s["wait_s"].sum() == 0   # fields not given are zero


def test_a_long_run_keeps_a_bounded_evenly_spread_timeline_ending_at_its_newest():
    tl = Timeline(every=1.0, capacity=16)
    for t in range(1000):
        tl.add(float(t), clock=t)
    s = tl.samples()
    assert 8 <= s.shape[0] <= 16
    assert s["t"][-1] >= 1000 - tl.every
    steps = np.diff(s["t"])
    assert steps.max() <= 2 * steps.min() and steps.max() <= tl.every   # evenly spread
    assert (s["clock"] == s["t"]).all()


@pytest.mark.parametrize("capacity", [0, 3])
def test_a_capacity_that_cannot_be_halved_is_refused(capacity):
    with pytest.raises(ValueError, match="capacity must be even"):
        Timeline(capacity=capacity)


def test_written_and_read_back_with_each_samples_rank(tmp_path):
    samples = np.zeros(5, SAMPLE)
    samples["t"] = np.arange(5)
    timeline.write(str(tmp_path), samples, np.array([2, 0, 3]), 1, "run-1")
    read, ranks, servers = timeline.read(str(tmp_path))
    np.testing.assert_array_equal(read, samples)
    assert list(ranks) == [0, 0, 2, 2, 2] and servers == 1


@pytest.mark.parametrize("damage, says", [
    ("missing", "no dataset 'gap'"),
    ("short", "'busy_s' holds 2 values, 'rank' 5"),
    ("garbage", "not a readable timeline"),
])
def test_a_damaged_timeline_is_named(tmp_path, damage, says):
    samples = np.zeros(5, SAMPLE)
    timeline.write(str(tmp_path), samples, np.array([5]), 1, "run-1")
    path = tmp_path / timeline.FILE
    if damage == "garbage":
        path.write_bytes(b"\x89HDF\r\n" + b"x" * 100)
    else:
        with h5py.File(path, "a") as f:
            if damage == "missing":
                del f["gap"]
            else:
                del f["busy_s"]
                f["busy_s"] = np.zeros(2)
    with pytest.raises(InputError, match=str(path).replace(".", r"\.") + ".*" + says[:12]):
        timeline.read(str(tmp_path))
