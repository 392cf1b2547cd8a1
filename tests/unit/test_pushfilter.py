"""Push filters (pushfilter, kernels.quantize, kernels.residuals): values rounded within their
bound and decoded by the server to what the worker counted on; error feedback that loses
nothing over many pushes; rows held back and the rules that hold them; the last push's flush of what was held back; the
figures a filter reports."""
import numpy as np
import pytest

from mpips.wire import encoding, protocol
from mpips.run import summary
from mpips.kernels.quantize import BLOCK
from mpips.wire.placement import Placement
from mpips.worker.pushfilter import FIGURES, Plain, PushFilter, merged

RNG = np.random.default_rng(11)
KEYS = np.unique(RNG.integers(0, 2**64, 3000, dtype=np.uint64))
KEYS[-1] = 2**64 - 1   # the bias key, which a table's empty marker must not shadow


def grads_like(n: int, width: int, scale: float = 1.0) -> np.ndarray:
    """Gradients of magnitudes over several decades, as rare and frequent keys give."""
    magnitude = 10.0 ** RNG.uniform(-4, 0, size=(n, width))
    return (scale * magnitude * RNG.choice([-1, 1], size=(n, width))).astype(np.float32)


def test_int8_rounds_each_value_within_half_its_blocks_scale():
    values = grads_like(1000, 3)
    data, applied = encoding.encode_values(values, protocol.INT8)
    scales = encoding.int8_scales(data, 1000, 3)
    assert data.nbytes == encoding.values_bytes(1000, 3, protocol.INT8)
    assert data.nbytes < values.nbytes / 3.5
    flat = values.reshape(-1)
    for b, scale in enumerate(scales):
        block = flat[b * BLOCK:(b + 1) * BLOCK]
        assert scale == np.float32(np.abs(block).max() / 127)
        err = np.abs(applied.reshape(-1)[b * BLOCK:(b + 1) * BLOCK] - block)
        assert err.max() <= scale * (0.5 + 1e-5)
    decoded = encoding.decode_values(data, 1000, 3, protocol.INT8)
    np.testing.assert_array_equal(decoded, applied)   # the server applies what the worker kept


def test_float16_rounds_to_half_precision_and_clips_to_its_range():
    values = np.concatenate([grads_like(500, 2), [[1e6, -1e6]]]).astype(np.float32)
    data, applied = encoding.encode_values(values, protocol.HALF)
    assert data.nbytes == encoding.values_bytes(501, 2, protocol.HALF) == 2008
    np.testing.assert_allclose(applied[:500], values[:500], rtol=2**-11, atol=2**-24)
    assert applied[500].tolist() == [encoding.HALF_MAX, -encoding.HALF_MAX]
    np.testing.assert_array_equal(encoding.decode_values(data, 501, 2, protocol.HALF), applied)


def test_an_all_zero_block_has_scale_zero():
    data, applied = encoding.encode_values(np.zeros((300, 1), np.float32), protocol.INT8)
    assert (encoding.int8_scales(data, 300, 1) == 0).all() and (applied == 0).all()


def test_a_bitmap_names_the_rows_sent():
    sent = RNG.random(77) < 0.3
    bits = protocol.bitmap(sent)
    assert bits.nbytes == 16
    assert protocol.set_bits(bits).tolist() == np.flatnonzero(sent).tolist()
    bits[-1] = 128   # padding: bit 127
    assert protocol.set_bits(bits).tolist() == [*np.flatnonzero(sent), 127]


def push_many(pf, pushes: int, width: int, servers: int = 3, scale: float = 1.0,
              weights=None):
    """`pushes` pushes of random subsets of KEYS (keys recur): (gradients summed, what the
    servers were sent summed, the last push's Outgoing), per key."""
    total = np.zeros((KEYS.shape[0], width))
    sent = np.zeros_like(total)
    out = None
    for _ in range(pushes):
        pick = np.flatnonzero(RNG.random(KEYS.shape[0]) < 0.4)
        keys = KEYS[pick]
        perm, offsets = Placement(servers).by_server(keys)
        g = grads_like(keys.shape[0], width, scale)
        out = pf.prepare(keys, g, perm, offsets, None if weights is None else weights[pick])
        total[pick] += g
        sent[pick] += out.values
        if out.skept is not None:   # the rows sent, and only those, are in svalues
            assert out.svalues.shape[0] == out.skept.sum() == out.offsets[-1]
    return total, sent, out


@pytest.mark.parametrize("values, threshold", [("float16", 0.0), ("int8", 0.0),
                                               ("float32", 0.05), ("int8", 0.05)])
@pytest.mark.parametrize("width", [1, 4])
def test_error_feedback_loses_nothing_over_many_pushes(values, threshold, width):
    pf = PushFilter(width, values, threshold)
    total, sent, _ = push_many(pf, 60, width)
    kept_back = pf.residuals(KEYS)
    np.testing.assert_allclose(sent + kept_back, total, rtol=0, atol=2e-5)
    assert np.abs(kept_back).max() > 0, "something was kept back"
    if threshold:
        assert np.abs(kept_back).max() < threshold * 1.0001, "a row at the threshold is sent"
    assert pf.lost == 0


def test_a_threshold_sends_rows_whole_and_holds_the_rest_back():
    pf = PushFilter(2, "float32", threshold=0.1)
    keys = KEYS[:6]
    g = np.array([[0.2, 0], [0.05, 0.05], [0, -0.1], [0.01, 0], [-0.3, 0.3], [0.09, 0.09]],
                 np.float32)
    out = pf.prepare(keys, g, None, np.array([0, 6]))
    assert out.kept.tolist() == [True, False, True, False, True, False]
    np.testing.assert_array_equal(out.values[out.kept], g[out.kept])   # exact: float32
    np.testing.assert_array_equal(out.svalues, g[out.kept])
    assert (out.values[~out.kept] == 0).all()
    np.testing.assert_array_equal(pf.residuals(keys), np.where(out.kept[:, None], 0, g))
    again = pf.prepare(keys, g, None, np.array([0, 6]))   # held back twice: 0.1 and 0.18
    assert again.kept.tolist() == [True, True, True, False, True, True]
    np.testing.assert_array_equal(again.values[1], 2 * g[1])


@pytest.mark.parametrize("servers", [1, 2, 3])
def test_a_push_sends_every_row_where_a_bitmap_would_cost_more_on_any_servers(servers):
    keys = KEYS[:200]
    perm, offsets = Placement(servers).by_server(keys)
    g = np.full((200, 1), 1.0, np.float32)
    g[[3, 150, 160, 170, 180, 190]] = 0.01
    # A bitmap over 200 keys is 25 bytes: 6 rows of 4 bytes are cheaper sent; 7 are not.
    out = PushFilter(1, "float32", 0.1).prepare(keys, g, perm, offsets)
    assert out.kept is None and out.offsets.tolist() == offsets.tolist()
    g[100] = 0.01
    out = PushFilter(1, "float32", 0.1).prepare(keys, g, perm, offsets)
    assert np.flatnonzero(~out.kept).tolist() == [3, 100, 150, 160, 170, 180, 190]
    assert out.offsets[-1] == 193


def test_ftrls_zero_weights_wait_while_the_gradient_stays_within_l1():
    pf = PushFilter(1, "float32", l1=0.5)
    keys = KEYS[:4]
    weights = np.array([[0], [0], [0.2], [0]], np.float32)
    g = np.array([[0.3], [-0.6], [0.01], [-0.5]], np.float32)
    out = pf.prepare(keys, g, None, np.array([0, 4]), weights)
    assert out.kept.tolist() == [False, True, True, False], "|g| <= l1 at weight 0 waits"
    again = pf.prepare(keys, g, None, np.array([0, 4]), weights)
    assert again.kept is None, "every row goes"
    np.testing.assert_array_equal(again.values[[0, 3]], 2 * g[[0, 3]])
    without = pf.prepare(keys, g, None, np.array([0, 4]))   # no pull: every row goes
    assert without.kept is None


def test_the_zero_rule_loses_nothing_either():
    weights = np.where(RNG.random((KEYS.shape[0], 1)) < 0.5, 0, 1).astype(np.float32)
    pf = PushFilter(1, "int8", l1=0.3)
    total, sent, _ = push_many(pf, 40, 1, weights=weights)
    np.testing.assert_allclose(sent + pf.residuals(KEYS), total, rtol=0, atol=2e-5)


def test_the_residual_table_grows_and_stays_within_its_bound():
    pf = PushFilter(1, "int8")
    push_many(pf, 5, 1)
    assert int(pf._meta[0]) > 3 * (1 << 12) // 4 * 0.6 and pf._keys.shape[0] == 1 << 13
    np.testing.assert_array_equal(pf.residuals(KEYS[:0]), np.zeros((0, 1), np.float32))
    small = PushFilter(1, "float32", threshold=0.5, max_bytes=64 * 13)   # 64 rows, 48 keys
    total, sent, _ = push_many(small, 20, 1)
    assert small._keys.shape[0] == 64 and int(small._meta[0]) <= 48
    # Rows whose residual finds no room are sent whole (float32: nothing lost).
    np.testing.assert_allclose(sent + small.residuals(KEYS), total, rtol=0, atol=2e-5)
    assert small.lost == 0
    rounding = PushFilter(1, "int8", max_bytes=64 * 13)
    push_many(rounding, 2, 1)
    assert rounding.lost > 0, "int8's rounding of keys without room is lost, and counted"


def test_no_filter_sends_the_values_as_given():
    keys = KEYS[:100]
    g = grads_like(100, 2)
    perm, offsets = Placement(3).by_server(keys)
    out = Plain().prepare(keys, g, perm, offsets)
    assert out.kept is None and out.values is g
    for s, (flags, data) in enumerate(out.parts):
        assert flags == 0
        np.testing.assert_array_equal(data, g[perm][offsets[s]:offsets[s + 1]])


def test_merged_adds_the_missing_keys_with_zero_rows_in_key_order():
    keys = np.array([2, 5, 9], np.uint64)
    values = np.array([[1, 1], [2, 2], [3, 3]], np.float32)
    out_keys, out_values = merged(keys, values, np.array([1, 5, 10], np.uint64))
    assert out_keys.tolist() == [1, 2, 5, 9, 10]
    assert out_values.tolist() == [[0, 0], [1, 1], [2, 2], [3, 3], [0, 0]]
    same, same_values = merged(keys, values, np.array([5, 9], np.uint64))
    assert same is keys and same_values is values, "nothing new: the pull's keys still serve"


def test_the_flush_delivers_every_row_held_back_and_leaves_the_rounding():
    pf = PushFilter(1, "int8", threshold=0.1)
    keys = KEYS[:6]
    g = np.array([[0.5], [0.05], [0.3], [0.01], [-0.04], [0.2]], np.float32)
    pf.prepare(keys, g, None, np.array([0, 6]))
    held = keys[[1, 3, 4]]
    assert pf.pending().tolist() == held.tolist(), "the rounding of rows sent is not pending"
    before = pf.residuals(keys)
    assert before[2] != 0 and before[5] != 0, "int8 rounded rows 2 and 5"
    last = KEYS[[2, 10]]   # the last minibatch: a key sent before, and a new one
    flush_keys, flush_values = pf.flushing(last, np.full((2, 1), 0.01, np.float32))
    assert flush_keys.tolist() == np.sort(np.concatenate([last, held])).tolist()
    expect = flush_values.copy()
    expect[:4] += before[[1, 2, 3, 4]]   # (KEYS[10] sorts last)
    out = pf.prepare(flush_keys, flush_values, None, np.array([0, 5]), flush=True)
    assert out.kept is None and all(flags == 0 for flags, _ in out.parts), "float32, whole"
    np.testing.assert_array_equal(out.values, expect)
    assert (pf.residuals(flush_keys) == 0).all() and pf.pending().shape[0] == 0
    f = pf.figures()
    assert f["push_rows"] == 3 + 5 and f["push_rows_held"] == 3
    assert f["residual_keys_flushed"] == 4, "the 3 held back and key 2's rounding"
    assert f["residual_flushed"] == pytest.approx(np.abs(before[[1, 2, 3, 4]]).sum())
    # Keys 0 and 5 keep their rounding (key 0's is 0: the block's largest), half a scale.
    assert f["residual_keys_left"] == np.count_nonzero(before[[0, 5]])
    assert f["residual_left"] == pytest.approx(np.abs(before[[0, 5]]).sum())
    assert f["residual_left"] <= 0.5 * 0.5 / 127 * 2


def test_a_row_sent_again_is_no_longer_pending_and_growth_keeps_what_was_held():
    keys = np.arange(1, 5001, dtype=np.uint64) * np.uint64(7919)
    pf = PushFilter(1, "float32", threshold=0.1)
    g = np.full((keys.shape[0], 1), 0.06, np.float32)
    pf.prepare(keys, g, None, np.array([0, keys.shape[0]]))   # all held; the table grew
    assert pf._keys.shape[0] > 1 << 12 and pf.pending().tolist() == keys.tolist()
    out = pf.prepare(keys[:10], g[:10], None, np.array([0, 10]))   # 0.12: sent
    assert out.kept is None
    assert pf.pending().tolist() == keys[10:].tolist()


def test_figures_count_rows_held_and_residuals_dropped():
    small = PushFilter(1, "int8", threshold=0.5, max_bytes=1024 * 13)
    push_many(small, 3, 1)
    f = small.figures()
    assert set(f) == set(FIGURES)
    assert f["push_rows"] > 0 and f["push_rows_held"] > 0
    assert f["residual_keys_dropped"] == small.lost > 0
    assert f["residual_keys_left"] == np.count_nonzero(small.residuals(KEYS))
    plain = Plain()
    plain.prepare(KEYS[:7], np.ones((7, 1), np.float32), None, np.array([0, 7]))
    assert plain.figures() == dict.fromkeys(FIGURES, 0) | {"push_rows": 7}
    keys = KEYS[:7]
    assert plain.flushing(keys, None)[0] is keys, "no filter: nothing to flush"


def test_the_summary_sums_the_workers_figures():
    records = np.zeros(3, summary.RECORD)
    records["push_rows"] = [0, 10, 20]
    records["residual_left"] = [0.0, 0.25, 0.5]
    s = summary.push_filter(records[1:])
    assert s["push_rows"] == 30 and s["residual_left"] == 0.75 and s["push_rows_held"] == 0
    assert isinstance(s["push_rows"], int) and isinstance(s["residual_left"], float)
