"""Soak: jobs launched with ULFM, each with one rank killed (SIGKILL) or frozen for good
(SIGSTOP) at a random point, on a machine loaded by busy processes beside the job.

    python bench/soak.py [--trials 20] [--seed 1] [--timeout 240] [--epochs 12] [--detector 6]
                         [--load 2] [--actions kill,freeze] [--rank R] [--clock C]

Every trial trains the same small set on 3 servers (each key on 2) + 3 workers, BSP and ASP
alternating, with a checkpoint every 50 clocks, while --load processes spin on the CPUs.
Each trial draws an action (kill or freeze), a random rank and a random clock before the
end of training (from the uninterrupted run's last clock), and the rank acts on itself
there (`--test-event "kill rank R at clock C"`, see mpips/run/testevents.py: a server once
every worker has completed clock C, a worker once its push of clock C is acknowledged). A
frozen rank stays frozen: the launch ends only if the survivors end it. Then:

  finished  the job went on and ended (exit 0) with a correct model: after a server's
            death under BSP bit for bit the uninterrupted run's; under ASP, or after a
            worker's death (its rows go to the others, so the minibatches differ), every
            example trained once per epoch, the whole test file scored, and the held-out
            logloss within 0.5% of the uninterrupted run's (15% under ASP, whose model
            depends on when each worker ran)
  fell back the job stopped (a death nobody could take over); its resume from the last
            checkpoint (or a rerun, if none was written) ended with a correct model
  hung      a launch that did not end within --timeout seconds (must be 0)
  wrong     a job that ended with a model that is not correct (must be 0)
  short     a job that ended (exit 0) with a model that lacks keys of the uninterrupted
            run's, or that `load_model` refuses as incomplete (must be 0)
  false death  a rank other than the one drawn was counted as dead (must be 0)
  not killed  the drawn event never fired: the rank drawn was not killed at the clock drawn,
            so the trial tested nothing (must be 0)

Prints one line per trial (the rank and clock drawn) and the table; writes
bench/results/soak.json. --rank and --clock fix the draw, to repeat a trial.
"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from report import save  # noqa: E402
from workers import mpiexec, run  # noqa: E402

from mpips.storage.model_files import load_model  # noqa: E402

SERVERS, WORKERS, ROWS, TEST_ROWS, EPOCHS = 3, 3, 20000, 4000, 12
ARGS = ["--servers", str(SERVERS), "--replicas", "2", "--batch-size", "200",
        "--checkpoint-every", "50", "--log-every", "0.2", "--timeout", "30"]
ROLES = ["server 0", "server 1", "server 2", "worker 0", "worker 1", "worker 2"]
OUTCOMES = ("finished", "fell back", "hung", "wrong", "short", "false death", "not killed")
FAILURES = ("hung", "wrong", "short", "false death", "not killed")
PAST = {"kill": "killed", "freeze": "frozen"}


def ulfm(detector_s: float) -> list:
    """mpiexec's options for ULFM, its failure detector declaring a rank silent this long dead."""
    return ["--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true",
            "--mca", "mpi_ft_detector_period", "0.2",
            "--mca", "mpi_ft_detector_timeout", f"{detector_s:g}"]


def dataset(work: str) -> str:
    prefix = os.path.join(work, "soak")
    if not os.path.exists(prefix + ".train.svm"):
        run([sys.executable, "-m", "mpips", "make-data", "--rows", str(ROWS),
             "--test-rows", str(TEST_ROWS), "--seed", "5", prefix])
    return prefix


def command(prefix: str, out: str, mode: str, epochs: int, detector_s: float, *more) -> list:
    return [mpiexec(), *ulfm(detector_s), "-n", str(SERVERS + WORKERS), sys.executable, "-m",
            "mpips", "train", "--train", prefix + ".train.svm", "--test", prefix + ".test.svm",
            "--out", out, "--consistency", mode, "--epochs", str(epochs), *ARGS, *more]


def launch(cmd: list, log: str) -> subprocess.Popen:
    """The launch, its output to `log`; events allowed (MPIPS_TESTING=1)."""
    with open(log, "w") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "MPIPS_TESTING": "1"})


def finish(proc: subprocess.Popen, timeout: float, log: str) -> int | None:
    """The exit status, or None (and the job killed) if it outlived `timeout`: then the
    processes still there, and each rank's Python stacks (SIGUSR2), end `log`."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        left = subprocess.run(["ps", "-o", "pid,stat,etime,args", "-g", str(proc.pid)],
                              capture_output=True, text=True).stdout
        with open(log, "a") as f:
            f.write(f"\n--- soak: still running after {timeout:g} s:\n{left}")
        os.killpg(proc.pid, signal.SIGUSR2)
        try:
            proc.wait(5)   # (SIGUSR2 makes the ranks write their stacks; the launcher ignores it)
        except subprocess.TimeoutExpired:
            pass
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def last_clock(out: str) -> int:
    """The last clock every worker of the finished run in `out` completed: its final
    checkpoint says where each worker ended."""
    final = sorted(glob.glob(os.path.join(out, "checkpoints", "clock-*", "manifest.json")))[-1]
    with open(final) as f:
        return min(p["clock"] for p in json.load(f)["positions"].values())


def fired(log: str, event: str) -> bool:
    """Whether the job whose output is `log` fired `event` (the rank says so, then acts)."""
    with open(log, errors="replace") as f:
        return f"test event: {event} (reached" in f.read()


# How far the held-out logloss of a run that went on without a rank may be from the
# uninterrupted run's: under BSP the minibatches differ once a worker's rows are handed over;
# under ASP the model also depends on when each worker ran (tests/support.py).
LOGLOSS_SLACK = {"bsp": 0.005, "asp": 0.15}


def short(out: str, reference: dict) -> bool:
    """Whether the model of `out` is incomplete, or lacks keys of the uninterrupted run's."""
    try:
        keys, _ = load_model(os.path.join(out, "model"))
    except (OSError, ValueError):
        return True
    return not np.array_equal(keys, reference["model"][0])


def false_deaths(out: str, log: str, rank: int) -> list:
    """The ranks other than `rank` that the job of `out` (its output in `log`) counted as
    dead: from its summary's failures and from what its log says died."""
    dead = set()
    summary = os.path.join(out, "summary.json")
    if os.path.exists(summary):
        with open(summary) as f:
            dead |= {f["rank"] for f in json.load(f).get("failures", [])}
    with open(log, errors="replace") as f:
        text = f.read()
    dead |= {int(r) for r in re.findall(r"\(rank (\d+)\) died", text)}
    for listed in re.findall(r"rank\(s\) \[([\d, ]+)\] died", text):
        dead |= {int(r) for r in listed.split(",")}
    return sorted(dead - {rank})


class Load:
    """`n` processes spinning on the CPUs for the duration (a machine loaded by others)."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(self.n)]
        return self

    def __exit__(self, *_):
        for p in self.procs:
            p.kill()
            p.wait()


def correct(out: str, mode: str, reference: dict, worker_killed: bool, epochs: int) -> bool:
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    if mode == "bsp" and not worker_killed:
        ours, theirs = load_model(os.path.join(out, "model")), reference["model"]
        return (np.array_equal(ours[0], theirs[0])
                and np.array_equal(ours[1].view(np.uint32), theirs[1].view(np.uint32)))
    return (s["train_examples"] == epochs * ROWS and s["test_examples"] == TEST_ROWS
            and abs(s["test_logloss"] / reference["logloss"] - 1) < LOGLOSS_SLACK[mode])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=240,
                        help="seconds a launch may take before it counts as hung")
    parser.add_argument("--epochs", type=int, default=EPOCHS,
                        help="epochs each job trains (the clocks drawn are before its end)")
    parser.add_argument("--detector", type=float, default=6, metavar="S",
                        help="ULFM's failure detector declares a rank silent S seconds dead "
                             "(default 6: on a loaded machine a live rank may be kept from MPI "
                             "for a second)")
    parser.add_argument("--load", type=int, default=2, metavar="N",
                        help="processes spinning on the CPUs during the trials (default 2)")
    parser.add_argument("--actions", default="kill,freeze",
                        help="what is drawn to happen to the rank: kill, freeze or both "
                             "(default kill,freeze)")
    parser.add_argument("--rank", type=int, choices=range(SERVERS + WORKERS),
                        help="act on this rank in every trial (default: drawn)")
    parser.add_argument("--clock", type=int,
                        help="act at this clock in every trial (default: drawn)")
    parser.add_argument("--work", default=os.path.join(HERE, "out", "soak"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "soak.json"))
    args = parser.parse_args()
    actions = args.actions.split(",")
    if not set(actions) <= {"kill", "freeze"}:
        parser.error(f"--actions {args.actions}: name kill, freeze or both")
    os.makedirs(args.work, exist_ok=True)
    prefix = dataset(args.work)

    def job(out: str, mode: str, *more) -> list:
        return command(prefix, out, mode, args.epochs, args.detector, *more)

    references = {}
    for mode in sorted({("bsp", "asp")[trial % 2] for trial in range(args.trials)}):
        out = os.path.join(args.work, f"reference-{mode}")
        shutil.rmtree(out, ignore_errors=True)
        run(job(out, mode))
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        references[mode] = {"model": load_model(os.path.join(out, "model")),
                            "logloss": summary["test_logloss"], "last_clock": last_clock(out)}
    rng = random.Random(args.seed)
    with Load(args.load):
        trials = [trial_of(trial, rng, args, actions, job, references)
                  for trial in range(args.trials)]
    table = {o: sum(t["outcome"] == o for t in trials) for o in OUTCOMES}
    print(f"\n{args.trials} trials ({SERVERS} servers with 2 copies, {WORKERS} workers, "
          f"BSP and ASP alternating, one rank {' or '.join(PAST[a] for a in actions)} in each at "
          f"a clock drawn, "
          f"{args.load} busy processes beside):")
    for outcome, count in table.items():
        print(f"  {outcome:>11}  {count}")
    save(args.out, "soak", trials=trials, table=table, seed=args.seed, epochs=args.epochs,
         detector_s=args.detector, load=args.load, actions=actions)
    if any(table[o] for o in FAILURES):
        sys.exit(1)


def trial_of(trial: int, rng: random.Random, args, actions: list, job, references: dict) -> dict:
    """Run trial `trial`: draw, launch, judge; print its line and return its record."""
    mode = ("bsp", "asp")[trial % 2]
    action = rng.choice(actions)
    rank = rng.randrange(SERVERS + WORKERS)
    clock = rng.randint(1, references[mode]["last_clock"] - 1)   # before the end
    rank = rank if args.rank is None else args.rank
    clock = clock if args.clock is None else args.clock
    event = f"{action} rank {rank} at clock {clock}"
    out = os.path.join(args.work, f"trial-{trial:03d}")
    shutil.rmtree(out, ignore_errors=True)
    log = out + ".log"
    began = time.monotonic()
    status = finish(launch(job(out, mode, "--test-event", event), log), args.timeout, log)
    killed = fired(log, event)
    worker_killed = killed and rank >= SERVERS
    outcome, detail = None, f"exit {status}"
    if status is None:
        outcome = "hung"
    elif status == 0:
        outcome = ("finished" if correct(out, mode, references[mode], worker_killed,
                                         args.epochs) else "wrong")
    else:
        ckpt = os.path.join(out, "checkpoints")
        more = ["--resume", ckpt] if os.path.isdir(ckpt) and os.listdir(ckpt) else \
            ["--overwrite"]
        again = finish(launch(job(out, mode, *more), out + ".resume.log"), args.timeout,
                       out + ".resume.log")
        detail += f", then {'resumed' if more[0] == '--resume' else 'rerun'}: exit {again}"
        if again is None:
            outcome = "hung"
        elif again == 0 and correct(out, mode, references[mode], worker_killed,
                                    args.epochs):
            outcome = "fell back"
        else:
            outcome = "wrong"
    if outcome in ("finished", "fell back"):
        wrongly = false_deaths(out, log, rank)
        if wrongly:
            outcome, detail = "false death", detail + f", ranks {wrongly} counted dead"
        elif short(out, references[mode]):
            outcome = "short"
    if not killed and outcome not in ("hung", "wrong"):
        outcome = "not killed"   # the trial tested nothing: a failure of the soak
    record = {"trial": trial, "mode": mode, "action": action, "rank": rank, "clock": clock,
              "drew": ROLES[rank], "acted": killed, "outcome": outcome, "detail": detail,
              "seconds": round(time.monotonic() - began, 1)}
    print(f"trial {trial:3d}  {mode}  {action:>6} {ROLES[rank]:>8} at clock {clock:4d}  "
          f"{'fired' if killed else 'NOT FIRED':>9}  {outcome:>11}  ({detail}, "
          f"{record['seconds']:.0f} s)", flush=True)
    return record


if __name__ == "__main__":
    main()
