"""Soak: jobs launched with ULFM, each with one rank killed (SIGKILL) at a random moment.

    python bench/soak.py [--trials 20] [--seed 1] [--timeout 240]

Every trial trains the same small set on 3 servers (each key on 2) + 3 workers, BSP and ASP
alternating, with a checkpoint every 50 clocks. Once the job has trained a little, a random
rank is killed after a random delay. Then:

  finished  the job went on and ended (exit 0) with a correct model: after a server's
            death under BSP bit for bit the uninterrupted run's; under ASP, or after a
            worker's death (its rows go to the others, so the minibatches differ), every
            example trained once per epoch, the whole test file scored, and the held-out
            logloss within 0.5% of the uninterrupted run's
  fell back the job stopped (a death nobody could take over); its resume from the last
            checkpoint (or a rerun, if none was written) ended with a correct model
  hung      a launch that did not end within --timeout seconds (must be 0)
  wrong     a job that ended with a model that is not correct (must be 0)

Prints one line per trial and the table; writes bench/results/soak.json.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from report import save  # noqa: E402
from workers import mpiexec, run  # noqa: E402

from mpips.model_io import load_model  # noqa: E402

ULFM = ["--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true",
        "--mca", "mpi_ft_detector_period", "0.2", "--mca", "mpi_ft_detector_timeout", "1"]
SERVERS, WORKERS, ROWS, TEST_ROWS, EPOCHS = 3, 3, 20000, 4000, 12
ARGS = ["--servers", str(SERVERS), "--replicas", "2", "--epochs", str(EPOCHS),
        "--batch-size", "200", "--checkpoint-every", "50", "--log-every", "0.2",
        "--timeout", "30"]
ROLES = ["server 0", "server 1", "server 2", "worker 0", "worker 1", "worker 2"]


def dataset(work: str) -> str:
    prefix = os.path.join(work, "soak")
    if not os.path.exists(prefix + ".train.svm"):
        run([sys.executable, "-m", "mpips", "make-data", "--rows", str(ROWS),
             "--test-rows", str(TEST_ROWS), "--seed", "5", prefix])
    return prefix


def command(prefix: str, out: str, mode: str, *more) -> list:
    return [mpiexec(), *ULFM, "-n", str(SERVERS + WORKERS), sys.executable, "-m", "mpips",
            "train", "--train", prefix + ".train.svm", "--test", prefix + ".test.svm",
            "--out", out, "--consistency", mode, *ARGS, *more]


def launch(cmd: list, log: str) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float) -> int | None:
    """The exit status, or None (and the job killed) if it outlived `timeout`."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def rank_pid(out: str, rank: int) -> int | None:
    """The process of MPI rank `rank` of the job writing to `out`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if out.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"OMPI_COMM_WORLD_RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(pid)
        except OSError:
            continue
    return None


def wait_for_training(log: str, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with open(log) as f:
            if "training: epoch" in f.read():
                return True
        time.sleep(0.05)
    return False


def correct(out: str, mode: str, reference: dict, worker_killed: bool) -> bool:
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    if mode == "bsp" and not worker_killed:
        ours, theirs = load_model(os.path.join(out, "model")), reference["model"]
        return (np.array_equal(ours[0], theirs[0])
                and np.array_equal(ours[1].view(np.uint32), theirs[1].view(np.uint32)))
    return (s["train_examples"] == EPOCHS * ROWS and s["test_examples"] == TEST_ROWS
            and abs(s["test_logloss"] / reference["logloss"] - 1) < 0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=240,
                        help="seconds a launch may take before it counts as hung")
    parser.add_argument("--work", default=os.path.join(HERE, "out", "soak"))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "soak.json"))
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    prefix = dataset(args.work)
    references = {}
    for mode in ("bsp", "asp"):
        out = os.path.join(args.work, f"reference-{mode}")
        shutil.rmtree(out, ignore_errors=True)
        run(command(prefix, out, mode))
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        references[mode] = {"model": load_model(os.path.join(out, "model")),
                            "logloss": summary["test_logloss"], "train_s": summary["train_s"]}
    rng = random.Random(args.seed)
    trials = []
    for trial in range(args.trials):
        mode = ("bsp", "asp")[trial % 2]
        rank = rng.randrange(SERVERS + WORKERS)
        delay = rng.uniform(0, references[mode]["train_s"])
        out = os.path.join(args.work, f"trial-{trial:03d}")
        shutil.rmtree(out, ignore_errors=True)
        log = out + ".log"
        began = time.monotonic()
        proc = launch(command(prefix, out, mode), log)
        killed = False
        if wait_for_training(log, proc, args.timeout):
            time.sleep(delay)
            pid = rank_pid(out, rank)
            if pid is not None and proc.poll() is None:
                os.kill(pid, signal.SIGKILL)
                killed = True
        status = finish(proc, args.timeout)
        worker_killed = killed and rank >= SERVERS
        outcome, detail = None, f"exit {status}"
        if status is None:
            outcome = "hung"
        elif status == 0:
            outcome = ("finished" if correct(out, mode, references[mode], worker_killed)
                       else "wrong")
        else:
            ckpt = os.path.join(out, "checkpoints")
            more = ["--resume", ckpt] if os.path.isdir(ckpt) and os.listdir(ckpt) else \
                ["--overwrite"]
            again = finish(launch(command(prefix, out, mode, *more), out + ".resume.log"),
                           args.timeout)
            detail += f", then {'resumed' if more[0] == '--resume' else 'rerun'}: exit {again}"
            if again is None:
                outcome = "hung"
            elif again == 0 and correct(out, mode, references[mode], worker_killed):
                outcome = "fell back"
            else:
                outcome = "wrong"
        record = {"trial": trial, "mode": mode, "killed": ROLES[rank] if killed else None,
                  "after_s": round(delay, 2), "outcome": outcome, "detail": detail,
                  "seconds": round(time.monotonic() - began, 1)}
        trials.append(record)
        print(f"trial {trial:3d}  {mode}  killed {record['killed'] or 'nothing (job ended)':>10} "
              f"after {delay:5.2f} s  {outcome:>9}  ({detail})", flush=True)
    table = {o: sum(t["outcome"] == o for t in trials)
             for o in ("finished", "fell back", "hung", "wrong")}
    print(f"\n{args.trials} trials ({SERVERS} servers with 2 copies, {WORKERS} workers, "
          f"BSP and ASP alternating, one rank killed in each):")
    for outcome, count in table.items():
        print(f"  {outcome:>10}  {count}")
    save(args.out, "soak", trials=trials, table=table, seed=args.seed)
    if table["hung"] or table["wrong"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
