"""A network as data, cut into pipeline stages.

A network is a list of dense layers (the deep part; its input comes from the embeddings
pulled from the servers). `partition` cuts it into S contiguous stages of balanced cost;
`Stage` runs its layers' forward and backward one micro-batch at a time, holding each
micro-batch's activations until its backward, and adds the micro-batches' gradients in
micro-batch order (so every schedule gives the same bits). No MPI here; a schedule played
in one process is pipeline.inprocess.run_step."""
import time
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from ..kernels.mlp import ACTIVATIONS, dense_backward, dense_forward, logistic_loss


@dataclass(frozen=True)
class Dense:
    inputs: int
    outputs: int
    activation: str = "relu"

    def __post_init__(self):
        if self.inputs < 1 or self.outputs < 1:
            raise ValueError(f"a dense layer needs positive sizes, got {self.inputs} x "
                             f"{self.outputs}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got "
                             f"{self.activation!r}")

    @property
    def cost(self) -> float:
        """Multiply-adds per example, forward (backward is twice that, for every layer)."""
        return float(self.inputs * self.outputs)


def mlp(inputs: int, hidden: list) -> list:
    """Hidden ReLU layers of the given widths, then one logit."""
    widths = [inputs, *hidden]
    return ([Dense(a, b) for a, b in pairwise(widths)] +
            [Dense(widths[-1], 1, "identity")])


def init(layers: list, seed: int, dtype=np.float64) -> list:
    """[(w, b)] per layer: He-uniform weights from `seed` (one stream over the layers in
    order), zero biases."""
    return [init_layer(layers, i, seed, dtype) for i in range(len(layers))]


def init_layer(layers: list, i: int, seed: int, dtype=np.float64) -> tuple:
    """Layer i's (w, b) of init(layers, seed), made without the other layers': the stream
    is advanced past theirs (one 64-bit draw per uniform double)."""
    bits = np.random.PCG64(seed)
    bits.advance(sum(a.inputs * a.outputs for a in layers[:i]))
    rng = np.random.Generator(bits)
    layer = layers[i]
    bound = np.sqrt(6.0 / layer.inputs)
    return (rng.uniform(-bound, bound, (layer.inputs, layer.outputs)).astype(dtype),
            np.zeros(layer.outputs, dtype))


def forward(layers: list, weights: list, x: np.ndarray) -> np.ndarray:
    """The layers' output for x, keeping nothing (scoring)."""
    for layer, (w, b) in zip(layers, weights):
        x = dense_forward(x, w, b, layer.activation)
    return x


def measured_costs(layers: list, weights: list | None, rows: int, repeats: int = 3) -> list:
    """Seconds per layer for the forward and backward of `rows` random examples, the best
    of `repeats`: what `partition` balances when the layers' sizes alone mislead (BLAS is
    faster per multiply-add on wide layers than on narrow ones). `weights` None: each
    layer's are made for its turn only, so no more than one layer is ever held."""
    rng = np.random.default_rng(0)
    costs = []
    for i, layer in enumerate(layers):
        w, b = weights[i] if weights is not None else init_layer(layers, i, 0)
        x = rng.normal(size=(rows, layer.inputs)).astype(w.dtype)
        best = np.inf
        for _ in range(repeats):
            start = time.perf_counter()
            y = dense_forward(x, w, b, layer.activation)
            dense_backward(np.ones_like(y), x, y, w, layer.activation)
            best = min(best, time.perf_counter() - start)
        costs.append(best)
    return costs


def partition(costs: list, stages: int) -> list:
    """Contiguous ranges of layer indices, one per stage, that minimize the most costly
    stage (ties: the earliest cut). Every stage gets at least one layer."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"{n} layer(s) cannot be cut into {stages} stage(s): each stage "
                         f"needs a layer")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    # best[k][i]: the least possible most costly stage for the first i layers in k stages.
    best = np.full((stages + 1, n + 1), np.inf)
    cut = np.zeros((stages + 1, n + 1), np.int64)
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                worst = max(best[k - 1][j], prefix[i] - prefix[j])
                if worst < best[k][i]:
                    best[k][i], cut[k][i] = worst, j
    ends, i = [], n
    for k in range(stages, 0, -1):
        ends.append(i)
        i = int(cut[k][i])
    ends.reverse()
    return [range(a, b) for a, b in zip([0, *ends[:-1]], ends)]


class Stage:
    """One stage's layers and weights, its held activations, its summed gradients."""

    def __init__(self, layers: list, weights: list, micros: int, last: bool,
                 mean_over: int | None = None):
        """`mean_over` (the last stage): the loss's gradient is divided by it before it goes
        back through the layers, as a whole minibatch's mean gradient is."""
        self.layers, self.weights, self.last = layers, weights, last
        self.micros, self.mean_over = micros, mean_over
        # micro-batch -> the input of each layer, the last output, labels and offsets
        self._held: dict[int, tuple] = {}
        # the weights' gradients of micro-batches 0 .. _next - 1, added
        self._sum: list | None = None
        self._next = 0
        self._early: dict[int, list] = {}   # a micro-batch's gradients that came before its turn
        self.loss = 0.0
        # the last stage: micro-batch -> the loss's gradient by logit
        self.dlogits: dict[int, np.ndarray] = {}
        self.held_bytes = self.peak_held_bytes = 0   # activations kept for backwards

    def forward(self, micro: int, x: np.ndarray, labels: np.ndarray | None = None,
                offsets: np.ndarray | None = None):
        """The stage's output for micro-batch `micro` (the last stage: its summed loss, of
        the output plus `offsets`, such as Wide & Deep's wide margins)."""
        inputs = []
        for layer, (w, b) in zip(self.layers, self.weights):
            inputs.append(x)
            x = dense_forward(x, w, b, layer.activation)
        self._held[micro] = (inputs, x, labels, offsets)
        self.held_bytes += x.nbytes + sum(a.nbytes for a in inputs)
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        if self.last:
            assert labels is not None, "the last stage is given the labels"
            loss, _ = logistic_loss(self._logits(x, offsets), labels)
            return loss
        return x

    @staticmethod
    def _logits(y: np.ndarray, offsets: np.ndarray | None) -> np.ndarray:
        return y if offsets is None else offsets[:, None] + y

    def backward(self, micro: int, dout: np.ndarray | None = None) -> np.ndarray:
        """The gradient with respect to the stage's input (the last stage starts from its
        loss); keeps the weights' gradients of this micro-batch."""
        inputs, y, labels, offsets = self._held.pop(micro)
        self.held_bytes -= y.nbytes + sum(a.nbytes for a in inputs)
        if self.last:
            loss, dout = logistic_loss(self._logits(y, offsets), labels)
            if self.mean_over:
                dout /= self.mean_over
            self.loss += loss
            self.dlogits[micro] = dout[:, 0]
        assert dout is not None, "a stage before the last is given the gradient by its output"
        grads = []
        for layer, (w, _), x in zip(reversed(self.layers), reversed(self.weights),
                                    reversed(inputs)):
            dout, dw, db = dense_backward(dout, x, y, w, layer.activation)
            grads.append((dw, db))
            y = x
        self._early[micro] = grads[::-1]
        while self._next in self._early:   # added in micro-batch order, as they come
            grads = self._early.pop(self._next)
            if self._sum is None:
                self._sum = grads
            else:
                for (dw, db), (gw, gb) in zip(self._sum, grads):
                    dw += gw
                    db += gb
            self._next += 1
        return dout

    def update(self, lr: float, examples: int, combine=None) -> None:
        """w -= lr * (the gradients of every micro-batch, added in micro-batch order) /
        examples. `combine` (data-parallel copies of the pipeline): the gradients, one flat
        vector, -> their sum over every copy (examples counts them all)."""
        summed = [g for pair in self.summed() for g in pair]
        if combine is not None:
            flat = combine(np.concatenate([g.ravel() for g in summed]))
            ends = np.cumsum([g.size for g in summed])
            summed = [part.reshape(g.shape) for part, g in zip(np.split(flat, ends[:-1]), summed)]
        for (w, b), dw, db in zip(self.weights, summed[0::2], summed[1::2]):
            w -= (lr / examples) * dw
            b -= (lr / examples) * db

    def summed(self) -> list:
        """[(dw, db)] per layer: every micro-batch's gradients added in micro-batch order;
        then the stage starts a new step."""
        if self._next < self.micros or self._held or self._sum is None:
            raise RuntimeError("update before every micro-batch's backward")
        out, self._sum, self._next = self._sum, None, 0
        return out


def stages_of(layers: list, weights: list, cuts: list, micros: int) -> list:
    return [Stage(layers[c.start:c.stop], weights[c.start:c.stop], micros,
                  last=i == len(cuts) - 1) for i, c in enumerate(cuts)]
