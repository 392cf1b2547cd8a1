"""Synthetic CTR-like rows written straight to svmlight text. Pure numba.

Every random draw is a hash of (seed, row, field), so any row range can be
generated independently and the output depends only on the parameters.
"""
import math

import numpy as np

from .criteo import bucket as criteo_bucket
from .criteo import feature_key as criteo_key
from .hashing import mix64
from .jit import njit

_TWO_M53 = 1.0 / 9007199254740992.0
_S11 = np.uint64(11)
_S40 = np.uint64(40)


@njit(cache=True, nogil=True, inline="always")
def _uniform(h):
    return np.float64(h >> _S11) * _TWO_M53


@njit(cache=True, nogil=True, inline="always")
def _draw(seed, row, slot):
    """Uniform [0, 1) for (seed, row, slot)."""
    return _uniform(mix64(mix64(mix64(seed) ^ row) ^ np.uint64(slot)))


@njit(cache=True, nogil=True)
def feature_key(seed, field, value):
    """The hashed 64-bit key of categorical `value` in `field` (distinct pairs give distinct
    keys)."""
    return mix64((np.uint64(field) << _S40 | np.uint64(value)) ^ mix64(seed ^ np.uint64(0x5EED)))


@njit(cache=True, nogil=True)
def planted_weight(seed, key, sigma):
    """The true model's weight of `key`: normal(0, sigma^2), derived from the key's hash."""
    h = mix64(key ^ mix64(seed ^ np.uint64(0x3E16)))
    u1 = max(_uniform(h), 1e-300)
    u2 = _uniform(mix64(h))
    return sigma * math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


@njit(cache=True, nogil=True)
def write_uint(out, pos, v):
    """The decimal digits of uint64 `v` into out[pos:]; returns the position after them."""
    n = 1
    rest = v // np.uint64(10)
    while rest > 0:
        n += 1
        rest //= np.uint64(10)
    for i in range(n - 1, -1, -1):
        out[pos + i] = np.uint8(np.uint64(48) + v % np.uint64(10))
        v //= np.uint64(10)
    return pos + n


def max_bytes_per_row(n_fields):
    """Upper bound of one row's text: label, then ' key:value' per field, newline."""
    return 3 + n_fields * 28


@njit(cache=True, nogil=True)
def factor_seed(seed, f):
    """The seed of latent dimension f's planted values (see planted_weight)."""
    return mix64(np.uint64(seed) ^ np.uint64(0xFAC70000 + f))


@njit(cache=True, nogil=True)
def write_rows(seed, first_row, n_rows, n_fields, n_numeric, cdf, bias, sigma, out,
               rank=0, tau=0.0, ffm=False):
    """Generate rows [first_row, first_row + n_rows) as svmlight text into `out` (with
    `ffm`, libffm: field:value:x, a numeric field's value 0).

    Fields 0..n_numeric-1 are numeric (value in [0, 1), 4 decimals, one key per
    field); the rest are categorical with values drawn from the Zipf-like `cdf`
    and value 1. The label is drawn from sigmoid(bias + planted weights . x), plus,
    with `rank` > 0, the pairwise term sum_{i<j} <u_i, u_j> x_i x_j of planted latent
    vectors u (`rank` values of standard deviation `tau` per key).
    Returns (bytes written, positives).
    """
    pos = 0
    positives = 0
    useed = np.uint64(seed)
    sums = np.zeros(rank)
    for r in range(n_rows):
        row = np.uint64(first_row + r)
        line_start = pos
        pos += 2  # label and space, written once the margin is known
        margin = bias
        sums[:] = 0.0
        squares = 0.0
        for f in range(n_fields):
            if f < n_numeric:
                v = 0
                key = feature_key(useed, f, np.uint64(0xFFFFFFFF))
                x10k = int(_draw(useed, row, f) * 10000.0)
                x = x10k / 10000.0
            else:
                v = np.searchsorted(cdf, _draw(useed, row, f), side="right")
                key = feature_key(useed, f, v)
                x = 1.0
            margin += planted_weight(useed, key, sigma) * x
            for d in range(rank):
                ux = planted_weight(factor_seed(useed, d), key, tau) * x
                sums[d] += ux
                squares += ux * ux
            if ffm:
                pos = write_uint(out, pos, np.uint64(f))
                out[pos] = 58
                pos = write_uint(out, pos + 1, np.uint64(v))
            else:
                pos = write_uint(out, pos, key)
            out[pos] = 58  # ':'
            pos += 1
            if f < n_numeric:
                out[pos] = 48
                out[pos + 1] = 46
                frac = 1000
                for i in range(4):
                    out[pos + 2 + i] = np.uint8(48 + (x10k // frac) % 10)
                    frac //= 10
                pos += 6
            else:
                out[pos] = 49
                pos += 1
            out[pos] = 32
            pos += 1
        for d in range(rank):
            margin += 0.5 * sums[d] * sums[d]
        margin -= 0.5 * squares
        p = 1.0 / (1.0 + math.exp(-margin))
        y = 1 if _draw(useed, row, n_fields + 1) < p else 0
        positives += y
        out[line_start] = 48 + y
        out[line_start + 1] = 32
        out[pos - 1] = 10  # the last field's trailing space becomes the newline
        if n_fields == 0:
            out[line_start + 1] = 10
            pos = line_start + 2
    return pos, positives


@njit(cache=True, nogil=True)
def criteo_rows(seed, first_row, ints, cats, labels, bias, sigma, cdf, empty):
    """Rows [first_row, first_row + len(labels)) in the Criteo layout: ints[r, 13] counts,
    cats[r, 26] categorical values (32-bit, written in hexadecimal), -1 for an empty field;
    labels[r] drawn from a planted model over the keys the Criteo reader makes of them
    (kernels.criteo), so that what is written can be learned. A field is empty with
    probability `empty`; counts are roughly geometric, categorical values Zipf-like over
    `cdf`."""
    useed = np.uint64(seed)
    n_int = ints.shape[1]
    for r in range(labels.shape[0]):
        row = np.uint64(first_row + r)
        margin = bias
        for f in range(n_int + cats.shape[1]):
            empty_here = _draw(useed, row, 2 * f) < empty
            u = _draw(useed, row, 2 * f + 1)
            if f < n_int:
                ints[r, f] = -1 if empty_here else np.int64(-math.log(1.0 - u) * (1 + 4 * f))
                if empty_here:
                    continue
                key = criteo_key(f, criteo_bucket(ints[r, f]))
            else:
                v = np.uint64(np.searchsorted(cdf, u, side="right") + 1)
                value = np.int64(mix64(v ^ np.uint64(f << 20)) >> np.uint64(32))
                cats[r, f - n_int] = -1 if empty_here else value
                if empty_here:
                    continue
                key = criteo_key(f, np.uint64(value))
            margin += planted_weight(useed, key, sigma)
        p = 1.0 / (1.0 + math.exp(-margin))
        labels[r] = 1 if _draw(useed, row, 1000) < p else 0
