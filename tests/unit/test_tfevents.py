"""TensorBoard event files written by mpips, read back with TensorBoard's own reader."""
import struct

import pytest

from mpips.storage import tfevents

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="TensorBoard (the test extra) reads the files back")


def test_crc32c_of_the_standard_check_string():
    assert tfevents.crc32c(b"123456789") == 0xE3069283
    assert tfevents.crc32c(b"") == 0


def read_back(directory):
    acc = event_accumulator.EventAccumulator(directory, size_guidance={
        event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def test_scalars_and_a_text_read_back_as_written(tmp_path):
    w = tfevents.EventWriter(str(tmp_path))
    for step in range(5):
        w.scalars({"train/logloss": 0.5 / (step + 1), "train/examples_per_s": 1000.0 * step},
                  step=step * 100)
    w.scalar("server/bytes", 2 ** 40, step=7)   # large steps and values stay exact enough
    w.text("config", "| option | value |\n|---|---|\n| --epochs | 3 |")
    w.close()
    acc = read_back(str(tmp_path))
    loss = acc.Scalars("train/logloss")
    assert [e.step for e in loss] == [0, 100, 200, 300, 400]
    assert [e.value for e in loss] == pytest.approx([0.5 / k for k in range(1, 6)], rel=1e-6)
    assert acc.Scalars("server/bytes")[0].value == 2 ** 40 and acc.Scalars(
        "server/bytes")[0].step == 7
    text = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert "--epochs | 3" in text
    assert w.events == 1 + 10 + 1 + 1   # the version, the scalars, the text


def test_a_damaged_record_is_found_by_its_checksum(tmp_path):
    """The framing's checksums are TFRecord's: TensorBoard's reader stops at a flipped byte
    (what it read before stays), as it does for files TensorBoard writes."""
    w = tfevents.EventWriter(str(tmp_path))
    for step in range(3):
        w.scalar("x", float(step), step)
    w.close()
    data = bytearray(open(w.path, "rb").read())
    # the third record's data: skip the version's record and two scalars' records
    at = 0
    for _ in range(3):
        (length,) = struct.unpack_from("<Q", data, at)
        at += 12 + length + 4
    data[at + 12 + 3] ^= 0x40
    open(w.path, "wb").write(bytes(data))
    assert [e.step for e in read_back(str(tmp_path)).Scalars("x")] == [0, 1]
