"""Start-up: how long a job takes from its processes' start to its first minibatch, against an
empty mpi4py program launched the same way, with the kernels compiled ahead (`make kernels`)
and with numba's (MPIPS_KERNELS=jit: its cache loaded by every rank).

    python bench/startup.py [--np 2,4] [--rounds 5]

For each rank count (2: a rank a core here; 4: two a core), each round launches, with the
same `mpiexec -n NP`:
- the reference: python imports mpi4py, MPI starts, every rank meets in a barrier; each rank
  says how long since its process started, and the slowest counts;
- mpips: `train` on a small file (2,000 rows), whose summary says the same of the slowest
  rank at its first minibatch (`startup_s`), beside `train_s`, `score_s` and `save_s`; once
  with the kernels compiled ahead, once with numba's.
Each also with the whole `mpiexec` wall time and the CPU time of all its processes. Medians
over the rounds, side by side, in bench/results/startup.json.

First mpips's modules are compiled to bytecode, as installing a package does and as the first
run writes it: with PYTHONDONTWRITEBYTECODE set (as in some containers) and none written,
every rank of every launch would compile mpips's sources again (about 0.08 s of a rank's
start-up). `--as-is` times the tree as it stands.
"""
import argparse
import compileall
import importlib.util
import json
import os
import py_compile
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
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


def compile_bytecode() -> None:
    """Write mpips's bytecode beside its sources, checked against each source's hash when
    imported (an edit made since is never run stale)."""
    package = importlib.util.find_spec("mpips").submodule_search_locations[0]
    if not compileall.compile_dir(package, quiet=1,
                                  invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH):
        sys.exit(f"could not compile {package} to bytecode")


def mpiexec() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else "mpiexec"


def timed(cmd: list, env: dict | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s of every process of the launch, its output)."""
    began, cpu = time.monotonic(), _children_cpu()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} ... failed:\n{done.stdout}\n{done.stderr}")
    return time.monotonic() - began, _children_cpu() - cpu, done.stdout


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


# The kernels each way: compiled ahead (where `make kernels` built them), numba's JIT.
WAYS = {"ahead": {}, "jit": {"MPIPS_KERNELS": "jit"}}


def measure(np_: int, data: str, tmp: str, rounds: int) -> dict:
    """Medians over `rounds` launches of `np_` ranks: the empty program and mpips train."""
    launch = [mpiexec(), "-n", str(np_)]
    each = []
    for i in range(rounds):
        empty_wall, empty_cpu, out = timed([*launch, sys.executable, "-c", EMPTY])
        one = {"empty_startup_s": float(out.split()[-1]), "empty_wall_s": empty_wall,
               "empty_cpu_s": empty_cpu}
        for way, env in WAYS.items():
            run = os.path.join(tmp, f"run{np_}-{i}-{way}")
            wall, cpu, _ = timed([*launch, sys.executable, "-m", "mpips", "train", "--train",
                                  f"{data}.train.svm", "--test", f"{data}.test.svm",
                                  "--out", run], {**os.environ, **env})
            with open(os.path.join(run, "summary.json")) as f:
                s = json.load(f)
            one.update({f"{way}_startup_s": s["startup_s"], f"{way}_wall_s": wall,
                        f"{way}_cpu_s": cpu, f"{way}_train_s": s["train_s"],
                        f"{way}_compile_s": s["compile_s"]})
        each.append(one)
    median = {k: round(statistics.median(r[k] for r in each), 3) for k in each[0]}
    for way in WAYS:
        median[f"{way}_beyond_empty_s"] = round(median[f"{way}_startup_s"]
                                                - median["empty_startup_s"], 3)
    median["cpu_ahead_over_jit"] = round(median["ahead_cpu_s"] / median["jit_cpu_s"], 3)
    return {"rounds": each, "median": median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default="2,4",
                        help="rank counts to launch, comma-separated (default 2,4: one and two "
                             "ranks a core here)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "startup.json"))
    parser.add_argument("--as-is", action="store_true",
                        help="do not compile mpips's bytecode first (with PYTHONDONTWRITEBYTECODE "
                             "set and none there, every rank compiles mpips's sources)")
    args = parser.parse_args()
    bytecode = "as found" if args.as_is else "compiled"
    if not args.as_is:
        compile_bytecode()
    counts = [int(n) for n in args.np.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "d")
        subprocess.run([sys.executable, "-m", "mpips", "make-data", "--rows", "2000",
                        "--test-rows", "1000", data], check=True, capture_output=True)
        results = {n: measure(n, data, tmp, args.rounds) for n in counts}
    print(f"medians of {args.rounds} rounds (seconds), {os.cpu_count()} cores, mpips's bytecode "
          f"{bytecode}:")
    print(f"{'ranks':>5} {'kernels':>8} {'ready':>6} {'beyond empty':>13} {'loading':>8} "
          f"{'wall':>6} {'CPU':>6} {'train':>6}")
    for n, r in results.items():
        m = r["median"]
        print(f"{n:>5} {'(empty)':>8} {m['empty_startup_s']:>6.2f} {'':>13} {'':>8} "
              f"{m['empty_wall_s']:>6.2f} {m['empty_cpu_s']:>6.2f}")
        for way in WAYS:
            print(f"{n:>5} {way:>8} {m[way + '_startup_s']:>6.2f} "
                  f"{m[way + '_beyond_empty_s']:>13.2f} {m[way + '_compile_s']:>8.2f} "
                  f"{m[way + '_wall_s']:>6.2f} {m[way + '_cpu_s']:>6.2f} "
                  f"{m[way + '_train_s']:>6.2f}")
        print(f"{n:>5} CPU of the launch, ahead / jit: {m['cpu_ahead_over_jit']:.2f}")
    print("ready: process start to the first minibatch (the slowest rank); beyond empty: "
          "mpips's minus the empty program's; loading: the kernels', part of it; CPU: every "
          "process of the launch")
    save(args.out, "startup", cpus=os.cpu_count(), rounds=args.rounds, bytecode=bytecode,
         dont_write_bytecode=bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
         by_ranks={str(n): r for n, r in results.items()})


if __name__ == "__main__":
    main()
