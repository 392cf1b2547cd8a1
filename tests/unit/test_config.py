"""The configuration in parts: its flat record (what summary.json, the model files and the
manifests hold) unchanged, its closed choices as enums, and `mpips.train`'s keyword options
building the same configuration as the command line, without parsing one."""
import json

import pytest

from mpips.base.errors import ConfigError
from mpips.cli.main import build_parser
from mpips.data.textfile import FORMATS
from mpips.pipeline.schedule import POLICIES
from mpips.run.config import (ConsistencyConfig, DataConfig, ModelConfig, SolverConfig,
                              TrainConfig)
from mpips.run.config_choices import DataFormat, PushValues, Schedule, Solver
from mpips.run.options import OPTIONS, config_from, config_of
from mpips.wire.encoding import ENCODINGS

# The record's keys, in order, as every run has written them.
RECORD_KEYS = [
    "train", "out", "test", "servers", "replicas", "spares", "vnodes", "epochs", "batch_size",
    "optimizer", "average_after", "bias", "consistency", "staleness", "stragglers",
    "test_events", "record_pulls", "snapshot_every", "skip_bad_lines", "overwrite",
    "checkpoint_dir", "checkpoint_every", "checkpoint_seconds", "keep_checkpoints", "resume",
    "allow_changed_data", "timeout", "disk_wait", "log_every", "solver", "dim", "history",
    "max_iter", "tol", "max_rank_memory", "model", "factors", "embedding_dim", "hidden",
    "fields", "format", "stages", "micro_batches", "pipeline", "push_values",
    "push_threshold", "push_skip_zeros", "tensorboard", "checkpoint_inline", "balance"]

ARGV = ["--train", "x.svm", "--model", "widedeep", "--hidden", "16,8", "--stages", "2",
        "--pipeline", "gpipe", "--straggler", "0:3", "--consistency", "ssp", "--staleness",
        "2", "--checkpoint-every", "30s", "--format", "criteo", "--optimizer", "sgd",
        "--average-after", "off", "--max-rank-memory", "4G", "--no-bias", "--lr", "0.5"]
OPTIONS_OF_ARGV = {"train": "x.svm", "model": "widedeep", "hidden": (16, 8), "stages": 2,
                   "pipeline": "gpipe", "straggler": [(0, 3)], "consistency": "ssp",
                   "staleness": 2, "checkpoint_every": "30s", "format": "criteo",
                   "optimizer": "sgd", "average_after": "off", "max_rank_memory": "4G",
                   "bias": False, "lr": 0.5}


def parsed(*argv) -> TrainConfig:
    return config_of(build_parser().parse_args(["train", *argv]))


def test_the_record_is_flat_in_the_order_runs_wrote_it():
    cfg = parsed(*ARGV)
    record = json.loads(json.dumps(cfg.to_record()))
    assert list(record) == RECORD_KEYS
    assert record["pipeline"] == "gpipe" and record["consistency"] == "ssp"
    assert record["hidden"] == [16, 8] and record["stragglers"] == [[0, 3.0]]
    assert record["checkpoint_seconds"] == 30.0 and record["optimizer"]["name"] == "sgd"
    assert json.dumps(cfg.to_record()) == json.dumps(record), "plain strings, not enums"
    assert TrainConfig.from_record(record) == cfg


def test_a_record_of_an_older_run_lacks_keys_that_are_then_the_defaults():
    old = {"train": "x.svm", "optimizer": {"name": "ftrl", "lr": 0.1}, "batch_size": 100}
    cfg = TrainConfig.from_record(old)
    assert cfg.model == ModelConfig() and cfg.solver == SolverConfig(batch_size=100)
    assert cfg.optimizer.name == "ftrl" and cfg.data == DataConfig("x.svm")


def test_closed_choices_are_enums_that_equal_their_strings():
    assert set(Schedule) == set(POLICIES) and set(PushValues) == set(ENCODINGS)
    assert set(DataFormat) == set(FORMATS)
    cfg = parsed("--train", "x", "--solver", "lbfgs")
    assert cfg.solver.name is Solver.LBFGS and cfg.solver.name == "lbfgs"
    assert f"{cfg.pipeline.schedule}" == "1f1b" and f"{cfg.consistency.mode}" == "bsp"
    with pytest.raises(ConfigError, match="--consistency must be one of bsp, ssp, asp, "
                                          "got 'eventual'"):
        ConsistencyConfig("eventual")


def test_keyword_options_make_the_configuration_the_command_line_makes():
    assert config_from(OPTIONS_OF_ARGV) == parsed(*ARGV)
    assert config_from({"train": "x.svm"}) == parsed("--train", "x.svm")
    typed = {"train": "x", "servers": 2, "epochs": 3, "l2": 0.01}
    assert config_from({name: str(value) for name, value in typed.items()}) == \
        config_from(typed), "the command line's text for a value, or the value"
    assert config_from({"train": "x", "checkpoint_every": 100}).checkpointing.every == 100
    assert config_from({"train": "x", "test": None}) == parsed("--train", "x")


def test_every_option_has_a_keyword_of_its_name():
    names = {option.name for option in OPTIONS}
    assert {"train", "bias", "straggler", "test_event", "checkpoint_every", "ftrl_beta"} <= names
    assert len(names) == len(OPTIONS)


@pytest.mark.parametrize("options, says", [
    ({"train": "x", "epoch": 2}, "mpips.train has no option 'epoch'; the closest is 'epochs'"),
    ({"train": "x", "optimiser": "sgd"}, "no option 'optimiser'; the closest is 'optimizer'"),
    ({"train": "x", "epochs": 2.5}, "epochs=2.5: give an integer"),
    ({"train": "x", "epochs": True}, "epochs=True: give an integer"),
    ({"train": "x", "overwrite": "yes"}, "overwrite='yes': give True or False"),
    ({"train": "x", "lr": float("inf")}, "argument --lr: 'inf': give a finite number"),
    ({"train": "x", "optimizer": "rmsprop"}, "argument --optimizer: invalid choice: 'rmsprop'"),
    ({"train": "x", "straggler": "0:3"}, "straggler='0:3': give a list of (worker, factor)"),
    ({"train": "x", "epochs": "two"}, "argument --epochs: invalid int value: 'two'"),
    ({"train": "x", "balance": "fast"},
     "argument --balance: invalid choice: 'fast' (choose from 'static', 'dynamic')"),
    ({"servers": 2}, "mpips.train needs train=FILE"),
    ({"train": "x", "print_schedule": True}, "print_schedule is the command line's"),
])
def test_a_bad_keyword_option_is_named(options, says):
    with pytest.raises(ConfigError) as refused:
        config_from(options)
    assert says in str(refused.value)


def test_a_straggler_slowed_for_some_clocks_comes_and_goes():
    cfg = parsed("--train", "x.svm", "--straggler", "0:3:10", "--straggler", "1:2")
    slow = cfg.diagnostics.slowdown
    assert [slow(0, c) for c in (0, 9, 10, 19, 20)] == [3.0, 3.0, 1.0, 1.0, 3.0]
    assert slow(1, 15) == 2.0 and slow(2, 0) == 1.0
    assert list(map(list, cfg.to_record()["stragglers"])) == [[0, 3.0, 10], [1, 2.0]]
