"""What a model is to the rest of mpips: the width of its rows on the servers, how a new
row starts there, and its margins and logloss gradient on a minibatch (numba kernels). The
worker loop, scoring, `evaluate`, the warm-up and the servers' tables use only this, so a
model is a class here, not a branch there.

Pulled weights are float32[n_keys, width], one row per unique key of the minibatch; a
minibatch's CSR columns index those rows; `bias_col` is the bias key's row, or -1.
"""
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError
from .kernels.fm import fm_gradient, fm_init, fm_margins
from .kernels.logistic import logistic_gradient, logistic_margins

NAMES = ("lr", "fm")


@dataclass(frozen=True)
class LogisticRegression:
    """margin = b + w . x; a new key starts at zero."""
    name = "lr"
    width = 1
    starts_at_zero = True

    def init(self, keys: np.ndarray, out: np.ndarray) -> None:
        out[:] = 0.0

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
        if not 1 <= self.factors <= 1024:
            raise ConfigError(f"--factors must be from 1 to 1024, got {self.factors}")

    @property
    def width(self) -> int:
        return 1 + self.factors

    def init(self, keys: np.ndarray, out: np.ndarray) -> None:
        fm_init(keys, self.seed, self.init_scale, out)

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


def model_of(name: str = "lr", factors: int = 8):
    """The model `--model NAME --factors K` stands for."""
    if name == "lr":
        return LogisticRegression()
    if name == "fm":
        return FactorizationMachine(factors)
    raise ConfigError(f"--model must be one of {', '.join(NAMES)}, got {name!r}")


def from_config(config: dict):
    """The model of a saved run's configuration (runs before models were chosen: lr)."""
    return model_of(config.get("model", "lr"), int(config.get("factors", 8)))
