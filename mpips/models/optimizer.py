"""Optimizer settings, and the update rules the servers apply to their state rows,
registered by name (`register`), as the servers' dense operations are."""
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..base.errors import ConfigError
from ..kernels import optim
from . import defaults

DEFAULT_FTRL_BETA = 1e-3   # for 1000-row minibatches; a job chooses defaults.damping
ADAM_BETAS = (0.9, 0.999)


@dataclass(frozen=True)
class Rule:
    """An update rule: `apply(optimizer, state, slots, grads, clock)` updates the state rows
    in place, reading the `parameters` of the Optimizer it names; a key's row holds
    `state_columns` float32 columns per weight and `key_columns` more."""
    name: str
    apply: Callable
    parameters: tuple
    state_columns: int
    key_columns: int


RULES: dict = {}   # name -> Rule, in the order registered


def register(name: str, *parameters: str):
    """Register the decorated function as the update rule `name`, reading `parameters`; its
    columns are the kernels' (optim.STATE_COLUMNS, optim.KEY_COLUMNS)."""
    def add(apply):
        RULES[name] = Rule(name, apply, parameters, optim.STATE_COLUMNS[name],
                           optim.KEY_COLUMNS.get(name, 0))
        return apply
    return add


@dataclass(frozen=True)
class Optimizer:
    """The settings of a server-side update rule (RULES[name]), the optimizer part of a
    job's configuration. `lr` is FTRL's alpha (None: not yet chosen, see
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
        if self.name not in RULES:
            raise ConfigError(f"--optimizer must be one of {', '.join(RULES)}, got {self.name!r}")
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
        rule = RULES[self.name]
        return rule.state_columns * width + rule.key_columns

    def averaging_span(self, clock: int) -> float:
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
        rule = RULES[self.name]
        if "beta" in rule.parameters and self.beta is None:
            raise ValueError("no FTRL beta: set beta (see defaults.damping)")
        rule.apply(self, state, slots, grads, clock)

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
        optim.sgd_average(state, width, self.averaging_span(clocks), out)
        return out


@register("sgd", "lr", "l2", "average_from")
def _sgd(opt: Optimizer, state, slots, grads, clock: int) -> None:
    optim.sgd_update(state, slots, grads, opt.lr, opt.l2, opt.averaging_span(clock),
                     opt.average_from is not None)


@register("adagrad", "lr", "l2", "eps")
def _adagrad(opt: Optimizer, state, slots, grads, clock: int) -> None:
    optim.adagrad_update(state, slots, grads, opt.lr, opt.l2, opt.eps)


@register("ftrl", "lr", "beta", "l1", "l2")
def _ftrl(opt: Optimizer, state, slots, grads, clock: int) -> None:
    optim.ftrl_update(state, slots, grads, opt.lr, opt.beta, opt.l1, opt.l2)


@register("adam", "lr", "l2", "eps")
def _adam(opt: Optimizer, state, slots, grads, clock: int) -> None:
    optim.adam_update(state, slots, grads, opt.lr, opt.l2, ADAM_BETAS[0], ADAM_BETAS[1],
                      opt.eps)


NAMES = tuple(RULES)
