"""What every rank must share before a job starts: numba kernels compiled once per node,
and every rank ready to train."""
import contextlib
import gc
import glob
import hashlib
import logging
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from .. import kernels
from ..kernels import jit
from ..ranks.bounded import wait_all
from ..ranks.collectives import agree
from .warmup import CompileWatch, compile_kernels

log = logging.getLogger("mpips")


def compile_per_node(comm: MPI.Intracomm, timeout: float, role: str | None = None,
                     **needs) -> float:
    """Compile the kernels (those `needs` names: see warmup.compile_kernels) on one rank per
    node first, every role's; the others then load numba's cache instead of compiling the
    same code at the same time on the same cores. Once a node has compiled them, every rank
    loads its `role`'s at once (see `warm_marker`). Returns seconds."""
    start = time.monotonic()
    marker = warm_marker(needs)
    # Decided together: a rank that saw the marker (another job had just written it) and one
    # that did not would take different ways, one of them into a collective the other skips.
    found = np.array([jit.AHEAD or (marker is not None and os.path.exists(marker))], np.int32)
    everywhere = np.zeros(1, np.int32)
    wait_all([comm.Iallreduce(found, everywhere, op=MPI.MIN)], timeout,
             lambda: "every rank to say whether this node's numba kernels were compiled")
    if everywhere[0]:
        _load_kernels(needs, role)
        return time.monotonic() - start
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        if node.rank == 0:
            if comm.rank == 0:
                log.info("loading the numba kernels (compiled on the first run of these "
                         "sources on a machine, ~20 s)")
            _compile_all(needs)
            if marker:
                with contextlib.suppress(OSError):
                    open(marker, "w").close()
        wait_all([node.Ibarrier()], timeout,
                 lambda: "the first rank on this node to compile the numba kernels")
        if node.rank != 0:
            _load_kernels(needs, role)
    finally:
        node.Free()
    return time.monotonic() - start


def _compile_all(needs: dict) -> None:
    """Every role's kernels, compiled with the cyclic collector on and a collection after,
    if start-up holds it off (see _load_kernels)."""
    held = not gc.isenabled()
    gc.enable()
    try:
        compile_kernels(**needs)
    finally:
        if held:
            gc.collect()
            gc.disable()


def _load_kernels(needs: dict, role: str | None) -> None:
    """compile_kernels from numba's cache, or collect what numba left if it compiled some
    anyway (a cache it found stale): start-up holds the cyclic collector off (see __main__),
    and compiling makes garbage by the hundred MB (loading the cache almost none), which
    `ready` would keep for good."""
    watch = CompileWatch()
    with watch.watching():
        compile_kernels(**needs, role=role)
    if watch.compiled and not gc.isenabled():
        gc.collect()


def warm_marker(needs: dict) -> str | None:
    """A file beside numba's cache of the kernels, there once this set of kernels has been
    compiled from these very sources (numba's cache goes stale by the same stamps: each
    source's modification time and size), by this numba and Python. None where the
    kernels are compiled ahead (kernels.jit): there is nothing to compile."""
    if jit.AHEAD:
        return None
    import numba
    directory = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.path.dirname(kernels.__file__), "__pycache__")
    if not os.access(directory, os.W_OK):
        return None
    named = sorted((k, getattr(v, "name", v)) for k, v in needs.items())   # a model by name
    stamp = hashlib.sha256(f"{numba.__version__} {sys.version} {named!r}".encode())
    for path in sorted(glob.glob(os.path.join(os.path.dirname(kernels.__file__), "*.py"))):
        st = os.stat(path)
        stamp.update(f"{os.path.basename(path)} {st.st_mtime_ns} {st.st_size}".encode())
    return os.path.join(directory, f"mpips-warm-{stamp.hexdigest()[:16]}")


def process_age() -> float:
    """Seconds since this process started (Linux's /proc: the interpreter's start-up and
    imports count), or since mpips was imported where /proc is not there."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])   # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - started / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


_IMPORTED = time.monotonic()


def ready(comm: MPI.Intracomm, timeout: float, prepare) -> float:
    """Every rank prepares (opens its data, loads its part of a checkpoint); if any fails,
    all stop together with its message instead of waiting for it. Returns the start time."""
    agree(comm, prepare, timeout, "every rank to be ready to train")
    if _gc_held():
        # What start-up made lives on (modules, kernels, tables): no later collection goes
        # over it. Not collected first: a full collection costs as much as the ones saved,
        # and start-up leaves under 1 MB of garbage.
        gc.freeze()
        gc.enable()
    return time.monotonic()


def _gc_held() -> bool:
    """Whether `python -m mpips train` holds the cyclic garbage collector off (__main__)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return not gc.isenabled() and getattr(spec, "name", None) == "mpips.__main__"
