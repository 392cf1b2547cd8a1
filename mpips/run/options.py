"""`train`'s options: one table (OPTIONS) of their groups, flags, types, defaults and help,
from which the command line's parser is built and `mpips.train`'s keyword options are read;
and the TrainConfig either makes."""
import argparse
import difflib
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..base.errors import ConfigError
from ..models import catalog
from ..models.optimizer import NAMES, Optimizer
from . import testevents
from .config import (
    Balance,
    CheckpointConfig,
    Consistency,
    ConsistencyConfig,
    DataConfig,
    DataFormat,
    DiagnosticsConfig,
    FaultToleranceConfig,
    LayoutConfig,
    ModelConfig,
    PipelineConfig,
    PushConfig,
    PushValues,
    Schedule,
    Solver,
    SolverConfig,
    TrainConfig,
)

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


def values(kind) -> tuple:
    """The strings of an enum's members: a closed choice's."""
    return tuple(member.value for member in kind)


def widths(text: str) -> tuple:
    """'64,32' -> (64, 32)."""
    try:
        return tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not layer widths such as 64,32") from None


def finite_float(text: str) -> float:
    """A number option: inf and nan are refused here, before any rank starts work."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number")
    return value


def _epochs_or_off(text: str) -> float:
    """--average-after: a number of epochs >= 0, or "off" (-1)."""
    if text.strip().lower() == "off":
        return -1.0
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give epochs >= 0, or off")
    return value


def checkpoint_interval(text: str) -> tuple[int, float]:
    """--checkpoint-every: "500" is (500 clocks, 0 s); "30s", "10m", "2h" are (0, seconds)."""
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:].lower())
    try:
        value = float(text[:-1]) if scale else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number of clocks (500) or of seconds, minutes or hours "
            f"(30s, 10m, 2h)") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number, not negative")
    return (0, value * scale) if scale else (int(value), 0.0)


def _size(text: str) -> int:
    from ..base.budget import parse_bytes
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _straggler(text: str):
    worker, _sep, rest = text.partition(":")
    factor, _sep, clocks = rest.partition(":")
    try:
        if clocks:
            return int(worker), finite_float(factor), int(clocks)
        return int(worker), finite_float(factor)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected W:FACTOR such as 0:3, or W:FACTOR:CLOCKS "
                                         f"such as 0:3:50, got {text!r}") from None


@dataclass(frozen=True)
class Option:
    """One `train` option: its group (a key of GROUPS), its flag, and argparse's keywords for
    it (type, default, choices, action, dest, metavar, help)."""
    group: str
    flag: str
    spec: dict

    @property
    def name(self) -> str:
        """Its name among `mpips.train`'s keyword options, and in parsed arguments."""
        return self.spec.get("dest") or self.flag[2:].replace("-", "_")

    @property
    def default(self):
        action = self.spec.get("action")
        return self.spec.get("default", {"store_true": False, "store_false": True,
                                         "append": []}.get(action or ""))

    def value(self, given):
        """The option's value for `given`, a keyword option's: a flag's bool, or a value of
        the option's type, or the command line's text for it (parsed as there), or for a
        repeatable option a list of those. ConfigError naming the option if it is none."""
        action = self.spec.get("action")
        if action in ("store_true", "store_false"):
            if not isinstance(given, bool):
                raise ConfigError(f"{self.name}={given!r}: give True or False")
            return given
        if action == "append":
            if not isinstance(given, (list, tuple)):
                raise ConfigError(f"{self.name}={given!r}: give a list of {self._kind().what}")
            return [self._one(item) for item in given]
        return self._one(given)

    def _kind(self) -> "_Kind":
        return KINDS.get(self.spec.get("type"), TEXT)

    def _one(self, given):
        kind = self._kind()
        if isinstance(given, str):
            text = given
        elif isinstance(given, kind.accepts) and not isinstance(given, bool):
            text = kind.text(given)
        else:
            raise ConfigError(f"{self.name}={given!r}: give {kind.what}")
        parse = self.spec.get("type", str)
        try:
            value = parse(text)
        except argparse.ArgumentTypeError as e:
            raise ConfigError(f"argument {self.flag}: {e}") from None
        except ValueError:
            raise ConfigError(f"argument {self.flag}: invalid {parse.__name__} value: "
                              f"{text!r}") from None
        choices = self.spec.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(f"argument {self.flag}: invalid choice: {value!r} (choose from "
                              f"{', '.join(map(repr, choices))})")
        return value


def _option(group: str, flag: str, **spec) -> Option:
    return Option(group, flag, spec)


@dataclass(frozen=True)
class _Kind:
    """The Python values a keyword option of one type takes besides its text, and that text."""
    accepts: tuple
    text: Callable[[Any], str]   # value -> the command line's text for it
    what: str


def _number_text(value) -> str:
    return str(int(value)) if isinstance(value, numbers.Integral) else repr(float(value))


TEXT = _Kind((os.PathLike,), os.fspath, "text")
KINDS = {
    int: _Kind((numbers.Integral,), _number_text, "an integer"),
    finite_float: _Kind((numbers.Real,), _number_text, "a number"),
    _epochs_or_off: _Kind((numbers.Real,), _number_text, "a number of epochs, or 'off'"),
    checkpoint_interval: _Kind((numbers.Integral,), _number_text,
                               "a number of clocks, or of seconds such as '30s'"),
    _size: _Kind((numbers.Integral,), _number_text, "a number of bytes, or a size such as '4G'"),
    widths: _Kind((tuple, list), lambda v: ",".join(map(str, v)), "layer widths such as (64, 32)"),
    _straggler: _Kind((tuple, list), lambda v: ":".join(map(str, v)),
                      "(worker, factor) pairs such as (0, 3)"),
}

# Key: (title, description), in the order the help shows them.
GROUPS = {
    "io": ("data and output", None),
    "job": ("job layout", None),
    "backup": (
        "checkpoints (cold backup)",
        ("The first SIGUSR1, SIGTERM or SIGINT asks the job to stop: it writes a checkpoint at "
        "the next clock every rank reaches and exits with status 75; a second SIGTERM or "
        "SIGINT stops at once. With Open MPI's mpiexec, send SIGUSR1 (Slurm: "
        "#SBATCH --signal=B:USR1@120 and a script that forwards it, as in slurm/).")),
    "diag": ("diagnostics and testing aids", None),
    "opt": ("model and optimizer", None),
    "pipe": ("pipeline (Wide & Deep's network cut into stages across workers)", None),
    "comm": (
        "push filters",
        ("What a worker's pushes send of its gradients. What a push does not deliver (the "
        "rounding, a row held back) the worker keeps by key and adds to that key's next "
        "gradient (error feedback): it arrives late, not never, if the key comes back. Worth it "
        "when the network limits the job (many workers on many nodes, wide rows, slow links); "
        "on one machine the servers' tables, not the wire, are the cost, and a filter's own "
        "work takes 5-25% of examples/s. Pulls are not filtered")),
    "full": (
        "full batch (--solver lbfgs)",
        ("The whole objective, mean logloss + l2/2 |w|^2 (+ l1 |w|_1), minimized by L-BFGS "
        "(OWL-QN with --l1). The weights, the gradient and the solver's history are dense "
        "vectors cut in blocks across the servers, and the solver's vector steps run there: no "
        "rank holds the model. Each worker keeps its rows in memory; a feature is coordinate "
        "key mod --dim, the bias coordinate --dim. Worker 0 drives; the job's log has one line "
        "per iteration and summary.json the objective over time")),
}

# In the order the command line's usage lists them.
OPTIONS = (
    _option("io", "--train", required=True, metavar="FILE",
            help="training data: svmlight or libffm text, Criteo TSV, Avazu CSV, "
                 "a directory from convert, or a Parquet file or folder of them"),
    _option("io", "--format", choices=values(DataFormat),
            help="the text's format: svmlight (label idx:val ...); libffm (label "
                 "field:idx:val ..., field 0 to 254, idx below 2^56); criteo (label, 13 "
                 "integer and 26 hexadecimal fields, tab separated, empty fields "
                 "allowed: integers are log-bucketed and every value hashed with its "
                 "field to a 64-bit key); avazu (its CSV with the header: the id "
                 "ignored, the hour as hour of day and weekday, every other value "
                 "hashed with its column) (default: as the file's first line shows)"),
    _option("io", "--test", metavar="FILE",
            help="held-out data scored after training (logloss, AUC in the summary)"),
    _option("io", "--out", metavar="RUN_DIR",
            help="where summary.json and the model go (default: runs/<date-time-id>)"),
    _option("io", "--overwrite", action="store_true",
            help="replace the run already in RUN_DIR (by default that is an error)"),
    _option("io", "--skip-bad-lines", action="store_true",
            help="count and skip malformed lines instead of stopping at the first one"),
    _option("job", "--servers", type=int, default=1, metavar="N",
            help="ranks that hold the model; the other ranks are workers (default: 1)"),
    _option("job", "--replicas", type=int, default=1, metavar="R",
            help="keep every key on R servers: a primary, which answers reads, and R-1 "
                 "backups on the next servers (other nodes first), which apply the "
                 "same pushes (default: 1, no copies)"),
    _option("job", "--spares", type=int, default=0, metavar="K",
            help="K more server ranks (after the --servers ones) that hold nothing and "
                 "wait: when a server dies (under ULFM, with --replicas 2 or more), a "
                 "spare stands in for it and receives copies of every key range it "
                 "held, instead of the survivors taking them on; `mpips ctl RUN_DIR "
                 "add-server` gives key ranges to one while the job trains "
                 "(default: 0)"),
    _option("job", "--vnodes", type=int, default=16, metavar="V",
            help="key ranges per server: the hash of the keys is cut into servers x V "
                 "equal ranges dealt round the ring: the shares are equal at any V; "
                 "more ranges per server are what keeps them even once servers join "
                 "or leave (mpips ctl): 16 keeps the largest within 2.1%% of the mean "
                 "after a join on the built-in data, 64 within 1.1%% (see "
                 "bench/ring.py) (default: %(default)s)"),
    _option("job", "--consistency", choices=values(Consistency), default="bsp",
            help="when a worker may read: bsp, only once every worker has finished the "
                 "previous clock (default); ssp, while at most --staleness clocks ahead "
                 "of the slowest worker; asp, always (never waits)"),
    _option("job", "--staleness", type=int, metavar="S",
            help="for --consistency ssp: how many clocks the fastest worker may be ahead "
                 "of the slowest (0 behaves as bsp)"),
    _option("job", "--balance", choices=values(Balance), default="static",
            help="who trains which rows: static, each worker its own part of the data, "
                 "a run with a fixed seed repeatable bit for bit (default); dynamic, the "
                 "lead server hands each epoch's rows out in chunks as the workers ask, "
                 "each worker's minibatch following its speed, so that a slow worker holds "
                 "no clock back (the hand-out, so the model, then depends on timing)"),
    _option("job", "--timeout", type=finite_float, default=600.0, metavar="SECONDS",
            help="longest any rank waits for another before failing the job "
                 "(default: %(default)g)"),
    _option("job", "--log-every", type=finite_float, default=5.0, metavar="SECONDS",
            help="progress line interval on rank 0 (default: %(default)g)"),
    _option("job", "--disk-wait", type=finite_float, default=600.0, metavar="SECONDS",
            help="when the model cannot be saved because the disk is full, keep it in "
                 "memory and try again for this long, saying how much space it needs "
                 "(default: %(default)g)"),
    _option("backup", "--checkpoint-every", type=checkpoint_interval, default=(None, None),
            metavar="N|Ts",
            help="write a checkpoint every N clocks (one clock = one minibatch per "
                 "worker), or every T seconds with a suffix s, m or h (30s, 10m), "
                 "and when training ends (default: with --resume, as the run "
                 "resumed did; else 0, only when asked to stop)"),
    _option("backup", "--checkpoint-inline", action="store_true",
            help="write each server's checkpoint file in the server's loop, every worker "
                 "waiting meanwhile, instead of in a forked process that takes the state at "
                 "the checkpoint's clock and writes it while the server goes on serving (for "
                 "an MPI whose transport must not see its rank fork)"),
    _option("backup", "--checkpoint-dir", metavar="DIR",
            help="where checkpoints go (default: RUN_DIR/checkpoints)"),
    _option("backup", "--keep-checkpoints", type=int, metavar="K",
            help="keep the newest K complete checkpoints (default: with --resume, "
                 "as the run resumed did; else 3)"),
    _option("backup", "--resume", metavar="DIR",
            help="continue from the newest complete, undamaged checkpoint in DIR "
                 "(the same workers and data; the number of servers may change). "
                 "It replaces the outputs in RUN_DIR of the run that wrote the "
                 "checkpoint, and nothing else"),
    _option("backup", "--allow-changed-data", action="store_true",
            help="resume even though --train changed since the checkpoint (its "
                 "size, modification time or first and last MiB differ); each "
                 "worker goes on at the first row at or after its recorded place"),
    _option("diag", "--snapshot-every", type=finite_float, metavar="SECONDS",
            help="also save the model every SECONDS of training to "
                 "RUN_DIR/snapshots/NNNN/ (learning curves: `python -m mpips score "
                 "RUN_DIR --snapshots`)"),
    _option("diag", "--tensorboard", metavar="DIR",
            help="write live curves for TensorBoard to DIR as the job trains (training "
                 "loss, examples/s, each worker's waiting, server bytes; the held-out "
                 "logloss and AUC at the end, and at each snapshot once `mpips report` "
                 "scores them): `tensorboard --logdir DIR` shows them (TensorBoard is not "
                 "needed to write them)"),
    _option("diag", "--record-pulls", action="store_true",
            help="each server writes every pull it served to RUN_DIR/pulls/ (worker, "
                 "its clock, the slowest worker's clock, time held), to check the "
                 "consistency model from outside"),
    _option("diag", "--straggler", action="append", default=[], metavar="W:FACTOR[:CLOCKS]",
            type=_straggler,
            help="make worker W (0-based among workers) take FACTOR times as long per "
                 "minibatch (at least 1 ms), by sleeping; with CLOCKS, only for CLOCKS "
                 "clocks in every 2 x CLOCKS (slowness that comes and goes); to test and "
                 "measure the consistency models and --balance (repeatable)"),
    _option("diag", "--test-event", action="append", default=[], metavar="EVENT",
            help="a testing aid for mpips's own tests, refused unless MPIPS_TESTING=1: "
                 "fire EVENT when the job reaches a point, e.g. 'kill rank 1 at clock "
                 "30', 'freeze rank 3 at epoch 2', 'stop rank 2 at checkpoint 1', "
                 "'ctl add-server at clock 40' (`python -m mpips.run.testevents` lists "
                 "them; repeatable)"),
    _option("opt", "--model", choices=values(catalog.ModelName), default="lr",
            help="lr: logistic regression; fm: a factorization machine (Rendle 2010): "
                 "each key's row on the servers holds its weight and a latent vector, "
                 "and pairs of features interact through their vectors' dot product; "
                 "widedeep: Wide & Deep (Cheng et al. 2016): each key's row holds its "
                 "weight and an embedding, and an MLP on the sum of a row's "
                 "embeddings adds to the linear margin; the MLP's weights are rows "
                 "on the servers too (default: lr)"),
    _option("opt", "--factors", type=int, default=8, metavar="K",
            help="fm: the latent vectors' length (default: 8)"),
    _option("opt", "--embedding-dim", type=int, default=8, metavar="K",
            help="widedeep: each key's embedding length (default: 8)"),
    _option("opt", "--hidden", type=widths, default=(64, 32), metavar="W1,W2,...",
            help="widedeep: the widths of the MLP's hidden ReLU layers, on the "
                 "row's embeddings (default: 64,32)"),
    _option("opt", "--fields", type=int, metavar="F",
            help="widedeep: the network's input is the embeddings of a row's F fields "
                 "concatenated (each field's: the sum of its features' embeddings); "
                 "0 sums all of a row's embeddings. A feature's field is in its key: "
                 "Criteo's 39 and Avazu's 23 are known, libffm text (label "
                 "field:idx:val ...) needs F given, svmlight has none (default: the "
                 "data's, else 0)"),
    _option("pipe", "--stages", type=int, default=1, metavar="S",
            help="widedeep: cut the network into S stages of balanced measured cost, "
                 "one per worker; the workers form (workers / S) data-parallel "
                 "copies of the pipeline, and every stage's weights stay rows on the "
                 "servers (default: 1, the whole network on each worker)"),
    _option("pipe", "--micro-batches", type=int, default=4, metavar="M",
            help="cut each minibatch into M micro-batches that flow through the "
                 "stages (default: 4)"),
    _option("pipe", "--pipeline", choices=values(Schedule), default="1f1b",
            help="the schedule: gpipe (all forwards, then all backwards) or 1f1b "
                 "(one forward, one backward: fewer activations held; default)"),
    _option("pipe", "--print-schedule", action="store_true",
            help="print the network's layers, each stage's share of them and every "
                 "stage's tasks in order, then exit without training"),
    _option("opt", "--epochs", type=int, default=1, help="passes over the data (default: 1)"),
    _option("opt", "--batch-size", type=int, metavar="B",
            help="rows per minibatch per worker; one pull and one push each (default: "
                 "about 1000 minibatches per epoch for the worker with the fewest rows, "
                 "at most 1000 rows; a resumed run keeps its own)"),
    _option("opt", "--optimizer", choices=NAMES, default="adagrad",
            help="server-side update rule: sgd, adagrad, ftrl (McMahan et al. 2013) or "
                 "adam (Kingma and Ba 2015; a key's moments move when it is pushed); "
                 "the state lives in the key's row and is checkpointed (default: "
                 "adagrad)"),
    _option("opt", "--lr", type=finite_float, metavar="RATE",
            help="learning rate; FTRL's alpha (default: chosen from a sample of the "
                 "training data. sgd: 1 / L, L = (workers x top eigenvalue of "
                 "X'X/n + mean |x|^2 / batch size) / 4, a bound on the curvature of "
                 "one clock's updates; adagrad and ftrl: 2 / (features per row x "
                 "median |value|); adam: a tenth of that; the job's log says what it "
                 "chose)"),
    _option("opt", "--average-after", type=_epochs_or_off, metavar="EPOCHS|off",
            help="sgd only: the model is the mean of the weights from this many epochs "
                 "on to the end (averaged SGD: the mean is closer to the optimum than "
                 "the last, noisy weights; the first steps are left out), or the last "
                 "weights with 'off' (default: 0.5)"),
    _option("opt", "--l2", type=finite_float, default=0.0,
            help="L2 penalty: the objective is mean logloss + l2/2 * |w|^2, applied "
                 "to the keys each minibatch touches (default: 0)"),
    _option("opt", "--l1", type=finite_float, default=0.0,
            help="L1 penalty (FTRL, or --solver lbfgs, which is then OWL-QN; gives "
                 "sparse models) (default: 0)"),
    _option("opt", "--ftrl-beta", type=finite_float, metavar="BETA",
            help="FTRL's beta in the per-key rate alpha / (beta + sqrt(n)); workers push "
                 "mean minibatch gradients, so it is smaller than the paper's per-example "
                 "1 (default: 1 / batch size)"),
    _option("opt", "--no-bias", dest="bias", action="store_false",
            help="no intercept (by default key 2^64-1 is an always-on bias feature)"),
    _option("comm", "--push-values", choices=values(PushValues),
            default="float32",
            help="how pushed values travel: float16 halves their bytes, int8 (a float32 "
                 "scale per 256 values) quarters them (default: float32, exact)"),
    _option("comm", "--push-threshold", type=finite_float, default=0.0, metavar="T",
            help="hold a key's row back while every entry of its gradient (plus what "
                 "was held back) is below T in magnitude: rare keys' small updates "
                 "wait until they add up; pushes then name their rows in a bitmap "
                 "(1 bit a pulled key) (default: 0, every row)"),
    _option("comm", "--push-skip-zeros", action="store_true",
            help="ftrl with --l1: hold a key's row back while its pulled weights are 0 "
                 "and every entry of its gradient (plus what was held back) is at "
                 "most --l1 in magnitude (such a push, to a key whose z is 0, leaves "
                 "its weight 0)"),
    _option("job", "--max-rank-memory", type=_size, metavar="SIZE",
            help="bytes each rank may hold in its tables (servers) and rows (a "
                 "full-batch worker), such as 512M or 4G: an allocation past it stops "
                 "the job naming what asked; summary.json reports each rank's peak "
                 "(default: no limit)"),
    _option("full", "--solver", choices=values(Solver), default="minibatch",
            help="minibatch: the servers' optimizers, a push per minibatch "
                 "(default); lbfgs: full batch over dense tables"),
    _option("full", "--dim", type=int, default=1 << 20, metavar="N",
            help="coordinates of the weight vector (default: 2^20)"),
    _option("full", "--history", type=int, default=10, metavar="M",
            help="pairs of past steps L-BFGS keeps (default: 10)"),
    _option("full", "--max-iter", type=int, default=500,
            help="iterations at most (default: 500)"),
    _option("full", "--tol", type=finite_float, default=1e-10,
            help="stop when an iteration lowers the objective by less than this, "
                 "relatively (default: 1e-10)"),
)
BY_NAME = {option.name: option for option in OPTIONS}


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
