"""The optimizers' formulas written out in numpy, independent of the numba kernels."""
import numpy as np


def weights_after_each_step(optimizer, grads):
    """grads[T, n, width] pushed in order to n keys starting at zero: returns [T + 1] arrays of
    weights (float32[n, width]) after 0..T steps. float64 arithmetic, float32 storage, like
    the server."""
    o = optimizer
    w = np.zeros(grads.shape[1:], np.float32)
    a = np.zeros_like(w)   # adagrad's sum of squares; ftrl's z
    n = np.zeros_like(w)   # ftrl's n
    out = [w.copy()]
    for g32 in grads:
        g = g32.astype(np.float64)
        w64 = w.astype(np.float64)
        if o.name == "sgd":
            w = (w64 - o.lr * (g + o.l2 * w64)).astype(np.float32)
        elif o.name == "adagrad":
            g = g + o.l2 * w64
            acc = a.astype(np.float64) + g * g
            a = acc.astype(np.float32)
            w = (w64 - o.lr * g / (np.sqrt(acc) + o.eps)).astype(np.float32)
        elif o.name == "adam":   # a: first moment, n: second; every key pushed every step
            t = len(out)
            g = g + o.l2 * w64
            m = 0.9 * a.astype(np.float64) + 0.1 * g
            v = 0.999 * n.astype(np.float64) + 0.001 * g * g
            a, n = m.astype(np.float32), v.astype(np.float32)
            w = (w64 - o.lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + o.eps)
                 ).astype(np.float32)
        else:
            n64 = n.astype(np.float64)
            n_new = n64 + g * g
            sigma = (np.sqrt(n_new) - np.sqrt(n64)) / o.lr
            z = a.astype(np.float64) + g - sigma * w64
            w_new = np.where(np.abs(z) <= o.l1, 0.0,
                             -(z - np.sign(z) * o.l1) / ((o.beta + np.sqrt(n_new)) / o.lr + o.l2))
            w, a, n = w_new.astype(np.float32), z.astype(np.float32), n_new.astype(np.float32)
        out.append(w.copy())
    return out
