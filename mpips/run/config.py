"""The configuration of a training job, and the checks every rank can make the same way."""
import os
from dataclasses import asdict, dataclass, field, replace

from ..data import fingerprint
from ..models import catalog as models
from . import testevents
from ..base.errors import ConfigError
from ..models.optimizer import Optimizer
from ..data.textfile import sniff
from ..ranks.roles import check_servers
from ..data.shards import check_input, data_format, fields_of, format_mismatch

CONSISTENCY = ("bsp", "ssp", "asp")
SOLVERS = ("minibatch", "lbfgs")
MAX_VNODES = 4096
STARTUP_S = 120.0   # the least time a rank waits for the others before training


@dataclass(frozen=True)
class TrainConfig:
    train: str
    out: str | None = None          # None: runs/<run id>
    test: str | None = None
    servers: int = 1
    replicas: int = 1               # copies of each key, on as many servers
    spares: int = 0                 # server ranks holding nothing, standing in for dead ones
    vnodes: int = 16                # key ranges per server (see placement)
    epochs: int = 1
    batch_size: int | None = None   # None: chosen from the data (defaults.batch_size)
    optimizer: Optimizer = field(default_factory=Optimizer)
    average_after: float | None = None   # SGD: epochs before averaging (None: 0.5; < 0: never)
    bias: bool = True
    consistency: str = "bsp"
    staleness: int | None = None    # SSP only
    stragglers: tuple = ()          # ((worker, slowdown factor), ...): a testing aid
    test_events: tuple = ()         # events at a point of the job: a testing aid (testevents)
    record_pulls: bool = False
    snapshot_every: float | None = None
    skip_bad_lines: bool = False
    overwrite: bool = False
    checkpoint_dir: str | None = None   # None: OUT/checkpoints
    # None, for the three below: not given, so the run resumed's, else the default (see
    # `with_checkpointing`).
    checkpoint_every: int | None = None      # clocks; 0: only when the job is asked to stop
    checkpoint_seconds: float | None = None  # or seconds between checkpoints; 0: by clocks
    keep_checkpoints: int | None = None
    resume: str | None = None           # a checkpoint directory to continue from
    allow_changed_data: bool = False    # resume even if --train changed since the checkpoint
    timeout: float = 600.0
    disk_wait: float = 600.0            # how long a model that cannot be saved waits for space
    log_every: float = 5.0
    solver: str = "minibatch"       # or lbfgs: full batch over dense tables (see fullbatch)
    dim: int = 1 << 20              # lbfgs: coordinates of the weights (a feature: key mod dim)
    history: int = 10               # lbfgs: pairs of the inverse Hessian's approximation
    max_iter: int = 500             # lbfgs
    tol: float = 1e-10              # lbfgs: stop when an iteration gains less (relative)
    max_rank_memory: int | None = None   # bytes a rank may hold in its tables and rows
    model: str = "lr"               # see models: lr, or fm (factorization machine)
    factors: int = 8                # fm: the latent vector's length
    embedding_dim: int = 8          # widedeep: each key's embedding length
    hidden: tuple = (64, 32)        # widedeep: the MLP's hidden layer widths
    fields: int | None = None       # widedeep: fields concatenated (0: summed; None: the data's)
    format: str | None = None       # svmlight, libffm, criteo or avazu text (None: as each
                                    # file's first line)
    stages: int = 1                 # widedeep: workers per pipeline (see stagework)
    micro_batches: int = 4          # a minibatch's parts in the pipeline
    pipeline: str = "1f1b"          # the pipeline's schedule: gpipe or 1f1b
    push_values: str = "float32"    # how pushed values travel: float32, float16 or int8
    push_threshold: float = 0.0     # a key's row is held back while all its entries are below
    push_skip_zeros: bool = False   # ftrl --l1: held back while its weight would stay 0

    def model_spec(self):
        """The models.* object this job trains."""
        return models.model_of(self.model, self.factors, self.embedding_dim, self.hidden,
                               self.fields or 0)

    def with_data_fields(self) -> "TrainConfig":
        """--fields not given: as many as the training data's keys carry (see
        shards.fields_of), for Wide & Deep."""
        if self.fields is not None:
            return self
        return replace(self, fields=fields_of(self.train) if self.model == "widedeep" else 0)

    @property
    def server_ranks(self) -> int:
        """The ranks that serve: the servers and their spares."""
        return self.servers + self.spares

    def check(self, n_ranks: int) -> None:
        """Raise ConfigError for anything wrong that every rank can see the same way."""
        if self.spares < 0:
            raise ConfigError(f"--spares must be 0 or more, got {self.spares}")
        check_servers(self.server_ranks, n_ranks, self.spares)
        if not 1 <= self.replicas <= self.servers:
            raise ConfigError(f"--replicas {self.replicas}: each key is kept on that many "
                              f"servers, so it must be from 1 to --servers ({self.servers})")
        if not 1 <= self.vnodes <= MAX_VNODES:
            raise ConfigError(f"--vnodes must be from 1 to {MAX_VNODES} key ranges per server, "
                              f"got {self.vnodes}")
        batch = 1 if self.batch_size is None else self.batch_size   # None: chosen later
        for flag, value in (("--epochs", self.epochs), ("--batch-size", batch)):
            if value < 1:
                raise ConfigError(f"{flag} must be at least 1, got {value}")
        if not 0 < self.timeout < float("inf"):
            raise ConfigError(f"--timeout must be a positive number of seconds, got {self.timeout}")
        if not 0 <= self.disk_wait < float("inf"):
            raise ConfigError(f"--disk-wait must be a number of seconds >= 0, got {self.disk_wait}")
        if self.average_after is not None and self.optimizer.name != "sgd":
            raise ConfigError(f"--average-after needs --optimizer sgd (got --optimizer "
                              f"{self.optimizer.name})")
        if self.consistency not in CONSISTENCY:
            raise ConfigError(f"--consistency must be one of {', '.join(CONSISTENCY)}, "
                              f"got {self.consistency!r}")
        if self.consistency == "ssp" and not 0 <= (self.staleness or 0) < 2**31:
            raise ConfigError(f"--staleness must be a number of clocks from 0 to 2^31-1, "
                              f"got {self.staleness}")
        if self.consistency == "ssp" and self.staleness is None:
            raise ConfigError("--consistency ssp needs --staleness S, a number of clocks >= 0")
        if self.consistency != "ssp" and self.staleness is not None:
            raise ConfigError(f"--staleness applies to --consistency ssp, not {self.consistency}")
        slowed = [worker for worker, _ in self.stragglers]
        if len(set(slowed)) < len(slowed):
            raise ConfigError(f"--straggler names a worker more than once: {sorted(slowed)}")
        for worker, factor in self.stragglers:
            if not 0 <= worker < n_ranks - self.server_ranks:
                raise ConfigError(f"--straggler {worker}:{factor}: worker {worker} does not exist "
                                  f"(workers are 0..{n_ranks - self.server_ranks - 1})")
            if not 1 <= factor < float("inf"):
                raise ConfigError(f"--straggler {worker}:{factor}: the factor must be >= 1")
        if self.snapshot_every is not None and not self.snapshot_every > 0:
            raise ConfigError(f"--snapshot-every must be positive, got {self.snapshot_every}")
        try:
            testevents.check(self.test_events, n_ranks, self.server_ranks,
                             self.solver == "lbfgs")
        except testevents.EventError as e:
            raise ConfigError(str(e)) from None
        self._check_solver()
        self._check_push_filter()
        self.with_data_fields().model_spec()   # an unknown model, sizes out of range
        self._check_stages(n_ranks - self.server_ranks)
        if self.max_rank_memory is not None and self.max_rank_memory < 1 << 20:
            raise ConfigError(f"--max-rank-memory must be at least 1M, got "
                              f"{self.max_rank_memory} bytes")
        check_input(self.train, "--train", self.format)
        if self.test is not None:
            check_input(self.test, "--test", self.format)
            mismatch = format_mismatch(self.test, data_format(self.train),
                                       f"the model (--train {self.train})")
            if mismatch:
                raise ConfigError(f"--test {mismatch}")
        self._check_fields()
        if (self.checkpoint_every or 0) < 0 or (self.checkpoint_seconds or 0) < 0:
            raise ConfigError("--checkpoint-every must not be negative")
        if self.keep_checkpoints is not None and self.keep_checkpoints < 1:
            raise ConfigError(f"--keep-checkpoints must be at least 1, got {self.keep_checkpoints}")
        if self.resume is not None and not os.path.isdir(self.resume):
            raise ConfigError(f"--resume {self.resume}: no such directory")
        if self.allow_changed_data and self.resume is None:
            raise ConfigError("--allow-changed-data applies to --resume only")

    def _check_stages(self, workers: int) -> None:
        from ..pipeline.schedule import POLICIES
        from ..wire.tags import MAX_MICROS
        if self.pipeline not in POLICIES:
            raise ConfigError(f"--pipeline must be one of {', '.join(POLICIES)}, got "
                              f"{self.pipeline!r}")
        if not 1 <= self.micro_batches <= MAX_MICROS:
            raise ConfigError(f"--micro-batches must be from 1 to {MAX_MICROS}, got "
                              f"{self.micro_batches}")
        if self.stages == 1:
            return
        if self.stages < 1:
            raise ConfigError(f"--stages must be at least 1, got {self.stages}")
        if self.model != "widedeep" or self.solver != "minibatch":
            raise ConfigError(f"--stages {self.stages} splits Wide & Deep's network across "
                              f"workers: it needs --model widedeep (got --model {self.model}"
                              f"{' --solver ' + self.solver if self.solver != 'minibatch' else ''})")
        layers = len(self.hidden) + 1
        if self.stages > layers:
            raise ConfigError(f"--stages {self.stages}: the network has {layers} layers "
                              f"(--hidden {','.join(map(str, self.hidden))} and the output), "
                              f"and each stage needs one")
        if workers % self.stages:
            raise ConfigError(f"--stages {self.stages} needs whole pipelines: the job has "
                              f"{workers} worker(s), not a multiple of {self.stages}; launch "
                              f"{self.server_ranks + self.stages * max(workers // self.stages, 1)} "
                              f"ranks, or change --stages or --servers")

    def _check_fields(self) -> None:
        if not self.fields:
            return
        if self.model != "widedeep":
            raise ConfigError(f"--fields {self.fields} is the number of fields Wide & Deep "
                              f"concatenates: it needs --model widedeep (got --model "
                              f"{self.model})")
        fixed = fields_of(self.train)
        if os.path.isfile(self.train) and sniff(self.train).name == "svmlight":
            raise ConfigError(f"--fields {self.fields}: --train {self.train} is svmlight text, "
                              f"whose features carry no field; use libffm text (label "
                              f"field:idx:val ...), Criteo or Avazu, or --fields 0 to sum the "
                              f"embeddings")
        if fixed and self.fields < fixed:
            raise ConfigError(f"--fields {self.fields}: --train {self.train} has {fixed} fields "
                              f"(give --fields {fixed}, or 0 to sum the embeddings)")

    @property
    def filters_pushes(self) -> bool:
        """Whether pushes go through a push filter (see pushfilter)."""
        return (self.push_values != "float32" or self.push_threshold > 0
                or self.push_skip_zeros)

    def _check_push_filter(self) -> None:
        from ..wire.protocol import ENCODINGS
        if self.push_values not in ENCODINGS:
            raise ConfigError(f"--push-values must be one of {', '.join(ENCODINGS)}, got "
                              f"{self.push_values!r}")
        if not 0 <= self.push_threshold < float("inf"):
            raise ConfigError(f"--push-threshold must be a gradient magnitude >= 0, got "
                              f"{self.push_threshold}")
        if self.push_skip_zeros and not (self.optimizer.name == "ftrl" and self.optimizer.l1 > 0):
            raise ConfigError(f"--push-skip-zeros holds back gradients of weights FTRL's --l1 "
                              f"keeps at 0: it needs --optimizer ftrl and --l1 > 0 (got "
                              f"--optimizer {self.optimizer.name} --l1 {self.optimizer.l1:g})")
        if self.filters_pushes and self.solver != "minibatch":
            raise ConfigError(f"--push-values, --push-threshold and --push-skip-zeros filter "
                              f"the minibatch solver's pushes; --solver {self.solver} pushes "
                              f"none")
        if self.filters_pushes and self.stages > 1:
            raise ConfigError(f"--push-values, --push-threshold and --push-skip-zeros filter a "
                              f"worker's pushes of its minibatch's keys; with --stages "
                              f"{self.stages} the later stages push the network's layers, "
                              f"whose held-back rows no last push would deliver: train "
                              f"without the filters, or without --stages")

    def _check_solver(self) -> None:
        if self.solver not in SOLVERS:
            raise ConfigError(f"--solver must be one of {', '.join(SOLVERS)}, got "
                              f"{self.solver!r}")
        if self.solver == "minibatch":
            if self.optimizer.l1 > 0 and self.optimizer.name != "ftrl":
                raise ConfigError(f"--l1 needs --optimizer ftrl or --solver lbfgs (got "
                                  f"--optimizer {self.optimizer.name})")
            return
        # Full batch: every step needs every worker (BSP by nature); checkpoints are every
        # so many iterations.
        refused = [(self.consistency != "bsp", f"--consistency {self.consistency}"),
                   (bool(self.checkpoint_seconds), "--checkpoint-every in seconds (give "
                                                   "it in iterations)"),
                   (self.epochs != 1, f"--epochs {self.epochs} (see --max-iter)"),
                   (self.batch_size is not None, "--batch-size (every step reads all rows)"),
                   (self.snapshot_every is not None, "--snapshot-every"),
                   (self.model != "lr", f"--model {self.model} (full batch trains lr)"),
                   (bool(self.stragglers), "--straggler")]
        for wrong, flag in refused:
            if wrong:
                raise ConfigError(f"--solver lbfgs does not take {flag}")
        for flag, value, low, high in (("--dim", self.dim, 1, (1 << 40) - 1),
                                       ("--history", self.history, 1, 1000),
                                       ("--max-iter", self.max_iter, 1, 10**9)):
            if not low <= value <= high:
                raise ConfigError(f"{flag} must be from {low} to {high}, got {value}")
        if not 0 <= self.tol < 1:
            raise ConfigError(f"--tol must be from 0 to 1, got {self.tol}")

    @property
    def model_dir(self) -> str:
        return os.path.join(self.out, "model")

    @property
    def checkpoints(self) -> str:
        return self.checkpoint_dir or os.path.join(self.out, "checkpoints")

    def with_checkpointing(self, resumed: dict | None) -> "TrainConfig":
        """The checkpoint settings not given: those of the run resumed (its configuration),
        else the defaults (none by clocks or time, keep 3)."""
        saved = resumed or {}
        fill = {}
        if self.checkpoint_every is None and self.checkpoint_seconds is None:
            fill["checkpoint_every"] = saved.get("checkpoint_every") or 0
            fill["checkpoint_seconds"] = saved.get("checkpoint_seconds") or 0.0
        if self.keep_checkpoints is None:
            fill["keep_checkpoints"] = saved.get("keep_checkpoints") or 3
        return replace(self, **fill)

    @property
    def checkpoints_on(self) -> bool:
        """Whether checkpoints are written as training goes (not only when asked to stop)."""
        return self.checkpoint_every > 0 or self.checkpoint_seconds > 0

    @property
    def max_staleness(self) -> int | None:
        """Clocks a reader may be ahead of the slowest worker: 0 for BSP, None (any) for ASP."""
        return {"bsp": 0, "asp": None}.get(self.consistency, self.staleness)

    @property
    def startup_timeout(self) -> float:
        """How long a rank waits for the others before training (compiling or loading kernels,
        sampling the data, loading a checkpoint): --timeout, but at least STARTUP_S. On a
        loaded node these take seconds; a short --timeout is meant for silence in training."""
        valid = self.timeout if 0 < self.timeout < float("inf") else TrainConfig.timeout
        return max(valid, STARTUP_S)

    def slowdown(self, worker: int) -> float:
        return dict(self.stragglers).get(worker, 1.0)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["optimizer"] = asdict(self.optimizer)
        return d




def check_resumable(cfg: TrainConfig, manifest: dict, n_workers: int,
                    compare_data: bool = True) -> None:
    """ConfigError unless this job can continue from the checkpoint: the same workers reading
    the same data in the same minibatches, the same optimizer (servers may differ)."""
    where = f"--resume {cfg.resume}: the checkpoint at clock {manifest['clock']}"
    if manifest["workers"] != n_workers:
        raise ConfigError(f"{where} was written by {manifest['workers']} workers; resume with "
                          f"{manifest['workers']} workers (the number of servers may change)")
    saved = manifest["config"]
    if os.path.realpath(saved["train"]) != os.path.realpath(cfg.train):
        raise ConfigError(f"{where} trained on {saved['train']}, not --train {cfg.train}")
    for flag, field_name, now in (("--batch-size", "batch_size", cfg.batch_size),
                                  ("--optimizer", None, cfg.optimizer.name),
                                  ("--no-bias", "bias", cfg.bias),
                                  ("--solver", "solver", cfg.solver),
                                  ("--model", "model", cfg.model),
                                  ("--factors", "factors",
                                   cfg.factors if cfg.model == "fm" else None),
                                  ("--embedding-dim", "embedding_dim",
                                   cfg.embedding_dim if cfg.model == "widedeep" else None),
                                  ("--hidden", "hidden",
                                   list(cfg.hidden) if cfg.model == "widedeep" else None),
                                  ("--fields", "fields",
                                   cfg.fields if cfg.model == "widedeep" else None),
                                  ("--stages", "stages", cfg.stages)):   # places per worker
        then = (saved["optimizer"]["name"] if field_name is None else
                saved.get(field_name, getattr(TrainConfig, field_name)))
        then = then or 0 if field_name == "fields" else then   # written before --fields: 0
        if then != now and now is not None:   # a batch size not given: the checkpoint's
            raise ConfigError(f"{where} was written with {flag} {then}, this job has {now}")
    if cfg.solver != "minibatch":   # the solver's history is of this objective
        for flag, now, then in (("--dim", cfg.dim, saved["dim"]),
                                ("--history", cfg.history, saved["history"]),
                                ("--l1", cfg.optimizer.l1, saved["optimizer"]["l1"]),
                                ("--l2", cfg.optimizer.l2, saved["optimizer"]["l2"])):
            if then != now:
                raise ConfigError(f"{where} was written with {flag} {then}, this job has "
                                  f"{now}")
    recorded = manifest.get("inputs", {}).get("train")
    if recorded is None or not compare_data:
        return   # written before inputs were fingerprinted, or another rank compares them
    changed = fingerprint.changes(cfg.train, recorded, fingerprint.of_input(cfg.train))
    if changed and not cfg.allow_changed_data:
        raise ConfigError(f"{where} was written on other data: --train {cfg.train} changed since "
                          f"({'; '.join(changed)}). The workers' places in it would be wrong; "
                          f"resume on the data it was written on, or pass --allow-changed-data "
                          f"to resume anyway (each worker goes on at the line at or after its "
                          f"recorded place)")
