"""TensorBoard event files, written without TensorBoard: records of TFRecord framing (a length,
the data, each with a masked CRC-32C) holding `Event` messages in protocol-buffer encoding,
encoded here for the few fields used: a scalar (`Summary.Value.simple_value`), a text (the
text plugin's string tensor), the file's version. TensorBoard reads them as it reads its own
writers' (tests/unit/test_tfevents.py reads them back with TensorBoard's reader).
"""
import os
import socket
import struct
import time

FILE_VERSION = "brain.Event:2"
_DT_STRING = 7   # tensorflow DataType of a string tensor


def _crc32c_table() -> list:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`: records are small, a table suffices."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """`data` framed as one TFRecord."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc(length)) + data
            + struct.pack("<I", masked_crc(data)))


# Protocol-buffer encoding of the fields used (wire types: 0 varint, 1 64-bit, 2 bytes,
# 5 32-bit).

def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes(number: int, data: bytes) -> bytes:
    return _field(number, 2) + _varint(len(data)) + data


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    """An Event: wall_time (1, double), step (2, int64), then `body` (its other fields)."""
    return (_field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step)
            + body)


def scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """An Event whose summary (5) holds one Value: tag (1), simple_value (2, float)."""
    value_msg = _bytes(1, tag.encode()) + _field(2, 5) + struct.pack("<f", value)
    return _event(wall_time, step, _bytes(5, _bytes(1, value_msg)))


def text_event(tag: str, text: str, step: int, wall_time: float) -> bytes:
    """An Event whose summary holds a text for TensorBoard's text plugin: a Value with
    metadata (9: plugin_data (1): plugin_name (1) "text") and a string tensor (8: dtype
    (1), an empty shape (2): a scalar, string_val (8))."""
    metadata = _bytes(1, _bytes(1, b"text"))
    tensor = _field(1, 0) + _varint(_DT_STRING) + _bytes(2, b"") + _bytes(8, text.encode())
    value_msg = _bytes(1, tag.encode()) + _bytes(9, metadata) + _bytes(8, tensor)
    return _event(wall_time, step, _bytes(5, _bytes(1, value_msg)))


def version_event(wall_time: float) -> bytes:
    return _event(wall_time, 0, _bytes(3, FILE_VERSION.encode()))


class EventWriter:
    """An event file in `directory` (made if missing), named as TensorBoard's writers name
    theirs; each write is flushed, so that TensorBoard shows a run as it trains."""

    def __init__(self, directory: str, suffix: str = "mpips"):
        os.makedirs(directory, exist_ok=True)
        now = time.time()
        self.path = os.path.join(directory, f"events.out.tfevents.{int(now)}."
                                            f"{socket.gethostname()}.{os.getpid()}.{suffix}")
        self._file = open(self.path, "ab")  # noqa: SIM115 (open while the job trains)
        self.events = 0
        self._write(record(version_event(now)))

    def scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        self.scalars({tag: value}, step, wall_time)

    def scalars(self, values: dict, step: int, wall_time: float | None = None) -> None:
        """Several scalars of one step, {tag: value}, in one write."""
        now = time.time() if wall_time is None else wall_time
        self._write(b"".join(record(scalar_event(tag, float(value), int(step), now))
                             for tag, value in values.items()), len(values))

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self._write(record(text_event(tag, text, int(step), time.time())))

    def _write(self, records: bytes, events: int = 1) -> None:
        self._file.write(records)
        self._file.flush()
        self.events += events

    def close(self) -> None:
        self._file.close()
