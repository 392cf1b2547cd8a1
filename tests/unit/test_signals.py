"""A rank that crashes says where: its Python stacks on standard error before it dies (the
launcher alone would say only that a rank died), alone and under mpiexec, whose Open MPI
installs its own handler of the same signals."""
import subprocess
import sys

from support import mpiexec_path

CRASH = """
import ctypes
from mpi4py import MPI
from mpips.run import signals
signals.install()
def a_kernel_that_reads_address_zero():
    ctypes.string_at(0)
if MPI.COMM_WORLD.rank == MPI.COMM_WORLD.size - 1:
    a_kernel_that_reads_address_zero()
MPI.COMM_WORLD.Barrier()
"""


def crashed(cmd) -> str:
    ran = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert ran.returncode != 0, ran.stdout + ran.stderr
    return ran.stdout + ran.stderr


def test_a_crashing_process_writes_its_python_stack(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    said = crashed([sys.executable, str(script)])
    assert "Fatal Python error: Segmentation fault" in said, said
    assert "in a_kernel_that_reads_address_zero" in said, said


def test_a_crashing_rank_writes_its_python_stack_under_mpiexec(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    said = crashed([mpiexec_path(), "-n", "2", sys.executable, str(script)])
    assert "Fatal Python error: Segmentation fault" in said, said
    assert "in a_kernel_that_reads_address_zero" in said, said
