"""Dense tables on servers, without MPI: each registered operation run on every server's
blocks gives what numpy gives on the whole vector; the element-wise kernels against their
formulas; scatter_add's parts applied in worker order whatever their arrival."""
import math
import queue
import threading

import h5py
import numpy as np
import pytest

from mpips.wire import dense_request, protocol
from mpips.wire.dense_layout import Layout, name_id, name_of, name_words
from mpips.storage.dense_files import read_blocks
from mpips.server.dense_tables import DenseTables
from mpips.base.files import write_hdf5
from mpips.kernels import elementwise
from mpips.wire.placement import Placement
from mpips.wire.protocol import Header, Op

SERVERS = 3
PLACEMENT = Placement(SERVERS)
N, BLOCK = 100, 7   # 15 blocks round three servers


class Cluster:
    """Every server's tables in one process; a request goes to each, as a client sends it
    (writes to every copy of a row, reads to its primary), split by the client's placement."""

    def __init__(self, workers: int = 2, servers: int = SERVERS, replicas: int = 1):
        self.placement = Placement(servers, replicas)
        self.servers = [DenseTables(s, self.placement, workers) for s in range(servers)]
        self.layout = Layout(N, 1, BLOCK)

    def living(self) -> list:
        return [s for s in range(len(self.servers)) if s not in self.placement.dead]

    def run(self, function: str, tables, ints=(), scalars=(), parts=None, worker=0):
        head = [name_id(function), *(name_id(t) for t in tables), *ints]
        out = {}
        for s in self.living():
            if parts is not None and s not in parts:
                continue
            rows, values = parts[s] if parts is not None else (None, None)
            fields, payload = dense_request.dense_payload(head, scalars, rows, values)
            message = protocol.pack(Header(Op.DENSE, placement=self.placement.version,
                                           **fields), *payload)
            out[s] = self.servers[s].call(worker, protocol.header(message), message)
        return out

    def create(self, name: str, n: int = N):
        self.run("create", [name], ints=[n, 1, BLOCK, *name_words(name)])

    def split(self, rows):
        perm, offsets = self.layout.by_server(rows.astype(np.uint64), self.placement)
        return {s: perm[offsets[s]:offsets[s + 1]] for s in self.living()}

    def scatter(self, name, rows, values, ints=(1, 1), worker=0, every=False):
        rows = rows.astype(np.uint64)
        parts = {}
        for s in self.living():
            p = self.layout.holders_of(rows, self.placement, s)
            if p.shape[0] or every:
                parts[s] = (rows[p], values[p])
        self.run("scatter_add", [name], ints=ints, parts=parts, worker=worker)

    def whole(self, name) -> np.ndarray:
        rows = np.arange(N, dtype=np.uint64)
        out = np.empty(N)
        for s, p in self.split(rows).items():
            reply = self.run("gather", [name], parts={s: (rows[p], None)})[s]
            assert reply[0] == self.placement.version
            out[p] = reply[1:]
        return out

    def partials(self, replies) -> np.ndarray:
        """A reduction's per-block partials, in block order."""
        blocks, values = [], []
        for s, reply in replies.items():
            assert reply[0] == self.placement.version
            blocks += self.layout.blocks_of(self.placement, s).tolist()
            values += reply[1:].tolist()
        return np.array(values)[np.argsort(blocks)]

    def total(self, replies) -> float:
        return math.fsum(self.partials(replies))

    def copies(self, name) -> dict:
        """{block: [its values on each server that holds it]}."""
        out = {}
        for s in self.living():
            for b, values in self.servers[s].tables[name_id(name)].blocks.items():
                out.setdefault(b, []).append(values)
        return out

    def kill(self, server: int) -> None:
        """Server `server` dies: the client and the survivors move to the next placement."""
        self.placement = self.placement.without({server})
        for s in self.living():
            self.servers[s].placement_changed(self.placement)

    def restore(self):
        """Every living server runs restore at once (a thread each, as separate ranks would),
        the copies travelling through queues."""
        mail = {(a, b): queue.Queue() for a in self.living() for b in self.living()}

        class Link:
            def __init__(self, me):
                self.me = me

            def send_copy(self, buf, to):
                mail[(self.me, to)].put(buf.copy())

            def receive_copy(self, into, source, what):
                into[:] = mail[(source, self.me)].get(timeout=10)
        replies = {}

        def run(s):
            self.servers[s].link = Link(s)
            fields, payload = dense_request.dense_payload([name_id("restore")])
            message = protocol.pack(Header(Op.DENSE, placement=self.placement.version,
                                           **fields), *payload)
            replies[s] = self.servers[s].call(0, protocol.header(message), message)
        threads = [threading.Thread(target=run, args=(s,)) for s in self.living()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(replies) == self.living(), "every server answered restore"
        return replies


@pytest.fixture(params=[1, 2], ids=["one-copy", "two-copies"])
def cluster(request):
    c = Cluster(replicas=request.param)
    rng = np.random.default_rng(3)
    for name in ("x", "y", "z"):
        c.create(name)
        c.scatter(name, np.arange(N), rng.normal(size=N))
    return c


def test_the_blocks_of_a_table_are_spread_over_every_server_once():
    layout = Layout(N, 1, BLOCK)
    held = [layout.blocks_of(PLACEMENT, s) for s in range(SERVERS)]
    assert sorted(np.concatenate(held).tolist()) == list(range(layout.n_blocks))
    assert min(len(h) for h in held) == layout.n_blocks // SERVERS
    assert layout.rows(layout.n_blocks - 1) == N - (layout.n_blocks - 1) * BLOCK


def test_each_operation_is_numpys_on_the_whole_vector(cluster):
    x, y = cluster.whole("x"), cluster.whole("y")
    assert cluster.total(cluster.run("dot", ["x", "y"])) == pytest.approx(x @ y, rel=1e-14)
    assert cluster.total(cluster.run("nrm2", ["x"])) == pytest.approx(x @ x, rel=1e-14)
    assert cluster.total(cluster.run("sum", ["x"])) == pytest.approx(x.sum(), abs=1e-12)
    cluster.run("axpy", ["y", "x"], scalars=[-0.5])
    np.testing.assert_array_equal(cluster.whole("y"), y + -0.5 * x)
    cluster.run("scale", ["x"], scalars=[3.0])
    np.testing.assert_array_equal(cluster.whole("x"), 3 * x)
    cluster.run("copy", ["z", "x"])
    np.testing.assert_array_equal(cluster.whole("z"), 3 * x)
    cluster.run("fill", ["z"], scalars=[2.5])
    assert (cluster.whole("z") == 2.5).all()
    cluster.run("map", ["z", "x"], ints=[name_id("abs")], scalars=[0.0])
    np.testing.assert_array_equal(cluster.whole("z"), np.abs(3 * x))
    cluster.run("zip", ["z", "x", "y"], ints=[name_id("multiply")], scalars=[0.0])
    np.testing.assert_array_equal(cluster.whole("z"), 3 * x * (y - 0.5 * x))
    rows = np.array([0, 6, 7, 50, 99], np.uint64)
    got = np.empty(rows.shape[0])
    for s, p in cluster.split(rows).items():
        if p.shape[0]:
            got[p] = cluster.run("gather", ["x"], parts={s: (rows[p], None)})[s][1:]
    np.testing.assert_array_equal(got, 3 * x[rows.astype(np.int64)])
    cluster.run("free", ["z"])
    assert all(name_id("z") not in s.tables for s in cluster.servers)


def test_every_copy_of_a_block_has_the_same_bits_after_every_write(cluster):
    cluster.run("axpy", ["y", "x"], scalars=[-0.5])
    cluster.run("zip", ["z", "x", "y"], ints=[name_id("multiply")], scalars=[0.0])
    cluster.scatter("z", np.arange(0, N, 3), np.full(34, 0.25))
    for name in ("x", "y", "z"):
        copies = cluster.copies(name)
        assert sorted(copies) == list(range(cluster.layout.n_blocks))
        for b, values in copies.items():
            assert len(values) == cluster.placement.replicas
            for v in values[1:]:
                np.testing.assert_array_equal(v, values[0], err_msg=f"{name} block {b}")


def test_a_reductions_per_block_partials_do_not_depend_on_the_number_of_servers():
    """The client adds per-block partials (math.fsum): the same bits on 1, 2 or 3 servers."""
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=N), rng.normal(size=N)
    seen = []
    for servers in (1, 2, 3):
        c = Cluster(servers=servers)
        for name, values in (("x", x), ("y", y)):
            c.create(name)
            c.scatter(name, np.arange(N), values)
        seen.append((c.partials(c.run("dot", ["x", "y"])), c.total(c.run("dot", ["x", "y"]))))
    for partials, total in seen[1:]:
        np.testing.assert_array_equal(partials, seen[0][0])
        assert total == seen[0][1]


def test_a_dead_servers_backups_answer_for_it_and_restore_copies_its_ranges_again():
    c = Cluster(servers=3, replicas=2)
    rng = np.random.default_rng(9)
    for name in ("x", "y"):
        c.create(name)
        c.scatter(name, np.arange(N), rng.normal(size=N))
    x, y = c.whole("x"), c.whole("y")
    dot = c.total(c.run("dot", ["x", "y"]))
    c.kill(1)
    np.testing.assert_array_equal(c.whole("x"), x)
    assert c.total(c.run("dot", ["x", "y"])) == dot
    # Writes before the copies are back: the new holder drops its part; restore brings it.
    waiting = [s for s in c.living() if c.servers[s].incoming]
    assert waiting, "server 1's ranges have a new holder"
    c.run("axpy", ["y", "x"], scalars=[2.0])
    c.scatter("x", np.arange(N), np.ones(N))
    replies = c.restore()
    blocks = sum(int(r[1]) for r in replies.values())
    # Server 1 held ranges 1 (primary) and 0 (backup): both tables' blocks of both.
    assert blocks == 2 * (len(c.layout.blocks_in(0, 3)) + len(c.layout.blocks_in(1, 3)))
    assert not any(s.incoming or s.outgoing for s in c.servers)
    np.testing.assert_array_equal(c.whole("x"), x + 1)
    np.testing.assert_array_equal(c.whole("y"), y + 2 * x)
    c.run("scale", ["x"], scalars=[0.5])
    for name in ("x", "y"):
        for b, values in c.copies(name).items():
            assert len(values) == 2, f"block {b} of {name}"
            np.testing.assert_array_equal(values[0], values[1])


def test_a_read_split_by_another_placement_is_answered_by_the_version_alone():
    c = Cluster(servers=3, replicas=2)
    c.create("x")
    old = c.placement
    c.kill(2)
    fields, payload = dense_request.dense_payload([name_id("dot"), name_id("x"), name_id("x")])
    message = protocol.pack(Header(Op.DENSE, placement=old.version, **fields), *payload)
    reply = c.servers[0].call(0, protocol.header(message), message)
    np.testing.assert_array_equal(reply, [float(c.placement.version)])


def test_a_rounds_parts_are_added_in_worker_order_whatever_their_arrival():
    """1 + 1e-16 - 1 is 0 in worker order (worker 0 first); -1 first would give 1e-16."""
    rows = np.arange(N)
    for arrival in ((0, 1), (1, 0)):
        c = Cluster(workers=2)
        c.create("g")
        c.scatter("g", rows, np.ones(N))
        parts = {0: np.full(N, 1e-16), 1: np.full(N, -1.0)}
        for worker in arrival:
            c.scatter("g", rows, parts[worker], ints=(5, 2), worker=worker, every=True)
        assert (c.whole("g") == 0.0).all(), f"arrival {arrival}"


def test_a_round_waits_for_every_worker():
    c = Cluster(workers=2)
    c.create("g")
    c.scatter("g", np.arange(N), np.ones(N), ints=(1, 2), worker=1, every=True)
    assert (c.whole("g") == 0).all(), "one of two parts: nothing applied yet"
    c.scatter("g", np.arange(N), np.ones(N), ints=(1, 2), worker=0, every=True)
    assert (c.whole("g") == 2).all()


def test_creating_again_keeps_the_table_and_another_shape_is_refused(cluster):
    before = cluster.whole("x")
    cluster.create("x")
    np.testing.assert_array_equal(cluster.whole("x"), before)
    with pytest.raises(Exception, match="exists with 100 rows"):
        cluster.create("x", n=50)


def test_names_travel_as_words():
    for name in ("w", "s10", "a name of 17 bytes", "é"):
        assert name_of(name_words(name)) == name
    assert name_id("w") != name_id("g") and name_id("w") == name_id("w")


X = np.array([-2.0, -0.5, 0.0, 0.0, 0.0, 0.5, 3.0])
G = np.array([0.3, -2.0, 0.5, -0.05, 2.0, 0.1, -1.0])


def run_zip(name, x, y, a):
    out = np.empty_like(x)
    elementwise.ZIPS[name](x, y, out, a)
    return out


def test_the_l1_pseudo_gradient_is_the_least_subgradient():
    a = 0.1
    expect = np.where(X > 0, G + a, np.where(X < 0, G - a,
                      np.where(G + a < 0, G + a, np.where(G - a > 0, G - a, 0.0))))
    np.testing.assert_array_equal(run_zip("l1_pseudo_gradient", X, G, a), expect)
    assert run_zip("l1_pseudo_gradient", X, G, a)[3] == 0.0, "|g| < l1 at 0: stay"


def test_the_orthant_and_its_projection():
    orthant = run_zip("orthant", X, G, 0.0)
    np.testing.assert_array_equal(orthant, [-1, -1, -1, 1, -1, 1, 1])
    np.testing.assert_array_equal(run_zip("keep_sign", np.array([1.0, -1.0, 2.0]),
                                          np.array([1.0, 1.0, 0.0]), 0.0), [1.0, 0.0, 0.0])


@pytest.mark.parametrize("name", sorted(elementwise.MAPS))
def test_each_map_is_its_formula(name):
    x = np.linspace(-3, 3, 13)
    out = np.empty_like(x)
    elementwise.MAPS[name](x, out, 1.5)
    expect = {"abs": np.abs(x), "sign": np.sign(x), "square": x * x,
              "clip": np.clip(x, -1.5, 1.5), "sigmoid": 1 / (1 + np.exp(-x))}[name]
    np.testing.assert_allclose(out, expect, rtol=1e-15)


def test_files_written_by_three_servers_load_into_two_and_damage_is_named(tmp_path):
    c = Cluster(servers=3, replicas=2)
    c.create("x")
    c.scatter("x", np.arange(N), np.arange(N, dtype=np.float64))
    paths = []
    for s, server in enumerate(c.servers):
        paths.append(str(tmp_path / f"server-{s:04d}.h5"))
        write_hdf5(paths[-1], server.datasets(), {})
    two = [DenseTables(s, Placement(2), 1) for s in range(2)]
    assert sum(read_blocks(paths, t) for t in two) == c.layout.n_blocks, "each block once"
    for t in two:
        for b, values in t.tables[name_id("x")].blocks.items():
            np.testing.assert_array_equal(values, np.arange(b * BLOCK, b * BLOCK + len(values)))
    with pytest.raises(ValueError, match="holds block 1 of table 'x'"):
        read_blocks([paths[0], paths[2]], DenseTables(0, Placement(1), 1))
    with h5py.File(paths[1], "r+") as f:
        del f["dense/x/values"]
        f["dense/x/values"] = np.zeros(3)
    with pytest.raises(ValueError, match=r"server-0001.h5: dense/x/values holds \(3,\) values"):
        read_blocks(paths, DenseTables(0, Placement(1), 1))
