"""Start-up: how long a job takes from its processes' start to its first minibatch, against an
empty mpi4py program launched the same way.

    python bench/startup.py [--np 4] [--rounds 5]

Each round launches, with the same `mpiexec -n NP`:
- the reference: python imports mpi4py, MPI starts, every rank meets in a barrier; each rank
  says how long since its process started, and the slowest counts;
- mpips: `train` on a small file (2,000 rows), whose summary says the same of the slowest
  rank at its first minibatch (`startup_s`), beside `train_s`, `score_s` and `save_s`.
Both also with the whole `mpiexec` wall time. Medians over the rounds, side by side, in
bench/results/startup.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from report import save  # noqa: E402

# The reference program: what every MPI Python program pays before its first line of work.
EMPTY = """
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
with open("/proc/self/stat") as f:
    started = int(f.read().rsplit(")", 1)[1].split()[19])
with open("/proc/uptime") as f:
    uptime = float(f.read().split()[0])
age = uptime - started / __import__("os").sysconf("SC_CLK_TCK")
ages = MPI.COMM_WORLD.gather(age)
if MPI.COMM_WORLD.rank == 0:
    print(max(ages))
"""


def mpiexec() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else "mpiexec"


def timed(cmd: list) -> tuple[float, str]:
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} ... failed:\n{done.stdout}\n{done.stderr}")
    return time.monotonic() - began, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "startup.json"))
    args = parser.parse_args()
    launch = [mpiexec(), "-n", str(args.np)]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "d")
        subprocess.run([sys.executable, "-m", "mpips", "make-data", "--rows", "2000",
                        "--test-rows", "1000", data], check=True, capture_output=True)
        rounds = []
        for i in range(args.rounds):
            empty_wall, out = timed(launch + [sys.executable, "-c", EMPTY])
            run = os.path.join(tmp, f"run{i}")
            mpips_wall, _ = timed(launch + [sys.executable, "-m", "mpips", "train", "--train",
                                            f"{data}.train.svm", "--test", f"{data}.test.svm",
                                            "--out", run])
            with open(os.path.join(run, "summary.json")) as f:
                s = json.load(f)
            rounds.append({"empty_startup_s": float(out.split()[-1]), "empty_wall_s": empty_wall,
                           "mpips_startup_s": s["startup_s"], "mpips_wall_s": mpips_wall,
                           "train_s": s["train_s"], "score_s": s["score_s"],
                           "save_s": s["save_s"], "compile_s": s["compile_s"]})
    median = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
    median["startup_beyond_empty_s"] = round(median["mpips_startup_s"]
                                             - median["empty_startup_s"], 3)
    print(f"{args.np} ranks, medians of {args.rounds} rounds (seconds):")
    print(f"{'':<34}{'empty mpi4py':>14}{'mpips train':>14}")
    print(f"{'process start -> ready (slowest)':<34}{median['empty_startup_s']:>14.2f}"
          f"{median['mpips_startup_s']:>14.2f}")
    print(f"{'mpiexec wall':<34}{median['empty_wall_s']:>14.2f}{median['mpips_wall_s']:>14.2f}")
    print(f"mpips beyond the empty program's start: {median['startup_beyond_empty_s']:.2f} s "
          f"(numba kernels loaded in {median['compile_s']:.2f} s of it); then training "
          f"{median['train_s']:.2f} s, scoring {median['score_s']:.2f} s, saving "
          f"{median['save_s']:.2f} s")
    save(args.out, "startup", np=args.np, rounds=rounds, median=median)


if __name__ == "__main__":
    main()
