"""Dense tables on servers, without MPI: each registered operation run on every server's
blocks gives what numpy gives on the whole vector; the element-wise kernels against their
formulas; scatter_add's parts applied in worker order whatever their arrival."""
import numpy as np
import pytest

from mpips import protocol
from mpips.blocks import Layout, name_id, name_of, name_words
from mpips.densetables import DenseTables
from mpips.kernels import elementwise
from mpips.placement import Placement
from mpips.protocol import Header, Op

SERVERS = 3
PLACEMENT = Placement(SERVERS)
N, BLOCK = 100, 7   # 15 blocks round three servers


class Cluster:
    """Every server's tables in one process; a request goes to each, as a client sends it."""

    def __init__(self, workers: int = 2):
        self.servers = [DenseTables(s, PLACEMENT, workers) for s in range(SERVERS)]

    def run(self, function: str, tables, ints=(), scalars=(), parts=None, worker=0):
        head = [name_id(function), *(name_id(t) for t in tables), *ints]
        out = {}
        for s, server in enumerate(self.servers):
            if parts is not None and s not in parts:
                continue
            rows, values = parts[s] if parts is not None else (None, None)
            fields, payload = protocol.dense_payload(head, scalars, rows, values)
            message = protocol.pack(Header(Op.DENSE, **fields), *payload)
            out[s] = server.call(worker, protocol.header(message), message)
        return out

    def create(self, name: str, n: int = N):
        self.run("create", [name], ints=[n, 1, BLOCK, *name_words(name)])

    def split(self, rows):
        perm, offsets = Layout(N, 1, BLOCK).split(rows.astype(np.uint64), PLACEMENT)
        return {s: perm[offsets[s]:offsets[s + 1]] for s in range(SERVERS)}

    def scatter(self, name, rows, values, ints=(1, 1), worker=0, every=False):
        parts = {s: (rows[p], values[p]) for s, p in self.split(rows).items()
                 if p.shape[0] or every}
        self.run("scatter_add", [name], ints=ints, parts=parts, worker=worker)

    def whole(self, name) -> np.ndarray:
        rows = np.arange(N, dtype=np.uint64)
        out = np.empty(N)
        for s, p in self.split(rows).items():
            out[p] = self.run("gather", [name], parts={s: (rows[p], None)})[s]
        return out

    def total(self, replies) -> float:
        return float(sum(r.sum() for _, r in sorted(replies.items())))


@pytest.fixture
def cluster():
    c = Cluster()
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
            got[p] = cluster.run("gather", ["x"], parts={s: (rows[p], None)})[s]
    np.testing.assert_array_equal(got, 3 * x[rows.astype(np.int64)])
    cluster.run("free", ["z"])
    assert all(name_id("z") not in s.tables for s in cluster.servers)


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
