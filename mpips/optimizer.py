"""Optimizer settings and their update on a server's state rows."""
from dataclasses import dataclass, replace

import numpy as np

from .errors import ConfigError
from .kernels import optim

NAMES = tuple(optim.STATE_COLUMNS)
# The default learning rate is LR_SCALE / (features per row, bias included). Each step moves
# every feature of a row by about the rate, so a margin moves by about rate x features: rows
# twice as dense want half the rate (0.1 for 20 features, 0.05 for 40, measured).
LR_SCALE = {"sgd": 40.0, "adagrad": 2.0, "ftrl": 2.0}
# Workers push the mean gradient of a minibatch, so FTRL's beta is in those units: the
# paper's beta = 1 for single examples corresponds to about 1e-3 for 1000-row minibatches.
DEFAULT_FTRL_BETA = 1e-3


@dataclass(frozen=True)
class Optimizer:
    """A server-side update rule. `lr` is FTRL's alpha (None: not yet chosen, see
    `with_default_lr`); `beta` is used by FTRL only."""
    name: str = "adagrad"
    lr: float | None = None
    l1: float = 0.0
    l2: float = 0.0
    beta: float = DEFAULT_FTRL_BETA
    eps: float = 1e-8

    def __post_init__(self):
        if self.name not in NAMES:
            raise ConfigError(f"--optimizer must be one of {', '.join(NAMES)}, got {self.name!r}")
        for flag, value in (("--lr", 1.0 if self.lr is None else self.lr),
                            ("--ftrl-beta", self.beta)):
            if not value > 0:
                raise ConfigError(f"{flag} must be positive, got {value}")
        for flag, value in (("--l1", self.l1), ("--l2", self.l2)):
            if not value >= 0:
                raise ConfigError(f"{flag} must be >= 0, got {value}")
        if self.l1 > 0 and self.name != "ftrl":
            raise ConfigError(f"--l1 needs --optimizer ftrl (got --optimizer {self.name})")

    def with_default_lr(self, features_per_row: float) -> "Optimizer":
        """This optimizer with its learning rate chosen for rows this dense, if none was set."""
        if self.lr is not None:
            return self
        return replace(self, lr=LR_SCALE[self.name] / max(features_per_row, 1.0))

    def state_columns(self, width: int) -> int:
        """float32 columns per key: the weights plus the optimizer's per-weight state."""
        return optim.STATE_COLUMNS[self.name] * width

    def update(self, state: np.ndarray, slots: np.ndarray, grads: np.ndarray) -> None:
        """Apply one pushed gradient (rows aligned with `slots`) to the state in place."""
        if self.lr is None:
            raise ValueError("no learning rate: set lr, or call with_default_lr first")
        if self.name == "sgd":
            optim.sgd_update(state, slots, grads, self.lr, self.l2)
        elif self.name == "adagrad":
            optim.adagrad_update(state, slots, grads, self.lr, self.l2, self.eps)
        else:
            optim.ftrl_update(state, slots, grads, self.lr, self.beta, self.l1, self.l2)
