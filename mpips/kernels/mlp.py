"""Dense layers of a multilayer perceptron and the logistic loss: forward and backward over a
micro-batch, pure numpy (the products go to BLAS). No MPI."""
import numpy as np

ACTIVATIONS = ("relu", "identity")


def dense_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray, activation: str) -> np.ndarray:
    """y = act(x @ w + b) for x[n, inputs], w[inputs, outputs], b[outputs]."""
    y = x @ w
    y += b
    if activation == "relu":
        np.maximum(y, 0, out=y)
    return y


def dense_backward(dy: np.ndarray, x: np.ndarray, y: np.ndarray, w: np.ndarray,
                   activation: str) -> tuple:
    """(dx, dw, db) from the gradient dy of the loss with respect to the layer's output y,
    given its input x."""
    if activation == "relu":
        dy = np.where(y > 0, dy, 0)
    return dy @ w.T, x.T @ dy, dy.sum(axis=0)


def logistic_loss(logits: np.ndarray, labels: np.ndarray) -> tuple:
    """(summed logloss, its gradient with respect to logits[n, 1]) for 0/1 labels."""
    z = logits[:, 0]
    loss = float(np.sum(np.logaddexp(0, z) - labels * z))
    p = 0.5 * (1 + np.tanh(0.5 * z))   # the sigmoid, without overflow
    return loss, (p - labels)[:, None].astype(logits.dtype)
