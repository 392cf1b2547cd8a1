"""Optimizer settings and their update on a server's state rows."""
from dataclasses import dataclass, replace

import numpy as np

from . import defaults
from ..base.errors import ConfigError
from ..kernels import optim

NAMES = tuple(optim.STATE_COLUMNS)
DEFAULT_FTRL_BETA = 1e-3   # for 1000-row minibatches; a job chooses defaults.damping
ADAM_BETAS = (0.9, 0.999)


@dataclass(frozen=True)
class Optimizer:
    """A server-side update rule. `lr` is FTRL's alpha (None: not yet chosen, see
    `with_default_lr`); `beta` is used by FTRL only and `eps` by AdaGrad and Adam only (a
    job sets both to `defaults.damping`; beta None: not yet chosen); Adam's moment decays
    are the paper's, 0.9 and 0.999. `average_from`, SGD only: the
    clock from which the model is the mean of the weights (averaged SGD; None: the last
    weights)."""
    name: str = "adagrad"
    lr: float | None = None
    l1: float = 0.0
    l2: float = 0.0
    beta: float | None = DEFAULT_FTRL_BETA
    eps: float = 1e-8
    average_from: int | None = None

    def __post_init__(self):
        if self.name not in NAMES:
            raise ConfigError(f"--optimizer must be one of {', '.join(NAMES)}, got {self.name!r}")
        for flag, value in (("--lr", 1.0 if self.lr is None else self.lr),
                            ("--ftrl-beta", 1.0 if self.beta is None else self.beta)):
            if not value > 0:
                raise ConfigError(f"{flag} must be positive, got {value}")
        for flag, value in (("--l1", self.l1), ("--l2", self.l2)):
            if not value >= 0:
                raise ConfigError(f"{flag} must be >= 0, got {value}")
        if self.average_from is not None and self.name != "sgd":
            raise ConfigError(f"--average-after needs --optimizer sgd (got --optimizer "
                              f"{self.name})")
        if self.average_from is not None and self.average_from < 0:
            raise ConfigError(f"--average-after must be >= 0 epochs, got clock "
                              f"{self.average_from}")

    def with_default_lr(self, stats, batch: int = defaults.MAX_BATCH,
                        workers: int = 1) -> "Optimizer":
        """This optimizer with its learning rate chosen by `defaults.learning_rate`, if none
        was set. `stats`: a `defaults.DataStats`, or the features per row (bias included) of
        binary rows, whose X^T X / n has a top eigenvalue of at most that."""
        if self.lr is not None:
            return self
        if not isinstance(stats, defaults.DataStats):
            stats = defaults.DataStats(features=stats, typical=1.0, sq_norm=stats,
                                       curvature=stats)
        return replace(self, lr=defaults.learning_rate(self.name, stats, batch, workers)[0])

    def state_columns(self, width: int) -> int:
        """float32 columns per key: the weights plus the optimizer's state."""
        if self.name == "sgd" and self.average_from is None:
            return width
        return optim.STATE_COLUMNS[self.name] * width + optim.KEY_COLUMNS.get(self.name, 0)

    def _span(self, clock: int) -> float:
        """Clocks of the average that have passed by `clock` (0 while none is averaged)."""
        if self.average_from is None:
            return 0.0
        return float(max(clock - self.average_from, 0))

    def update(self, state: np.ndarray, slots: np.ndarray, grads: np.ndarray,
               clock: int = 0) -> None:
        """Apply one pushed gradient (rows aligned with `slots`), pushed at the worker's
        `clock`, to the state in place."""
        if self.lr is None:
            raise ValueError("no learning rate: set lr, or call with_default_lr first")
        if self.name == "ftrl" and self.beta is None:
            raise ValueError("no FTRL beta: set beta (see defaults.damping)")
        if self.name == "sgd":
            optim.sgd_update(state, slots, grads, self.lr, self.l2, self._span(clock),
                             self.average_from is not None)
        elif self.name == "adagrad":
            optim.adagrad_update(state, slots, grads, self.lr, self.l2, self.eps)
        elif self.name == "adam":
            optim.adam_update(state, slots, grads, self.lr, self.l2, ADAM_BETAS[0],
                              ADAM_BETAS[1], self.eps)
        else:
            optim.ftrl_update(state, slots, grads, self.lr, self.beta, self.l1, self.l2)

    @property
    def averages(self) -> bool:
        """Whether the model is a mean kept beside the weights (averaged SGD), not the weights
        themselves."""
        return self.name == "sgd" and self.average_from is not None

    def weights(self, state: np.ndarray, width: int, clocks: int) -> np.ndarray:
        """The model's weights[len(state), width] of these state rows once `clocks` clocks
        are done: the weights, or with averaged SGD their mean since `average_from`."""
        if not self.averages:
            return np.ascontiguousarray(state[:, :width])
        out = np.empty((state.shape[0], width), np.float32)
        optim.sgd_average(state, width, self._span(clocks), out)
        return out
