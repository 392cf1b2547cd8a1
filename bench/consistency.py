"""BSP, SSP and ASP with one worker slowed 3x: time to a target held-out logloss.

    python bench/consistency.py [--rows 500000] [--slowdown 3] [--repeats 3]

Trains one epoch with 1 server and 3 workers for staleness s in {0, 1, 3, 10, inf}
(s = 0 is BSP, s = inf is ASP), worker 0 slowed by --slowdown (--straggler). The
servers snapshot the model every --every seconds; each snapshot is scored on the
test set to draw held-out logloss against wall time. Prints, per s, the time to
reach the target logloss (by default 0.5% above the best final logloss of all
runs; interpolated between snapshots), the final logloss and the time workers
spent waiting, as medians over --repeats runs; writes
bench/results/consistency.json and consistency.png (the first run's curves).
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from workers import dataset, mpiexec, run  # noqa: E402

from mpips.models.evaluate import read_rows, score_snapshots  # noqa: E402
from report import save  # noqa: E402

STALENESS = [0, 1, 3, 10, None]   # None: ASP


def label(s) -> str:
    return "ASP (s=inf)" if s is None else "BSP (s=0)" if s == 0 else f"SSP s={s}"


def consistency_args(s) -> list:
    if s is None:
        return ["--consistency", "asp"]
    return ["--consistency", "bsp"] if s == 0 else ["--consistency", "ssp", "--staleness", str(s)]


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


def train(prefix, s, args, test) -> dict:
    """One run at staleness s: its learning curve from the snapshots, and its summary."""
    out = os.path.join(HERE, "out", f"consistency-{'inf' if s is None else s}")
    run([mpiexec(), "-n", "4", sys.executable, "-m", "mpips", "train", "--servers", "1",
         "--train", prefix + ".train.svm", "--test", prefix + ".test.svm", "--out", out,
         "--overwrite", "--straggler", f"0:{args.slowdown}", "--snapshot-every",
         str(args.every), *consistency_args(s)])
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    fast = len(summary["wait_s"]) - 1
    skipped = []
    curve = score_snapshots(out, test, skipped)
    for note in skipped:
        print(f"{out}: {note}", file=sys.stderr)
    return {"curve": curve, "final_logloss": summary["test_logloss"],
            "train_s": summary["train_s"], "max_clock_gap": summary["max_clock_gap"],
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
    parser.add_argument("--repeats", type=int, default=3, help="runs per s; medians reported")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "consistency.json"))
    args = parser.parse_args()

    prefix = dataset(args.rows)
    test = read_rows(prefix + ".test.svm")
    trials = {s: [] for s in STALENESS}
    for repeat in range(args.repeats):       # interleaved, so drift hits every s alike
        for s in STALENESS:
            trials[s].append(train(prefix, s, args, test))
    target = args.target or 1.005 * min(t["final_logloss"] for ts in trials.values() for t in ts)
    runs = []
    for s, ts in trials.items():
        for t in ts:
            t["time_to_target_s"] = time_to(t["curve"], target)
        runs.append({"staleness": s, "label": label(s),
                     **{k: median([t[k] for t in ts]) for k in ts[0] if k != "curve"},
                     "time_to_target_each_s": [t["time_to_target_s"] for t in ts],
                     "curve": ts[0]["curve"]})
    base = runs[0]["time_to_target_s"]
    print(f"target held-out logloss {target:.4f}; worker 0 slowed {args.slowdown:g}x; "
          f"1 server, 3 workers, {args.rows:,} rows, one epoch; medians of {args.repeats} runs")
    print("waiting: 'held' is time pulls were held for the clocks; 'wait' adds round trips")
    print(f"{'':>12} {'to target s':>11} {'vs BSP':>7} {'final':>7} {'train s':>8} "
          f"{'max gap':>7} {'held s fast':>11} {'held s slow':>11} {'wait s fast':>11}")
    nan = float("nan")
    for r in runs:
        t = r["time_to_target_s"]
        r["speedup_vs_bsp"] = base / t if t and base else None
        print(f"{r['label']:>12} {t or nan:>11.2f} {r['speedup_vs_bsp'] or nan:>6.2f}x "
              f"{r['final_logloss']:>7.4f} {r['train_s']:>8.2f} {r['max_clock_gap']:>7} "
              f"{r['held_s_others']:>11.2f} {r['held_s_straggler']:>11.2f} "
              f"{r['wait_s_others']:>11.2f}")
    save(args.out, "consistency", rows=args.rows, slowdown=args.slowdown,
         target_logloss=target, cpus=os.cpu_count(), runs=runs)
    plot(runs, target, args, os.path.splitext(args.out)[0] + ".png")


def plot(runs, target, args, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for r in runs:
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
