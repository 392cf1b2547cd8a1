"""Server-side optimizer updates. Pure numba over a table's state rows.

State row layout for value width W (weights first, so a pull reads columns [0, W)):
  sgd      [w], or averaged: [w, mean of w since the averaging began, clocks it covers (1)]
  adagrad  [w, sum of squared gradients]
  ftrl     [w, z, n]          (McMahan et al., KDD 2013, Algorithm 1)
  adam     [w, m, v, pushes of this key (1)]   (Kingma and Ba, ICLR 2015, Algorithm 1;
           "lazy": a key's moments and its bias correction move only when it is pushed)
Arithmetic is float64; the state is stored as float32. Each update asks for the rows of the
keys a few places ahead (a pull found them, but other reads may have pushed them out of cache).
"""
import math

import numpy as np

from .jit import njit
from .prefetch import UPDATE_AHEAD, prefetch


@njit(cache=True, nogil=True)
def sgd_update(state, slots, grads, lr, l2, span, averaged):
    """w -= lr * (g + l2 * w); `averaged`: first fold the weight the key held so far into its
    running mean (averaged SGD). `span`: how many clocks of the average have passed when this
    push is applied (0 before the averaging begins). A key's weights change only when it is
    pushed, so its mean is brought up to date lazily: the weight it held since then, that
    many times."""
    width = grads.shape[1]
    for i in range(slots.shape[0]):
        if i + UPDATE_AHEAD < slots.shape[0]:
            prefetch(state, slots[i + UPDATE_AHEAD])
        s = slots[i]
        covered = np.float64(state[s, 2 * width]) if averaged else 0.0
        if averaged and span > covered:
            share = (span - covered) / span
            for j in range(width):
                mean = np.float64(state[s, width + j])
                state[s, width + j] = mean + (np.float64(state[s, j]) - mean) * share
            state[s, 2 * width] = span
        for j in range(width):
            w = np.float64(state[s, j])
            g = np.float64(grads[i, j]) + l2 * w
            state[s, j] = w - lr * g


@njit(cache=True, nogil=True)
def sgd_average(state, width, span, out):
    """The averaged weights of state rows into out[len(state), width]: each key's running
    mean brought up to `span` clocks (its last weight for the clocks since its last push);
    the weights themselves while nothing is averaged yet (span 0)."""
    for s in range(state.shape[0]):
        covered = np.float64(state[s, 2 * width])
        for j in range(width):
            w = np.float64(state[s, j])
            if span <= 0:
                out[s, j] = w
            else:
                mean = np.float64(state[s, width + j])
                out[s, j] = mean + (w - mean) * max(span - covered, 0.0) / span


@njit(cache=True, nogil=True)
def adagrad_update(state, slots, grads, lr, l2, eps):
    """n += g^2; w -= lr * g / (sqrt(n) + eps), with g = grad + l2 * w"""
    width = grads.shape[1]
    for i in range(slots.shape[0]):
        if i + UPDATE_AHEAD < slots.shape[0]:
            prefetch(state, slots[i + UPDATE_AHEAD])
        s = slots[i]
        for j in range(width):
            w = np.float64(state[s, j])
            g = np.float64(grads[i, j]) + l2 * w
            n = np.float64(state[s, width + j]) + g * g
            state[s, width + j] = n
            state[s, j] = w - lr * g / (math.sqrt(n) + eps)


@njit(cache=True, nogil=True)
def ftrl_update(state, slots, grads, alpha, beta, l1, l2):
    """FTRL-Proximal: per-coordinate rate alpha / (beta + sqrt(n)), L1 and L2 in closed form."""
    width = grads.shape[1]
    for i in range(slots.shape[0]):
        if i + UPDATE_AHEAD < slots.shape[0]:
            prefetch(state, slots[i + UPDATE_AHEAD])
        s = slots[i]
        for j in range(width):
            w = np.float64(state[s, j])
            z = np.float64(state[s, width + j])
            n = np.float64(state[s, 2 * width + j])
            g = np.float64(grads[i, j])
            n_new = n + g * g
            sigma = (math.sqrt(n_new) - math.sqrt(n)) / alpha
            z = z + g - sigma * w
            if abs(z) <= l1:
                w = 0.0
            else:
                sign = 1.0 if z > 0 else -1.0
                w = -(z - sign * l1) / ((beta + math.sqrt(n_new)) / alpha + l2)
            state[s, j] = w
            state[s, width + j] = z
            state[s, 2 * width + j] = n_new


@njit(cache=True, nogil=True)
def adam_update(state, slots, grads, lr, l2, beta1, beta2, eps):
    """m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; w -= lr m^ / (sqrt(v^) + eps), with
    g = grad + l2 * w and m^, v^ corrected for the key's own count of pushes t: m / (1 - b1^t),
    v / (1 - b2^t)."""
    width = grads.shape[1]
    for i in range(slots.shape[0]):
        if i + UPDATE_AHEAD < slots.shape[0]:
            prefetch(state, slots[i + UPDATE_AHEAD])
        s = slots[i]
        t = np.float64(state[s, 3 * width]) + 1.0
        state[s, 3 * width] = t
        fix1 = 1.0 - beta1 ** t
        fix2 = 1.0 - beta2 ** t
        for j in range(width):
            w = np.float64(state[s, j])
            g = np.float64(grads[i, j]) + l2 * w
            m = beta1 * np.float64(state[s, width + j]) + (1.0 - beta1) * g
            v = beta2 * np.float64(state[s, 2 * width + j]) + (1.0 - beta2) * g * g
            state[s, width + j] = m
            state[s, 2 * width + j] = v
            state[s, j] = w - lr * (m / fix1) / (math.sqrt(v / fix2) + eps)
