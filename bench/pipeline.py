"""Pipeline parallelism: throughput against the number of stages S and micro-batches M, the
measured bubble beside the theoretical (S-1)/(M+S-1), and the activations each stage held
at most under GPipe and 1F1B; a timeline of one step as a PNG.

    python bench/pipeline.py [--stages 1,2] [--micros 1,2,4,8] [--steps 6]

Each (S, M, policy) is one `mpiexec -n S` launch of this file: an MLP of --hidden layers on
--batch random rows, cut into S stages balanced by measured layer costs, trained --steps
steps after one warm-up step. The bubble is 1 - (time the ranks spent in tasks) / (S x the
step's wall time; a task's time starts when its input has arrived), the median over steps.
Each rank computes with one BLAS thread, so that S ranks use S cores; on a machine with fewer
cores than S they would share them, so S is at most the cores by default.
Writes bench/results/pipeline.json and bench/results/pipeline-timeline.png.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from report import save  # noqa: E402

from mpips.pipeline.schedule import theoretical_bubble  # noqa: E402


def as_rank(args) -> None:
    """One rank of a launch: its stage, the steps, its records in args.work."""
    from mpi4py import MPI

    from mpips.models.network import init, measured_costs, mlp, partition, stages_of
    from mpips.pipeline.stage_rank import StageRank
    from mpips.pipeline.schedule import POLICIES

    comm = MPI.COMM_WORLD
    layers = mlp(args.inputs, [int(h) for h in args.hidden.split(",")])
    weights = init(layers, 1)
    costs = np.array(measured_costs(layers, weights, args.batch // args.micros)
                     if comm.rank == 0 else [0.0] * len(layers))
    comm.Bcast(costs, root=0)   # every rank cuts alike
    cuts = partition(list(costs), comm.size)
    stage = stages_of(layers, weights, cuts, args.micros)[comm.rank]
    rank = StageRank(comm, stage, layers[cuts[comm.rank].start].inputs, timeout=120)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(args.batch, args.inputs))
    labels = (x[:, 0] > 0).astype(np.float64)
    rows = [len(p) for p in np.array_split(np.arange(args.batch), args.micros)]
    tasks = POLICIES[args.policy](comm.size, args.micros)[comm.rank]
    steps = []
    for step in range(args.steps + 1):
        comm.Barrier()
        start = time.perf_counter()
        _, record = rank.step(tasks, rows, x if comm.rank == 0 else None,
                              labels if stage.last else None, 0.01)
        comm.Barrier()
        wall = time.perf_counter() - start
        if step:   # the first compiles and warms the caches
            steps.append({"wall": wall, "busy": float((record["end"] - record["start"]).sum()),
                          "tasks": [[r["kind"].decode(), int(r["micro"]), float(r["start"]),
                                     float(r["end"])] for r in record]})
    with open(os.path.join(args.work, f"rank-{comm.rank}.json"), "w") as f:
        json.dump({"stage": comm.rank, "steps": steps, "peak_held_bytes": stage.peak_held_bytes,
                   "layers": [cuts[comm.rank].start, cuts[comm.rank].stop]}, f)


def launch(args, stages: int, micros: int, policy: str) -> dict:
    with tempfile.TemporaryDirectory() as work:
        command = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(stages),
                   sys.executable, __file__, "--as-rank", "--work", work, "--policy", policy,
                   "--micros", str(micros), "--batch", str(args.batch), "--hidden",
                   args.hidden, "--inputs", str(args.inputs), "--steps", str(args.steps)]
        # One BLAS thread a rank: S ranks then use S cores, and S=1 is one core's figure.
        env = {**os.environ, **{v: "1" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                 "MKL_NUM_THREADS")}}
        subprocess.run(command, check=True, timeout=600, env=env)
        ranks = []
        for r in range(stages):
            with open(os.path.join(work, f"rank-{r}.json")) as f:
                ranks.append(json.load(f))
    walls = np.array([[s["wall"] for s in r["steps"]] for r in ranks]).max(axis=0)
    busy = np.array([[s["busy"] for s in r["steps"]] for r in ranks]).sum(axis=0)
    step = int(np.argsort(walls)[len(walls) // 2])   # the median step, for the timeline
    return {"stages": stages, "micros": micros, "policy": policy,
            "examples_per_s": args.batch / float(np.median(walls)),
            "bubble": float(np.median(1 - busy / (stages * walls))),
            "bubble_theory": theoretical_bubble(stages, micros),
            "peak_held_mib": [r["peak_held_bytes"] / 2**20 for r in ranks],
            "layers": [r["layers"] for r in ranks],
            "timeline": [r["steps"][step]["tasks"] for r in ranks]}


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"F": "tab:blue", "B": "tab:orange", "U": "tab:gray"}
    fig, ax = plt.subplots(figsize=(11, 1 + 0.7 * result["stages"]))
    for s, tasks in enumerate(result["timeline"]):
        for kind, micro, start, end in tasks:
            ax.broken_barh([(start * 1e3, max(end - start, 1e-6) * 1e3)], (s - 0.4, 0.8),
                           color=colors[kind], edgecolor="white")
            if kind != "U" and (end - start) * 1e3 > 0.02 * ax.get_xlim()[1]:
                ax.text((start + end) / 2 * 1e3, s, f"{kind}{micro}", ha="center",
                        va="center", fontsize=7, color="white")
    ax.set_yticks(range(result["stages"]), [f"stage {s}" for s in range(result["stages"])])
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds into the step")
    ax.set_title(f"One step, {result['policy']}, S={result['stages']}, M={result['micros']}: "
                 f"bubble {result['bubble']:.0%} (theory {result['bubble_theory']:.0%}); "
                 f"blue forward, orange backward")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cores = len(os.sched_getaffinity(0))
    parser.add_argument("--stages", default=",".join(str(s) for s in range(1, min(cores, 4) + 1)))
    parser.add_argument("--micros", default="1,2,4,8")
    parser.add_argument("--policies", default="gpipe,1f1b")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--inputs", type=int, default=256)
    parser.add_argument("--hidden", default="512,512,512,512")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "pipeline.json"))
    parser.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--policy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_rank:
        args.micros = int(args.micros)
        as_rank(args)
        return
    results = []
    print(f"{'S':>2} {'M':>2} {'policy':>6} {'examples/s':>11} {'bubble':>7} {'theory':>7}  "
          f"peak activations per stage (MiB)")
    for stages in map(int, args.stages.split(",")):
        for micros in map(int, args.micros.split(",")):
            for policy in args.policies.split(","):
                r = launch(args, stages, micros, policy)
                results.append(r)
                print(f"{stages:>2} {micros:>2} {policy:>6} {r['examples_per_s']:>11,.0f} "
                      f"{r['bubble']:>7.1%} {r['bubble_theory']:>7.1%}  "
                      + " ".join(f"{m:.1f}" for m in r["peak_held_mib"]), flush=True)
    one = [r for r in results if r["stages"] > 1 and r["micros"] > 1] or results
    picture = os.path.join(os.path.dirname(args.out), "pipeline-timeline.png")
    plot(max(one, key=lambda r: (r["stages"], r["policy"] == "1f1b", -abs(r["micros"] - 4))),
         picture)
    print(f"wrote {picture}")
    save(args.out, "pipeline", cores=cores, batch=args.batch, hidden=args.hidden,
         results=[{k: v for k, v in r.items() if k != "timeline"} for r in results])


if __name__ == "__main__":
    main()
