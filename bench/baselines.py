"""numba kernels the benchmarks need beside mpips: the bare AdaGrad loop (the machine's
limit for this model) and a writer of Vowpal Wabbit's input format."""
import math

import numpy as np
from numba import njit

import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from mpips.kernels import jit, synth

# numba's own kernel, which the functions here call from compiled code (where the kernels are
# compiled ahead, synth's is their call guard, which numba cannot call)
write_uint = jit.twin("synth").write_uint if jit.AHEAD else synth.write_uint


@njit(cache=True)
def adagrad_pass(indptr, idx, vals, labels, table, lr, mask):
    """One pass of per-example AdaGrad on hashed slots: table[slot] = (weight, sum of g^2)
    side by side; slot mask + 1 holds the bias."""
    for r in range(indptr.shape[0] - 1):
        m = np.float64(table[mask + 1, 0])
        for p in range(indptr[r], indptr[r + 1]):
            m += table[idx[p] & mask, 0] * vals[p]
        g = 1.0 / (1.0 + math.exp(-m)) - labels[r]
        for p in range(indptr[r], indptr[r + 1]):
            s = idx[p] & mask
            gi = g * vals[p]
            table[s, 1] += gi * gi
            table[s, 0] -= lr * gi / math.sqrt(table[s, 1])
        table[mask + 1, 1] += g * g
        table[mask + 1, 0] -= lr * g / math.sqrt(table[mask + 1, 1])


@njit(cache=True)
def hashed_margins(indptr, idx, vals, table, mask, out):
    for r in range(indptr.shape[0] - 1):
        m = np.float64(table[mask + 1, 0])
        for p in range(indptr[r], indptr[r + 1]):
            m += table[idx[p] & mask, 0] * vals[p]
        out[r] = m


@njit(cache=True)
def format_vw(indptr, idx, vals, labels, out):
    """Rows as VW text into `out` ('1 |f key:value ...', -1 for negatives, ':value' left out
    when it is 1, values with 4 decimals); returns the bytes written."""
    pos = 0
    for r in range(indptr.shape[0] - 1):
        if labels[r] > 0.5:
            out[pos] = 49
            pos += 1
        else:
            out[pos] = 45
            out[pos + 1] = 49
            pos += 2
        out[pos] = 32
        out[pos + 1] = 124
        out[pos + 2] = 102
        pos += 3
        for p in range(indptr[r], indptr[r + 1]):
            out[pos] = 32
            pos = write_uint(out, pos + 1, idx[p])
            if vals[p] != 1.0:
                q = int(round(vals[p] * 10000))
                out[pos] = 58
                out[pos + 1] = 48 + q // 10000
                out[pos + 2] = 46
                pos += 3
                d = 1000
                for i in range(4):
                    out[pos] = 48 + (q // d) % 10
                    pos += 1
                    d //= 10
        out[pos] = 10
        pos += 1
    return pos
