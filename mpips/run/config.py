"""The configuration of a training job, in parts (the data, the model, the optimizer, the
solver, consistency, fault tolerance, checkpoints, the pipeline, push filters, diagnostics),
the checks each part makes of itself, and its flat record in
summary.json, the model files and the checkpoints' manifests (the checks of the whole:
config_checks; its closed choices: config_choices)."""
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, get_type_hints

from ..base.choices import Choice
from ..base.errors import ConfigError
from ..data.inputs import fields_of
from ..models import specs
from ..models.optimizer import Optimizer
from ..models.specs import ModelName
from .config_choices import (
    Balance,
    Consistency,
    DataFormat,
    PushValues,
    Schedule,
    Solver,
    set_choice,
)

MAX_VNODES = 4096
STARTUP_S = 120.0   # the least time a rank waits for the others before training


@dataclass(frozen=True)
class DataConfig:
    """What the job reads, and where it writes."""
    train: str
    test: str | None = None
    format: DataFormat | None = None   # None: as each file's first line
    skip_bad_lines: bool = False
    out: str | None = None             # None: runs/<run id>
    overwrite: bool = False

    def __post_init__(self):
        set_choice(self, "format", DataFormat, "--format")


@dataclass(frozen=True)
class LayoutConfig:
    """The ranks that serve, and what each may hold."""
    servers: int = 1
    vnodes: int = 16                     # key ranges per server (see placement)
    max_rank_memory: int | None = None   # bytes a rank may hold in its tables and rows


@dataclass(frozen=True)
class ModelConfig:
    """The model trained (see models.catalog)."""
    name: ModelName = ModelName.LR
    bias: bool = True
    factors: int = 8                # fm: the latent vector's length
    embedding_dim: int = 8          # widedeep: each key's embedding length
    hidden: tuple = (64, 32)        # widedeep: the MLP's hidden layer widths
    fields: int | None = None       # widedeep: fields concatenated (0: summed; None: the data's)

    def __post_init__(self):
        set_choice(self, "name", ModelName, "--model")

    def spec(self):
        """The models.* object this job trains (a catalog.Model)."""
        from ..models import catalog  # not at the top: its kernels load numba
        return catalog.model_of(self.name, self.factors, self.embedding_dim, self.hidden,
                               self.fields or 0)

    def check(self) -> None:
        """ConfigError if the model's sizes are out of range (as `spec` would raise)."""
        specs.check(self.name, self.factors, self.embedding_dim, self.hidden, self.fields or 0)


@dataclass(frozen=True)
class SolverConfig:
    """How the objective is minimized: minibatches (the servers' optimizers), or full-batch
    L-BFGS over dense tables."""
    name: Solver = Solver.MINIBATCH
    epochs: int = 1
    batch_size: int | None = None   # None: chosen from the data (defaults.batch_size)
    average_after: float | None = None   # SGD: epochs before averaging (None: 0.5; < 0: never)
    dim: int = 1 << 20              # lbfgs: coordinates of the weights (a feature: key mod dim)
    history: int = 10               # lbfgs: pairs of the inverse Hessian's approximation
    max_iter: int = 500             # lbfgs
    tol: float = 1e-10              # lbfgs: stop when an iteration gains less (relative)

    def __post_init__(self):
        set_choice(self, "name", Solver, "--solver")

    @property
    def full_batch(self) -> bool:
        """Full-batch L-BFGS: workers hold their rows, the servers dense tables; no
        minibatches, no clocks, no server-side optimizer."""
        return self.name == Solver.LBFGS

    @property
    def step(self) -> str:
        """What the job counts its progress, checkpoints and stops in."""
        return "iteration" if self.full_batch else "clock"


@dataclass(frozen=True)
class ConsistencyConfig:
    """When a worker may read (see wire.clocks)."""
    mode: Consistency = Consistency.BSP
    staleness: int | None = None    # SSP only
    balance: Balance = Balance.STATIC

    def __post_init__(self):
        set_choice(self, "mode", Consistency, "--consistency")
        set_choice(self, "balance", Balance, "--balance")

    @property
    def dynamic(self) -> bool:
        """Whether the lead hands out the rows as the workers ask (--balance dynamic)."""
        return self.balance == Balance.DYNAMIC

    def check(self) -> None:
        """ConfigError for a staleness SSP lacks, or that is not SSP's."""
        mode, staleness = self.mode, self.staleness
        if mode == Consistency.SSP and not 0 <= (staleness or 0) < 2**31:
            raise ConfigError(f"--staleness must be a number of clocks from 0 to 2^31-1, "
                              f"got {staleness}")
        if mode == Consistency.SSP and staleness is None:
            raise ConfigError("--consistency ssp needs --staleness S, a number of clocks >= 0")
        if mode != Consistency.SSP and staleness is not None:
            raise ConfigError(f"--staleness applies to --consistency ssp, not {mode}")

    @property
    def max_staleness(self) -> int | None:
        """Clocks a reader may be ahead of the slowest worker: 0 for BSP, None (any) for ASP."""
        return {Consistency.BSP: 0, Consistency.ASP: None}.get(self.mode, self.staleness)


@dataclass(frozen=True)
class FaultToleranceConfig:
    """Copies of the keys, stand-in servers, and how long a rank waits for another."""
    replicas: int = 1               # copies of each key, on as many servers
    spares: int = 0                 # server ranks holding nothing, standing in for dead ones
    timeout: float = 600.0
    disk_wait: float = 600.0        # how long a model that cannot be saved waits for space

    def check(self) -> None:
        """ConfigError for waits that are not a number of seconds."""
        if not 0 < self.timeout < float("inf"):
            raise ConfigError(f"--timeout must be a positive number of seconds, got "
                              f"{self.timeout}")
        if not 0 <= self.disk_wait < float("inf"):
            raise ConfigError(f"--disk-wait must be a number of seconds >= 0, got "
                              f"{self.disk_wait}")

    @property
    def startup_timeout(self) -> float:
        """How long a rank waits for the others before training (compiling or loading kernels,
        sampling the data, loading a checkpoint): --timeout, but at least STARTUP_S. On a
        loaded node these take seconds; a short --timeout is meant for silence in training."""
        valid = (self.timeout if 0 < self.timeout < float("inf")
                 else FaultToleranceConfig.timeout)
        return max(valid, STARTUP_S)


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints (cold backup), and the one a job resumes from. None, for `every`,
    `seconds` and `keep`: not given, so the run resumed's, else the default (see
    `TrainConfig.with_checkpointing`)."""
    dir: str | None = None          # None: OUT/checkpoints
    every: int | None = None        # clocks; 0: only when the job is asked to stop
    seconds: float | None = None    # or seconds between checkpoints; 0: by clocks
    keep: int | None = None
    resume: str | None = None       # a checkpoint directory to continue from
    allow_changed_data: bool = False   # resume even if --train changed since the checkpoint
    inline: bool = False            # write a server's file in its loop, not in a forked writer

    def check(self) -> None:
        """ConfigError for intervals or counts out of range, a --resume that is no directory."""
        if (self.every or 0) < 0 or (self.seconds or 0) < 0:
            raise ConfigError("--checkpoint-every must not be negative")
        if self.keep is not None and self.keep < 1:
            raise ConfigError(f"--keep-checkpoints must be at least 1, got {self.keep}")
        if self.resume is not None and not os.path.isdir(self.resume):
            raise ConfigError(f"--resume {self.resume}: no such directory")
        if self.allow_changed_data and self.resume is None:
            raise ConfigError("--allow-changed-data applies to --resume only")

    @property
    def on(self) -> bool:
        """Whether checkpoints are written as training goes (not only when asked to stop)."""
        return bool(self.every or self.seconds)   # None (not given yet) counts as 0


@dataclass(frozen=True)
class PipelineConfig:
    """Wide & Deep's network cut into stages across workers (see stage_part)."""
    stages: int = 1
    micro_batches: int = 4          # a minibatch's parts in the pipeline
    schedule: Schedule = Schedule.ONE_F_ONE_B

    def __post_init__(self):
        set_choice(self, "schedule", Schedule, "--pipeline")


@dataclass(frozen=True)
class PushConfig:
    """What a worker's pushes send of its gradients (see pushfilter)."""
    values: PushValues = PushValues.FLOAT32
    threshold: float = 0.0          # a key's row is held back while all its entries are below
    skip_zeros: bool = False        # ftrl --l1: held back while its weight would stay 0

    def __post_init__(self):
        set_choice(self, "values", PushValues, "--push-values")

    @property
    def filtered(self) -> bool:
        """Whether pushes go through a push filter."""
        return self.values != PushValues.FLOAT32 or self.threshold > 0 or self.skip_zeros


@dataclass(frozen=True)
class DiagnosticsConfig:
    """Progress lines, snapshots and testing aids."""
    log_every: float = 5.0
    snapshot_every: float | None = None
    tensorboard: str | None = None  # where the lead writes TensorBoard's event files
    record_pulls: bool = False
    stragglers: tuple = ()          # ((worker, slowdown factor[, clocks]), ...): a testing aid
    test_events: tuple = ()         # events at a point of the job: a testing aid (testevents)

    def check(self, workers: int) -> None:
        """ConfigError for a straggler that is no worker of `workers`, or named twice, or a
        snapshot interval not positive."""
        slowed = [worker for worker, *_ in self.stragglers]
        if len(set(slowed)) < len(slowed):
            raise ConfigError(f"--straggler names a worker more than once: {sorted(slowed)}")
        for worker, factor, *clocks in self.stragglers:
            if clocks and not clocks[0] >= 1:
                raise ConfigError(f"--straggler {worker}:{factor}:{clocks[0]}: slowed for "
                                  f"{clocks[0]} clocks in every {2 * clocks[0]}: give 1 or more")
            if not 0 <= worker < workers:
                raise ConfigError(f"--straggler {worker}:{factor}: worker {worker} does not exist "
                                  f"(workers are 0..{workers - 1})")
            if not 1 <= factor < float("inf"):
                raise ConfigError(f"--straggler {worker}:{factor}: the factor must be >= 1")
        if self.snapshot_every is not None and not self.snapshot_every > 0:
            raise ConfigError(f"--snapshot-every must be positive, got {self.snapshot_every}")

    def slowdown(self, worker: int, clock: int = 0) -> float:
        """How many times as long `worker` takes for its minibatch of clock `clock`."""
        for slowed, factor, *clocks in self.stragglers:
            if slowed == worker:
                return factor if not clocks or (clock // clocks[0]) % 2 == 0 else 1.0
        return 1.0


# The record's flat keys, in its order, and where each is in a TrainConfig (part, field).
RECORD = (("train", "data", "train"), ("out", "data", "out"), ("test", "data", "test"),
          ("servers", "layout", "servers"), ("replicas", "faults", "replicas"),
          ("spares", "faults", "spares"), ("vnodes", "layout", "vnodes"),
          ("epochs", "solver", "epochs"), ("batch_size", "solver", "batch_size"),
          ("optimizer", "optimizer", None), ("average_after", "solver", "average_after"),
          ("bias", "model", "bias"), ("consistency", "consistency", "mode"),
          ("staleness", "consistency", "staleness"),
          ("stragglers", "diagnostics", "stragglers"),
          ("test_events", "diagnostics", "test_events"),
          ("record_pulls", "diagnostics", "record_pulls"),
          ("snapshot_every", "diagnostics", "snapshot_every"),
          ("skip_bad_lines", "data", "skip_bad_lines"), ("overwrite", "data", "overwrite"),
          ("checkpoint_dir", "checkpointing", "dir"),
          ("checkpoint_every", "checkpointing", "every"),
          ("checkpoint_seconds", "checkpointing", "seconds"),
          ("keep_checkpoints", "checkpointing", "keep"),
          ("resume", "checkpointing", "resume"),
          ("allow_changed_data", "checkpointing", "allow_changed_data"),
          ("timeout", "faults", "timeout"), ("disk_wait", "faults", "disk_wait"),
          ("log_every", "diagnostics", "log_every"), ("solver", "solver", "name"),
          ("dim", "solver", "dim"), ("history", "solver", "history"),
          ("max_iter", "solver", "max_iter"), ("tol", "solver", "tol"),
          ("max_rank_memory", "layout", "max_rank_memory"), ("model", "model", "name"),
          ("factors", "model", "factors"), ("embedding_dim", "model", "embedding_dim"),
          ("hidden", "model", "hidden"), ("fields", "model", "fields"),
          ("format", "data", "format"), ("stages", "pipeline", "stages"),
          ("micro_batches", "pipeline", "micro_batches"), ("pipeline", "pipeline", "schedule"),
          ("push_values", "push", "values"), ("push_threshold", "push", "threshold"),
          ("push_skip_zeros", "push", "skip_zeros"),
          ("tensorboard", "diagnostics", "tensorboard"),
          ("checkpoint_inline", "checkpointing", "inline"),
          ("balance", "consistency", "balance"))


@dataclass(frozen=True)
class TrainConfig:
    """A training job's configuration: its parts. Built from the command line or from
    `mpips.train`'s options by run.options."""
    data: DataConfig
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: Optimizer = field(default_factory=Optimizer)
    solver: SolverConfig = field(default_factory=SolverConfig)
    consistency: ConsistencyConfig = field(default_factory=ConsistencyConfig)
    faults: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)
    checkpointing: CheckpointConfig = field(default_factory=CheckpointConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    push: PushConfig = field(default_factory=PushConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)

    def to_record(self) -> dict:
        """The flat record of this configuration (summary.json, the model files, the
        checkpoints' manifests): one key per option, the enums as their strings."""
        record = {}
        for key, part, name in RECORD:
            value = getattr(self, part) if name is None else getattr(getattr(self, part), name)
            if isinstance(value, Choice):
                value = value.value
            record[key] = asdict(value) if key == "optimizer" else _copy(value)
        return record

    @classmethod
    def from_record(cls, record: dict) -> "TrainConfig":
        """The configuration of a flat record; what it lacks (written by an older version)
        is the default."""
        types = get_type_hints(cls)
        parts: dict = {name: {} for name in types}
        for key, part, name in RECORD:
            if key in record and key != "optimizer":
                value = record[key]
                parts[part][name] = (tuple(map(tuple, value)) if key == "stragglers" else
                                     tuple(value) if isinstance(value, list) else value)
        built = {part: types[part](**values) for part, values in parts.items() if values}
        built["optimizer"] = Optimizer(**record.get("optimizer", {}))
        return cls(**built)

    def with_data_fields(self) -> "TrainConfig":
        """--fields not given: as many as the training data's keys carry (see
        inputs.fields_of), for Wide & Deep."""
        if self.model.fields is not None:
            return self
        fields = fields_of(self.data.train) if self.model.name == ModelName.WIDEDEEP else 0
        return replace(self, model=replace(self.model, fields=fields))

    @property
    def server_ranks(self) -> int:
        """The ranks that serve: the servers and their spares."""
        return self.layout.servers + self.faults.spares

    @property
    def run_dir(self) -> str:
        """--out, which the job sets (to runs/<run id> if not given) before anything reads it."""
        assert self.data.out is not None, "the run directory is read before the job named it"
        return self.data.out

    @property
    def model_dir(self) -> str:
        return os.path.join(self.run_dir, "model")

    @property
    def checkpoints(self) -> str:
        """The directory checkpoints go to."""
        return self.checkpointing.dir or os.path.join(self.run_dir, "checkpoints")

    def with_checkpointing(self, resumed: dict | None) -> "TrainConfig":
        """The checkpoint settings not given: those of the run resumed (its configuration's
        record), else the defaults (none by clocks or time, keep 3)."""
        saved, ckpt = resumed or {}, self.checkpointing
        fill: dict[str, Any] = {}
        if ckpt.every is None and ckpt.seconds is None:
            fill["every"] = saved.get("checkpoint_every") or 0
            fill["seconds"] = saved.get("checkpoint_seconds") or 0.0
        if ckpt.keep is None:
            fill["keep"] = saved.get("keep_checkpoints") or 3
        return replace(self, checkpointing=replace(ckpt, **fill))


def _copy(value):
    """A record's value: tuples (also nested) stay tuples, as asdict leaves them."""
    return tuple(map(_copy, value)) if isinstance(value, tuple) else value
