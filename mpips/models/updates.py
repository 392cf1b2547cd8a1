"""The update rules the servers apply to their state rows (numba kernels, kernels.optim),
registered by Optimizer name (`register`, `RULES`), as the servers' dense operations are;
`update` applies an Optimizer's, `weights` makes the final model of state rows."""
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..kernels import optim
from .optimizer import ADAM_BETAS, Optimizer


@dataclass(frozen=True)
class Rule:
    """An update rule: `apply(optimizer, state, slots, grads, clock)` updates the state rows
    in place, reading the `parameters` of the Optimizer it names (its columns:
    optimizer.STATE_COLUMNS and KEY_COLUMNS)."""
    name: str
    apply: Callable
    parameters: tuple


RULES: dict = {}   # name -> Rule, in the order registered (that of optimizer.NAMES)


def register(name: str, *parameters: str):
    """Register the decorated function as the update rule `name`, reading `parameters`."""
    def add(apply):
        RULES[name] = Rule(name, apply, parameters)
        return apply
    return add


def update(opt: Optimizer, state: np.ndarray, slots: np.ndarray, grads: np.ndarray,
           clock: int = 0) -> None:
    """Apply one pushed gradient (rows aligned with `slots`), pushed at the worker's
    `clock`, to the state in place, by `opt`'s rule."""
    applier(opt)(state, slots, grads, clock)


def applier(opt: Optimizer) -> Callable[[np.ndarray, np.ndarray, np.ndarray, int], None]:
    """`update` by `opt`'s rule with its settings checked and its rule found once (a server
    applies it to every push): (state, slots, grads, clock) -> None."""
    rule = RULES[opt.name]
    if opt.lr is None:
        return _refuse("no learning rate: set lr, or call with_default_lr first")
    if "beta" in rule.parameters and opt.beta is None:
        return _refuse("no FTRL beta: set beta (see defaults.damping)")
    return partial(rule.apply, opt)


def _refuse(why: str) -> Callable:
    def refused(state, slots, grads, clock) -> None:
        raise ValueError(why)
    return refused


def weights(opt: Optimizer, state: np.ndarray, width: int, clocks: int) -> np.ndarray:
    """The model's weights[len(state), width] of these state rows of `opt` once `clocks`
    clocks are done: the weights, or with averaged SGD their mean since `average_from`."""
    if not opt.averages:
        return np.ascontiguousarray(state[:, :width])
    out = np.empty((state.shape[0], width), np.float32)
    optim.sgd_average(state, width, opt.averaging_span(clocks), out)
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
