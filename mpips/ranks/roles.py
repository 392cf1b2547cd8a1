"""Split one MPI job into a server group and a worker group.

The first `n_servers` ranks serve shards of the model, the rest are workers.
Parameter-server traffic runs on a private duplicate of the job's communicator,
so it never matches messages of other libraries; `group` connects the ranks
that share a role (servers with servers, workers with workers).
"""
import os
from dataclasses import dataclass
from typing import cast

import numpy as np
from mpi4py import MPI

from ..base.errors import ConfigError
from .bounded import wait_all
from .ulfm import job_communicator, know_neighbours, survivors, world_ranks

MEET_S = 120.0   # split's bound on the wait for every rank


@dataclass(frozen=True)
class Roles:
    comm: MPI.Intracomm
    group: MPI.Intracomm
    servers: tuple
    workers: tuple
    nodes: tuple = ()   # for each rank of `comm`, a number shared by the ranks of its node
    pids: tuple = ()    # for each rank of `comm`, its process id (on its node)

    @property
    def is_server(self) -> bool:
        return self.comm.rank < len(self.servers)

    @property
    def index(self) -> int:
        """This rank's position among the ranks of its role."""
        return self.group.rank

    @property
    def name(self) -> str:
        return f"{'server' if self.is_server else 'worker'} {self.index}"

    def worker_index(self, rank: int) -> int:
        return rank - len(self.servers)

    def ranks_on_node(self) -> int:
        """How many ranks of the job share this rank's node."""
        if not self.nodes:
            return 1
        return self.nodes.count(self.nodes[self.comm.rank])

    def pids_on_node(self) -> dict:
        """Rank -> process id, of the ranks on this rank's node."""
        here = self.nodes[self.comm.rank] if self.nodes else None
        return {r: pid for r, pid in enumerate(self.pids)
                if not self.nodes or self.nodes[r] == here}

    def survived(self) -> "Roles":
        """Collective over the living ranks: if a rank has died (under ULFM), the roles of
        the survivors on a communicator of their own (servers first, as before; `group` is
        not carried over); else these roles."""
        comm = survivors(self.comm)
        if comm is None:
            return self
        old = comm.Get_group().Translate_ranks(list(range(comm.size)), self.comm.Get_group())
        n_servers = sum(1 for r in old if r < len(self.servers))
        return Roles(comm=comm, group=self.group, servers=tuple(range(n_servers)),
                     workers=tuple(range(n_servers, comm.size)),
                     nodes=tuple(self.nodes[r] for r in old) if self.nodes else (),
                     pids=tuple(self.pids[r] for r in old) if self.pids else ())

    def free(self) -> None:
        self.group.Free()
        self.comm.Free()


def check_servers(n_servers: int, n_ranks: int, spares: int = 0) -> None:
    """Raise ConfigError unless n_servers (of which `spares` spares) leaves at least one
    worker."""
    if n_servers - spares < 1:
        raise ConfigError(f"--servers must be at least 1, got {n_servers - spares}")
    if n_servers >= n_ranks:
        named = (f"--servers {n_servers - spares} and --spares {spares}" if spares else
                 f"--servers {n_servers}")
        raise ConfigError(
            f"{named} {'leave' if spares else 'leaves'} no worker: the job has {n_ranks} "
            f"rank(s), and needs at least {n_servers + 1} ({n_servers} server(s) + 1 worker). "
            f"Launch more ranks, e.g. mpiexec -n {n_servers + 1} python -m mpips train ..., or "
            f"lower --servers.")


def split(n_servers: int, comm: MPI.Intracomm = MPI.COMM_WORLD,
          timeout: float = MEET_S) -> Roles:
    """Collective over `comm`: assign roles and build the communicators. Waits at most
    `timeout` seconds for every rank to come."""
    check_servers(n_servers, comm.size)
    # The blocking collectives below busy-poll until the last rank comes: the ranks meet
    # first in a wait that sleeps (bounded.wait_all). Ranks that came in turns to a job's
    # split (a rank off its core, kernels loaded at different speeds) burned 0.15 CPU-s of
    # a 4-rank launch on 2 cores there.
    wait_all([comm.Ibarrier()], timeout, lambda: "every rank to take its role")
    ps = comm.Dup()
    job_communicator(ps)   # what a rank leaving after a failure revokes
    is_server = ps.rank < n_servers
    # An intracommunicator split gives intracommunicators; mpi4py types it as any Comm.
    group = cast(MPI.Intracomm, ps.Split(color=0 if is_server else 1, key=ps.rank))
    nodes, pids = whereabouts(ps)
    roles = Roles(comm=ps, group=group, servers=tuple(range(n_servers)),
                  workers=tuple(range(n_servers, ps.size)), nodes=nodes, pids=pids)
    in_world = world_ranks(ps, range(ps.size))
    know_neighbours({in_world[r]: pid for r, pid in roles.pids_on_node().items()})
    return roles


def whereabouts(comm: MPI.Intracomm) -> tuple[tuple, tuple]:
    """Collective: for each rank, the lowest rank on its node (so that backups can be put on
    other nodes than their primaries), and its process id."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    try:
        first = np.array([comm.rank], np.int64)
        node.Bcast(first, root=0)
    finally:
        node.Free()
    mine = np.array([first[0], os.getpid()], np.int64)
    everyone = np.empty((comm.size, 2), np.int64)
    comm.Allgather(mine, everyone)
    return tuple(everyone[:, 0].tolist()), tuple(everyone[:, 1].tolist())
