"""A rank failing: why, said once (with a traceback only for a bug), and the servers told to
save what they hold before the job stops, whichever rank fails first."""
import contextlib
import logging
import traceback

import numpy as np
from mpi4py import MPI

from ..base.errors import ConfigError, Interrupted, MpipsError, said_by
from ..ranks.bounded import wait_until
from ..ranks.roles import Roles
from ..ranks.ulfm import CannotFailOver, dead_ranks, is_failure, revoked, what_died
from ..wire import messages, protocol, tags
from ..wire.protocol import Op

log = logging.getLogger("mpips")


def log_failure(e: Exception) -> str:
    """Log why this rank fails (with a traceback if it is a bug); return a one-line reason."""
    if is_failure(e):   # another rank died (under ULFM): the command line says which
        return what_died(MPI.COMM_WORLD, e)
    if isinstance(e, CannotFailOver):   # the command line says it, with how to go on
        return str(e)
    text = str(e) if isinstance(e, MpipsError) else f"{type(e).__name__}: {e}"
    logging.getLogger("mpips").error("%s", text if isinstance(e, MpipsError)
                                     else traceback.format_exc())
    # The command line does not log it again. Any exception (a bug's too) carries the mark:
    # MpipsError declares it; the command line reads it with getattr.
    e.reported = True  # type: ignore[attr-defined]
    return text


@contextlib.contextmanager
def saving_on_failure(roles: Roles, placement, timeout: float):
    """When this worker fails, the servers save what they hold before the job stops."""
    try:
        yield
    except Exception as e:
        if isinstance(e, ConfigError):
            raise   # every rank stops with it, before training
        reason = said_by(f"worker {roles.index}", log_failure(e))
        others_save(roles.comm, [roles.servers[i] for i in placement.living], e, reason, timeout,
                    "could not reach the servers to save the model")
        raise


def others_save(comm: MPI.Intracomm, servers: list, e: Exception, reason: str, timeout: float,
                unconfirmed: str, answering: bool = False) -> None:
    """This rank failed with `e` (said as `reason`): `servers` (ranks of `comm`), but those
    MPI knows to be dead, are told to save their shards (tell_servers_to_save), unless `e`
    is a second signal, a failure every rank stops on by itself (CannotFailOver) or another
    rank's stop (the job's communicator revoked). If they do not confirm, `unconfirmed` is
    logged, with why (not when another rank stopped the job meanwhile)."""
    if isinstance(e, (Interrupted, CannotFailOver)) or revoked(e):
        return
    if is_failure(e):   # none of the dead would answer
        dead = dead_ranks(comm)
        servers = [rank for rank in servers if rank not in dead]
    if not servers:
        return
    try:
        tell_servers_to_save(comm, servers, reason, timeout, answering)
    except (MpipsError, MPI.Exception) as again:
        if not revoked(again):
            log.error("%s: %s", unconfirmed, again)


def tell_servers_to_save(comm: MPI.Intracomm, servers, reason: str, timeout: float,
                         answering: bool = False) -> None:
    """Tell each server in `servers` (ranks) that the job is failing, and wait until each has
    saved its shard and acknowledged. Used by a failing worker, or server for the others: a
    failing server is `answering` meanwhile, acknowledging the others' ERROR messages, since
    they may be failing at once and waiting for it (it has saved already)."""
    message = messages.Error(reason).pack()
    acks = np.zeros(len(servers), np.int64)
    requests = []
    for i, server in enumerate(servers):
        requests.append(comm.Isend(message, server, tags.REQUEST_TAG))
        requests.append(comm.Irecv(acks[i:i + 1], server, tags.ERROR_ACK_TAG))
    answers = []

    def done() -> bool:
        if answering:
            for server in servers:
                probed = MPI.Status()
                found = comm.Improbe(server, tags.REQUEST_TAG, probed)
                if found is None:
                    continue
                buf = np.empty(probed.Get_count(MPI.BYTE), np.uint8)
                found.Recv(buf)   # the job is failing: only an ERROR message matters now
                if buf.shape[0] >= protocol.HEADER_BYTES and \
                        protocol.header(buf).op == Op.ERROR:
                    answers.append(comm.Isend(np.ones(1, np.int64), server,
                                              tags.ERROR_ACK_TAG))
        return MPI.Request.Testall(requests) and MPI.Request.Testall(answers)

    wait_until(done, timeout,
               lambda: f"server rank(s) {list(servers)} to save their shards after an error")
