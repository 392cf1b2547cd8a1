"""The checks of a training job's configuration that every rank can make the same way: its
parts against each other and against the launch (`check`, `check_stages`), and against the
checkpoint a job resumes from (`check_resumable`). Each failure is a ConfigError that names
the flags to change."""
import os

from ..base import files
from ..base.errors import ConfigError
from ..data import fingerprint
from ..data.inputs import check_input, data_format, fields_of, format_mismatch
from ..models.specs import ModelName
from ..ranks.roles import check_servers
from . import testevents
from .config import MAX_VNODES, TrainConfig
from .config_choices import Consistency, Solver


def check(cfg: TrainConfig, n_ranks: int) -> None:
    """Raise ConfigError for anything wrong that every rank can see the same way."""
    layout, faults, solver = cfg.layout, cfg.faults, cfg.solver
    files.check_fsync_setting()
    if faults.spares < 0:
        raise ConfigError(f"--spares must be 0 or more, got {faults.spares}")
    check_servers(cfg.server_ranks, n_ranks, faults.spares)
    if not 1 <= faults.replicas <= layout.servers:
        raise ConfigError(f"--replicas {faults.replicas}: each key is kept on that many "
                          f"servers, so it must be from 1 to --servers ({layout.servers})")
    if not 1 <= layout.vnodes <= MAX_VNODES:
        raise ConfigError(f"--vnodes must be from 1 to {MAX_VNODES} key ranges per server, "
                          f"got {layout.vnodes}")
    batch = 1 if solver.batch_size is None else solver.batch_size   # None: chosen later
    for flag, value in (("--epochs", solver.epochs), ("--batch-size", batch)):
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    faults.check()
    if solver.average_after is not None and cfg.optimizer.name != "sgd":
        raise ConfigError(f"--average-after needs --optimizer sgd (got --optimizer "
                          f"{cfg.optimizer.name})")
    cfg.consistency.check()
    _check_balance(cfg)
    cfg.diagnostics.check(n_ranks - cfg.server_ranks)
    try:
        testevents.check(cfg.diagnostics.test_events, n_ranks, cfg.server_ranks,
                         solver.full_batch)
    except testevents.EventError as e:
        raise ConfigError(str(e)) from None
    _check_solver(cfg)
    _check_push_filter(cfg)
    cfg.with_data_fields().model.check()   # sizes out of range
    check_stages(cfg, n_ranks - cfg.server_ranks)
    if layout.max_rank_memory is not None and layout.max_rank_memory < 1 << 20:
        raise ConfigError(f"--max-rank-memory must be at least 1M, got "
                          f"{layout.max_rank_memory} bytes")
    _check_data(cfg)
    cfg.checkpointing.check()

def _check_data(cfg: TrainConfig) -> None:
    data = cfg.data
    check_input(data.train, "--train", data.format)
    if data.test is not None:
        check_input(data.test, "--test", data.format)
        mismatch = format_mismatch(data.test, data_format(data.train),
                                   f"the model (--train {data.train})")
        if mismatch:
            raise ConfigError(f"--test {mismatch}")
    _check_fields(cfg)

def check_stages(cfg: TrainConfig, workers: int) -> None:
    """ConfigError unless --stages and --micro-batches suit the model and `workers`."""
    from ..wire.tags import MAX_MICROS
    pipe, model, solver = cfg.pipeline, cfg.model, cfg.solver.name
    if not 1 <= pipe.micro_batches <= MAX_MICROS:
        raise ConfigError(f"--micro-batches must be from 1 to {MAX_MICROS}, got "
                          f"{pipe.micro_batches}")
    if pipe.stages == 1:
        return
    if pipe.stages < 1:
        raise ConfigError(f"--stages must be at least 1, got {pipe.stages}")
    if model.name != ModelName.WIDEDEEP or solver != Solver.MINIBATCH:
        raise ConfigError(f"--stages {pipe.stages} splits Wide & Deep's network across "
                          f"workers: it needs --model widedeep (got --model {model.name}"
                          f"{' --solver ' + solver if solver != Solver.MINIBATCH else ''})")
    layers = len(model.hidden) + 1
    if pipe.stages > layers:
        raise ConfigError(f"--stages {pipe.stages}: the network has {layers} layers "
                          f"(--hidden {','.join(map(str, model.hidden))} and the output), "
                          f"and each stage needs one")
    if workers % pipe.stages:
        raise ConfigError(f"--stages {pipe.stages} needs whole pipelines: the job has "
                          f"{workers} worker(s), not a multiple of {pipe.stages}; launch "
                          f"{cfg.server_ranks + pipe.stages * max(workers // pipe.stages, 1)} "
                          f"ranks, or change --stages or --servers")

def _check_fields(cfg: TrainConfig) -> None:
    fields, model, train = cfg.model.fields, cfg.model.name, cfg.data.train
    if not fields:
        return
    if model != ModelName.WIDEDEEP:
        raise ConfigError(f"--fields {fields} is the number of fields Wide & Deep "
                          f"concatenates: it needs --model widedeep (got --model "
                          f"{model})")
    fixed = fields_of(train)
    if os.path.isfile(train) and data_format(train) == "svmlight":
        raise ConfigError(f"--fields {fields}: --train {train} is svmlight text, "
                          f"whose features carry no field; use libffm text (label "
                          f"field:idx:val ...), Criteo or Avazu, or --fields 0 to sum the "
                          f"embeddings")
    if fixed and fields < fixed:
        raise ConfigError(f"--fields {fields}: --train {train} has {fixed} fields "
                          f"(give --fields {fixed}, or 0 to sum the embeddings)")

def _check_push_filter(cfg: TrainConfig) -> None:
    push, optimizer = cfg.push, cfg.optimizer
    if not 0 <= push.threshold < float("inf"):
        raise ConfigError(f"--push-threshold must be a gradient magnitude >= 0, got "
                          f"{push.threshold}")
    if push.skip_zeros and not (optimizer.name == "ftrl" and optimizer.l1 > 0):
        raise ConfigError(f"--push-skip-zeros holds back gradients of weights FTRL's --l1 "
                          f"keeps at 0: it needs --optimizer ftrl and --l1 > 0 (got "
                          f"--optimizer {optimizer.name} --l1 {optimizer.l1:g})")
    if push.filtered and cfg.solver.full_batch:
        raise ConfigError(f"--push-values, --push-threshold and --push-skip-zeros filter "
                          f"the minibatch solver's pushes; --solver {cfg.solver.name} "
                          f"pushes none")
    if push.filtered and cfg.pipeline.stages > 1:
        raise ConfigError(f"--push-values, --push-threshold and --push-skip-zeros filter a "
                          f"worker's pushes of its minibatch's keys; with --stages "
                          f"{cfg.pipeline.stages} the later stages push the network's "
                          f"layers, whose held-back rows no last push would deliver: train "
                          f"without the filters, or without --stages")

def _check_balance(cfg: TrainConfig) -> None:
    """--balance dynamic hands out a minibatch solver's rows to the workers themselves."""
    if not cfg.consistency.dynamic:
        return
    fixed = (f"--solver {cfg.solver.name}" if cfg.solver.full_batch else
             f"--stages {cfg.pipeline.stages}" if cfg.pipeline.stages > 1 else None)
    if fixed:
        raise ConfigError(f"--balance dynamic hands each worker minibatches of the rows it "
                          f"asks for; {fixed} trains fixed parts of the data: use --balance "
                          f"static")


def _check_solver(cfg: TrainConfig) -> None:
    solver, optimizer = cfg.solver, cfg.optimizer
    if not solver.full_batch:
        if optimizer.l1 > 0 and optimizer.name != "ftrl":
            raise ConfigError(f"--l1 needs --optimizer ftrl or --solver lbfgs (got "
                              f"--optimizer {optimizer.name})")
        return
    # Full batch: every step needs every worker (BSP by nature); checkpoints are every
    # so many iterations.
    mode, model = cfg.consistency.mode, cfg.model.name
    refused = [(mode != Consistency.BSP, f"--consistency {mode}"),
               (bool(cfg.checkpointing.seconds), "--checkpoint-every in seconds (give "
                                                  "it in iterations)"),
               (solver.epochs != 1, f"--epochs {solver.epochs} (see --max-iter)"),
               (solver.batch_size is not None, "--batch-size (every step reads all rows)"),
               (cfg.diagnostics.snapshot_every is not None, "--snapshot-every"),
               (model != ModelName.LR, f"--model {model} (full batch trains lr)"),
               (bool(cfg.diagnostics.stragglers), "--straggler")]
    for wrong, flag in refused:
        if wrong:
            raise ConfigError(f"--solver lbfgs does not take {flag}")
    for flag, value, low, high in (("--dim", solver.dim, 1, (1 << 40) - 1),
                                   ("--history", solver.history, 1, 1000),
                                   ("--max-iter", solver.max_iter, 1, 10**9)):
        if not low <= value <= high:
            raise ConfigError(f"{flag} must be from {low} to {high}, got {value}")
    if not 0 <= solver.tol < 1:
        raise ConfigError(f"--tol must be from 0 to 1, got {solver.tol}")


def check_resumable(cfg: TrainConfig, manifest: dict, n_workers: int,
                    compare_data: bool = True) -> None:
    """ConfigError unless this job can continue from the checkpoint: the same workers reading
    the same data in the same minibatches, the same optimizer (servers may differ)."""
    where = f"--resume {cfg.checkpointing.resume}: the checkpoint at clock {manifest['clock']}"
    if manifest["workers"] != n_workers:
        raise ConfigError(f"{where} was written by {manifest['workers']} workers; resume with "
                          f"{manifest['workers']} workers (the number of servers may change)")
    saved = manifest["config"]
    train = cfg.data.train
    if os.path.realpath(saved["train"]) != os.path.realpath(train):
        raise ConfigError(f"{where} trained on {saved['train']}, not --train {train}")
    then, now = TrainConfig.from_record(saved), cfg
    fm, widedeep = (now.model.name == name for name in (ModelName.FM, ModelName.WIDEDEEP))
    for flag, before, given in (
            ("--batch-size", then.solver.batch_size, now.solver.batch_size),
            ("--optimizer", then.optimizer.name, now.optimizer.name),
            ("--no-bias", then.model.bias, now.model.bias),
            ("--solver", then.solver.name, now.solver.name),
            ("--model", then.model.name, now.model.name),
            ("--factors", then.model.factors, now.model.factors if fm else None),
            ("--embedding-dim", then.model.embedding_dim,
             now.model.embedding_dim if widedeep else None),
            ("--hidden", list(then.model.hidden), list(now.model.hidden) if widedeep else None),
            ("--fields", then.model.fields or 0,   # written before --fields: 0
             now.model.fields if widedeep else None),
            ("--stages", then.pipeline.stages, now.pipeline.stages),   # places per worker
            ("--balance", then.consistency.balance, now.consistency.balance)):
        if before != given and given is not None:   # a batch size not given: the checkpoint's
            raise ConfigError(f"{where} was written with {flag} {before}, this job has {given}")
    if cfg.solver.full_batch:   # the solver's history is of this objective
        for flag, value, before in (("--dim", cfg.solver.dim, saved["dim"]),
                                    ("--history", cfg.solver.history, saved["history"]),
                                    ("--l1", cfg.optimizer.l1, saved["optimizer"]["l1"]),
                                    ("--l2", cfg.optimizer.l2, saved["optimizer"]["l2"])):
            if before != value:
                raise ConfigError(f"{where} was written with {flag} {before}, this job has "
                                  f"{value}")
    recorded = manifest.get("inputs", {}).get("train")
    if recorded is None or not compare_data:
        return   # written before inputs were fingerprinted, or another rank compares them
    changed = fingerprint.changes(train, recorded, fingerprint.of_input(train))
    if changed and not cfg.checkpointing.allow_changed_data:
        raise ConfigError(f"{where} was written on other data: --train {train} changed since "
                          f"({'; '.join(changed)}). The workers' places in it would be wrong; "
                          f"resume on the data it was written on, or pass --allow-changed-data "
                          f"to resume anyway (each worker goes on at the line at or after its "
                          f"recorded place)")
