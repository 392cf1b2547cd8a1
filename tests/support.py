"""What the tests share: launching real mpiexec jobs and plain mpips commands, reading what
a run wrote, the model compared bit for bit, and the rule for tests that need the system.

Jobs are launched with MPIPS_TESTING=1, so that they may carry `--test-event`s (see
mpips/run/testevents.py): a test names the point of the job where a rank dies, freezes, is
signalled or pauses, or where a `ctl` request comes, instead of racing the clock.
"""
import glob
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

# What the Makefile exports, so that `pytest` also works when run by hand (as root, on few
# cores); events at a point of a job, which only tests may use; and no fsync: the tests kill
# processes, never the node, and a rename is atomic without it. On the suite's loaded disk an
# fsync took up to seconds: a job that checkpoints at every clock (488 fsyncs) took 30 s, not 3.
# The tests that launch with FSYNC_ON fsync as users' jobs do (tests/jobs/test_checkpoints.py).
# And on one machine, Open MPI's ob1 messaging (shared memory, TCP) without probing for UCX
# first: a 4-rank launch then takes 0.31 CPU-s to start MPI, not 0.39 (under ULFM, no change).
for _name, _value in (("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                      ("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe"),
                      ("OMPI_MCA_osc", "^ucx"), ("OMPI_MCA_btl", "^ofi"), ("OMPI_MCA_pml", "ob1"),
                      ("MPIPS_TESTING", "1"), ("MPIPS_FSYNC", "0")):
    os.environ.setdefault(_name, _value)

# ULFM's failure detector declares a rank dead after this many seconds of silence. A loaded
# machine (2 cores, 4-6 ranks, CI beside) can keep a live rank from MPI for a second: tests
# give it several. Only the test that measures detection uses 1 s.
DETECTOR_S = 6


def ulfm(detector_s: float = DETECTOR_S) -> tuple:
    """mpiexec's options for hot failover: ULFM and its failure detector (what FT=1 adds)."""
    return ("--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true",
            "--mca", "mpi_ft_detector_period", "0.2",
            "--mca", "mpi_ft_detector_timeout", f"{detector_s:g}")


ULFM = ulfm()


def mpiexec_path() -> str:
    if os.environ.get("MPIEXEC"):
        return os.environ["MPIEXEC"]
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else "mpiexec"


@dataclass
class Job:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


# The environment of a launch that fsyncs every file, as a user's job does.
FSYNC_ON = {"MPIPS_FSYNC": "1"}


def launch(n_ranks: int, *args, launcher=(), env=None) -> subprocess.Popen:
    """Start `mpiexec [LAUNCHER] -n N python -m mpips ARGS` in its own process group (`env`:
    variables set for it on top of this process's)."""
    cmd = [mpiexec_path(), *launcher, "-n", str(n_ranks), sys.executable, "-m", "mpips",
           *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **(env or {})})


def finish(proc: subprocess.Popen, timeout: float = 300) -> Job:
    """Wait for a launched job; kill its whole process group and fail the test if it
    outlives `timeout`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"job did not finish within {timeout} s: {' '.join(proc.args)}\n{out}\n{err}")
    _last_job[:] = [Job(proc.returncode, out, err)]
    return _last_job[0]


# The job this process (a test worker) last finished: what a missing summary.json is shown with.
_last_job: list[Job] = []


# Open MPI's launcher, started many times in a row, now and then fails to start before any
# rank runs (its PMIx listener cannot bind): that launch is tried again.
LAUNCHER_DID_NOT_START = "The PMIx server's listener thread failed to start"


def run_job(n_ranks: int, *args, timeout: float = 300, launcher=(), env=None) -> Job:
    """Run `mpiexec -n N python -m mpips ARGS` to completion (see `finish`)."""
    for _ in range(3):
        job = finish(launch(n_ranks, *args, launcher=launcher, env=env), timeout)
        if LAUNCHER_DID_NOT_START not in job.stderr:
            break
    return job


def run_mpips(*args, timeout: float = 300) -> Job:
    """Run `python -m mpips ARGS` as a plain process (no mpiexec)."""
    proc = subprocess.run([sys.executable, "-m", "mpips", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)
    return Job(proc.returncode, proc.stdout, proc.stderr)


def run_here(*args) -> Job:
    """`python -m mpips ARGS` of a one-process command (score, report, inspect) run in this
    process: its exit status, standard output and standard error as the program's, without a
    new interpreter's imports (report's matplotlib alone is a second of CPU). For tests of
    what the command does with its inputs; each command also has tests that run it as a
    program (`run_mpips`). The 'mpips' logger's warnings go to standard error as the
    program's, whose logger has no handler, prints them (the message alone), and an
    exception that escapes is printed with its traceback (status 1)."""
    import contextlib
    import io
    import logging
    import traceback

    from mpips.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    logger = logging.getLogger("mpips")
    saved = logger.handlers[:], logger.level, logger.propagate
    last_resort = logging.StreamHandler(err)   # as logging.lastResort: WARNING, the message
    last_resort.setLevel(logging.WARNING)
    logger.handlers, logger.propagate = [last_resort], False
    logger.setLevel(logging.WARNING)
    status = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([*map(str, args)])
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    status = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
                    status = 1
            except Exception:
                traceback.print_exc()
                status = 1
    finally:
        logger.handlers, logger.propagate = saved[0], saved[2]
        logger.setLevel(saved[1])
    return Job(status, out.getvalue(), err.getvalue())


def read_summary(run_dir) -> dict:
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        said = (f"exit {_last_job[0].returncode}:\n{_last_job[0].output}" if _last_job
                else "no job was launched by this process")
        pytest.fail(f"no {path}; the last job launched here ended with {said}")
    with open(path) as f:
        return json.load(f)


def same_model(a, b) -> None:
    """The models of runs `a` and `b` are the same, bit for bit."""
    from mpips.storage.model_files import load_model
    ours, theirs = load_model(os.path.join(a, "model")), load_model(os.path.join(b, "model"))
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1].view(np.uint32), theirs[1].view(np.uint32))


# Under ASP a model depends on when each worker ran, not only on what it trained: an
# uninterrupted run in which a worker froze for 0.5 s at clock 10 ends with a held-out logloss
# 2.8% above that of a run without (2 servers + 2 workers, 40 epochs), while runs that keep
# pace agree within 0.1%. A loaded machine pauses workers too: a test compares an ASP model
# loosely (5x that), and asserts exactly what must hold whatever the timing (every example
# trained, every push applied).
ASP_LOGLOSS_SLACK = 0.15


def close_logloss(ours: float, theirs: float, slack: float) -> None:
    """Held-out loglosses `ours` and `theirs` differ by at most `slack`, relatively."""
    assert abs(ours - theirs) <= slack * theirs, \
        f"held-out logloss {ours:.6f} against {theirs:.6f}: more than {slack:.1%} apart"


def fired(job, event: str) -> None:
    """Assert that the job fired `--test-event EVENT` (it says so when it does)."""
    assert f"test event: {event} (reached" in job.output, \
        f"the job never fired {event!r}:\n{job.output}"


def ctl_answers(run_dir) -> list:
    """The answers the lead wrote to `ctl` requests (made by `ctl` or by test events), in the
    order they were asked."""
    answers = []
    for path in sorted(glob.glob(os.path.join(run_dir, "control", "answer-*.json"))):
        with open(path) as f:
            answers.append(json.load(f))
    return answers


def cannot(reason: str) -> None:
    """Skip the test for `reason`, or fail it where the tests must all run
    (MPIPS_REQUIRE_SYSTEM_TESTS=1, set by .ci/run)."""
    if os.environ.get("MPIPS_REQUIRE_SYSTEM_TESTS") == "1":
        pytest.fail(f"{reason} (MPIPS_REQUIRE_SYSTEM_TESTS=1: this must run here)")
    pytest.skip(reason)


def refusal(argv, n_ranks: int) -> tuple:
    """(exit status, message) of `mpips train ARGV` refused before any work, found in this
    process as every rank of an `n_ranks` launch would: the parser's message (its status), or
    the configuration's check (a ConfigError: status 2, "mpips train: error: ..."); (0,
    "(accepted)") if neither refuses. For refusals of a kind that tests also launch under
    mpiexec (tests/hostile/test_options.py: the parser's, the configuration's, the data's, a
    layout's), where what is tested is the check and its message, not the launch."""
    import contextlib
    import io

    from mpips.base.errors import ConfigError
    from mpips.cli import main as cli
    from mpips.run.config_checks import check
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = cli.build_parser().parse_args(["train", *map(str, argv)])
        check(cli.config_of(args), n_ranks)
    except SystemExit as e:
        return e.code, said.getvalue()
    except ConfigError as e:
        return 2, f"mpips train: error: {e}"
    return 0, "(accepted)"
