"""Optimizer settings, a job's choice of update rule and its parameters, and the columns
each rule keeps per key; the rules themselves (numba kernels) are models.updates'."""
from dataclasses import dataclass, replace

from ..base.errors import ConfigError

DEFAULT_FTRL_BETA = 1e-3   # for 1000-row minibatches; a job chooses defaults.damping
ADAM_BETAS = (0.9, 0.999)

# The float32 columns of each update rule's state row per weight (kernels.optim gives their
# layout), and per key: averaged SGD's span, Adam's count of pushes. Its keys are the rules,
# in the order --optimizer lists them (models.updates.RULES registers each).
STATE_COLUMNS = {"sgd": 2, "adagrad": 2, "ftrl": 3, "adam": 3}
KEY_COLUMNS = {"sgd": 1, "adam": 1}
NAMES = tuple(STATE_COLUMNS)


@dataclass(frozen=True)
class Optimizer:
    """The settings of a server-side update rule (models.updates.RULES[name]), the
    optimizer part of a job's configuration. `lr` is FTRL's alpha (None: not yet chosen, see
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

    def with_default_lr(self, stats, batch: int | None = None,
                        workers: int = 1) -> "Optimizer":
        """This optimizer with its learning rate chosen by `defaults.learning_rate`, if none
        was set. `stats`: a `defaults.DataStats`, or the features per row (bias included) of
        binary rows, whose X^T X / n has a top eigenvalue of at most that; `batch`: rows per
        minibatch (None: defaults.MAX_BATCH)."""
        from . import defaults  # not at the top: it reads rows with numba's kernels
        if self.lr is not None:
            return self
        if batch is None:
            batch = defaults.MAX_BATCH
        if not isinstance(stats, defaults.DataStats):
            stats = defaults.DataStats(features=stats, typical=1.0, sq_norm=stats,
                                       curvature=stats)
        return replace(self, lr=defaults.learning_rate(self.name, stats, batch, workers)[0])

    def state_columns(self, width: int) -> int:
        """float32 columns per key: the weights plus the optimizer's state."""
        if self.name == "sgd" and self.average_from is None:
            return width
        return STATE_COLUMNS[self.name] * width + KEY_COLUMNS.get(self.name, 0)

    def averaging_span(self, clock: int) -> float:
        """Clocks of the average that have passed by `clock` (0 while none is averaged)."""
        if self.average_from is None:
            return 0.0
        return float(max(clock - self.average_from, 0))

    @property
    def averages(self) -> bool:
        """Whether the model is a mean kept beside the weights (averaged SGD), not the weights
        themselves."""
        return self.name == "sgd" and self.average_from is not None
