"""What a finished job reports: each rank's figures, gathered; summary.json; the last lines."""
import logging
import math
import os
import resource

import numpy as np
from mpi4py import MPI

from ..base.files import keep_trying, write_json
from ..base.log import say
from ..base.version import __version__
from ..kernels.logistic import held_out
from ..ranks.bounded import wait_all
from ..worker.pushfilter import FIGURES

log = logging.getLogger("mpips")

# One rank's figures at the end of a job (servers and workers fill different fields).
RECORD = np.dtype([
    ("examples", "<i8"), ("train_loss", "<f8"), ("train_s", "<f8"), ("wait_s", "<f8"),
    ("bytes_sent", "<i8"), ("keys", "<i8"), ("table_bytes", "<i8"), ("bad_lines", "<i8"),
    ("copies", "<i8"),        # servers: keys stored, as primary or backup
    ("pulls_held", "<i8"), ("max_gap", "<i8"), ("test_rows", "<i8"),
    ("test_units", "<i8"),    # rows or bytes of --test its scores span (job/chunks.covered)
    ("compile_s", "<f8"), ("late_compiles", "<i8"), ("busy_s", "<f8"), ("peak_rss_mb", "<f8"),
    ("train_bytes", "<i8"),   # bytes sent until every worker had finished training
    ("stopped_at", "<i8"),    # servers: the clock the job stopped at (checkpoint), or -1
    ("stop_saved", "?"),      # server 0: the checkpoint it stopped at was written
    ("examples_before", "<i8"),   # workers: examples trained before this launch (a resume)
    ("node", "S64"),          # where the rank ran: Slurm's node name, else the host name
    ("pushes", "<i8"),        # this launch: a worker's pushes acknowledged, a server's applied
    ("solver_steps", "<i8"),  # full-batch jobs: the driver's iterations (see job/fullbatch_part)
    ("held_peak", "<i8"),     # the most bytes counted against --max-rank-memory (budget)
    ("samples", "<i8"),       # in the rank's timeline
    ("tasks", "<i8"),         # pipeline tasks logged (job/stage_part.TaskLog)
    ("keys_served", "<i8"),   # servers: keys of the reads answered
    ("test_keys", "<i8"),     # servers: keys of the test rows read (each batch's distinct)
    ("test_keys_known", "<i8"),   # servers: of them, those the model holds
    ("startup_s", "<f8"),     # from the process's start to training (see startup.ready)
    ("score_s", "<f8"),       # scoring this rank's share of --test
    ("save_s", "<f8"),        # servers: writing their shard of the model
    ("push_bytes", "<i8"),    # servers: of the workers' pushes received
    ("train_requests", "<i8"),   # servers: messages received until training ended
    ("ranges_lost", "<i8"),   # servers: key ranges in no model file (see job/server_part)
    ("rows_abandoned", "<i8"),   # the lead: dead workers' rows no worker could take over
    ("epoch_entries", "<i8"),    # workers: epochs they trained rows of (job/part_result)
    ("snapshots", "<i8"),     # servers: numbered snapshots taken (--snapshot-every)
    # Workers: their push filter's work (see pushfilter.FIGURES).
    ("push_rows", "<i8"), ("push_rows_held", "<i8"), ("residual_keys_dropped", "<i8"),
    ("residual_keys_flushed", "<i8"), ("residual_flushed", "<f8"),
    ("residual_keys_left", "<i8"), ("residual_left", "<f8"),
])


def new_record() -> np.ndarray:
    return np.zeros((), RECORD)


def allgather(comm: MPI.Intracomm, record: np.ndarray, timeout: float) -> np.ndarray:
    """Every rank's record, on every rank (so all can decide the job's outcome alike). Fills
    in this rank's peak resident memory and node."""
    record["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    node = os.environ.get("SLURMD_NODENAME") or MPI.Get_processor_name()
    record["node"] = node.encode()[:64]
    records = np.empty(comm.size, RECORD)
    req = comm.Iallgather([record.reshape(1).view(np.uint8), MPI.BYTE],
                          [records.view(np.uint8), MPI.BYTE])
    wait_all([req], timeout, lambda: "every rank's results")
    return records


def max_over_ranks(comm: MPI.Intracomm, values: np.ndarray, timeout: float,
                   what: str) -> np.ndarray:
    """Elementwise maximum of a float64 array over all ranks, on every rank."""
    out = np.empty_like(values)
    wait_all([comm.Iallreduce(values, out, op=MPI.MAX)], timeout, lambda: what)
    return out


def gather_to_root(comm: MPI.Intracomm, local: np.ndarray, counts: np.ndarray, timeout: float,
                   what: str) -> np.ndarray | None:
    """Concatenate each rank's `local` (counts[r] entries from rank r) on rank 0. Records
    of a structured dtype (a timeline's samples, a pipeline's tasks) travel as their bytes."""
    if local.dtype.names:
        rows = gather_to_root(comm, local.view(np.uint8), counts * local.dtype.itemsize,
                              timeout, what)
        return None if rows is None else rows.view(local.dtype)
    recv = np.empty(int(counts.sum()), local.dtype) if comm.rank == 0 else None
    req = comm.Igatherv(local, [recv, counts] if recv is not None else None, root=0)
    wait_all([req], timeout, lambda: what)
    return recv


def rows_per_epoch(entries: np.ndarray, workers: int, epochs: int) -> list:
    """[worker][epoch]: rows trained in this launch, from part_result.EPOCH_ROWS entries
    (a worker that died has a row of zeros; `workers`: those living, at least)."""
    if entries.shape[0]:
        workers = max(workers, int(entries["worker"].max()) + 1)
    out = np.zeros((workers, epochs), np.int64)
    np.add.at(out, (entries["worker"], entries["epoch"]), entries["rows"])
    return out.tolist()


def key_spread(keys: np.ndarray) -> float | None:
    """The most keys a server holds over the mean of the servers holding any."""
    held = keys[keys > 0]
    return round(float(held.max() / held.mean()), 4) if held.size else None


def build(records: np.ndarray, n_servers: int, margins, labels, held_s, **extra) -> dict:
    """The summary from all ranks' records, the gathered test scores, and how long each
    worker's pulls were held for the clocks."""
    servers, workers = records[:n_servers], records[n_servers:]
    examples = int(workers["examples"].sum()) + int(servers["examples"].sum())   # + the dead
    # Rates are of this launch: a resumed run trained the examples before it in others.
    now = examples - int(workers["examples_before"].sum())
    train_s = float(workers["train_s"].max())
    return {
        "mpips_version": __version__,
        "servers": n_servers,
        "workers": len(workers),
        **extra,
        **_examples(records, servers, workers, examples, now, train_s, margins, labels),
        **_times(records, servers, train_s),
        **_keys_and_bytes(records, servers, now),
        **_pushes_and_waits(servers, workers, held_s),
        **_ranks(records, servers, workers),
    }


def _examples(records: np.ndarray, servers: np.ndarray, workers: np.ndarray, examples: int,
              now: int, train_s: float, margins, labels) -> dict:
    """Examples trained and tested, their losses, the test's AUC, the training rate."""
    tested = margins is not None and margins.shape[0] > 0
    logloss, auc = held_out(margins, labels) if tested else (None, float("nan"))
    return {
        "train_examples": examples,
        "train_examples_this_launch": now,
        "train_logloss": float(workers["train_loss"].sum()) / examples if examples else None,
        "test_examples": int(records["test_rows"].sum()),
        "test_examples_by_rank": records["test_rows"].tolist(),   # servers first
        "test_logloss": logloss,
        "test_auc": None if np.isnan(auc) else auc,
        # Of the keys of the test rows (each batch's distinct ones), those the model holds:
        # few, and the test data is not like the training data (None: a full-batch model's,
        # whose coordinates every key has).
        "test_keys_known": (float(servers["test_keys_known"].sum() / servers["test_keys"].sum())
                            if servers["test_keys"].sum() else None),
        "examples_per_s": now / train_s if train_s > 0 and now else None,
    }


def _times(records: np.ndarray, servers: np.ndarray, train_s: float) -> dict:
    """Where the time went (the slowest rank of each): process start to the first
    minibatch, training, scoring the test file, writing the model; compiling."""
    return {
        "startup_s": float(records["startup_s"].max()),
        "train_s": train_s,
        "score_s": float(records["score_s"].max()),
        "save_s": float(servers["save_s"].max()),
        "compile_s": float(records["compile_s"].max()),
        "late_compiles": int(records["late_compiles"].sum()),
    }


def _keys_and_bytes(records: np.ndarray, servers: np.ndarray, now: int) -> dict:
    """The keys the servers store, the bytes they take, and the bytes sent."""
    keys = int(servers["keys"].sum())
    return {
        "keys_stored": keys,
        # Keys each server answers for, and the largest share over the mean of those that
        # hold any (a dead server holds none): how evenly the key ranges spread them.
        "server_keys": [int(x) for x in servers["keys"]],
        "key_spread": key_spread(servers["keys"]),
        "key_copies_stored": int(servers["copies"].sum()),
        "server_bytes": int(servers["table_bytes"].sum()),
        "server_bytes_per_key": float(servers["table_bytes"].sum()) / keys if keys else None,
        # All parameter-server traffic, scoring the test file included.
        "bytes_sent": int(records["bytes_sent"].sum()),
        "bytes_per_example": (float(records["train_bytes"].sum()) / now
                              if now else None),   # training traffic only
        "push_bytes_per_example": (float(servers["push_bytes"].sum()) / now
                                   if now else None),   # of it, the pushes (see pushfilter)
    }


def _pushes_and_waits(servers: np.ndarray, workers: np.ndarray, held_s) -> dict:
    """Pushes sent and applied, reads served, and the workers' time blocked on pulls."""
    return {
        # Every push a worker sent was acknowledged; each server applied each one (its part,
        # possibly empty: every push completes a clock on every server) unless a worker died.
        "pushes_sent": int(workers["pushes"].sum()),
        **push_filter(workers),
        "pushes_applied": [int(x) for x in servers["pushes"]],
        # Messages a server received per clock of a worker, while training: a push and the
        # next minibatch's pull travel as one (KVWorker.pull's with_push), so about 1.
        "messages_per_clock": (float(servers["train_requests"].sum())
                               / (int(workers["pushes"].sum()) * servers.shape[0])
                               if workers["pushes"].sum() else None),
        # The read load each server carried: keys of the reads it answered.
        "server_keys_served": [int(x) for x in servers["keys_served"]],
        # Per worker: time blocked on pulls (round trips and waiting for the clocks), and of
        # that, time its pulls were held for the clocks (on the server that held them longest).
        "wait_s": [float(x) for x in workers["wait_s"]],
        "worker_examples": [int(x) for x in workers["examples"]],   # each, resumes included
        "held_s": [float(x) for x in held_s],
        "max_clock_gap": int(servers["max_gap"].max()),
        # Pulls held for the clocks, on the server that held the most (each holds its part).
        "pulls_held": int(servers["pulls_held"].max()),
        # Fraction of training time each server spent handling requests (not waiting for them).
        "server_busy": [float(b / t) if t > 0 else None
                        for b, t in zip(servers["busy_s"], servers["train_s"])],
    }


def _ranks(records: np.ndarray, servers: np.ndarray, workers: np.ndarray) -> dict:
    """Where each rank ran, the bad lines it skipped, the memory it took."""
    return {
        "nodes": {"servers": [n.decode() for n in servers["node"]],
                  "workers": [n.decode() for n in workers["node"]]},
        "bad_lines": int(records["bad_lines"].sum()),
        # Peak resident memory of each rank (servers first), and of the job.
        "peak_rss_mb": [round(float(x), 1) for x in records["peak_rss_mb"]],
        "peak_rss_mb_total": round(float(records["peak_rss_mb"].sum()), 1),
        # What each rank counted against --max-rank-memory at most: tables, a full-batch
        # worker's rows.
        "held_peak_mb": [round(float(x) / 2**20, 1) for x in records["held_peak"]],
    }


def push_filter(workers: np.ndarray) -> dict:
    """The push filters' work, summed over workers (see pushfilter.FIGURES): rows pushed and
    held back, residuals dropped for want of room, delivered by the last push, left unsent.
    Without a filter every row is pushed and the rest is 0."""
    return {name: (float(workers[name].sum()) if workers.dtype[name].kind == "f"
                   else int(workers[name].sum())) for name in FIGURES}


def solver_steps(steps: np.ndarray) -> dict:
    """A full-batch solver's steps (rows of lbfgs.Step) for summary.json: where it ended, and
    the objective over time."""
    last = steps[-1]
    return {"iterations": int(last[0]), "objective": float(last[2]),
            "gradient_norm": float(last[3]), "evaluations": int(last[5]),
            "steps": [{"iteration": int(s[0]), "seconds": float(s[1]), "objective": float(s[2]),
                       "gradient_norm": float(s[3]), "step": float(s[4]),
                       "evaluations": int(s[5])} for s in steps]}


def _finite(value, where: str, bad: list):
    """`value` with every non-finite float replaced by None (strict JSON), naming each in
    `bad`."""
    if isinstance(value, dict):
        return {k: _finite(v, f"{where}.{k}" if where else k, bad) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v, f"{where}[{i}]", bad) for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        bad.append(f"{where} = {value}")
        return None
    return value


def write(out_dir: str, summary: dict, wait_s: float = 0.0) -> str:
    """RUN_DIR/summary.json, replaced atomically; on a full disk tried again for `wait_s`."""
    path = os.path.join(out_dir, "summary.json")
    bad: list[str] = []
    clean = _finite(summary, "", bad)
    if bad:
        log.warning("summary.json: not finite, written as null: %s", ", ".join(bad))
    keep_trying(lambda: write_json(path, clean), wait_s, "the summary")
    return path


def print_lines(s: dict, path: str) -> None:
    if s["status"] == "stopped":
        say(f"stopped at clock {s['stopped_at_clock']}, as asked, after writing a checkpoint: "
            f"continue with --resume {s['checkpoints']}")
    if s["test_logloss"] is not None:
        auc = "n/a (one class)" if s["test_auc"] is None else f"{s['test_auc']:.4f}"
        test = f"test logloss {s['test_logloss']:.4f}  AUC {auc} on {s['test_examples']:,} examples"
    elif s["config"]["test"] and s["status"] == "complete":
        test = "the test file holds no examples"
    elif s["config"]["test"] and s["status"] == "not scored":
        test = "not wholly scored (scores died with a rank)"
    elif s["config"]["test"]:
        test = "not scored (stopped early)"
    else:
        test = "no --test file given"
    if s["test_keys_known"] is not None:
        from ..models.evaluate import warn_if_few_known
        warn_if_few_known(s["test_keys_known"], s["config"]["test"], s["model_dir"])
    rate = f"{s['examples_per_s'] / 1e3:,.1f}k examples/s, " if s["examples_per_s"] else ""
    say(f"done: {s['train_examples']:,} training examples in {s['train_s']:.1f} s "
        f"({rate}{s['workers']} worker(s), {s['servers']} server(s)); {test}")
    say(f"time: {s['startup_s']:.2f} s from the start of the processes to training, "
        f"{s['train_s']:.2f} s training, {s['score_s']:.2f} s scoring, {s['save_s']:.2f} s "
        f"saving the model")
    if s["keys_stored"]:
        sent = (f"; {s['bytes_per_example']:,.0f} bytes sent per example"
                if s["bytes_per_example"] else "")
        spread = (f" (the largest server's share {s['key_spread']:.3f}x the mean)"
                  if s.get("key_spread") and s["servers"] > 1 else "")
        say(f"model: {s['keys_stored']:,} keys{spread}, {s['server_bytes_per_key']:.1f} "
            f"bytes/key on the servers, in {s['model_dir']}{sent}")
    if s["bad_lines"]:
        say(f"skipped {s['bad_lines']:,} bad input line(s) (--skip-bad-lines)")
    say(f"summary: {path}")
