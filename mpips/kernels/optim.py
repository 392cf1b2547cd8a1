"""Server-side optimizer updates. Pure numba over a table's state rows.

State row layout for value width W (weights first, so a pull reads columns [0, W)):
  sgd      [w]
  adagrad  [w, sum of squared gradients]
  ftrl     [w, z, n]          (McMahan et al., KDD 2013, Algorithm 1)
Arithmetic is float64; the state is stored as float32.
"""
import math

import numpy as np
from numba import njit

STATE_COLUMNS = {"sgd": 1, "adagrad": 2, "ftrl": 3}


@njit(cache=True, nogil=True)
def sgd_update(state, slots, grads, lr, l2):
    """w -= lr * (g + l2 * w)"""
    width = grads.shape[1]
    for i in range(slots.shape[0]):
        s = slots[i]
        for j in range(width):
            w = np.float64(state[s, j])
            g = np.float64(grads[i, j]) + l2 * w
            state[s, j] = w - lr * g


@njit(cache=True, nogil=True)
def adagrad_update(state, slots, grads, lr, l2, eps):
    """n += g^2; w -= lr * g / (sqrt(n) + eps), with g = grad + l2 * w"""
    width = grads.shape[1]
    for i in range(slots.shape[0]):
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
