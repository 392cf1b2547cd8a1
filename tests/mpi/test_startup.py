"""Start-up's kernels compiled once per node, decided by every rank together: a rank that
sees this node's marker (another job on the same sources has just written it) and a rank
that does not must not take different ways, one of them into a collective.

Run with: mpiexec -n 4 python -m pytest --with-mpi tests/mpi
"""
import os

import pytest
from mpi4py import MPI

from mpips.run import startup

pytestmark = pytest.mark.mpi(min_size=2)


def test_ranks_that_disagree_on_the_marker_take_one_way(tmp_path, monkeypatch):
    """Rank 0 finds the marker, the others do not: every rank returns (the old check let
    rank 0 skip the node's split the others waited in, until --timeout)."""
    comm = MPI.COMM_WORLD
    found = os.path.join(str(tmp_path), "found")
    open(found, "w").close()
    where = found if comm.rank == 0 else os.path.join(str(tmp_path), "not-yet")
    monkeypatch.setattr(startup.jit, "AHEAD", False)   # kernels numba's: compiled here
    monkeypatch.setattr(startup, "warm_marker", lambda needs: where)
    loaded = []
    monkeypatch.setattr(startup, "_load_kernels", lambda needs, role: loaded.append(role))
    monkeypatch.setattr(startup, "_compile_all", lambda needs: loaded.append("all"))
    startup.compile_per_node(comm, 30.0, "server", optimizer="sgd")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    first = node.rank == 0
    node.Free()
    assert loaded == (["all"] if first else ["server"]), \
        "the way of a node whose ranks had not all seen the marker: one compiles, then loads"


def test_with_the_kernels_compiled_ahead_no_rank_compiles(tmp_path, monkeypatch):
    """Whatever the marker says, a rank whose kernels are compiled ahead counts as warm: where
    every rank's are, every rank loads its own at once."""
    comm = MPI.COMM_WORLD
    monkeypatch.setattr(startup.jit, "AHEAD", True)
    monkeypatch.setattr(startup, "warm_marker",
                        lambda needs: os.path.join(str(tmp_path), "never"))
    loaded = []
    monkeypatch.setattr(startup, "_load_kernels", lambda needs, role: loaded.append(role))
    monkeypatch.setattr(startup, "_compile_all", lambda needs: loaded.append("all"))
    startup.compile_per_node(comm, 30.0, "server", optimizer="sgd")
    assert loaded == ["server"]
