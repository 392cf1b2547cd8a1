"""Wide & Deep (mpips.models.WideDeep): margins against the model written out, the gradient
against finite differences for every kind of row (a key's weight and embedding, the bias, the
MLP's rows), with the embeddings summed or concatenated by field, first weights a function of
the key alone, the MLP's keys in every minibatch, each layer's rows apart (a pipeline stage
pulls its own)."""
import numpy as np
import pytest
from minibatches import batch

from mpips.data.textfile import BIAS_KEY, KeyIndexer, Rows
from mpips.base.errors import ConfigError, InputError
from mpips.models.catalog import WideDeep, model_of

MODEL = WideDeep(3, (4, 3))
BY_FIELD = WideDeep(3, (4, 3), fields=3)   # three fields' embeddings concatenated: 9 inputs


def with_fields(b, cols, model):
    """The minibatch with keys whose top byte is a field (column mod 3), if the model reads
    fields: the field is all the model takes of a key here."""
    if model.fields:
        b.indices[:] = (cols % 3).astype(np.uint64) << np.uint64(56)
    return b


def rows_for(model, keys: int, seed: int = 1) -> tuple:
    """Weights for `keys` data keys, the MLP's rows and the bias, as a pull returns them."""
    ids = np.concatenate([np.arange(keys, dtype=np.uint64) * np.uint64(7919),
                          model.reserved_keys(), [BIAS_KEY]])
    w = np.empty((ids.shape[0], model.width), np.float32)
    model.init(ids, w)
    rng = np.random.default_rng(seed)
    w[:keys] += rng.normal(0, 0.3, (keys, model.width))
    w[keys:-1] += rng.normal(0, 0.1, (w.shape[0] - keys - 1, model.width))   # biases not 0:
    # a row whose hidden units are all zero would sit on a ReLU's kink
    w[-1, 0] = 0.2
    return ids, w


def written_out(model, b, cols, bias_col, w) -> np.ndarray:
    first = bias_col - model.reserved_keys().shape[0]
    flat = w[first:bias_col].astype(np.float64).ravel()
    out = []
    for r in range(len(b)):
        lo, hi = b.indptr[r], b.indptr[r + 1]
        c, x = cols[lo:hi], b.values[lo:hi].astype(np.float64)
        h = np.zeros(model.deep_inputs)
        k = model.embedding_dim
        for p in range(lo, hi):
            at = int(b.indices[p] >> np.uint64(56)) * k if model.fields else 0
            h[at:at + k] += w[cols[p], 1:].astype(np.float64) * b.values[p]
        at = 0
        for i, layer in enumerate(model.layers):
            W = flat[at:at + layer.inputs * layer.outputs].reshape(layer.inputs, layer.outputs)
            at += layer.inputs * layer.outputs
            h = h @ W + flat[at:at + layer.outputs]
            at += layer.outputs
            at = -(-at // model.width) * model.width   # each layer starts a row
            if i < len(model.layers) - 1:
                h = np.maximum(h, 0)
        out.append(w[bias_col, 0] + (w[c, 0] * x).sum() + h[0])
    return np.array(out)


@pytest.mark.parametrize("model", [MODEL, BY_FIELD], ids=["summed", "by field"])
def test_margins_are_the_wide_part_plus_the_mlp_of_the_embeddings(model):
    b, cols = batch(rows=7, keys=5)
    b = with_fields(b, cols, model)
    _, w = rows_for(model, 5)
    bias_col = w.shape[0] - 1
    np.testing.assert_allclose(model.margins(b, cols, bias_col, w),
                               written_out(model, b, cols, bias_col, w), rtol=1e-9)


@pytest.mark.parametrize("model", [MODEL, BY_FIELD], ids=["summed", "by field"])
def test_the_gradient_matches_finite_differences_on_every_kind_of_row(model):
    b, cols = batch(seed=3, rows=8, keys=5)
    b = with_fields(b, cols, model)
    _, w = rows_for(model, 5, seed=4)
    bias_col = w.shape[0] - 1
    grad, loss = model.gradient(b, cols, bias_col, w)
    w64 = w.astype(np.float64)

    def mean_loss(v):
        m = written_out(model, b, cols, bias_col, v)
        y = b.labels.astype(np.float64)
        return np.mean(np.logaddexp(0, m) - y * m)

    assert loss == pytest.approx(mean_loss(w64) * len(b), rel=1e-6)
    reserved = model.reserved_keys().shape[0]
    checked = [(0, 0), (2, 1), (4, 3), (bias_col, 0)] + [(bias_col - reserved + r, c)
                                                         for r in range(reserved)
                                                         for c in range(model.width)]
    for row, col in checked:   # the padding of each layer's last row included: 0
        up, down = w64.copy(), w64.copy()
        up[row, col] += 1e-6
        down[row, col] -= 1e-6
        numeric = (mean_loss(up) - mean_loss(down)) / 2e-6
        assert grad[row, col] == pytest.approx(numeric, rel=2e-3, abs=1e-6), (row, col)


def test_first_weights_depend_on_the_key_alone_and_the_mlp_starts_he_uniform():
    keys = np.concatenate([np.array([5, 10**12], np.uint64), MODEL.reserved_keys()])
    a = np.empty((keys.shape[0], MODEL.width), np.float32)
    b = np.empty_like(a)
    MODEL.init(keys, a)
    MODEL.init(keys[::-1].copy(), b)
    np.testing.assert_array_equal(a, b[::-1])
    assert (a[:2, 0] == 0).all() and 0 < np.abs(a[:2, 1:]).max() < 0.05
    first = a[2:].ravel()[:3 * 4]
    assert np.abs(first).max() <= np.sqrt(6 / 3) and np.abs(first).min() > 0


def test_every_minibatch_pulls_the_mlps_rows_and_data_may_not_use_them():
    reserved = MODEL.reserved_keys()
    assert reserved[-1] == BIAS_KEY - np.uint64(1) and (np.diff(reserved) == 1).all()
    rows = Rows(np.ones(2, np.float32), np.array([0, 1, 2]), np.array([9, 3], np.uint64),
                np.ones(2, np.float32))
    keys, cols, bias_col = KeyIndexer(reserved)(rows, bias=True)
    assert list(keys[:2]) == [3, 9] and (keys[2:-1] == reserved).all()
    assert keys[-1] == BIAS_KEY and bias_col == keys.shape[0] - 1 and list(cols) == [1, 0]
    bad = Rows(np.ones(1, np.float32), np.array([0, 1]), reserved[:1].copy(),
               np.ones(1, np.float32))
    with pytest.raises(InputError, match="hold the model's own weights"):
        KeyIndexer(reserved)(bad, bias=True, source="x.svm")


@pytest.mark.parametrize("args, says", [((0,), "--embedding-dim must be from 1 to 1024"),
                                         ((4, ()), "--hidden must be layer widths"),
                                         ((4, (8, 0)), "--hidden must be layer widths")])
def test_bad_sizes_are_refused(args, says):
    with pytest.raises(ConfigError, match=says):
        WideDeep(*args)


def test_the_model_of_its_options():
    assert model_of("widedeep", embedding_dim=5, hidden=(7,)) == WideDeep(5, (7,))
    assert model_of("widedeep", embedding_dim=5, hidden=(7,), fields=39).layers[0].inputs == 195


@pytest.mark.parametrize("args, says", [
    ((4, (8,), 255), "--fields must be from 0"), ((1024, (8,), 100), "would be 102400 wide")])
def test_bad_field_counts_are_refused(args, says):
    with pytest.raises(ConfigError, match=says):
        WideDeep(*args)


def test_a_feature_beyond_the_fields_is_named():
    b, cols = batch(rows=4, keys=5)
    b.indices[:] = np.uint64(7) << np.uint64(56)
    _, w = rows_for(BY_FIELD, 5)
    with pytest.raises(InputError, match=r"a feature in field 7 .* --fields 3 fields, 0 to 2: "
                                         r"give --fields 8 or more"):
        BY_FIELD.margins(b, cols, w.shape[0] - 1, w)


@pytest.mark.parametrize("bias", [True, False])
def test_a_saved_model_scores_rows_as_the_training_path_does(bias):
    """evaluate.margins_of looks keys up in a whole model (unknown keys count as zero): with
    or without the bias key, the MLP's rows must be found where training put them."""
    from mpips.models.evaluate import margins_of
    b, drawn = batch(seed=5, rows=9, keys=6)
    ids, w = rows_for(MODEL, 6, seed=6)
    b.indices[:] = np.where(drawn < 4, ids[drawn], np.uint64(123457))   # 123457: unknown
    if not bias:
        ids, w = ids[:-1], w[:-1]
    order = np.argsort(ids)
    keys, weights = ids[order], w[order]
    indexed, cols, bias_col = KeyIndexer(MODEL.reserved_keys())(b, bias=bias)
    pulled = np.zeros((indexed.shape[0], MODEL.width), np.float32)
    at = np.searchsorted(keys, indexed)
    there = (at < keys.shape[0]) & (keys[np.minimum(at, keys.shape[0] - 1)] == indexed)
    pulled[there] = weights[at[there]]
    np.testing.assert_allclose(margins_of(keys, weights, b, bias, MODEL),
                               MODEL.margins(b, cols, bias_col, pulled), rtol=1e-12)


def test_each_layer_has_rows_of_its_own_that_pack_and_unpack():
    model = WideDeep(3, (5, 4))   # width 4: layers of 15+5, 20+4 and 4+1 values
    assert model.layer_rows() == [5, 6, 2]
    every = model.reserved_keys()
    parts = [model.reserved_keys(range(i, i + 1)) for i in range(3)]
    np.testing.assert_array_equal(np.concatenate(parts), every)
    np.testing.assert_array_equal(model.reserved_keys(range(1, 3)), every[5:])
    rng = np.random.default_rng(0)
    weights = [(rng.normal(size=(a.inputs, a.outputs)), rng.normal(size=a.outputs))
               for a in model.layers]
    rows = model.pack(weights)
    assert rows.shape == (13, 4) and rows.dtype == np.float32
    np.testing.assert_array_equal(model.pack(weights[1:], range(1, 3)), rows[5:])
    assert rows[4, 3] == np.float32(weights[0][1][-1]) and rows[5, 0] == np.float32(
        weights[1][0][0, 0])
    assert rows[12, 0] == np.float32(weights[2][1][0]) and (rows[12, 1:] == 0).all()
    for (w, b), (w2, b2) in zip(weights[1:], model.unpack(rows[5:], range(1, 3))):
        np.testing.assert_array_equal(w2, w.astype(np.float32))
        np.testing.assert_array_equal(b2, b.astype(np.float32))
