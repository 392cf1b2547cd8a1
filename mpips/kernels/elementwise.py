"""Named element-wise functions that servers apply to the blocks of dense tables they hold
(`map`: out = f(x, a); `zip`: out = f(x, y, a), with one scalar a). Pure numba over float64
arrays; a request names them, so no code travels on the wire. To add one: write the kernel
and put it in MAPS or ZIPS under a new name (every rank imports this module)."""
import math

from .jit import njit


@njit(cache=True, nogil=True)
def _abs(x, out, a):
    for i in range(x.shape[0]):
        out[i] = abs(x[i])


@njit(cache=True, nogil=True)
def _sign(x, out, a):
    for i in range(x.shape[0]):
        out[i] = (x[i] > 0) - (x[i] < 0)


@njit(cache=True, nogil=True)
def _square(x, out, a):
    for i in range(x.shape[0]):
        out[i] = x[i] * x[i]


@njit(cache=True, nogil=True)
def _clip(x, out, a):
    """Into [-a, a]."""
    for i in range(x.shape[0]):
        out[i] = min(max(x[i], -a), a)


@njit(cache=True, nogil=True)
def _sigmoid(x, out, a):
    for i in range(x.shape[0]):
        m = x[i]
        out[i] = 1.0 / (1.0 + math.exp(-m)) if m >= 0 else math.exp(m) / (1.0 + math.exp(m))


@njit(cache=True, nogil=True)
def _multiply(x, y, out, a):
    for i in range(x.shape[0]):
        out[i] = x[i] * y[i]


@njit(cache=True, nogil=True)
def _l1_pseudo_gradient(w, g, out, a):
    """OWL-QN's pseudo-gradient of f(w) + a |w|_1 given g, the gradient of f: the
    steepest-descent direction's negative, 0 where no direction descends."""
    for i in range(w.shape[0]):
        if w[i] > 0:
            out[i] = g[i] + a
        elif w[i] < 0:
            out[i] = g[i] - a
        elif g[i] + a < 0:
            out[i] = g[i] + a
        elif g[i] - a > 0:
            out[i] = g[i] - a
        else:
            out[i] = 0.0


@njit(cache=True, nogil=True)
def _orthant(w, pg, out, a):
    """The orthant a step from w may not leave: sign(w), or sign(-pg) where w is 0."""
    for i in range(w.shape[0]):
        if w[i] != 0:
            out[i] = 1.0 if w[i] > 0 else -1.0
        else:
            out[i] = 1.0 if pg[i] < 0 else (-1.0 if pg[i] > 0 else 0.0)


@njit(cache=True, nogil=True)
def _keep_sign(x, sign, out, a):
    """x where it has the sign `sign` gives, else 0 (OWL-QN's projections)."""
    for i in range(x.shape[0]):
        out[i] = x[i] if x[i] * sign[i] > 0 else 0.0


MAPS = {"abs": _abs, "sign": _sign, "square": _square, "clip": _clip, "sigmoid": _sigmoid}
ZIPS = {"multiply": _multiply, "l1_pseudo_gradient": _l1_pseudo_gradient,
        "orthant": _orthant, "keep_sign": _keep_sign}
