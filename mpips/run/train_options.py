"""`train`'s options, one table (OPTIONS) in their groups (GROUPS): flags, types, defaults
and help, from which the command line's parser is built (run/options)."""

from ..models.optimizer import NAMES
from ..models.specs import ModelName
from .config_choices import Balance, Consistency, DataFormat, PushValues, Schedule, Solver
from .option_spec import (
    byte_size,
    checkpoint_interval,
    epochs_or_off,
    finite_float,
    straggler,
    train_option,
    values,
    widths,
)

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
    train_option("io", "--train", required=True, metavar="FILE",
            help="training data: svmlight or libffm text, Criteo TSV, Avazu CSV, "
                 "a directory from convert, or a Parquet file or folder of them"),
    train_option("io", "--format", choices=values(DataFormat),
            help="the text's format: svmlight (label idx:val ...); libffm (label "
                 "field:idx:val ..., field 0 to 254, idx below 2^56); criteo (label, 13 "
                 "integer and 26 hexadecimal fields, tab separated, empty fields "
                 "allowed: integers are log-bucketed and every value hashed with its "
                 "field to a 64-bit key); avazu (its CSV with the header: the id "
                 "ignored, the hour as hour of day and weekday, every other value "
                 "hashed with its column) (default: as the file's first line shows)"),
    train_option("io", "--test", metavar="FILE",
            help="held-out data scored after training (logloss, AUC in the summary)"),
    train_option("io", "--out", metavar="RUN_DIR",
            help="where summary.json and the model go (default: runs/<date-time-id>)"),
    train_option("io", "--overwrite", action="store_true",
            help="replace the run already in RUN_DIR (by default that is an error)"),
    train_option("io", "--skip-bad-lines", action="store_true",
            help="count and skip malformed lines instead of stopping at the first one"),
    train_option("job", "--servers", type=int, default=1, metavar="N",
            help="ranks that hold the model; the other ranks are workers (default: 1)"),
    train_option("job", "--replicas", type=int, default=1, metavar="R",
            help="keep every key on R servers: a primary, which answers reads, and R-1 "
                 "backups on the next servers (other nodes first), which apply the "
                 "same pushes (default: 1, no copies)"),
    train_option("job", "--spares", type=int, default=0, metavar="K",
            help="K more server ranks (after the --servers ones) that hold nothing and "
                 "wait: when a server dies (under ULFM, with --replicas 2 or more), a "
                 "spare stands in for it and receives copies of every key range it "
                 "held, instead of the survivors taking them on; `mpips ctl RUN_DIR "
                 "add-server` gives key ranges to one while the job trains "
                 "(default: 0)"),
    train_option("job", "--vnodes", type=int, default=16, metavar="V",
            help="key ranges per server: the hash of the keys is cut into servers x V "
                 "equal ranges dealt round the ring: the shares are equal at any V; "
                 "more ranges per server are what keeps them even once servers join "
                 "or leave (mpips ctl): 16 keeps the largest within 2.1%% of the mean "
                 "after a join on the built-in data, 64 within 1.1%% (see "
                 "bench/ring.py) (default: %(default)s)"),
    train_option("job", "--consistency", choices=values(Consistency), default="bsp",
            help="when a worker may read: bsp, only once every worker has finished the "
                 "previous clock (default); ssp, while at most --staleness clocks ahead "
                 "of the slowest worker; asp, always (never waits)"),
    train_option("job", "--staleness", type=int, metavar="S",
            help="for --consistency ssp: how many clocks the fastest worker may be ahead "
                 "of the slowest (0 behaves as bsp)"),
    train_option("job", "--balance", choices=values(Balance), default="static",
            help="who trains which rows: static, each worker its own part of the data, "
                 "a run with a fixed seed repeatable bit for bit (default); dynamic, the "
                 "lead server hands each epoch's rows out in chunks as the workers ask, "
                 "each worker's minibatch following its speed, so that a slow worker holds "
                 "no clock back (the hand-out, so the model, then depends on timing)"),
    train_option("job", "--timeout", type=finite_float, default=600.0, metavar="SECONDS",
            help="longest any rank waits for another before failing the job "
                 "(default: %(default)g)"),
    train_option("job", "--log-every", type=finite_float, default=5.0, metavar="SECONDS",
            help="progress line interval on rank 0 (default: %(default)g)"),
    train_option("job", "--disk-wait", type=finite_float, default=600.0, metavar="SECONDS",
            help="when the model cannot be saved because the disk is full, keep it in "
                 "memory and try again for this long, saying how much space it needs "
                 "(default: %(default)g)"),
    train_option("backup", "--checkpoint-every", type=checkpoint_interval, default=(None, None),
            metavar="N|Ts",
            help="write a checkpoint every N clocks (one clock = one minibatch per "
                 "worker), or every T seconds with a suffix s, m or h (30s, 10m), "
                 "and when training ends (default: with --resume, as the run "
                 "resumed did; else 0, only when asked to stop)"),
    train_option("backup", "--checkpoint-inline", action="store_true",
            help="write each server's checkpoint file in the server's loop, every worker "
                 "waiting meanwhile, instead of in a forked process that takes the state at "
                 "the checkpoint's clock and writes it while the server goes on serving (for "
                 "an MPI whose transport must not see its rank fork)"),
    train_option("backup", "--checkpoint-dir", metavar="DIR",
            help="where checkpoints go (default: RUN_DIR/checkpoints)"),
    train_option("backup", "--keep-checkpoints", type=int, metavar="K",
            help="keep the newest K complete checkpoints (default: with --resume, "
                 "as the run resumed did; else 3)"),
    train_option("backup", "--resume", metavar="DIR",
            help="continue from the newest complete, undamaged checkpoint in DIR "
                 "(the same workers and data; the number of servers may change). "
                 "It replaces the outputs in RUN_DIR of the run that wrote the "
                 "checkpoint, and nothing else"),
    train_option("backup", "--allow-changed-data", action="store_true",
            help="resume even though --train changed since the checkpoint (its "
                 "size, modification time or first and last MiB differ); each "
                 "worker goes on at the first row at or after its recorded place"),
    train_option("diag", "--snapshot-every", type=finite_float, metavar="SECONDS",
            help="also save the model every SECONDS of training to "
                 "RUN_DIR/snapshots/NNNN/ (learning curves: `python -m mpips score "
                 "RUN_DIR --snapshots`)"),
    train_option("diag", "--tensorboard", metavar="DIR",
            help="write live curves for TensorBoard to DIR as the job trains (training "
                 "loss, examples/s, each worker's waiting, server bytes; the held-out "
                 "logloss and AUC of each --snapshot-every snapshot as it is taken, scored "
                 "on --test by a process beside the lead, and of the final model): "
                 "`tensorboard --logdir DIR` shows them (TensorBoard is not needed to "
                 "write them)"),
    train_option("diag", "--record-pulls", action="store_true",
            help="each server writes every pull it served to RUN_DIR/pulls/ (worker, "
                 "its clock, the slowest worker's clock, time held), to check the "
                 "consistency model from outside"),
    train_option("diag", "--straggler", action="append", default=[], metavar="W:FACTOR[:CLOCKS]",
            type=straggler,
            help="make worker W (0-based among workers) take FACTOR times as long per "
                 "minibatch (at least 1 ms), by sleeping; with CLOCKS, only for CLOCKS "
                 "clocks in every 2 x CLOCKS (slowness that comes and goes); to test and "
                 "measure the consistency models and --balance (repeatable)"),
    train_option("diag", "--test-event", action="append", default=[], metavar="EVENT",
            help="a testing aid for mpips's own tests, refused unless MPIPS_TESTING=1: "
                 "fire EVENT when the job reaches a point, e.g. 'kill rank 1 at clock "
                 "30', 'freeze rank 3 at epoch 2', 'stop rank 2 at checkpoint 1', "
                 "'ctl add-server at clock 40' (`python -m mpips.run.testevents` lists "
                 "them; repeatable)"),
    train_option("opt", "--model", choices=values(ModelName), default="lr",
            help="lr: logistic regression; fm: a factorization machine (Rendle 2010): "
                 "each key's row on the servers holds its weight and a latent vector, "
                 "and pairs of features interact through their vectors' dot product; "
                 "widedeep: Wide & Deep (Cheng et al. 2016): each key's row holds its "
                 "weight and an embedding, and an MLP on the sum of a row's "
                 "embeddings adds to the linear margin; the MLP's weights are rows "
                 "on the servers too (default: lr)"),
    train_option("opt", "--factors", type=int, default=8, metavar="K",
            help="fm: the latent vectors' length (default: 8)"),
    train_option("opt", "--embedding-dim", type=int, default=8, metavar="K",
            help="widedeep: each key's embedding length (default: 8)"),
    train_option("opt", "--hidden", type=widths, default=(64, 32), metavar="W1,W2,...",
            help="widedeep: the widths of the MLP's hidden ReLU layers, on the "
                 "row's embeddings (default: 64,32)"),
    train_option("opt", "--fields", type=int, metavar="F",
            help="widedeep: the network's input is the embeddings of a row's F fields "
                 "concatenated (each field's: the sum of its features' embeddings); "
                 "0 sums all of a row's embeddings. A feature's field is in its key: "
                 "Criteo's 39 and Avazu's 23 are known, libffm text (label "
                 "field:idx:val ...) needs F given, svmlight has none (default: the "
                 "data's, else 0)"),
    train_option("pipe", "--stages", type=int, default=1, metavar="S",
            help="widedeep: cut the network into S stages of balanced measured cost, "
                 "one per worker; the workers form (workers / S) data-parallel "
                 "copies of the pipeline, and every stage's weights stay rows on the "
                 "servers (default: 1, the whole network on each worker)"),
    train_option("pipe", "--micro-batches", type=int, default=4, metavar="M",
            help="cut each minibatch into M micro-batches that flow through the "
                 "stages (default: 4)"),
    train_option("pipe", "--pipeline", choices=values(Schedule), default="1f1b",
            help="the schedule: gpipe (all forwards, then all backwards) or 1f1b "
                 "(one forward, one backward: fewer activations held; default)"),
    train_option("pipe", "--print-schedule", action="store_true",
            help="print the network's layers, each stage's share of them and every "
                 "stage's tasks in order, then exit without training"),
    train_option("opt", "--epochs", type=int, default=1, help="passes over the data (default: 1)"),
    train_option("opt", "--batch-size", type=int, metavar="B",
            help="rows per minibatch per worker; one pull and one push each (default: "
                 "about 1000 minibatches per epoch for the worker with the fewest rows, "
                 "at most 1000 rows; a resumed run keeps its own)"),
    train_option("opt", "--optimizer", choices=NAMES, default="adagrad",
            help="server-side update rule: sgd, adagrad, ftrl (McMahan et al. 2013) or "
                 "adam (Kingma and Ba 2015; a key's moments move when it is pushed); "
                 "the state lives in the key's row and is checkpointed (default: "
                 "adagrad)"),
    train_option("opt", "--lr", type=finite_float, metavar="RATE",
            help="learning rate; FTRL's alpha (default: chosen from a sample of the "
                 "training data. sgd: 1 / L, L = (workers x top eigenvalue of "
                 "X'X/n + mean |x|^2 / batch size) / 4, a bound on the curvature of "
                 "one clock's updates; adagrad and ftrl: 2 / (features per row x "
                 "median |value|); adam: a tenth of that; the job's log says what it "
                 "chose)"),
    train_option("opt", "--average-after", type=epochs_or_off, metavar="EPOCHS|off",
            help="sgd only: the model is the mean of the weights from this many epochs "
                 "on to the end (averaged SGD: the mean is closer to the optimum than "
                 "the last, noisy weights; the first steps are left out), or the last "
                 "weights with 'off' (default: 0.5)"),
    train_option("opt", "--l2", type=finite_float, default=0.0,
            help="L2 penalty: the objective is mean logloss + l2/2 * |w|^2, applied "
                 "to the keys each minibatch touches (default: 0)"),
    train_option("opt", "--l1", type=finite_float, default=0.0,
            help="L1 penalty (FTRL, or --solver lbfgs, which is then OWL-QN; gives "
                 "sparse models) (default: 0)"),
    train_option("opt", "--ftrl-beta", type=finite_float, metavar="BETA",
            help="FTRL's beta in the per-key rate alpha / (beta + sqrt(n)); workers push "
                 "mean minibatch gradients, so it is smaller than the paper's per-example "
                 "1 (default: 1 / batch size)"),
    train_option("opt", "--no-bias", dest="bias", action="store_false",
            help="no intercept (by default key 2^64-1 is an always-on bias feature)"),
    train_option("comm", "--push-values", choices=values(PushValues),
            default="float32",
            help="how pushed values travel: float16 halves their bytes, int8 (a float32 "
                 "scale per 256 values) quarters them (default: float32, exact)"),
    train_option("comm", "--push-threshold", type=finite_float, default=0.0, metavar="T",
            help="hold a key's row back while every entry of its gradient (plus what "
                 "was held back) is below T in magnitude: rare keys' small updates "
                 "wait until they add up; pushes then name their rows in a bitmap "
                 "(1 bit a pulled key) (default: 0, every row)"),
    train_option("comm", "--push-skip-zeros", action="store_true",
            help="ftrl with --l1: hold a key's row back while its pulled weights are 0 "
                 "and every entry of its gradient (plus what was held back) is at "
                 "most --l1 in magnitude (such a push, to a key whose z is 0, leaves "
                 "its weight 0)"),
    train_option("job", "--max-rank-memory", type=byte_size, metavar="SIZE",
            help="bytes each rank may hold in its tables (servers) and rows (a "
                 "full-batch worker), such as 512M or 4G: an allocation past it stops "
                 "the job naming what asked; summary.json reports each rank's peak "
                 "(default: no limit)"),
    train_option("full", "--solver", choices=values(Solver), default="minibatch",
            help="minibatch: the servers' optimizers, a push per minibatch "
                 "(default); lbfgs: full batch over dense tables"),
    train_option("full", "--dim", type=int, default=1 << 20, metavar="N",
            help="coordinates of the weight vector (default: 2^20)"),
    train_option("full", "--history", type=int, default=10, metavar="M",
            help="pairs of past steps L-BFGS keeps (default: 10)"),
    train_option("full", "--max-iter", type=int, default=500,
            help="iterations at most (default: 500)"),
    train_option("full", "--tol", type=finite_float, default=1e-10,
            help="stop when an iteration lowers the objective by less than this, "
                 "relatively (default: 1e-10)"),
)
BY_NAME = {option.name: option for option in OPTIONS}
