"""Defaults chosen from the training data: the minibatch size, and each optimizer's learning
rate from the feature values, the minibatch and the number of workers. Pure functions, no MPI.

Measured on generated stand-ins (bench/defaults.py): a census-like set of 30,000 rows with
123 one-hot features, a set of 20,000 rows with 10 real-valued features of different
magnitudes, and the built-in 500,000 rows of 20 hashed features.
"""
import math
from dataclasses import dataclass

import numpy as np

from ..data.textfile import Rows
from ..kernels.csr import scatter_add

MAX_BATCH = 1000
# Updates per epoch the default minibatch gives each worker. On small data the last model
# is only as good as the number of steps that made it: with 30,000 rows, 1,000-row
# minibatches leave 30 updates and one epoch ends far behind a per-example learner.
CLOCKS_PER_EPOCH = 1000
# SGD's one rate is bounded by the most frequent features' curvature, and moves a rare key
# by rate / batch per row that has it; smaller minibatches let rare keys learn. Measured on
# the built-in data (3 workers): one epoch 5.6% above the optimum with 1,000 updates per
# epoch, 3.1% with 2,600 (bench/defaults.py).
SGD_CLOCKS_PER_EPOCH = 2500
# Epochs before averaged SGD's model starts to be the mean of the weights. With the rate at
# 1 / L the last weights are noisy: on the census-like set one epoch ended 5% above Vowpal
# Wabbit's one pass with the last weights, 0.3% with the mean from half an epoch on; five
# epochs 0.06% above the optimum (bench/defaults.py).
AVERAGE_AFTER = 0.5
FEW_CLOCKS = 100            # a --batch-size that leaves fewer updates per epoch is warned about
CURVATURE_ROWS = 20000      # rows of the sample the top eigenvalue is measured on
POWER_STEPS = 40


@dataclass(frozen=True)
class DataStats:
    """Figures of the training rows the defaults depend on, the always-on bias feature
    included when the model has one."""
    features: float = 1.0     # mean non-zeros per row
    typical: float = 1.0      # median |value| of the non-zeros
    sq_norm: float = 1.0      # mean sum of x^2 per row
    curvature: float = 1.0    # top eigenvalue of X^T X / n


def measure(rows: Rows, bias: bool) -> DataStats:
    """DataStats of a sample of rows (all 1.0 if it is empty)."""
    n = len(rows)
    if n == 0:
        return DataStats()
    if not np.isfinite(rows.values).all():   # training stops on them, saying where
        rows = Rows(rows.labels, rows.indptr, rows.indices,
                    np.where(np.isfinite(rows.values), rows.values, 0).astype(np.float32))
    values = np.abs(rows.values.astype(np.float64))
    pool = np.concatenate([values, np.ones(n)]) if bias else values
    typical = float(np.median(pool)) if pool.size else 1.0
    return DataStats(features=values.shape[0] / n + bias, typical=typical or 1.0,
                     sq_norm=float((values ** 2).sum() / n + bias),
                     curvature=top_eigenvalue(_spread_rows(rows, CURVATURE_ROWS), bias))


def _spread_rows(rows: Rows, most: int, runs: int = 8) -> Rows:
    """At most `most` rows, in `runs` evenly spaced runs (a sorted file is not measured by its
    first rows alone)."""
    n = len(rows)
    if n <= most:
        return rows
    size = most // runs
    return Rows.concat([rows.slice(a, a + size) for a in
                        (i * (n - size) // (runs - 1) for i in range(runs))])


def top_eigenvalue(rows: Rows, bias: bool, steps: int = POWER_STEPS) -> float:
    """The largest eigenvalue of X^T X / n (X with a column of ones when `bias`), by power
    iteration from the all-ones vector."""
    n = len(rows)
    if n == 0:
        return 1.0
    keys, cols = np.unique(rows.indices, return_inverse=True)
    cols = cols.ravel()
    row_of = np.repeat(np.arange(n), np.diff(rows.indptr))
    values = rows.values.astype(np.float64)
    v = np.ones(keys.shape[0] + bias)
    estimate = 0.0
    for _ in range(steps):
        xv = np.zeros(n)
        scatter_add(row_of, values, v, cols, xv)
        if bias:
            xv += v[-1]
        w = np.zeros(keys.shape[0])
        scatter_add(cols, values, xv, row_of, w)
        w /= n
        if bias:
            w = np.append(w, xv.sum() / n)
        norm = float(np.linalg.norm(w))
        if norm == 0:
            return 1.0
        estimate = norm / float(np.linalg.norm(v))
        v = w / norm
    return estimate


def batch_size(per_worker: list, exact: bool, clocks: int = CLOCKS_PER_EPOCH) -> int:
    """Rows per minibatch: about `clocks` updates per epoch for the worker with the fewest
    rows, at most MAX_BATCH. Workers push a minibatch's mean gradient, so a last
    minibatch of a few rows weighs as much as a full one, with the noise of a few rows (on
    the census-like set with 3 workers, a last minibatch of 1 row of 9 left SGD 8% worse).
    When every worker's row count is known: the largest size down to half the aim whose
    last minibatches are at least half full, else the one whose emptiest is fullest. With
    no row counts at all (the data could not be sampled), MAX_BATCH."""
    aim = max(1, min(MAX_BATCH, min(per_worker, default=MAX_BATCH * clocks) // clocks))
    if not exact or not per_worker:
        return aim

    def fullest(size):   # how full the emptiest last minibatch is
        return min((n % size or size) / size for n in per_worker)
    sizes = range(aim, (aim + 1) // 2 - 1, -1)
    return next((s for s in sizes if fullest(s) >= 0.5), max(sizes, key=fullest))


def clocks_warning(per_worker: list, batch: int, aim: int = CLOCKS_PER_EPOCH) -> str | None:
    """A warning if minibatches of `batch` rows leave a worker few updates per epoch."""
    shortest = min(per_worker, default=0)
    clocks = -(-shortest // batch)
    if shortest == 0 or clocks >= FEW_CLOCKS:
        return None
    return (f"--batch-size {batch} leaves the worker with the fewest rows ({shortest:,}) "
            f"{clocks} update(s) per epoch; one epoch of so few steps trains a poor model. "
            f"Leave --batch-size out to have a size chosen for about {aim} "
            f"updates per epoch, or train more --epochs")


def learning_rate(name: str, stats: DataStats, batch: int, workers: int,
                  epochs: int = 1) -> tuple[float, str]:
    """(rate, how it was chosen) for optimizer `name`, for a job of `epochs` epochs."""
    if name == "sgd":
        # The logistic loss's curvature is at most a quarter of X^T X / n's. A clock applies
        # `workers` pushes of `batch`-row mean gradients computed at the same weights, whose
        # curvature together is at most about L below (a minibatch adds |x|^2 / batch to the
        # top eigenvalue). Gradient steps diverge above 2 / L; at 1 / L the noise of small
        # minibatches is left to the averaging (see `average_from`), not to a smaller rate
        # that would slow every feature whose curvature is below L.
        curvature = (workers * stats.curvature + stats.sq_norm / batch) / 4
        return 1.0 / curvature, (
            f"1 / L, L = ({workers} worker(s) x {stats.curvature:.3g} top eigenvalue of "
            f"X'X/n + {stats.sq_norm:.3g} mean |x|^2 / {batch} rows) / 4 = {curvature:.3g}")
    # An AdaGrad or FTRL step moves each weight it touches by up to about the rate, whatever
    # the gradient's size, so a row's margin moves by about rate x features x their typical
    # value: 2 / (features per row x typical |value|), which is the earlier 2 / features per
    # row on binary data. The median, not the mean: per-key rates already shrink the steps
    # of the few large-valued features, and small-valued ones need the larger weights.
    scale = max(stats.features * stats.typical, 1e-6)
    if name == "adam":
        # Adam's steps keep about the rate (its second moment forgets), where AdaGrad's
        # shrink as its sum grows: a tenth, measured (bench/defaults.py). With a constant
        # rate it ends at a distance from the optimum that grows with the rate, so a longer
        # job takes smaller steps: 1 / sqrt(epochs), as for SGD over a known horizon (five
        # epochs on the dense set: 1.3% above the optimum at a tenth, 0.4% at this).
        rate = 0.2 / scale / math.sqrt(max(epochs, 1))
        return rate, (f"0.2 / ({stats.features:.1f} features per row x {stats.typical:.3g} "
                      f"typical |value|)" + (f" / sqrt({epochs} epochs)" if epochs > 1 else ""))
    return 2.0 / scale, (f"2 / ({stats.features:.1f} features per row x {stats.typical:.3g} "
                         f"typical |value|)")


def average_from(per_worker: list, batch: int, epochs: float | None = AVERAGE_AFTER
                 ) -> int | None:
    """The clock from which averaged SGD's model is the mean of the weights: after `epochs`
    epochs of the worker with the fewest rows (None: no averaging, or no row counts). The
    first steps are far from the optimum and would weigh on the mean; after them,
    constant-rate steps circle the optimum at a distance set by the minibatch noise, and
    their mean is much closer (Polyak and Juditsky 1992)."""
    if epochs is None or not per_worker:
        return None
    return round(epochs * -(-min(per_worker) // batch))


def damping(batch: int) -> float:
    """FTRL's beta and AdaGrad's epsilon, in the per-key rates alpha / (beta + sqrt(n)) and
    lr / (sqrt(n) + eps). The FTRL paper's beta = 1 is for single examples; workers push the
    mean gradient of `batch` rows, where a key in one row has 1 / batch of that row's
    gradient: 1 / batch in those units. It damps the first steps of rare keys, which would
    otherwise each move by the full rate whatever their gradient, and over several epochs
    fit noise (measured on the built-in data: five AdaGrad epochs 2.9% above the optimum
    with eps 1e-8, 0.4% with 1 / batch)."""
    return 1.0 / batch


def choose(rows: Rows, per_worker: list, exact: bool, *, workers: int, bias: bool,
           optimizer: str, lr: float | None, batch: int | None,
           resumed_batch: int | None = None, beta: float | None = None,
           average_after: float | None = AVERAGE_AFTER, resumed: dict | None = None,
           epochs: int = 1) -> dict:
    """The minibatch size, learning rate, FTRL beta, AdaGrad eps and averaged SGD's first
    clock a job of `workers` workers uses (those given stay; None: chosen; eps has no
    option), with log lines saying what was chosen and why, and warnings. `rows`: a sample
    of the training rows; `per_worker`: each worker's row count (exact or not), or [] if
    unknown; `average_after`: epochs before SGD averages (None: never); `resumed`: the
    optimizer settings of the run resumed, whose averaging is kept."""
    notes, warnings = [], []
    clocks = SGD_CLOCKS_PER_EPOCH if optimizer == "sgd" else CLOCKS_PER_EPOCH
    if batch is None and resumed_batch:
        batch = resumed_batch
        notes.append(f"minibatches of {batch} rows per worker, as the run resumed")
    elif batch is None:
        batch = batch_size(per_worker, exact, clocks)
        shortest = (f"{'' if exact else 'about '}{min(per_worker):,}" if per_worker
                    else "an unknown number of")
        notes.append(f"minibatches of {batch} rows per worker, for about {clocks} "
                     f"updates per epoch and at most {MAX_BATCH} rows (the worker with the "
                     f"fewest rows has {shortest}) (set --batch-size to change)")
    else:
        warning = clocks_warning(per_worker, batch, clocks)
        if warning:
            warnings.append(warning)
    if lr is None:
        lr, why = learning_rate(optimizer, measure(rows, bias), batch, workers, epochs)
        notes.append(f"{optimizer} learning rate {lr:.4g}: {why} (set --lr to change)")
    eps = damping(batch)
    if beta is None:
        beta = eps
        if optimizer == "ftrl":
            notes.append(f"ftrl beta {beta:.4g}: 1 / {batch} rows per minibatch, the paper's "
                         f"1 per example (set --ftrl-beta to change)")
    if optimizer in ("adagrad", "adam"):
        notes.append(f"{optimizer} eps {eps:.4g}: 1 / {batch} rows per minibatch")
    first = None
    if optimizer == "sgd" and resumed is not None:
        first = resumed.get("average_from")
        notes.append("sgd model: " + (f"the mean of the weights from clock {first}, as the run "
                                      f"resumed" if first is not None else
                                      "the last weights, as the run resumed"))
    elif optimizer == "sgd":
        first = average_from(per_worker, batch, average_after)
        notes.append("sgd model: " + (
            "the last weights (--average-after off)" if average_after is None else
            "the last weights: the workers' row counts are unknown" if first is None else
            f"the mean of the weights from clock {first} ({average_after:g} epoch(s) of the "
            f"worker with the fewest rows) to the end (set --average-after to change)"))
    return {"batch_size": batch, "lr": lr, "beta": beta, "eps": eps, "average_from": first,
            "notes": notes, "warnings": warnings}
