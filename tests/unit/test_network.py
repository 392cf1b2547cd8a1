"""A network cut into stages and run through a pipeline schedule in one process: the same
weights as a whole-batch numpy step (float64 to 1e-10, float32 to 1e-5), the same bits under
every schedule; balanced cuts."""
import numpy as np
import pytest

from mpips.kernels.mlp import dense_backward, dense_forward, logistic_loss
from mpips.models.network import Dense, Stage, init, measured_costs, mlp, partition, stages_of
from mpips.pipeline.inprocess import run_step
from mpips.pipeline.schedule import POLICIES


def reference_step(layers, weights, x, labels, lr):
    """Plain backpropagation over the whole batch, written out on its own."""
    acts = [x]
    for layer, (w, b) in zip(layers, weights):
        acts.append(dense_forward(acts[-1], w, b, layer.activation))
    loss, d = logistic_loss(acts[-1], labels)
    for i in reversed(range(len(layers))):
        w, b = weights[i]
        d, dw, db = dense_backward(d, acts[i], acts[i + 1], w, layers[i].activation)
        w -= lr / x.shape[0] * dw
        b -= lr / x.shape[0] * db
    return loss


def data(n, inputs, seed, dtype):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, inputs)).astype(dtype)
    labels = (x[:, 0] * x[:, 1] + 0.3 * rng.normal(size=n) > 0).astype(dtype)
    return x, labels


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("micros", [1, 3, 8])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_pipelined_step_equals_the_whole_batch_step(dtype, tol, stages, micros, policy):
    layers = mlp(12, [16, 8, 8])
    x, labels = data(96, 12, 1, dtype)
    ref, piped = init(layers, 7, dtype), init(layers, 7, dtype)
    cuts = partition([layer.cost for layer in layers], stages)
    pipeline = stages_of(layers, piped, cuts, micros)
    for step in range(3):
        expected = reference_step(layers, ref, x, labels, 0.5)
        loss = run_step(pipeline, POLICIES[policy](stages, micros), x, labels, 0.5)
        assert loss == pytest.approx(expected, rel=tol)
    for (w, b), (w_ref, b_ref) in zip(piped, ref):
        np.testing.assert_allclose(w, w_ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(b, b_ref, rtol=tol, atol=tol)
    assert not np.allclose(piped[0][0], init(layers, 7, dtype)[0][0]), "it trained"


def test_every_schedule_gives_the_same_bits():
    layers = mlp(12, [16, 8])
    x, labels = data(64, 12, 2, np.float32)
    out = []
    for policy in sorted(POLICIES):
        weights = init(layers, 3, np.float32)
        pipeline = stages_of(layers, weights, partition([1, 1, 1], 3), 4)
        for _ in range(4):
            run_step(pipeline, POLICIES[policy](3, 4), x, labels, 0.3)
        out.append(weights)
    for (w, b), (w2, b2) in zip(*out):
        assert np.array_equal(w, w2) and np.array_equal(b, b2)


@pytest.mark.parametrize("costs, stages, cuts", [
    ([1, 1, 1, 1], 2, [(0, 2), (2, 4)]),
    ([8, 1, 1, 1, 1, 1, 1, 1, 1], 2, [(0, 1), (1, 9)]),
    ([1, 2, 3, 4, 5], 3, [(0, 3), (3, 4), (4, 5)]),
    ([5, 4, 3, 2, 1], 5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]),
    ([3], 1, [(0, 1)]),
])
def test_stages_are_contiguous_and_balanced(costs, stages, cuts):
    assert [(r.start, r.stop) for r in partition(costs, stages)] == cuts


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ValueError, match="2 layer.s. cannot be cut into 3 stage"):
        partition([1, 1], 3)


@pytest.mark.parametrize("args, says", [((0, 4), "positive sizes"),
                                         ((4, 4, "tanh"), "activation must be one of")])
def test_a_bad_layer_is_refused(args, says):
    with pytest.raises(ValueError, match=says):
        Dense(*args)


def test_a_layer_a_hundred_times_wider_measures_costlier():
    layers = [Dense(8, 8), Dense(8, 800)]
    costs = measured_costs(layers, init(layers, 1), rows=256)
    assert len(costs) == 2 and 0 < costs[0] < costs[1]


def test_1f1b_holds_fewer_activations_than_gpipe_measured():
    layers = mlp(12, [32, 32])
    x, labels = data(80, 12, 3, np.float64)
    peaks = {}
    for policy in sorted(POLICIES):
        pipeline = stages_of(layers, init(layers, 1), partition([1, 1, 1], 2), 8)
        run_step(pipeline, POLICIES[policy](2, 8), x, labels, 0.1)
        peaks[policy] = [s.peak_held_bytes for s in pipeline]
        assert all(s.held_bytes == 0 for s in pipeline)
    one = [p // 8 for p in peaks["gpipe"]]   # a micro-batch's (10 rows each)
    assert peaks["gpipe"] == [8 * o for o in one] and min(one) >= 10 * 12 * 8
    assert peaks["1f1b"] == [2 * one[0], one[1]]   # S - s micro-batches, not all 8


def test_a_last_stage_with_offsets_is_wide_and_deeps_network_gradient():
    """Wide & Deep split in stages: the wide margins added to the last stage's logits, the
    loss's gradient divided by the minibatch's rows before it goes back: one micro-batch
    gives the bits of WideDeep.gradient's network part, two give them to 1e-12."""
    from mpips.models.catalog import WideDeep
    model = WideDeep(4, (6, 5))
    x, labels = data(40, 4, 3, np.float64)
    weights = model.unpack(model.pack(init(model.layers, 2)))
    offsets = np.random.default_rng(4).normal(size=40)
    acts = [x]
    for layer, (w, b) in zip(model.layers, weights):
        acts.append(dense_forward(acts[-1], w, b, layer.activation))
    _, d = logistic_loss(offsets[:, None] + acts[-1], labels)
    d /= 40
    dlogits, expected = d[:, 0].copy(), []
    for i in reversed(range(3)):
        d, dw, db = dense_backward(d, acts[i], acts[i + 1], weights[i][0],
                                   model.layers[i].activation)
        expected.insert(0, (dw, db))
    for micros, exact in ((1, True), (2, False)):
        stages = [Stage(model.layers[:1], weights[:1], micros, last=False),
                  Stage(model.layers[1:], weights[1:], micros, last=True, mean_over=40)]
        parts, dx = np.array_split(np.arange(40), micros), []
        for m, part in enumerate(parts):
            stages[1].forward(m, stages[0].forward(m, x[part]), labels[part], offsets[part])
            dx.append(stages[0].backward(m, stages[1].backward(m)))
        got = stages[0].summed() + stages[1].summed()
        dl = np.concatenate([stages[1].dlogits[m] for m in range(micros)])
        check = (np.testing.assert_array_equal if exact else
                 lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15))
        check(dl, dlogits)
        check(np.concatenate(dx), d)
        for (dw, db), (ew, eb) in zip(got, expected):
            check(dw, ew)
            check(db, eb)


def test_gradients_add_in_micro_batch_order_whatever_order_the_backwards_come():
    """A stage keeps one running sum, not every micro-batch's gradients; a backward that
    comes before its turn waits, so the sum's order (and bits) never change."""
    layers = mlp(6, [5])
    x, labels = data(30, 6, 8, np.float32)
    sums = []
    for order in ([0, 1, 2], [2, 0, 1]):
        stage = Stage(layers, init(layers, 4, np.float32), 3, last=True)
        parts = np.array_split(np.arange(30), 3)
        for m, part in enumerate(parts):
            stage.forward(m, x[part], labels[part])
        for m in order:
            stage.backward(m)
        sums.append(stage.summed())
    for (a, b), (c, d) in zip(*sums):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)
    with pytest.raises(RuntimeError, match="update before every micro-batch's backward"):
        stage.summed()


def test_one_layers_first_weights_are_those_of_the_whole_network():
    """init_layer skips the other layers' draws: a server or a stage makes one layer's
    first weights without holding the whole network's."""
    from mpips.models.network import init_layer
    layers = mlp(7, [9, 5, 3])
    whole = init(layers, 11)
    seq = np.random.default_rng(11)   # the stream written out: layer after layer
    for i, (w, b) in enumerate(whole):
        alone = init_layer(layers, i, 11)
        np.testing.assert_array_equal(alone[0], w)
        np.testing.assert_array_equal(alone[1], b)
        bound = np.sqrt(6.0 / layers[i].inputs)
        np.testing.assert_array_equal(w, seq.uniform(-bound, bound, w.shape))
