"""The dense-table API against real servers: 4 ranks, 2 servers + 2 workers.

Run with: mpiexec -n 4 python -m pytest --with-mpi tests/mpi
"""
import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI
from serving import serve

from mpips.worker.kvworker import KVWorker
from mpips.worker.dense_client import DenseClient
from mpips.base.errors import InputError
from mpips.ranks.roles import split

pytestmark = pytest.mark.mpi(min_size=4)

N, BLOCK = 1000, 64   # 16 blocks, 8 on each server


def test_each_operation_runs_on_the_servers_as_numpy_on_the_whole_vector():
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            server = serve(roles)
            held = {name: sum(b.shape[0] for b in t.blocks.values())
                    for name, t in ((t.name, t) for t in server.dense.tables.values())}
            assert 0 < held["x"] < N, "each server holds part of each table, not all of it"
        else:
            kv = KVWorker(roles, timeout=60)
            ps = DenseClient(kv)
            x, y, z = (ps.dense(name, N, block_rows=BLOCK) for name in "xyz")
            rng = np.random.default_rng(7)
            xs, ys = rng.normal(size=N), rng.normal(size=N)
            rows = np.arange(N)
            if roles.index == 0:
                x.scatter_add(rows, xs)
                y.scatter_add(rows, ys)
                np.testing.assert_array_equal(x.gather(rows), xs)
                assert x.dot(y) == pytest.approx(xs @ ys, rel=1e-13)
                assert x.nrm2() == pytest.approx(np.linalg.norm(xs), rel=1e-13)
                assert x.sum() == pytest.approx(xs.sum(), rel=1e-12)
                z.copy(x).axpy(-2.0, y).scale(0.5)
                np.testing.assert_array_equal(z.gather(rows), 0.5 * (xs + -2.0 * ys))
                z.zip("multiply", x, y)
                np.testing.assert_array_equal(z.gather(rows), xs * ys)
                z.map("abs", x)
                some = np.array([3, 64, 65, 999])
                np.testing.assert_array_equal(z.gather(some), np.abs(xs[some]))
                # Several tables in one request: dot products with the bits of `dot`, and
                # a combination with the bits of copy-then-axpy.
                gram = ps.gram([x, y], [x, y, z])
                assert gram.tolist() == [[x.dot(x), x.dot(y), x.dot(z)],
                                         [y.dot(x), y.dot(y), y.dot(z)]]
                w = ps.dense("w", N, block_rows=BLOCK).combine([1.0, -2.0, 0.5], [x, y, z])
                np.testing.assert_array_equal(w.gather(rows), xs + -2.0 * ys + 0.5 * np.abs(xs))
                with pytest.raises(ValueError, match="into Dense\\(.w."):
                    w.combine([1.0], [w])
                with pytest.raises(ValueError, match="differ in shape"):
                    ps.gram([x], [ps.dense("tiny", 10)])
                with pytest.raises(ValueError, match="sorted, unique and below 1000"):
                    x.gather(np.array([5, 1000]))
                with pytest.raises(ValueError, match="no element-wise function 'cube'"):
                    z.map("cube", x)
                with pytest.raises(ValueError, match="differ in shape"):
                    z.axpy(1.0, ps.dense("short", 10))
            kv.finish()
            kv.close()
    finally:
        roles.free()


def test_a_sum_over_workers_has_the_same_bits_whatever_arrives_first():
    """1 + 1e-16 - 1: worker 1's -1 arrives first (worker 0 waits for it), yet the servers add
    in worker order and the result is 0, not 1e-16."""
    roles = split(2, MPI.COMM_WORLD)
    try:
        if roles.is_server:
            serve(roles)
        else:
            kv = KVWorker(roles, timeout=60)
            g = DenseClient(kv).dense("g", N, block_rows=BLOCK)
            rows = np.arange(N)
            if roles.index == 0:
                g.fill(1.0)
            roles.group.Barrier()
            if roles.index == 1:
                g.scatter_add(rows, np.full(N, -1.0), workers=2)
            roles.group.Barrier()
            if roles.index == 0:
                g.scatter_add(rows, np.full(N, 1e-16), workers=2)
                assert (g.gather(rows) == 0.0).all()
            kv.finish()
            kv.close()
    finally:
        roles.free()


@pytest.fixture
def directory():
    """A directory made by rank 0, the same on every rank; removed once every rank is done
    with it (a failed test aborts the job before this teardown: see conftest)."""
    where = np.zeros(512, np.uint8)
    if MPI.COMM_WORLD.rank == 0:
        path = tempfile.mkdtemp(prefix="mpips-dense-").encode()
        where[:len(path)] = np.frombuffer(path, np.uint8)
    MPI.COMM_WORLD.Bcast(where, root=0)
    path = where.tobytes().rstrip(b"\0").decode()
    yield path
    MPI.COMM_WORLD.Barrier()
    if MPI.COMM_WORLD.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def test_tables_saved_on_two_servers_load_on_one(directory):
    """save: one HDF5 file per server and an index; load: into another number of servers,
    the same values; a directory without an index is refused, naming it."""
    rng = np.random.default_rng(11)
    xs, ys = rng.normal(size=N), rng.normal(size=N)
    rows = np.arange(N)
    for n_servers in (2, 1):
        roles = split(n_servers, MPI.COMM_WORLD)
        try:
            if roles.is_server:
                serve(roles)
                continue
            kv = KVWorker(roles, timeout=60)
            ps = DenseClient(kv)
            if roles.index == 0 and n_servers == 2:
                x, y = ps.dense("x", N, block_rows=BLOCK), ps.dense("y", N, block_rows=BLOCK)
                x.scatter_add(rows, xs)
                y.scatter_add(rows, ys)
                assert ps.save(directory, x, y) == directory
                assert sorted(os.listdir(directory)) == ["server-0000.h5", "server-0001.h5",
                                                         "tables.json"]
            elif roles.index == 0:
                with pytest.raises(InputError, match="tables.json: No such file"):
                    ps.load(os.path.join(directory, "elsewhere"))
                tables = ps.load(directory)
                assert sorted(tables) == ["x", "y"]
                np.testing.assert_array_equal(tables["x"].gather(rows), xs)
                np.testing.assert_array_equal(tables["y"].gather(rows), ys)
            kv.finish()
            kv.close()
        finally:
            roles.free()
