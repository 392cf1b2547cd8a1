"""`score`, `report`, `schedule`, `inspect`: the commands that describe, in one process, a
trained model, its runs, a pipeline's schedule or a directory of checkpoints."""
import logging
import sys

from ..ranks.exits import fail, print_out


def score_parser(sub):
    p = sub.add_parser(
        "score", help="score a trained model (or a run's snapshots) on a test file",
        description="Held-out logloss and AUC of a saved model, in one process (the test file "
                    "must fit in memory). RUN_DIR is a run's --out directory or a model "
                    "directory of server-NNNN.h5 files.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--test", required=True, metavar="FILE", help="test data: text, a directory "
                   "from convert, or Parquet (of the training data's format)")
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

    from ..base.errors import MpipsError
    from ..base.files import write_bytes
    from ..base.log import say, setup
    from ..data.inputs import check_input
    from ..models.evaluate import read_rows, score_model, score_snapshots, warn_if_few_known
    from ..storage.model_files import model_dir_of
    setup("score")
    try:
        check_input(args.test, "--test")
        rows = read_rows(args.test)
        if args.snapshots:
            skipped: list[str] = []
            curve = score_snapshots(args.run_dir, rows, skipped, test=args.test)
            for note in skipped:
                logging.getLogger("mpips").warning("%s: %s", args.run_dir, note)
            if not curve:
                fail(f"{args.run_dir}/snapshots: no complete snapshots", 2)
            for r in curve:
                clock = "done" if r["slowest_clock"] < 0 else r["slowest_clock"]
                say(f"snapshot {r['snapshot']:>5}  {r['elapsed_s']:7.2f} s  slowest clock "
                    f"{clock:>6}  logloss {r['logloss']:.4f}  AUC {_auc(r)}")
        else:
            model = model_dir_of(args.run_dir) or args.run_dir
            result = score_model(model, rows, allow_partial=args.allow_partial, test=args.test)
            if "known_keys" in result:
                warn_if_few_known(result["known_keys"], args.test, model)
            say(f"logloss {result['logloss']:.4f}  AUC {_auc(result)} on "
                f"{result['examples']:,} examples")
        if args.json:
            write_bytes(args.json, json.dumps(curve if args.snapshots else result,
                                              indent=2).encode())
    except (OSError, ValueError, MpipsError) as e:
        fail(str(e), 2)


def report_parser(sub):
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
    from ..base.errors import MpipsError
    from ..base.log import say
    from .report import report
    try:
        path = report(args.run_dirs, args.out, args.test)
    except (OSError, ValueError, MpipsError) as e:
        fail(str(e), 2)
    say(f"report: {path}")


def schedule_parser(sub):
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
    from ..pipeline.schedule import POLICIES, describe
    try:
        schedule = POLICIES[args.policy](args.stages, args.micro_batches)
    except ValueError as e:
        fail(str(e), 2)
    print_out(describe(schedule))


def inspect_parser(sub):
    p = sub.add_parser(
        "inspect", help="describe the checkpoints in a directory, or a trained model",
        description="The checkpoint in CKPT_DIR that --resume would take (and any damaged "
                    "ones newer than it, which a resume passes over; --all: every one). For "
                    "each, newest first: whether it is complete "
                    "and undamaged, its clock, keys and weight norms per server, where each "
                    "worker stood, and the configuration that wrote it. The files are plain "
                    "HDF5 (h5dump -H CKPT_DIR/clock-*/server-0000.h5). Given a model "
                    "directory (server-NNNN.h5 files) or a run's --out (its model/): each "
                    "file's checksums, keys and weight norms, the training data's format, and "
                    "whether the model can be read. Exit status 1 if nothing is usable.")
    p.add_argument("ckpt_dir", metavar="CKPT_DIR")
    p.add_argument("--all", action="store_true",
                   help="every checkpoint; by default, the one --resume would take and the "
                        "damaged ones newer than it")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args) -> None:
    from ..base.errors import MpipsError
    from ..storage import model_files
    from ..storage.checkpoint import all_checkpoints, describe
    model = model_files.model_dir_of(args.ckpt_dir)
    try:
        if model and not all_checkpoints(args.ckpt_dir):
            text, ok = model_files.describe(model)
        else:
            text, ok = describe(args.ckpt_dir, every=args.all)
    except (OSError, ValueError, MpipsError) as e:
        fail(str(e), 2)
    print_out(text)
    sys.exit(0 if ok else 1)
