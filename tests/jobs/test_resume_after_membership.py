"""Resuming a job from a checkpoint written after a worker left (`mpips ctl remove-worker`) or
joined again (`mpips ctl add-worker`).

What the design promises (docs/checkpoints.md; docs/architecture.md,
"Checkpoints and stopping"): under BSP a checkpoint is the exact state after its clock, and a
run resumed from it ends with the same model, bit for bit, as the run that was never stopped.
A worker change is not itself reproducible (the clock at which the worker reads the lead's
word depends on timing, and the minibatches then differ from a run without the change), so
the uninterrupted run compared with is the very run that wrote the checkpoint: it had the
change, and it went on to its end. A checkpoint records the change (its `deaths`: a leave is
a `workplan.Handover` that is not `dead`, a join one split per donor) and every worker's place
(`positions`, with `taken`: the epochs at which it took its shares of the rows handed over), so
a resume from a clock after the change must end on that run's bits and train exactly its rows
(`train_examples`, and each worker's `worker_examples`).

Jobs: 2 servers + 3 workers on the 20,000 rows of `small_data`, 2 epochs of minibatches of
200 rows (34 clocks an epoch per worker), a checkpoint at every clock, so that the
checkpoints right after a change, where the bookkeeping is the most delicate, exist whatever
the clock at which the change landed. The lead itself asks for each change at a clock the
test names (`--test-event "ctl remove-worker 1 at clock 10"`, see mpips/run/testevents.py), and a
stop comes the same way ("stop rank 2 at clock 40"), never after the test saw a progress
line; the clocks the changes were made at, and those the tests resume from, are read from
the answers and the checkpoints, never assumed.
"""
import os
import shutil

import h5py
import numpy as np
import pytest
from support import ctl_answers, fired, read_summary, run_job, same_model
from watch import complete_checkpoints

from mpips.storage.checkpoint import clock_dir, read_manifest

EPOCHS, ROWS = 2, 20000
ARGS = ("--servers", 2, "--epochs", EPOCHS, "--batch-size", 200, "--timeout", 60,
        "--checkpoint-every", 1, "--keep-checkpoints", 1000)
# The lead asks worker 1 to leave at clock 10; it leaves within a few clocks (and the others
# take its rows left within a few more), far from the end of the job (about 95 clocks).
LEAVE = "ctl remove-worker 1 at clock 10"
# ... and to join again at clock 30, some 20 clocks after it has left; the join is done a few
# clocks later.
JOIN = "ctl add-worker at clock 30"


def events(*texts) -> list:
    return [arg for text in texts for arg in ("--test-event", text)]


def answered(job, run, *asked) -> list:
    """The lead's answers to the requests it made at the events `asked` (each fired exactly
    at its clock), in order, each done."""
    for event in asked:
        fired(job, event)
        clock = int(event.rsplit(" ", 1)[1])
        assert f"test event: {event} (reached clock {clock})" in job.output, job.output[-4000:]
    answers = ctl_answers(run)
    assert len(answers) == len(asked) and all(a["ok"] for a in answers), answers
    return answers


def left_soon(answer: dict) -> None:
    """Asked at clock 10, worker 1 left with one of the next few minibatches (the one at the
    top of which it found the lead's word: 12 in every run seen)."""
    assert answer["command"] == "remove-worker" and answer["target"] == 1, answer
    assert 10 < answer["clock"] <= 14, answer


def data(small_data) -> tuple:
    return "train", "--train", small_data[0], "--test", small_data[1]


def manifest(run, clock: int) -> dict:
    directory = clock_dir(run / "checkpoints", clock)
    assert os.path.exists(os.path.join(directory, "manifest.json")), \
        f"no complete checkpoint at clock {clock} in {run / 'checkpoints'}"
    return read_manifest(directory)


def resume(small_data, run, clock: int, out, checkpoints: bool = True):
    """A new job resumed from `run`'s checkpoint at `clock` (copied on its own, so that the
    resume takes that one), training into `out`, with the job's options (no test events);
    without `checkpoints`, it writes none (--checkpoint-every 0: a checkpoint at every clock
    costs a forked writer per server per clock, and only the tests that read a resumed run's
    own checkpoints need them; under BSP they change no bit of the model)."""
    source = clock_dir(run / "checkpoints", clock)
    ckpt = out.parent / f"{out.name}-checkpoint"
    shutil.copytree(source, ckpt / os.path.basename(source))
    quiet = () if checkpoints else ("--checkpoint-every", 0)
    job = run_job(5, *data(small_data), "--out", out, *ARGS, *quiet, "--resume", ckpt)
    return job


def resumer(small_data, run, base, checkpointed=lambda clock: False):
    """A function that resumes a copy of `run`'s checkpoint at a clock into a new directory
    under `base`, once per clock: (its directory, the job). The runs resumed at the clocks
    `checkpointed` says write checkpoints as the job's options ask (every clock); the others
    none."""
    runs = {}

    def resumed(clock: int):
        if clock not in runs:
            out = base / f"resumed-{clock}"
            runs[clock] = (out, resume(small_data, run, clock, out, checkpointed(clock)))
        return runs[clock]
    return resumed


def checkpoint_state(directory, m: dict) -> tuple:
    """(keys, state) of a checkpoint, every server's file, in key order."""
    keys, state = [], []
    for shard in m["shards"]:
        with h5py.File(os.path.join(directory, shard["file"]), "r") as f:
            keys.append(f["keys"][:])
            state.append(f["state"][:])
    keys, state = np.concatenate(keys), np.concatenate(state)
    order = np.argsort(keys)
    return keys[order], state[order]


def shares_taken(m: dict) -> dict:
    """Worker -> (shares handed to it that the checkpoint records, shares its position says it
    has taken), for the workers still training at the checkpoint."""
    deaths = m.get("deaths", [])
    return {int(w): (sum(int(w) in d["survivors"] for d in deaths), len(p["taken"]))
            for w, p in m["positions"].items() if not p["finished"]}


def resumed_like(job, run, whole, bits: bool = True) -> None:
    """The resumed job `job` (into `run`) finished, trained exactly the rows of `whole` and
    (with `bits`) ended on its model, bit for bit."""
    assert job.returncode == 0, job.output[-4000:]
    ours, theirs = read_summary(run), read_summary(whole)
    assert ours["train_examples"] == theirs["train_examples"] == EPOCHS * ROWS, \
        (ours["train_examples"], theirs["train_examples"])
    assert ours["worker_examples"] == theirs["worker_examples"], \
        (ours["worker_examples"], theirs["worker_examples"])
    if bits:
        same_model(run, whole)


# A worker leaves.

@pytest.fixture(scope="module")
def leave(small_data, tmp_path_factory):
    """A run in which worker 1 left part-way and the others trained on to the end: (run
    directory, ctl's answer, a function that resumes a copy of its checkpoint at a clock into a
    new directory, once per clock)."""
    base = tmp_path_factory.mktemp("leave")
    whole = base / "whole"
    ended = run_job(5, *data(small_data), "--out", whole, *ARGS, *events(LEAVE))
    assert ended.returncode == 0, ended.output[-4000:]
    [answer] = answered(ended, whole, LEAVE)
    left_soon(answer)
    assert answer["handed_to"] == [0, 2], answer
    assert read_summary(whole)["train_examples"] == EPOCHS * ROWS
    # The run resumed at L + 10 writes its checkpoints: the test of those reads them.
    resumed = resumer(small_data, whole, base, lambda clock: clock == answer["clock"] + 10)
    return whole, answer, resumed


@pytest.mark.parametrize("after", [1, 2, 10], ids=lambda n: f"L+{n}")
def test_a_run_resumed_after_a_leave_ends_as_the_run_that_went_on(leave, after):
    """From the checkpoint `after` clocks past the leave's clock L (worker 1's last): the
    checkpoint records the leave (its deaths) and worker 1's place; the resumed job must
    finish, train each worker's rows of the uninterrupted run and end on its model.

    At L + 1 and L + 2 the other workers may have pushed their clock without having read
    the lead's notice of the leave yet (they read notices at the top of a minibatch), so
    their positions have not taken their share of its rows while the checkpoint's deaths list
    the leave. Resumed, they take it at once, in the epoch they go on in. In the run that
    went on, each took it in the epoch it was in when the word reached it: the same, unless
    the word came late enough for that worker to be in the next one (a matter of timing, seen
    once in CI). So there the promise is every row trained once, by the same workers; the
    bits are compared where every share was taken before the checkpoint."""
    whole, answer, resumed = leave
    clock = answer["clock"] + after
    m = manifest(whole, clock)
    assert [(d["worker"], d["clock"], d["dead"]) for d in m["deaths"]] == \
        [(1, answer["clock"], False)], "the checkpoint records the leave"
    assert m["positions"]["1"]["finished"] and m["positions"]["1"]["clock"] == answer["clock"]
    shares = shares_taken(m)
    print(f"leave at clock {answer['clock']}; checkpoint {clock}: (shares handed, taken) by "
          f"worker {shares}")
    out, job = resumed(clock)
    resumed_like(job, out, whole, bits=all(handed == taken for handed, taken in shares.values()))


def test_a_resume_after_a_leave_does_not_say_the_data_changed(leave):
    """The data did not change: the worker that left stands at the end of what it trained,
    which is no reason to warn of changed data (`Work.resume_point`)."""
    whole, answer, resumed = leave
    out, job = resumed(answer["clock"] + 10)
    assert job.returncode == 0, job.output[-4000:]
    assert "changed data" not in job.output, [line for line in job.output.splitlines()
                                              if "changed data" in line]


def test_a_run_resumed_after_a_leave_writes_each_checkpoint_at_its_own_clock(leave):
    """Under BSP a checkpoint is the state after its clock. The run resumed at L + 10 goes on
    from there, so it writes no checkpoint of an earlier clock, and each it writes is that of
    the original run at the same clock (positions and weights), bit for bit."""
    whole, answer, resumed = leave
    start = answer["clock"] + 10
    out, job = resumed(start)
    assert job.returncode == 0, job.output[-4000:]
    written = [read_manifest(os.path.dirname(p)) for p in complete_checkpoints(out / "checkpoints")]
    assert written, "the resumed run wrote checkpoints"
    assert min(m["clock"] for m in written) >= start, \
        f"checkpoints of clocks before the resume's {start}: " \
        f"{sorted(m['clock'] for m in written if m['clock'] < start)}"
    for m in written[:3]:
        theirs = manifest(whole, m["clock"])
        for w, p in theirs["positions"].items():   # the idle worker's place: its clock, rows
            ours = m["positions"][w]
            assert (ours["clock"], ours["examples"]) == (p["clock"], p["examples"]), m["clock"]
            if not p["finished"]:
                assert ours == p, (m["clock"], w)
        a = checkpoint_state(clock_dir(out / "checkpoints", m["clock"]), m)
        b = checkpoint_state(clock_dir(whole / "checkpoints", m["clock"]), theirs)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_a_run_stopped_after_a_leave_resumes_to_the_same_model(small_data, tmp_path):
    """Worker 1 leaves, the job writes a checkpoint at every clock, and a stop (SIGUSR1 to
    worker 0 at its clock 40, as Slurm's warning) ends it at a clock past the leave (exit 75);
    resumed in place, it ends on the same model, with the same rows, as the job resumed from
    an earlier checkpoint after the leave that nothing stopped (that checkpoint is chosen
    among those whose positions hold the share of every worker still training, so that the
    comparison is with a resume of the kind
    `test_a_run_resumed_after_a_leave_ends_as_the_run_that_went_on` shows to hold at
    L + 10)."""
    run = tmp_path / "run"
    stop = "stop rank 2 at clock 40"   # worker 0, some 30 clocks after worker 1 left
    stopped = run_job(5, *data(small_data), "--out", run, *ARGS, *events(LEAVE, stop))
    assert stopped.returncode == 75, stopped.output[-4000:]
    fired(stopped, stop)
    [answer] = answered(stopped, run, LEAVE)
    left_soon(answer)
    # The first checkpoint past the leave whose positions took every share handed over: keep
    # a copy of it (a resume in place may prune).
    earlier = None
    for path in complete_checkpoints(run / "checkpoints"):
        m = read_manifest(os.path.dirname(path))
        if m["clock"] > answer["clock"] and all(
                handed == taken for handed, taken in shares_taken(m).values()):
            earlier = m["clock"]
            break
    assert earlier is not None, "no checkpoint after the leave took every share"
    kept = tmp_path / "kept"
    shutil.copytree(clock_dir(run / "checkpoints", earlier),
                    kept / os.path.basename(clock_dir(run / "checkpoints", earlier)))
    stop = read_summary(run)["stopped_at_clock"]
    print(f"leave at clock {answer['clock']}; every share taken at checkpoint {earlier}; "
          f"stopped at {stop}")
    assert stop > earlier, (stop, earlier)
    assert [d["worker"] for d in manifest(run, stop)["deaths"]] == [1]
    again = run_job(5, *data(small_data), "--out", run, *ARGS, "--resume", run / "checkpoints")
    assert again.returncode == 0, again.output[-4000:]
    assert f"resumed from checkpoint clock {stop}" in again.output
    reference = tmp_path / "reference"
    went_on = run_job(5, *data(small_data), "--out", reference, *ARGS, "--checkpoint-every", 0,
                      "--resume", kept)
    resumed_like(went_on, reference, run)


# A worker leaves and joins again.

@pytest.fixture(scope="module")
def rejoin(small_data, tmp_path_factory):
    """A run in which worker 1 left, then joined again (worker 0 and 2 each gave it a share of
    their rows left), and which trained on to the end: (run directory, the lead's answer to
    the join asked at clock 30, the splits (worker, clock) its last checkpoint records, a
    function that resumes a copy of its checkpoint at a clock into a new directory, once per
    clock)."""
    base = tmp_path_factory.mktemp("rejoin")
    whole = base / "whole"
    ended = run_job(5, *data(small_data), "--out", whole, *ARGS, *events(LEAVE, JOIN))
    assert ended.returncode == 0, ended.output[-4000:]
    left, joined = answered(ended, whole, LEAVE, JOIN)
    left_soon(left)
    assert joined["target"] == 1 and sorted(joined["from"]) == [0, 2], joined
    assert joined["clock"] > 30 > left["clock"], (left, joined)
    assert read_summary(whole)["train_examples"] == EPOCHS * ROWS
    last = read_manifest(os.path.dirname(complete_checkpoints(whole / "checkpoints")[-1]))
    splits = [(d["worker"], d["clock"]) for d in last["deaths"] if d["worker"] != 1]
    assert sorted(w for w, _ in splits) == [0, 2], last["deaths"]
    resumed = resumer(small_data, whole, base)
    return whole, joined, splits, resumed


@pytest.mark.parametrize("after", [0, 1, 10], ids=lambda n: f"C+{n}")
def test_a_run_resumed_after_a_join_ends_as_the_run_that_went_on(rejoin, after):
    """From the checkpoint `after` clocks past C, the clock from which the worker that joined
    trains (its first push is of clock C; the others cannot complete C before the servers
    count it: see rangemoves), the resumed job must finish, train each worker's rows of the
    uninterrupted run and end on its model.

    At C itself the joiner's position (from its first push) has taken the shares of every
    donor's split: the checkpoint must hold the splits too, whatever clock each donor split
    at (a donor ahead of the others splits later than they do). The print says which."""
    whole, joined, splits, resumed = rejoin
    clock = joined["clock"] + after
    m = manifest(whole, clock)
    assert m["positions"]["1"]["clock"] == clock and not m["positions"]["1"]["finished"], \
        "at the checkpoint the worker that joined is training"
    recorded = [(d["worker"], d["clock"]) for d in m["deaths"] if d["worker"] != 1]
    print(f"join at clock {joined['clock']}, splits {splits}; checkpoint {clock} records "
          f"{recorded}; (shares handed, taken) by worker {shares_taken(m)}")
    out, job = resumed(clock)
    resumed_like(job, out, whole)
