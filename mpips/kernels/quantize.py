"""int8 push values: each block of BLOCK values is sent as int8 with one float32 scale.
Pure numba.

A block's scale is its largest magnitude over 127, so a value is off by at most half a
scale. The worker computes what the server will apply with the very expression the server
uses (`np.float32(q) * scale`), so its error feedback keeps exactly what was lost.
"""
import numpy as np

from .jit import njit

BLOCK = 256


@njit(cache=True, nogil=True)
def quantize_int8(values, scales, q, applied):
    """values[n] (float32) into q[n] (int8) and scales[ceil(n / BLOCK)] (float32), and
    applied[n]: what the server makes of them (see dequantize_int8)."""
    n = values.shape[0]
    for b in range(scales.shape[0]):
        lo = b * BLOCK
        hi = min(lo + BLOCK, n)
        top = 0.0
        for i in range(lo, hi):
            top = max(top, abs(np.float64(values[i])))
        scale = np.float32(top / 127.0)
        scales[b] = scale
        for i in range(lo, hi):
            x = 0.0
            if scale > 0:
                x = min(max(round(np.float64(values[i]) / np.float64(scale)), -127.0), 127.0)
            q[i] = np.int8(x)
            applied[i] = np.float32(q[i]) * scale


@njit(cache=True, nogil=True)
def dequantize_int8(scales, q, out):
    """out[i] = q[i] x the scale of its block."""
    for i in range(q.shape[0]):
        out[i] = np.float32(q[i]) * scales[i // BLOCK]
