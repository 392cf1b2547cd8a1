"""A real Slurm on this machine for the slurm/ templates: munge, slurmctld and two slurmd,
started for the test session on their own ports and directories, and stopped after it.

The two slurmd are two nodes on this host, ps1 (feature bigmem) and ps2 (feature standard),
so that multi-node and heterogeneous jobs have two nodes. Each runs in its own UTS namespace
with its node name as host name: MPI tells nodes apart by host name, as on a real cluster.

Installs Debian's slurm-wlm and munge when they are missing (tests/debian.py). Needs root;
without it the tests skip and say why.
"""
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

import pytest
from debian import SLURM, ensure
from support import cannot

from mpips.base.errors import WaitTimeout
from mpips.base.processes import start_time
from mpips.ranks.bounded import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}

CONF = """\
ClusterName=mpipstest
SlurmctldHost={host}
SlurmctldPort=16817
AuthType=auth/munge
# A requeued job waits out the credential lifetime (default 120 s) before it starts again.
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
SlurmUser=root
ReturnToService=2
MpiDefault=none
JobRequeue=1
MinJobAge=600
KillWait=10
NodeName=ps1 NodeHostname=ps1 NodeAddr=127.0.0.1 Port=16818 CPUs=4 RealMemory=8000 Feature=bigmem State=UNKNOWN
NodeName=ps2 NodeHostname=ps2 NodeAddr=127.0.0.1 Port=16819 CPUs=4 RealMemory=8000 Feature=standard State=UNKNOWN
PartitionName=debug Nodes=ps1,ps2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


DAEMONS = ("slurmctld", "slurmd")
STOP_S = 30   # a daemon's bound to end once told to (shutdown, then SIGTERM, then SIGKILL)


@dataclass
class Cluster:
    env: dict
    dir: str

    def run(self, *cmd: str, timeout: float = 60) -> str:
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed: {out.stdout}{out.stderr}")
        return out.stdout

    def submit(self, template: str, *options: str, **knobs) -> str:
        """sbatch a template from slurm/ with knobs as environment variables; the job id."""
        exports = ",".join(["ALL", f"MPIPS_DIR={REPO}"] + [f"{k}={v}" for k, v in knobs.items()])
        return self.run("sbatch", "--parsable", f"--chdir={self.dir}", f"--export={exports}",
                        *options, os.path.join(REPO, "slurm", template)).strip().split(";")[0]

    def job(self, job_id: str) -> dict:
        """The job's fields from scontrol (JobState, Restarts, ExitCode, StdOut, ...)."""
        fields = {}
        for token in self.run("scontrol", "show", "job", "-o", job_id).split():
            key, _, value = token.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait(self, job_id: str, timeout: float = 600, until=TERMINAL) -> dict:
        """Poll until the job reaches a state in `until`; fail the test past `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                job = self.job(job_id)
            except AssertionError as e:   # slurmctld busy for a moment: asked again
                job = {"JobState": f"unknown ({e})"}
            if job["JobState"] in until:
                return job
            if time.monotonic() > deadline:
                pytest.fail(f"job {job_id} still {job['JobState']} after {timeout} s")
            time.sleep(1)

    def output(self, job: dict) -> str:
        with open(job["StdOut"]) as f:
            return f.read()


def _test_daemons(conf: str | None = None) -> list[int]:
    """The running slurmctld and slurmd started with `conf`, or with any slurm.conf in
    pytest's temporary directories (a test cluster's): a session that ended without stopping
    its own leaves them holding the cluster's ports, and they, not the next session's, would
    take its jobs."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue   # gone meanwhile
        if os.path.basename(argv[0]) not in DAEMONS or "-f" not in argv[:-1]:
            continue
        used = argv[argv.index("-f") + 1]
        if used == conf or (conf is None and "/pytest-of-" in used):
            found.append(int(name))
    return found


def _stop(pids: list[int], why: str) -> None:
    """End these processes: SIGTERM, then SIGKILL to those still running STOP_S seconds on;
    fails, naming them, if any outlives that."""
    started = {pid: start_time(pid) for pid in pids}   # (a pid reused meanwhile is not them)

    def running() -> list[int]:
        return [p for p, t in started.items() if t is not None and start_time(p) == t]
    for signal in ("TERM", "KILL"):
        if not running():
            return
        subprocess.run(["kill", f"-{signal}", *map(str, running())], capture_output=True)
        try:
            wait_until(lambda: not running(), STOP_S, lambda: f"Slurm daemon(s) {running()}")
            return
        except WaitTimeout:
            continue
    pytest.fail(f"Slurm daemon(s) {running()} ({why}) did not end on SIGKILL within "
                f"{STOP_S} s")


def _start_munge() -> bool:
    """Start munged unless one answers already; whether this started it."""
    if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
        return False
    if not os.path.exists("/etc/munge/munge.key"):
        subprocess.run(["mungekey", "--create"], check=True)
        shutil.chown("/etc/munge/munge.key", "munge", "munge")
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "munged"], check=True)
    return True


@pytest.fixture(scope="session", name="slurm")
def slurm_fixture(tmp_path_factory):
    if os.geteuid() != 0:
        cannot("needs root to start munge, slurmctld and slurmd")
    ensure(SLURM)
    started_munge = _start_munge()
    _stop(_test_daemons(), "an earlier session's test cluster, still running")
    base = str(tmp_path_factory.mktemp("slurm"))
    for sub in ("state", "spool-ps1", "spool-ps2", "jobs"):
        os.makedirs(os.path.join(base, sub))
    conf = os.path.join(base, "slurm.conf")
    with open(conf, "w") as f:
        f.write(CONF.format(host=socket.gethostname(), dir=base))
    env = {**os.environ, "SLURM_CONF": conf}
    try:
        subprocess.run(["slurmctld", "-f", conf], env=env, check=True, timeout=60)
        for node in ("ps1", "ps2"):
            subprocess.run(["unshare", "--uts", "--", "sh", "-c",
                            f"hostname {node} && exec slurmd -N {node} -f {conf}"],
                           env=env, check=True, timeout=60)
        deadline = time.monotonic() + 60
        while subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True,
                             text=True).stdout.split() != ["idle", "idle"]:
            if time.monotonic() > deadline:
                pytest.fail(f"the Slurm nodes did not come up in 60 s; see {base}/*.log")
            time.sleep(0.5)
        ours = _test_daemons(conf)
        if len(ours) != 3:
            pytest.fail(f"this session's slurmctld and 2 slurmd are not all running (pids "
                        f"{ours}): does another process hold the cluster's ports "
                        f"16817-16819? see {base}/*.log")
        yield Cluster(env=env, dir=os.path.join(base, "jobs"))
    finally:
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True, timeout=60)
        # `scontrol shutdown` asks the controller to stop the slurmd too; one it never
        # reached (seen once, beside a CPU hog) would hold the ports for the next session.
        _stop(_test_daemons(conf), "this session's test cluster, after scontrol shutdown")
        if started_munge:
            subprocess.run(["pkill", "-x", "munged"], capture_output=True)
