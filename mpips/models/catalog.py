"""What a model is to the rest of mpips: the width of its rows on the servers, how a new
row starts there, and its margins and logloss gradient on a minibatch (numba kernels). The
worker loop, scoring, `evaluate`, the warm-up and the servers' tables use only this, so a
model is a class here, not a branch there.

Pulled weights are float32[n_keys, width], one row per unique key of the minibatch; a
minibatch's CSR columns index those rows; `bias_col` is the bias key's row, or -1. Every
model implements the `Model` protocol (tests/unit/test_model_protocol.py checks it).
"""
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..base.errors import ConfigError, InputError
from ..data.textfile import BIAS_KEY
from ..kernels.fm import fm_gradient, fm_init, fm_margins
from ..kernels.logistic import logistic_gradient, logistic_margins
from ..kernels.mlp import dense_backward, dense_forward, logistic_loss
from ..kernels.shapes import FIELD_SHIFT
from ..kernels.widedeep import scatter_sparse, wide_and_pooled
from . import specs
from .network import init_layer, mlp
from .specs import ModelName


@runtime_checkable
class Model(Protocol):
    """What the rest of mpips uses of a model."""

    @property
    def name(self) -> str:
        """Its --model name (a ModelName)."""

    @property
    def width(self) -> int:
        """float32 columns of a key's row on the servers."""

    @property
    def starts_at_zero(self) -> bool:
        """Whether a new key's row is all zeros (else `init` fills it)."""

    def init(self, keys: np.ndarray, out: np.ndarray) -> None:
        """Fill `out`, the rows of new `keys`, with their first values."""

    def reserved_keys(self) -> np.ndarray:
        """The keys of the rows the model itself holds (none, or a network's weights)."""

    def gradient(self, batch, cols, bias_col: int, weights: np.ndarray) -> tuple:
        """(the mean logloss gradient float32[n_keys, width], the summed logloss before the
        update) of a minibatch."""

    def margins(self, batch, cols, bias_col: int, weights: np.ndarray) -> np.ndarray:
        """float64[rows]: each row's margin."""

    def describe(self) -> dict:
        """The model's name and parameters, for the summary and the logs."""


@dataclass(frozen=True)
class LogisticRegression:
    """margin = b + w . x; a new key starts at zero."""
    name = "lr"
    width = 1
    starts_at_zero = True

    def init(self, keys: np.ndarray, out: np.ndarray) -> None:
        out[:] = 0.0

    def reserved_keys(self) -> np.ndarray:
        return np.empty(0, np.uint64)

    def gradient(self, batch, cols, bias_col: int, weights: np.ndarray):
        """(mean logloss gradient float32[n_keys, 1], summed logloss before the update)."""
        grad = np.empty(weights.shape[0], np.float32)
        loss = logistic_gradient(batch.indptr, cols, batch.values, batch.labels, bias_col,
                                 weights.reshape(-1), grad)
        return grad.reshape(-1, 1), loss

    def margins(self, batch, cols, bias_col: int, weights: np.ndarray) -> np.ndarray:
        out = np.empty(len(batch))
        logistic_margins(batch.indptr, cols, batch.values, bias_col, weights.reshape(-1), out)
        return out

    def describe(self) -> dict:
        return {"name": self.name}


@dataclass(frozen=True)
class FactorizationMachine:
    """Rows [w, v_1 .. v_k] (kernels.fm); a new key's latent vector starts small and
    random (standard deviation `init_scale`), a function of the key alone, else every
    pairwise term and its gradient would stay zero."""
    factors: int
    init_scale: float = 0.01
    seed: int = 0
    name = "fm"
    starts_at_zero = False

    def __post_init__(self):
        specs.check_factors(self.factors)

    @property
    def width(self) -> int:
        return 1 + self.factors

    def init(self, keys: np.ndarray, out: np.ndarray) -> None:
        fm_init(keys, self.seed, self.init_scale, out)

    def reserved_keys(self) -> np.ndarray:
        return np.empty(0, np.uint64)

    def gradient(self, batch, cols, bias_col: int, weights: np.ndarray):
        grad = np.empty(weights.shape, np.float32)
        loss = fm_gradient(batch.indptr, cols, batch.values, batch.labels, bias_col, weights,
                           grad)
        return grad, loss

    def margins(self, batch, cols, bias_col: int, weights: np.ndarray) -> np.ndarray:
        out = np.empty(len(batch))
        fm_margins(batch.indptr, cols, batch.values, bias_col, weights, out)
        return out

    def describe(self) -> dict:
        return {"name": self.name, "factors": self.factors, "init_scale": self.init_scale,
                "seed": self.seed}


@dataclass(frozen=True)
class WideDeep:
    """Wide & Deep (Cheng et al. 2016) on the parameter server: each key's row is [w, e_1..e_k],
    its wide weight and its embedding; margin = b + w . x + MLP(deep input), the MLP of
    `hidden` ReLU layers and one output. With `fields` F > 0 the deep input is the F fields'
    embeddings concatenated (field f's: the sum of x_i e_i over the row's features of field
    f, a key's top byte; F k values); with 0, the sum of all x_i e_i (k values), for data
    whose keys carry no field. The MLP's weights are rows too, under the keys just
    below the bias key (`reserved_keys`), pulled with every minibatch and updated by the
    servers' optimizer like any row: so they follow the job's consistency model, its
    checkpoints and its copies unchanged."""
    embedding_dim: int
    hidden: tuple = (64, 32)
    fields: int = 0
    init_scale: float = 0.01
    seed: int = 0
    name = "widedeep"
    starts_at_zero = False

    def __post_init__(self):
        specs.check_network(self.embedding_dim, self.hidden, self.fields)

    @property
    def width(self) -> int:
        return 1 + self.embedding_dim

    @property
    def deep_inputs(self) -> int:
        """The network's input width: k, or the concatenated fields' F k."""
        return specs.deep_inputs(self.embedding_dim, self.fields)

    @property
    def layers(self) -> list:
        return mlp(self.deep_inputs, list(self.hidden))

    def slots(self, batch) -> np.ndarray:
        """Each nonzero's block of the deep input: its key's field (empty when summing)."""
        if not self.fields:
            return np.empty(0, np.int64)
        slots = (batch.indices >> FIELD_SHIFT).astype(np.int64)
        if slots.size and slots.max() >= self.fields:
            raise InputError(f"the data has a feature in field {slots.max()} (its key's top "
                             f"byte), but the network concatenates --fields {self.fields} "
                             f"fields, 0 to {self.fields - 1}: give --fields "
                             f"{slots.max() + 1} or more, or 0 to sum the embeddings")
        return slots

    def layer_rows(self) -> list:
        """The rows each layer's weights and biases fill, every layer from a row's start, so
        a stage of a pipeline (see job/stage_part) pulls and pushes its own layers' rows only."""
        return [-(-(layer.inputs * layer.outputs + layer.outputs) // self.width)
                for layer in self.layers]

    def reserved_keys(self, layers: range | None = None) -> np.ndarray:
        """The keys of the rows that hold the network's weights (of `layers`; None: all),
        ascending, just below the bias key."""
        counts = self.layer_rows()
        layers = range(len(counts)) if layers is None else layers
        first = BIAS_KEY - np.uint64(sum(counts)) + np.uint64(sum(counts[:layers.start]))
        return first + np.arange(sum(counts[layers.start:layers.stop]), dtype=np.uint64)

    def unpack(self, rows: np.ndarray, layers: range | None = None) -> list:
        """[(w, b)] float64 of `layers` (None: all) from their rows."""
        counts, out, at = self.layer_rows(), [], 0
        for i in range(len(counts)) if layers is None else layers:
            layer, n = self.layers[i], self.layers[i].inputs * self.layers[i].outputs
            flat = rows[at:at + counts[i]].astype(np.float64).ravel()
            out.append((flat[:n].reshape(layer.inputs, layer.outputs), flat[n:n + layer.outputs]))
            at += counts[i]
        return out

    def pack(self, weights: list, layers: range | None = None) -> np.ndarray:
        """The rows float32[n, width] of `layers`' [(w, b)] (None: all layers), zero-padded."""
        counts = self.layer_rows()
        counts = counts if layers is None else counts[layers.start:layers.stop]
        out = np.zeros((sum(counts), self.width), np.float32)
        flat, at = out.reshape(-1), 0
        for count, (w, b) in zip(counts, weights):
            flat[at:at + w.size] = w.ravel()
            flat[at + w.size:at + w.size + b.size] = b
            at += count * self.width
        return out

    def init(self, keys: np.ndarray, out: np.ndarray) -> None:
        fm_init(keys, self.seed, self.init_scale, out)
        for i in range(len(self.layers)):   # a layer's first weights only if asked for
            mine = self.reserved_keys(range(i, i + 1))
            asked = (keys >= mine[0]) & (keys <= mine[-1])
            if asked.any():
                rows = self.pack([init_layer(self.layers, i, self.seed)], range(i, i + 1))
                out[asked] = rows[(keys[asked] - mine[0]).astype(np.int64)]

    @staticmethod
    def own_rows(bias_col: int, n_rows: int, count: int) -> slice:
        """Where the `count` rows of the model's own keys sit among a pull's `n_rows` rows:
        just before the bias row (KeyIndexer puts them there), or last without a bias."""
        end = bias_col if bias_col >= 0 else n_rows
        return slice(end - count, end)

    def sparse_forward(self, batch, cols, bias_col: int, weights: np.ndarray) -> tuple:
        """(the rows' wide margins, the network's input: their pooled embeddings), float64."""
        wide = np.empty(len(batch))
        pooled = np.empty((len(batch), self.deep_inputs))
        wide_and_pooled(batch.indptr, cols, batch.values, self.slots(batch), bias_col, weights,
                        wide, pooled)
        return wide, pooled

    def sparse_gradient(self, batch, cols, bias_col: int, dmargin: np.ndarray,
                        dpooled: np.ndarray, shape: tuple) -> np.ndarray:
        """float32 rows of `shape`: the keys' and the bias's gradients from the loss's
        gradient by margin and by the network's input (the network's rows left zero)."""
        grad = np.zeros(shape, np.float32)
        scatter_sparse(batch.indptr, cols, batch.values, self.slots(batch), bias_col, dmargin,
                       dpooled, grad)
        return grad

    def _forward(self, batch, cols, bias_col: int, weights: np.ndarray) -> tuple:
        own = self.own_rows(bias_col, weights.shape[0], self.reserved_keys().shape[0])
        mlp_weights = self.unpack(weights[own])
        wide, pooled = self.sparse_forward(batch, cols, bias_col, weights)
        acts = [pooled]
        for layer, (w, b) in zip(self.layers, mlp_weights):
            acts.append(dense_forward(acts[-1], w, b, layer.activation))
        return wide + acts[-1][:, 0], acts, mlp_weights, own

    def gradient(self, batch, cols, bias_col: int, weights: np.ndarray):
        margin, acts, mlp_weights, own = self._forward(batch, cols, bias_col, weights)
        loss, dmargin = logistic_loss(margin[:, None], batch.labels.astype(np.float64))
        dmargin /= max(len(batch), 1)   # the mean gradient, as the other models give
        d = dmargin
        grads: list = []   # each layer's (dw, db), the last layer's first
        for i in reversed(range(len(self.layers))):
            d, dw, db = dense_backward(d, acts[i], acts[i + 1], mlp_weights[i][0],
                                       self.layers[i].activation)
            grads.insert(0, (dw, db))
        grad = self.sparse_gradient(batch, cols, bias_col, dmargin[:, 0], d, weights.shape)
        grad[own] = self.pack(grads)
        return grad, loss

    def margins(self, batch, cols, bias_col: int, weights: np.ndarray) -> np.ndarray:
        return self._forward(batch, cols, bias_col, weights)[0]

    def describe(self) -> dict:
        return {"name": self.name, "embedding_dim": self.embedding_dim,
                "hidden": list(self.hidden), "fields": self.fields,
                "init_scale": self.init_scale, "seed": self.seed}


MODELS = {ModelName.LR: LogisticRegression, ModelName.FM: FactorizationMachine,
          ModelName.WIDEDEEP: WideDeep}


def model_of(name: str = "lr", factors: int = 8, embedding_dim: int = 8,
             hidden: tuple = (64, 32), fields: int = 0) -> Model:
    """The model `--model NAME` (with --factors K, or --embedding-dim, --hidden and --fields)
    stands for."""
    if name == ModelName.LR:
        return LogisticRegression()
    if name == ModelName.FM:
        return FactorizationMachine(factors)
    if name == ModelName.WIDEDEEP:
        return WideDeep(embedding_dim, tuple(hidden), fields)
    raise ConfigError(f"--model must be one of {', '.join(specs.NAMES)}, got {name!r}")


def from_config(config: dict) -> Model:
    """The model of a saved run's configuration (runs before models were chosen: lr)."""
    return model_of(config.get("model", "lr"), int(config.get("factors", 8)),
                    int(config.get("embedding_dim", 8)), tuple(config.get("hidden", (64, 32))),
                    int(config.get("fields") or 0))
