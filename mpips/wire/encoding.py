"""How a push's own values travel: float32 as they are, float16 (flag HALF) or int8 with a
float32 scale per block of 256 values (flag INT8), and how many bytes each takes. A worker's
push filter encodes, a server decodes; the values applied are the decoded ones on both sides.
Imports only the quantizing kernels.
"""
import numpy as np

from ..kernels.quantize import BLOCK, dequantize_int8, quantize_int8

HALF = 64        # PUSH flag: the own part's values are float16
INT8 = 128       # PUSH flag: the own part's values are int8, a float32 scale per BLOCK of them
                 # first (see values_bytes)
ENCODINGS = {"float32": 0, "float16": HALF, "int8": INT8}
HALF_MAX = 65504.0   # float16's largest finite value


def pad8(n: int) -> int:
    return (n + 7) & ~7


def values_bytes(rows: int, width: int, flags: int) -> int:
    """The bytes of a push's own values, `rows` of `width` encoded as `flags` say: float32;
    float16 (HALF), padded to 8 bytes; or int8 (INT8): the blocks' float32 scales, then the
    values, each padded to 8 bytes."""
    n = rows * width
    if flags & HALF:
        return pad8(2 * n)
    if flags & INT8:
        return pad8(4 * -(-n // BLOCK)) + pad8(n)
    return 4 * n


def encode_values(rows: np.ndarray, flags: int):
    """(the bytes of rows[m, width] (float32) encoded as `flags` say (HALF, INT8 or neither),
    float32 values the server will decode them to)."""
    if not flags & (HALF | INT8):
        return rows, rows
    n = rows.size
    out = np.zeros(values_bytes(rows.shape[0], rows.shape[1], flags), np.uint8)
    if flags & HALF:
        half = np.clip(rows, -HALF_MAX, HALF_MAX).astype(np.float16)
        out[:2 * n] = half.reshape(-1).view(np.uint8)
        return out, half.astype(np.float32)
    scales, q = _int8_fields(out, n)
    applied = np.empty(rows.shape, np.float32)
    quantize_int8(rows.reshape(-1), scales, q, applied.reshape(-1))
    return out, applied


def _int8_fields(data: np.ndarray, n: int):
    """(scales, int8 values) of INT8 values' bytes for n values: views."""
    blocks = -(-n // BLOCK)
    at = pad8(4 * blocks)
    return data[:4 * blocks].view(np.float32), data[at:at + n].view(np.int8)


def int8_scales(data: np.ndarray, rows: int, width: int) -> np.ndarray:
    """The block scales of INT8 values' bytes (a view)."""
    return _int8_fields(data, rows * width)[0]


def decode_values(data: np.ndarray, rows: int, width: int, flags: int) -> np.ndarray:
    """A push's own values[rows, width] (float32) from their bytes: a view when float32."""
    if flags & HALF:
        return data[:2 * rows * width].view(np.float16).astype(np.float32).reshape(rows, width)
    if flags & INT8:
        scales, q = _int8_fields(data, rows * width)
        out = np.empty(rows * width, np.float32)
        dequantize_int8(scales, q, out)
        return out.reshape(rows, width)
    return data.view(np.float32).reshape(rows, width)
