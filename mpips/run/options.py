"""`train`'s command line and `mpips.train`'s keyword options, both made from the table of
options (train_options), and the TrainConfig either makes."""
import argparse
import difflib
import os

from ..base.errors import ConfigError
from ..models.optimizer import Optimizer
from . import testevents
from .config import (
    CheckpointConfig,
    ConsistencyConfig,
    DataConfig,
    DiagnosticsConfig,
    FaultToleranceConfig,
    LayoutConfig,
    ModelConfig,
    PipelineConfig,
    PushConfig,
    SolverConfig,
    TrainConfig,
)
from .train_options import BY_NAME, GROUPS, OPTIONS

TRAIN_EPILOG = """\
Input is svmlight/libsvm text: `label idx:val idx:val ...`, one example per
line, label 0/1 or -1/+1, idx any integer from 0 to 2^64-1 (hashed features are
fine: servers store only the keys that occur). Each worker reads only its own
byte range of the file.

The job writes RUN_DIR/summary.json (test logloss and AUC, throughput, bytes
sent, keys and bytes per key on the servers) and RUN_DIR/model/server-NNNN.h5
(one HDF5 file per server: keys, weights, optimizer state).

Waits are bounded: a rank that waits longer than --timeout for another stops
the job with a message that says what it waited for.
"""


def train_parser(sub) -> argparse.ArgumentParser:
    """The `train` parser; how it runs is the caller's to set."""
    p = sub.add_parser(
        "train", help="train a model with a parameter server (run under mpiexec/srun)",
        description="Train sparse logistic regression, a factorization machine or Wide & Deep "
                    "with a parameter server (or logistic regression by full-batch L-BFGS "
                    "over dense tables on the servers).",
        epilog=TRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = {key: p.add_argument_group(title, description)
              for key, (title, description) in GROUPS.items()}
    for option in OPTIONS:
        groups[option.group].add_argument(option.flag, **option.spec)
    return p


def config_of(args) -> TrainConfig:
    """The TrainConfig of parsed `train` arguments."""
    return _config(vars(args))


def config_from(options: dict) -> TrainConfig:
    """The TrainConfig of `mpips.train`'s keyword options: the command line's names with _
    for - (train="x.svm", servers=2, checkpoint_every=100, bias=False), each a value of its
    type or the command line's text for it; None or left out: the default. ConfigError
    naming an option unknown (and the closest known one) or of a wrong value."""
    for name in options:
        if name not in BY_NAME:
            [close] = difflib.get_close_matches(name, BY_NAME, n=1, cutoff=0)
            raise ConfigError(f"mpips.train has no option {name!r}; the closest is {close!r}")
    if options.get("print_schedule"):
        raise ConfigError("print_schedule is the command line's (`python -m mpips train ... "
                          "--print-schedule` prints a pipeline's schedule and trains nothing); "
                          "mpips.train trains: leave it out, or print the schedule with "
                          "`python -m mpips schedule`")
    values = {option.name: option.default for option in OPTIONS}
    values.update({name: BY_NAME[name].value(given) for name, given in options.items()
                   if given is not None})
    if values["train"] is None:
        raise ConfigError("mpips.train needs train=FILE, the training data")
    return _config(values)


def _config(v: dict) -> TrainConfig:
    """The TrainConfig of every option's value, by name."""
    optimizer = Optimizer(name=v["optimizer"], lr=v["lr"], l1=v["l1"], l2=v["l2"],
                          beta=v["ftrl_beta"])
    every, seconds = v["checkpoint_every"]
    return TrainConfig(
        data=DataConfig(train=v["train"], test=v["test"], format=v["format"],
                        skip_bad_lines=v["skip_bad_lines"], out=v["out"],
                        overwrite=v["overwrite"]),
        layout=LayoutConfig(servers=v["servers"], vnodes=v["vnodes"],
                            max_rank_memory=v["max_rank_memory"]),
        model=ModelConfig(name=v["model"], bias=v["bias"], factors=v["factors"],
                          embedding_dim=v["embedding_dim"], hidden=v["hidden"],
                          fields=v["fields"]),
        optimizer=optimizer,
        solver=SolverConfig(name=v["solver"], epochs=v["epochs"], batch_size=v["batch_size"],
                            average_after=v["average_after"], dim=v["dim"],
                            history=v["history"], max_iter=v["max_iter"], tol=v["tol"]),
        consistency=ConsistencyConfig(mode=v["consistency"], staleness=v["staleness"],
                                      balance=v["balance"]),
        faults=FaultToleranceConfig(replicas=v["replicas"], spares=v["spares"],
                                    timeout=v["timeout"], disk_wait=v["disk_wait"]),
        checkpointing=CheckpointConfig(dir=v["checkpoint_dir"], every=every, seconds=seconds,
                                       keep=v["keep_checkpoints"], resume=v["resume"],
                                       allow_changed_data=v["allow_changed_data"],
                                       inline=v["checkpoint_inline"]),
        pipeline=PipelineConfig(stages=v["stages"], micro_batches=v["micro_batches"],
                                schedule=v["pipeline"]),
        push=PushConfig(values=v["push_values"], threshold=v["push_threshold"],
                        skip_zeros=v["push_skip_zeros"]),
        diagnostics=DiagnosticsConfig(
            log_every=v["log_every"], snapshot_every=v["snapshot_every"],
            tensorboard=v["tensorboard"] and os.path.abspath(v["tensorboard"]),
            record_pulls=v["record_pulls"], stragglers=tuple(v["straggler"]),
            test_events=tuple(v["test_event"]) + testevents.from_environment()))
