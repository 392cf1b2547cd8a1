"""BSP, SSP, ASP and BSP with --balance dynamic, one worker slowed 3x: time per epoch and
time to a target held-out logloss, against the ideal.

    python bench/consistency.py [--rows 500000] [--slowdown 3] [--repeats 3]

Trains one epoch with 1 server and 3 workers for staleness s in {0, 1, 3, 10, inf}
(s = 0 is BSP, s = inf is ASP) and for BSP with --balance dynamic (the lead hands the rows
out in chunks, each worker's minibatch following its speed), worker 0 slowed by --slowdown
(--straggler); then BSP, static and dynamic, with a slowness that comes and goes (slowed for
--period clocks in every 2 x --period), and BSP with no straggler. The ideal is the time per
epoch of the run with no straggler, scaled to the workers' summed speed with it: W / (W - 1 +
1/slowdown) times as long (W / (W - 1 + (1 + 1/slowdown) / 2) when it comes and goes). The
servers snapshot the model every --every seconds; each snapshot is scored on the test set to
draw held-out logloss against wall time. Prints, per run, the time per epoch, the time to
reach the target logloss (by default 0.5% above the best final logloss of all runs;
interpolated between snapshots), the final logloss and the time workers spent waiting, as
medians over --repeats runs (a run's epoch against the ideal: the median of each repeat's
against the same repeat's no-straggler run, since the machine drifts between repeats);
writes bench/results/consistency.json and consistency.png (the first run's curves).
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from workers import dataset, mpiexec, run  # noqa: E402

from mpips.models.evaluate import read_rows, score_snapshots  # noqa: E402
from report import save  # noqa: E402

STALENESS = [0, 1, 3, 10, None]   # None: ASP
WORKERS = 3
STEADY, COMES_AND_GOES, NONE = "steady", "comes and goes", "none"   # the straggler's slowness
# (staleness, --balance, slowness) of each run, in the order printed.
RUNS = ([(s, "static", STEADY) for s in STALENESS] + [(0, "dynamic", STEADY)]
        + [(0, "static", COMES_AND_GOES), (0, "dynamic", COMES_AND_GOES), (0, "static", NONE)])


def label(s, balance="static", slowness=STEADY) -> str:
    name = "ASP (s=inf)" if s is None else "BSP (s=0)" if s == 0 else f"SSP s={s}"
    if balance == "dynamic":
        name = "BSP dynamic" if s == 0 else f"{name} dynamic"
    return {STEADY: name, COMES_AND_GOES: f"{name}, on/off", NONE: "no straggler"}[slowness]


def consistency_args(s) -> list:
    if s is None:
        return ["--consistency", "asp"]
    return ["--consistency", "bsp"] if s == 0 else ["--consistency", "ssp", "--staleness", str(s)]


def straggler_args(slowness, args) -> list:
    if slowness == NONE:
        return []
    period = f":{args.period}" if slowness == COMES_AND_GOES else ""
    return ["--straggler", f"0:{args.slowdown}{period}"]


def summed_speed(slowness, slowdown: float) -> float:
    """The workers' summed speed, in workers at full speed."""
    slow = {STEADY: 1 / slowdown, COMES_AND_GOES: (1 + 1 / slowdown) / 2, NONE: 1.0}[slowness]
    return WORKERS - 1 + slow


def time_to(curve, target):
    """Seconds into training when the held-out logloss first reaches the target,
    interpolated linearly between snapshots; None if it never does."""
    for before, after in zip([None] + curve[:-1], curve):
        if after["logloss"] <= target:
            if before is None:
                return after["elapsed_s"]
            t0, t1 = before["elapsed_s"], after["elapsed_s"]
            l0, l1 = before["logloss"], after["logloss"]
            return t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return None


def median(values):
    """The median, or None unless most values exist (a run that never reached the target
    counts against its s rather than being dropped)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if 2 * len(present) > len(values) else None


def train(prefix, key, args, test) -> dict:
    """One run (staleness, balance, slowness): its learning curve from the snapshots, and its
    summary."""
    s, balance, slowness = key
    out = os.path.join(HERE, "out", f"consistency-{'inf' if s is None else s}-{balance}-"
                                    f"{slowness.replace(' ', '-')}")
    run([mpiexec(), "-n", str(1 + WORKERS), sys.executable, "-m", "mpips", "train",
         "--servers", "1", "--train", prefix + ".train.svm", "--test", prefix + ".test.svm",
         "--out", out, "--overwrite", "--epochs", str(args.epochs), "--snapshot-every",
         str(args.every), *(["--batch-size", str(args.batch_size)] if args.batch_size else []),
         "--balance", balance, *straggler_args(slowness, args), *consistency_args(s)])
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    fast = len(summary["wait_s"]) - 1
    skipped = []
    curve = score_snapshots(out, test, skipped)
    for note in skipped:
        print(f"{out}: {note}", file=sys.stderr)
    rows = [sum(w) for w in summary.get("rows_per_epoch", [])]
    return {"curve": curve, "final_logloss": summary["test_logloss"],
            "train_s": summary["train_s"], "epoch_s": summary["train_s"] / args.epochs,
            "max_clock_gap": summary["max_clock_gap"],
            "rows_straggler": rows[0] if rows else None,
            "held_s_straggler": summary["held_s"][0],
            "held_s_others": sum(summary["held_s"][1:]) / fast,
            "wait_s_straggler": summary["wait_s"][0],
            "wait_s_others": sum(summary["wait_s"][1:]) / fast}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--slowdown", type=float, default=3.0)
    parser.add_argument("--every", type=float, default=0.25, help="snapshot interval, seconds")
    parser.add_argument("--target", type=float, help="logloss to reach (default: see above)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; medians reported")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, help="rows a minibatch (default: mpips's "
                                                           "choice)")
    parser.add_argument("--period", type=int, default=100,
                        help="clocks slowed, then as many not, for the on/off runs")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "consistency.json"))
    args = parser.parse_args()

    prefix = dataset(args.rows)
    test = read_rows(prefix + ".test.svm")
    trials = {key: [] for key in RUNS}
    for _ in range(args.repeats):       # interleaved, so drift hits every run alike
        for key in RUNS:
            trials[key].append(train(prefix, key, args, test))
    target = args.target or 1.005 * min(t["final_logloss"] for ts in trials.values() for t in ts)
    runs = []
    for (s, balance, slowness), ts in trials.items():
        for t in ts:
            t["time_to_target_s"] = time_to(t["curve"], target)
        runs.append({"staleness": s, "balance": balance, "straggler": slowness,
                     "label": label(s, balance, slowness),
                     **{k: median([t[k] for t in ts]) for k in ts[0] if k != "curve"},
                     "time_to_target_each_s": [t["time_to_target_s"] for t in ts],
                     "epoch_each_s": [t["epoch_s"] for t in ts],
                     "curve": ts[0]["curve"]})
    base, bsp = runs[0]["time_to_target_s"], runs[0]["final_logloss"]
    alone = next(r["epoch_s"] for r in runs if r["straggler"] == NONE)
    # Each repeat's run against the same repeat's ideal: the machine's speed drifts between
    # repeats (the no-straggler epoch alone moved by 30% between launches), less within one.
    alone_each = next(r["epoch_each_s"] for r in runs if r["straggler"] == NONE)
    print(f"target held-out logloss {target:.4f}; worker 0 slowed {args.slowdown:g}x (on/off: "
          f"for {args.period} clocks in every {2 * args.period}); 1 server, {WORKERS} workers, "
          f"{args.rows:,} rows, {args.epochs} epoch(s), minibatches of "
          f"{args.batch_size or 'the default'}; medians of {args.repeats} runs")
    print("ideal: the epoch time with no straggler, scaled to the workers' summed speed; "
          "/ideal: the median of each repeat's epoch against that repeat's ideal; "
          "'held' is time pulls were held for the clocks")
    print(f"{'':>22} {'epoch s':>7} {'ideal s':>7} {'/ideal':>6} {'to target s':>11} "
          f"{'vs BSP':>7} {'final':>7} {'vs BSP':>7} {'max gap':>7} {'held s fast':>11} "
          f"{'slow rows':>9}")
    nan = float("nan")
    for r in runs:
        t = r["time_to_target_s"]
        r["speedup_vs_bsp"] = base / t if t and base else None
        scale = WORKERS / summed_speed(r["straggler"], args.slowdown)
        r["ideal_epoch_s"] = alone * scale
        r["epoch_vs_ideal_each"] = [e / (a * scale) for e, a in zip(r["epoch_each_s"],
                                                                      alone_each)]
        r["epoch_vs_ideal"] = statistics.median(r["epoch_vs_ideal_each"])
        r["logloss_vs_bsp"] = r["final_logloss"] / bsp - 1
        print(f"{r['label']:>22} {r['epoch_s']:>7.2f} {r['ideal_epoch_s']:>7.2f} "
              f"{r['epoch_vs_ideal']:>6.2f} {t or nan:>11.2f} {r['speedup_vs_bsp'] or nan:>6.2f}x "
              f"{r['final_logloss']:>7.4f} {r['logloss_vs_bsp']:>+7.2%} {r['max_clock_gap']:>7} "
              f"{r['held_s_others']:>11.2f} {r['rows_straggler'] or 0:>9,}")
    save(args.out, "consistency", rows=args.rows, slowdown=args.slowdown, epochs=args.epochs,
         batch_size=args.batch_size,
         period=args.period, target_logloss=target, cpus=os.cpu_count(), runs=runs)
    plot(runs, target, args, os.path.splitext(args.out)[0] + ".png")


def plot(runs, target, args, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for r in runs:
        if r["straggler"] != STEADY:
            continue
        ax.plot([c["elapsed_s"] for c in r["curve"]], [c["logloss"] for c in r["curve"]],
                marker=".", label=r["label"])
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel("wall time since training started (s)")
    ax.set_ylabel("held-out logloss")
    ax.set_title(f"1 server, 3 workers, worker 0 slowed {args.slowdown:g}x")
    finals = [r["final_logloss"] for r in runs]
    ax.set_ylim(min(finals) - 0.002, min(finals) + 0.03)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
