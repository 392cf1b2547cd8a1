"""Command line: `python -m mpips {train,make-data} ...`."""
import argparse
import contextlib
import math
import os
import sys
import traceback

from . import ctl, models
from .optimizer import NAMES

DESCRIPTION = """\
mpips: parameter-server training on an MPI job. Launch `train` with mpiexec or
srun; the first --servers ranks hold the model, the others are workers.

  mpiexec -n 4 python -m mpips train --train data/ctr.train.svm --test data/ctr.test.svm
"""

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
    return (0, value * scale) if scale else (value, 0.0)


def _train_parser(sub):
    p = sub.add_parser(
        "train", help="train a model with a parameter server (run under mpiexec/srun)",
        description="Train sparse logistic regression, a factorization machine or Wide & Deep "
                    "with a parameter server (or logistic regression by full-batch L-BFGS "
                    "over dense tables on the servers).",
        epilog=TRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    io = p.add_argument_group("data and output")
    io.add_argument("--train", required=True, metavar="FILE",
                    help="training data: svmlight or libffm text, Criteo TSV, Avazu CSV, "
                         "or a directory from convert")
    io.add_argument("--format", choices=("svmlight", "libffm", "criteo", "avazu"),
                    help="the text's format: svmlight (label idx:val ...); libffm (label "
                         "field:idx:val ..., field 0 to 254, idx below 2^56); criteo (label, 13 "
                         "integer and 26 hexadecimal fields, tab separated, empty fields "
                         "allowed: integers are log-bucketed and every value hashed with its "
                         "field to a 64-bit key); avazu (its CSV with the header: the id "
                         "ignored, the hour as hour of day and weekday, every other value "
                         "hashed with its column) (default: as the file's first line shows)")
    io.add_argument("--test", metavar="FILE",
                    help="held-out data scored after training (logloss, AUC in the summary)")
    io.add_argument("--out", metavar="RUN_DIR",
                    help="where summary.json and the model go (default: runs/<date-time-id>)")
    io.add_argument("--overwrite", action="store_true",
                    help="replace the run already in RUN_DIR (by default that is an error)")
    io.add_argument("--skip-bad-lines", action="store_true",
                    help="count and skip malformed lines instead of stopping at the first one")
    job = p.add_argument_group("job layout")
    job.add_argument("--servers", type=int, default=1, metavar="N",
                     help="ranks that hold the model; the other ranks are workers (default: 1)")
    job.add_argument("--replicas", type=int, default=1, metavar="R",
                     help="keep every key on R servers: a primary, which answers reads, and R-1 "
                          "backups on the next servers (other nodes first), which apply the "
                          "same pushes (default: 1, no copies)")
    job.add_argument("--spares", type=int, default=0, metavar="K",
                     help="K more server ranks (after the --servers ones) that hold nothing and "
                          "wait: when a server dies (under ULFM, with --replicas 2 or more), a "
                          "spare stands in for it and receives copies of every key range it "
                          "held, instead of the survivors taking them on; `mpips ctl RUN_DIR "
                          "add-server` gives key ranges to one while the job trains "
                          "(default: 0)")
    job.add_argument("--vnodes", type=int, default=16, metavar="V",
                     help="key ranges per server: the hash of the keys is cut into servers x V "
                          "equal ranges dealt round the ring: the shares are equal at any V; "
                          "more ranges per server are what keeps them even once servers join "
                          "or leave (mpips ctl): 16 keeps the largest within 2.1%% of the mean "
                          "after a join on the built-in data, 64 within 1.1%% (see "
                          "bench/ring.py) (default: %(default)s)")
    job.add_argument("--consistency", choices=["bsp", "ssp", "asp"], default="bsp",
                     help="when a worker may read: bsp, only once every worker has finished the "
                          "previous clock (default); ssp, while at most --staleness clocks ahead "
                          "of the slowest worker; asp, always (never waits)")
    job.add_argument("--staleness", type=int, metavar="S",
                     help="for --consistency ssp: how many clocks the fastest worker may be ahead "
                          "of the slowest (0 behaves as bsp)")
    job.add_argument("--timeout", type=finite_float, default=600.0, metavar="SECONDS",
                     help="longest any rank waits for another before failing the job "
                          "(default: %(default)g)")
    job.add_argument("--log-every", type=finite_float, default=5.0, metavar="SECONDS",
                     help="progress line interval on rank 0 (default: %(default)g)")
    job.add_argument("--disk-wait", type=finite_float, default=600.0, metavar="SECONDS",
                     help="when the model cannot be saved because the disk is full, keep it in "
                          "memory and try again for this long, saying how much space it needs "
                          "(default: %(default)g)")
    backup = p.add_argument_group(
        "checkpoints (cold backup)",
        "The first SIGUSR1, SIGTERM or SIGINT asks the job to stop: it writes a checkpoint at "
        "the next clock every rank reaches and exits with status 75; a second SIGTERM or "
        "SIGINT stops at once. With Open MPI's mpiexec, send SIGUSR1 (Slurm: "
        "#SBATCH --signal=B:USR1@120 and a script that forwards it, as in slurm/).")
    backup.add_argument("--checkpoint-every", type=checkpoint_interval, default=(None, None),
                        metavar="N|Ts",
                        help="write a checkpoint every N clocks (one clock = one minibatch per "
                             "worker), or every T seconds with a suffix s, m or h (30s, 10m), "
                             "and when training ends (default: with --resume, as the run "
                             "resumed did; else 0, only when asked to stop)")
    backup.add_argument("--checkpoint-dir", metavar="DIR",
                        help="where checkpoints go (default: RUN_DIR/checkpoints)")
    backup.add_argument("--keep-checkpoints", type=int, metavar="K",
                        help="keep the newest K complete checkpoints (default: with --resume, "
                             "as the run resumed did; else 3)")
    backup.add_argument("--resume", metavar="DIR",
                        help="continue from the newest complete, undamaged checkpoint in DIR "
                             "(the same workers and data; the number of servers may change). "
                             "It replaces the outputs in RUN_DIR of the run that wrote the "
                             "checkpoint, and nothing else")
    backup.add_argument("--allow-changed-data", action="store_true",
                        help="resume even though --train changed since the checkpoint (its "
                             "size, modification time or first and last MiB differ); each "
                             "worker goes on at the first row at or after its recorded place")
    diag = p.add_argument_group("diagnostics and testing aids")
    diag.add_argument("--snapshot-every", type=finite_float, metavar="SECONDS",
                      help="also save the model every SECONDS of training to "
                           "RUN_DIR/snapshots/NNNN/ (learning curves: `python -m mpips score "
                           "RUN_DIR --snapshots`)")
    diag.add_argument("--record-pulls", action="store_true",
                      help="each server writes every pull it served to RUN_DIR/pulls/ (worker, "
                           "its clock, the slowest worker's clock, time held), to check the "
                           "consistency model from outside")
    diag.add_argument("--straggler", action="append", default=[], metavar="W:FACTOR",
                      type=_straggler,
                      help="make worker W (0-based among workers) take FACTOR times as long per "
                           "minibatch (at least 1 ms), by sleeping; to test and measure the "
                           "consistency models (repeatable)")
    opt = p.add_argument_group("model and optimizer")
    opt.add_argument("--model", choices=models.NAMES, default="lr",
                     help="lr: logistic regression; fm: a factorization machine (Rendle 2010): "
                          "each key's row on the servers holds its weight and a latent vector, "
                          "and pairs of features interact through their vectors' dot product; "
                          "widedeep: Wide & Deep (Cheng et al. 2016): each key's row holds its "
                          "weight and an embedding, and an MLP on the sum of a row's "
                          "embeddings adds to the linear margin; the MLP's weights are rows "
                          "on the servers too (default: lr)")
    opt.add_argument("--factors", type=int, default=8, metavar="K",
                     help="fm: the latent vectors' length (default: 8)")
    opt.add_argument("--embedding-dim", type=int, default=8, metavar="K",
                     help="widedeep: each key's embedding length (default: 8)")
    opt.add_argument("--hidden", type=widths, default=(64, 32), metavar="W1,W2,...",
                     help="widedeep: the widths of the MLP's hidden ReLU layers, on the "
                          "row's embeddings (default: 64,32)")
    opt.add_argument("--fields", type=int, metavar="F",
                     help="widedeep: the network's input is the embeddings of a row's F fields "
                          "concatenated (each field's: the sum of its features' embeddings); "
                          "0 sums all of a row's embeddings. A feature's field is in its key: "
                          "Criteo's 39 and Avazu's 23 are known, libffm text (label "
                          "field:idx:val ...) needs F given, svmlight has none (default: the "
                          "data's, else 0)")
    pipe = p.add_argument_group(
        "pipeline (Wide & Deep's network split across workers: realm 4)")
    pipe.add_argument("--stages", type=int, default=1, metavar="S",
                      help="widedeep: cut the network into S stages of balanced measured cost, "
                           "one per worker; the workers form (workers / S) data-parallel "
                           "copies of the pipeline, and every stage's weights stay rows on the "
                           "servers (default: 1, the whole network on each worker)")
    pipe.add_argument("--micro-batches", type=int, default=4, metavar="M",
                      help="cut each minibatch into M micro-batches that flow through the "
                           "stages (default: 4)")
    pipe.add_argument("--pipeline", choices=("gpipe", "1f1b"), default="1f1b",
                      help="the schedule: gpipe (all forwards, then all backwards) or 1f1b "
                           "(one forward, one backward: fewer activations held; default)")
    pipe.add_argument("--print-schedule", action="store_true",
                      help="print the network's layers, each stage's share of them and every "
                           "stage's tasks in order, then exit without training")
    opt.add_argument("--epochs", type=int, default=1, help="passes over the data (default: 1)")
    opt.add_argument("--batch-size", type=int, metavar="B",
                     help="rows per minibatch per worker; one pull and one push each (default: "
                          "about 1000 minibatches per epoch for the worker with the fewest rows, "
                          "at most 1000 rows; a resumed run keeps its own)")
    opt.add_argument("--optimizer", choices=NAMES, default="adagrad",
                     help="server-side update rule: sgd, adagrad, ftrl (McMahan et al. 2013) or "
                          "adam (Kingma and Ba 2015; a key's moments move when it is pushed); "
                          "the state lives in the key's row and is checkpointed (default: "
                          "adagrad)")
    opt.add_argument("--lr", type=finite_float, metavar="RATE",
                     help="learning rate; FTRL's alpha (default: chosen from a sample of the "
                          "training data. sgd: 1 / L, L = (workers x top eigenvalue of "
                          "X'X/n + mean |x|^2 / batch size) / 4, a bound on the curvature of "
                          "one clock's updates; adagrad and ftrl: 2 / (features per row x "
                          "median |value|); adam: a tenth of that; the job's log says what it "
                          "chose)")
    opt.add_argument("--average-after", type=_epochs_or_off, metavar="EPOCHS|off",
                     help="sgd only: the model is the mean of the weights from this many epochs "
                          "on to the end (averaged SGD: the mean is closer to the optimum than "
                          "the last, noisy weights; the first steps are left out), or the last "
                          "weights with 'off' (default: 0.5)")
    opt.add_argument("--l2", type=finite_float, default=0.0,
                     help="L2 penalty: the objective is mean logloss + l2/2 * |w|^2, applied "
                          "to the keys each minibatch touches (default: 0)")
    opt.add_argument("--l1", type=finite_float, default=0.0,
                     help="L1 penalty (FTRL, or --solver lbfgs, which is then OWL-QN; gives "
                          "sparse models) (default: 0)")
    opt.add_argument("--ftrl-beta", type=finite_float, metavar="BETA",
                     help="FTRL's beta in the per-key rate alpha / (beta + sqrt(n)); workers push "
                          "mean minibatch gradients, so it is smaller than the paper's per-example "
                          "1 (default: 1 / batch size)")
    opt.add_argument("--no-bias", dest="bias", action="store_false",
                     help="no intercept (by default key 2^64-1 is an always-on bias feature)")
    comm = p.add_argument_group(
        "push filters",
        "What a worker's pushes send of its gradients. What a push does not deliver (the "
        "rounding, a row held back) the worker keeps by key and adds to that key's next "
        "gradient (error feedback): it arrives late, not never, if the key comes back. Worth it "
        "when the network limits the job (many workers on many nodes, wide rows, slow links); "
        "on one machine the servers' tables, not the wire, are the cost, and a filter's own "
        "work takes 5-25% of examples/s. Pulls are not filtered")
    comm.add_argument("--push-values", choices=("float32", "float16", "int8"),
                      default="float32",
                      help="how pushed values travel: float16 halves their bytes, int8 (a float32 "
                           "scale per 256 values) quarters them (default: float32, exact)")
    comm.add_argument("--push-threshold", type=finite_float, default=0.0, metavar="T",
                      help="hold a key's row back while every entry of its gradient (plus what "
                           "was held back) is below T in magnitude: rare keys' small updates "
                           "wait until they add up; pushes then name their rows in a bitmap "
                           "(1 bit a pulled key) (default: 0, every row)")
    comm.add_argument("--push-skip-zeros", action="store_true",
                      help="ftrl with --l1: hold a key's row back while its pulled weights are 0 "
                           "and every entry of its gradient (plus what was held back) is at "
                           "most --l1 in magnitude (such a push, to a key whose z is 0, leaves "
                           "its weight 0)")
    full = p.add_argument_group(
        "full batch (--solver lbfgs)",
        "The whole objective, mean logloss + l2/2 |w|^2 (+ l1 |w|_1), minimized by L-BFGS "
        "(OWL-QN with --l1). The weights, the gradient and the solver's history are dense "
        "vectors cut in blocks across the servers, and the solver's vector steps run there: no "
        "rank holds the model. Each worker keeps its rows in memory; a feature is coordinate "
        "key mod --dim, the bias coordinate --dim. Worker 0 drives; the job's log has one line "
        "per iteration and summary.json the objective over time")
    job.add_argument("--max-rank-memory", type=_size, metavar="SIZE",
                     help="bytes each rank may hold in its tables (servers) and rows (a "
                          "full-batch worker), such as 512M or 4G: an allocation past it stops "
                          "the job naming what asked; summary.json reports each rank's peak "
                          "(default: no limit)")
    full.add_argument("--solver", choices=("minibatch", "lbfgs"), default="minibatch",
                      help="minibatch: the servers' optimizers, a push per minibatch "
                           "(default); lbfgs: full batch over dense tables")
    full.add_argument("--dim", type=int, default=1 << 20, metavar="N",
                      help="coordinates of the weight vector (default: 2^20)")
    full.add_argument("--history", type=int, default=10, metavar="M",
                      help="pairs of past steps L-BFGS keeps (default: 10)")
    full.add_argument("--max-iter", type=int, default=500,
                      help="iterations at most (default: 500)")
    full.add_argument("--tol", type=finite_float, default=1e-10,
                      help="stop when an iteration lowers the objective by less than this, "
                           "relatively (default: 1e-10)")
    p.set_defaults(run=_run_train)


def _size(text: str) -> int:
    from .budget import parse_bytes
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _straggler(text: str):
    worker, sep, factor = text.partition(":")
    try:
        return int(worker), finite_float(factor)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected W:FACTOR such as 0:3, got {text!r}") from None


def _schedule_parser(sub):
    p = sub.add_parser(
        "schedule", help="print a pipeline schedule: each stage's tasks, its bubble, its memory",
        description="Print the order in which each of S pipeline stages runs the forward (F) "
                    "and backward (B) of M micro-batches and its update (U), under a policy: "
                    "gpipe (fill-drain: all forwards, then all backwards) or 1f1b (one "
                    "forward, one backward: stage s holds at most S - s micro-batches' "
                    "activations). Then the fraction of time idle on ideal ranks with a "
                    "backward twice a forward, beside (S-1)/(M+S-1), and the activations each "
                    "stage holds at most, in micro-batches.")
    p.add_argument("--stages", type=int, required=True, metavar="S")
    p.add_argument("--micro-batches", type=int, required=True, metavar="M")
    p.add_argument("--policy", choices=("gpipe", "1f1b"), default="1f1b",
                   help="(default: %(default)s)")
    p.set_defaults(run=_run_schedule)


def _run_schedule(args) -> None:
    from .schedule import POLICIES, describe
    try:
        schedule = POLICIES[args.policy](args.stages, args.micro_batches)
    except ValueError as e:
        _fail(str(e), 2)
    _print(describe(schedule))


def _print(text: str) -> None:
    """`text` on standard output; a reader that stopped early (`| head`) is no error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _make_data_parser(sub):
    p = sub.add_parser(
        "make-data", help="write a synthetic dataset (svmlight train/test files)",
        description="Write PREFIX.train.svm and PREFIX.test.svm, with labels drawn from a "
                    "planted logistic model. --kind ctr (default): hashed 64-bit categorical "
                    "features with Zipf-skewed frequencies and two numeric features. census: "
                    "like the adult/a9a data, 14 correlated categorical fields one-hot encoded "
                    "into 123 binary features. dense: 10 real-valued features of different "
                    "magnitudes. Same arguments, same files.")
    p.add_argument("prefix", metavar="OUT_PREFIX", help="e.g. data/ctr -> data/ctr.train.svm")
    p.add_argument("--rows", type=int, required=True, help="training rows")
    p.add_argument("--test-rows", type=int, help="test rows (default: rows / 5)")
    p.add_argument("--kind", choices=("ctr", "census", "dense"), default="ctr",
                   help="what the data looks like (default: %(default)s)")
    p.add_argument("--features", type=int,
                   help="distinct categorical values over all fields (ctr only; default: 1048576)")
    p.add_argument("--nnz", type=int, help="features per row (ctr only; default: 20)")
    p.add_argument("--format", choices=("svmlight", "libffm", "criteo"), default="svmlight",
                   help="svmlight (PREFIX.train.svm); libffm (PREFIX.train.ffm: the same rows, "
                        "each feature as field:value:x, for Wide & Deep's --fields); criteo: the Criteo display-advertising "
                        "layout (PREFIX.train.tsv: label, 13 integer and 26 hexadecimal "
                        "categorical fields, tab separated, some empty), labels from a planted "
                        "model over the keys mpips makes of them (default: svmlight)")
    p.add_argument("--interactions", type=int, default=0, metavar="R",
                   help="ctr only: each key also gets a planted latent vector of R values, and "
                        "each pair of a row's features adds their dot product to the margin, "
                        "as large as the linear part: data on which a factorization machine "
                        "(--model fm) beats logistic regression (default: 0, none)")
    p.add_argument("--seed", type=int, default=1, help="(default: %(default)s)")
    p.set_defaults(run=_run_make_data)


def _launched(names: tuple) -> int | None:
    """What the MPI launcher announced in the first of these variables that it set."""
    for name in names:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def _launch_rank() -> int:
    """This process's rank as the MPI launcher announced it (0 when not launched by one)."""
    return _launched(("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")) or 0


def exit_together(code: int, message: str | None = None) -> None:
    """Print `message` (if this rank reports it) and exit with `code`, but under a launcher
    only once every rank has got here (or 10 s have passed): a launcher kills the remaining
    ranks when one exits with an error, and could kill the one still printing."""
    if message:
        print(message, file=sys.stderr, flush=True)
    if (_launched(("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")) or 1) > 1:
        from mpi4py import MPI

        from .bounded import wait_all
        from .errors import WaitTimeout
        try:
            wait_all([MPI.COMM_WORLD.Ibarrier()], 10.0, lambda: "the other ranks to exit")
        except WaitTimeout:
            pass   # a rank that never arrives cannot be waited for: leave anyway
    sys.exit(code)


class _Parser(argparse.ArgumentParser):
    """Under mpiexec every rank parses the same arguments: only rank 0 prints the error."""

    def error(self, message):
        if _launch_rank() == 0:
            self.print_usage(sys.stderr)
        exit_together(2, f"{self.prog}: error: {message}" if _launch_rank() == 0 else None)


def _score_parser(sub):
    p = sub.add_parser(
        "score", help="score a trained model (or a run's snapshots) on a test file",
        description="Held-out logloss and AUC of a saved model, in one process (the test file "
                    "must fit in memory). RUN_DIR is a run's --out directory or a model "
                    "directory of server-NNNN.h5 files.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--test", required=True, metavar="FILE", help="svmlight test data")
    p.add_argument("--snapshots", action="store_true",
                   help="score every snapshot in RUN_DIR/snapshots/ (from --snapshot-every)")
    p.add_argument("--allow-partial", action="store_true",
                   help="also score a model saved after an error (it holds what was trained)")
    p.add_argument("--json", metavar="FILE", help="also write the scores as JSON")
    p.set_defaults(run=_run_score)


def _auc(scores: dict) -> str:
    return "n/a (one class)" if scores["auc"] is None else f"{scores['auc']:.4f}"


def _run_score(args) -> None:
    import json

    from .errors import MpipsError
    from .evaluate import read_rows, score_model, score_snapshots
    from .log import say
    from .shards import check_input
    try:
        check_input(args.test, "--test")
        rows = read_rows(args.test)
        if args.snapshots:
            result = score_snapshots(args.run_dir, rows)
            if not result:
                _fail(f"{args.run_dir}/snapshots: no complete snapshots", 2)
            for r in result:
                clock = "done" if r["slowest_clock"] < 0 else r["slowest_clock"]
                say(f"snapshot {r['snapshot']:>5}  {r['elapsed_s']:7.2f} s  slowest clock "
                    f"{clock:>6}  logloss {r['logloss']:.4f}  AUC {_auc(r)}")
        else:
            model = os.path.join(args.run_dir, "model")
            result = score_model(model if os.path.isdir(model) else args.run_dir, rows,
                                 allow_partial=args.allow_partial)
            say(f"logloss {result['logloss']:.4f}  AUC {_auc(result)} on "
                f"{result['examples']:,} examples")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    except (OSError, ValueError, MpipsError) as e:
        _fail(str(e), 2)


def _report_parser(sub):
    p = sub.add_parser(
        "report", help="an HTML page of plots of one run, or of several side by side",
        description="Write an HTML page with plots of how the runs went: held-out logloss "
                    "and AUC against time and examples (the snapshots of --snapshot-every, "
                    "scored here on the run's --test file), throughput and training loss over "
                    "time, each worker's waiting and its pulls held for the clocks, clock "
                    "gaps, server load and bytes sent; a table compares the runs. The page is "
                    "one file (the plots are inside it). In one process.")
    p.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="a finished run's --out")
    p.add_argument("--out", metavar="FILE",
                   help="where to write the page (default: RUN_DIR/report.html for one run, "
                        "./report.html for several)")
    p.add_argument("--test", metavar="FILE",
                   help="score the snapshots on this file instead of each run's --test")
    p.set_defaults(run=_run_report)


def _run_report(args) -> None:
    from .errors import MpipsError
    from .log import say
    from .report import report
    try:
        path = report(args.run_dirs, args.out, args.test)
    except (OSError, ValueError, MpipsError) as e:
        _fail(str(e), 2)
    say(f"report: {path}")


def _convert_parser(sub):
    p = sub.add_parser(
        "convert", help="convert svmlight text to binary CSR shards that workers memory-map",
        description="Write OUT/ with one part of CSR arrays (.npy: labels, row pointers, uint64 "
                    "keys, float32 values) per rank and a meta.json. Under mpiexec -n K each "
                    "rank converts its own byte range of IN in parallel. `train --train OUT` "
                    "then reads it without parsing; each worker maps only its rows.")
    p.add_argument("src", metavar="IN", help="svmlight text file")
    p.add_argument("dst", metavar="OUT", help="output directory")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="count and skip malformed lines instead of stopping at the first one")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.set_defaults(run=_run_convert)


def _run_convert(args) -> None:
    from mpi4py import MPI

    from .errors import ConfigError, MpipsError
    from .log import say, setup
    from .shards import convert

    world = MPI.COMM_WORLD
    log = setup(f"rank {world.rank}")
    try:
        meta = convert(args.src, args.dst, world, skip_bad=args.skip_bad_lines,
                       overwrite=args.overwrite)
    except ConfigError as e:   # agreed by every rank: all exit, one prints
        exit_together(2, f"mpips convert: error: {e}"
                      if getattr(e, "reported", world.rank == 0) else None)
    except MpipsError as e:
        log.error("%s", e)
        world.Abort(1)
    if meta:
        say(f"wrote {args.dst}: {meta['rows']:,} rows, {meta['nnz']:,} non-zeros in "
            f"{len(meta['parts'])} part(s), about {meta['distinct_keys']:,} distinct keys" +
            (f"; skipped {meta['bad_lines']:,} bad line(s)" if meta["bad_lines"] else ""))


class _RaisingParser(argparse.ArgumentParser):
    """For mpips.train: a bad option is a ConfigError, not an exit."""

    def error(self, message):
        from .errors import ConfigError
        raise ConfigError(message)


def build_parser(raising: bool = False) -> argparse.ArgumentParser:
    """The command line's parser; `raising`: errors raise ConfigError (for mpips.train)."""
    parser = (_RaisingParser if raising else _Parser)(
        prog="python -m mpips", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _train_parser(sub)
    _score_parser(sub)
    _report_parser(sub)
    _schedule_parser(sub)
    _inspect_parser(sub)
    _convert_parser(sub)
    _make_data_parser(sub)
    ctl.add_parser(sub)
    return parser


def _fail(text: str, code: int) -> None:
    print(f"mpips: error: {text}", file=sys.stderr, flush=True)
    sys.exit(code)


def _run_make_data(args) -> None:
    from .errors import ConfigError
    from .log import say
    from .makedata import make_data
    try:
        files = make_data(args.prefix, args.rows, args.features, args.nnz, args.seed,
                          args.test_rows, args.kind, args.interactions, args.format)
    except ConfigError as e:
        _fail(str(e), 2)
    for f in files.values():
        say(f"wrote {f['path']}: {f['rows']:,} rows, {f['positive_rate']:.1%} positive")


def config_of(args):
    """The TrainConfig of parsed `train` arguments."""
    from .config import TrainConfig
    from .optimizer import Optimizer
    optimizer = Optimizer(name=args.optimizer, lr=args.lr,
                          l1=args.l1, l2=args.l2, beta=args.ftrl_beta)
    return TrainConfig(train=args.train, test=args.test, out=args.out, servers=args.servers,
                      replicas=args.replicas, spares=args.spares, vnodes=args.vnodes,
                      epochs=args.epochs, batch_size=args.batch_size, optimizer=optimizer,
                      average_after=args.average_after,
                      bias=args.bias, consistency=args.consistency,
                      staleness=args.staleness, stragglers=tuple(args.straggler),
                      record_pulls=args.record_pulls, snapshot_every=args.snapshot_every,
                      skip_bad_lines=args.skip_bad_lines, overwrite=args.overwrite,
                      checkpoint_dir=args.checkpoint_dir,
                      checkpoint_every=args.checkpoint_every[0],
                      checkpoint_seconds=args.checkpoint_every[1],
                      keep_checkpoints=args.keep_checkpoints, resume=args.resume,
                      allow_changed_data=args.allow_changed_data, timeout=args.timeout,
                      disk_wait=args.disk_wait, log_every=args.log_every,
                      solver=args.solver, dim=args.dim, history=args.history,
                      max_iter=args.max_iter, tol=args.tol,
                      max_rank_memory=args.max_rank_memory, model=args.model,
                      factors=args.factors, embedding_dim=args.embedding_dim,
                      hidden=args.hidden, fields=args.fields, format=args.format,
                      stages=args.stages,
                      micro_batches=args.micro_batches, pipeline=args.pipeline,
                      push_values=args.push_values, push_threshold=args.push_threshold,
                      push_skip_zeros=args.push_skip_zeros)


def _run_train(args) -> None:
    from mpi4py import MPI

    from . import signals
    from .errors import ConfigError, Interrupted, MpipsError
    from .failover import (LOST, CannotFailOver, KeepAlive, is_failure, leave_after_failure,
                           what_died)
    from .faulttolerance import local_verdict
    from .log import setup
    from .job import JobStopped, train

    world = MPI.COMM_WORLD
    log = setup(f"rank {world.rank}")
    signals.install()
    # Under ULFM a rank busy without MPI calls would count as dead: keep it heard.
    with KeepAlive() if local_verdict().on else contextlib.nullcontext():
        try:
            cfg = config_of(args)
            if args.print_schedule:
                from .stagework import describe_pipeline
                if world.rank == 0:
                    _print(describe_pipeline(cfg))
                return
            train(cfg, world)
        except ConfigError as e:
            # Every rank raises the same error before any work starts: exit together, print once.
            exit_together(2, f"mpips train: error: {e}"
                          if getattr(e, "reported", world.rank == 0) else None)
        except JobStopped as e:
            if not getattr(e, "reported", False):
                log.info("%s", e)
            sys.exit(signals.RESUMABLE)
        except CannotFailOver as e:
            log.error("%s: the job stops; continue from its last checkpoint with --resume "
                      "(exit %d, which the requeue template resumes)", e, e.exit_status)
            leave_after_failure(e.exit_status)
        except Interrupted as e:
            # A second signal: leave at once, without MPI_Abort (which could kill a server while
            # it saves its shard) and without MPI_Finalize (which waits for the other ranks).
            if not getattr(e, "reported", False):
                log.error("%s", e)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.exit_status)
        except Exception as e:
            if is_failure(e):   # a rank died where no other takes over its part
                log.error("%s: the job stops; continue from its last checkpoint with --resume "
                          "(exit %d, which the requeue template resumes)",
                          what_died(world, e), LOST)
                leave_after_failure(LOST)
            if not getattr(e, "reported", False):
                log.error("%s", e if isinstance(e, MpipsError) else traceback.format_exc())
            log.error("stopping the whole job (MPI_Abort)")
            sys.stdout.flush()
            sys.stderr.flush()
            world.Abort(1)


def _inspect_parser(sub):
    p = sub.add_parser(
        "inspect", help="describe the checkpoints in a directory",
        description="The checkpoint in CKPT_DIR that --resume would take (and any damaged "
                    "ones newer than it, which a resume passes over; --all: every one). For "
                    "each, newest first: whether it is complete "
                    "and undamaged, its clock, keys and weight norms per server, where each "
                    "worker stood, and the configuration that wrote it. The files are plain "
                    "HDF5 (h5dump -H CKPT_DIR/clock-*/server-0000.h5).")
    p.add_argument("ckpt_dir", metavar="CKPT_DIR")
    p.add_argument("--all", action="store_true",
                   help="every checkpoint; by default, the one --resume would take and the "
                        "damaged ones newer than it")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args) -> None:
    from .checkpoint import describe
    from .errors import MpipsError
    try:
        text, ok = describe(args.ckpt_dir, every=args.all)
    except (OSError, ValueError, MpipsError) as e:
        _fail(str(e), 2)
    _print(text)
    sys.exit(0 if ok else 1)


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.run(args)
