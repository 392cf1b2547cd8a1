"""Defaults chosen from the data: the statistics, the minibatch size, the learning rates."""
import numpy as np
import pytest

from mpips.models import defaults, updates
from mpips.data.textfile import Rows, TextShard
from mpips.models.evaluate import read_rows
from mpips.data.synthetic import make_data
from mpips.models.optimizer import Optimizer
from mpips.data.samples import sample_rows


def csr(dense: np.ndarray, labels=None) -> Rows:
    """Rows holding the non-zeros of a dense matrix, keys = column + 1."""
    nz = dense != 0
    return Rows(np.zeros(dense.shape[0], np.float32) if labels is None else labels,
                np.concatenate([[0], np.cumsum(nz.sum(axis=1))]).astype(np.int64),
                (np.nonzero(nz)[1] + 1).astype(np.uint64), dense[nz].astype(np.float32))


def with_ones(dense: np.ndarray) -> np.ndarray:
    return np.hstack([dense, np.ones((dense.shape[0], 1))])


@pytest.fixture(scope="module")
def census(tmp_path_factory):
    """3,000 rows of the census-like set, as rows and as a dense matrix (bias included)."""
    prefix = tmp_path_factory.mktemp("census") / "c"
    make_data(str(prefix), rows=3000, test_rows=10, seed=2, kind="census")
    rows = read_rows(f"{prefix}.train.svm")
    x = np.zeros((len(rows), 124))
    for r in range(len(rows)):
        x[r, rows.indices[rows.indptr[r]:rows.indptr[r + 1]].astype(int) - 1] = 1
    x[:, 123] = 1
    return f"{prefix}.train.svm", rows, x


@pytest.mark.parametrize("bias", [True, False])
def test_top_eigenvalue_is_that_of_x_transpose_x_over_n(bias):
    rng = np.random.default_rng(0)
    dense = rng.normal(size=(400, 6)) * [0.5, 1, 2, 3, 5, 8] + [0, 1, 0, 4, 0, 0]
    dense[rng.random(dense.shape) < 0.3] = 0
    x = with_ones(dense) if bias else dense
    want = np.linalg.eigvalsh(x.T @ x / x.shape[0])[-1]
    assert defaults.top_eigenvalue(csr(dense), bias) == pytest.approx(want, rel=1e-4)


def test_statistics_of_a_sample():
    dense = np.array([[1.0, 0, 3.0], [0, -2.0, 0], [0.5, 0, 0]])
    stats = defaults.measure(csr(dense), bias=True)
    assert stats.features == pytest.approx(4 / 3 + 1)
    assert stats.typical == 1.0, "median of |values| 1, 3, 2, 0.5 and three bias ones"
    assert stats.sq_norm == pytest.approx((1 + 9 + 4 + 0.25) / 3 + 1)
    assert defaults.measure(csr(np.zeros((0, 3))), bias=True) == defaults.DataStats()
    broken = csr(dense)
    broken.values[0] = np.nan
    assert np.isfinite(defaults.learning_rate("sgd", defaults.measure(broken, True), 10, 2)[0])


def test_the_sample_measures_the_census_like_set(census):
    """Its frequent, correlated values give X^T X / n a large top eigenvalue; that of the
    whole file is what the sample finds."""
    path, rows, x = census
    stats = defaults.measure(rows, bias=True)
    assert stats.curvature == pytest.approx(np.linalg.eigvalsh(x.T @ x / len(rows))[-1], rel=1e-3)
    assert stats.curvature > 4
    assert 13 < stats.features - 1 <= 14 and stats.typical == 1.0


def test_sgd_steps_stay_below_the_stability_bound(census):
    """Gradient steps on the logistic loss diverge above 2 / L, L = (top eigenvalue of the
    rows' X^T X / n) / 4. With W workers a clock takes W steps from the same weights, so
    the rate must stay below 2 / (W L) with L measured on the rows of one clock. The old
    default (40 / features per row) broke it here; the chosen rate keeps to about half."""
    path, rows, x = census
    stats = defaults.measure(rows, bias=True)
    rng = np.random.default_rng(1)
    for workers, batch in ((1, 30), (3, 6), (3, 1000), (8, 100)):
        lr = Optimizer("sgd").with_default_lr(stats, batch, workers).lr
        clock = x[rng.choice(x.shape[0], min(workers * batch, x.shape[0]), replace=False)]
        bound = np.linalg.eigvalsh(clock.T @ clock / clock.shape[0])[-1] / 4
        assert workers * lr * bound < 1.2, (workers, batch, lr)
    full = np.linalg.eigvalsh(x.T @ x / x.shape[0])[-1] / 4
    assert 3 * 40 / stats.features * full > 2, "the old default diverged with 3 workers"


def test_sgd_rate_scales_with_the_values_the_workers_and_the_batch():
    dense = np.random.default_rng(3).normal(size=(500, 5))
    small, large = defaults.measure(csr(dense), False), defaults.measure(csr(10 * dense), False)
    rate = lambda stats, batch=100, workers=1: defaults.learning_rate(  # noqa: E731
        "sgd", stats, batch, workers)[0]
    assert rate(large) == pytest.approx(rate(small) / 100), "curvature grows as values squared"
    assert rate(small, workers=4) < rate(small, workers=2) < rate(small)
    assert rate(small, batch=1) < rate(small, batch=10) < rate(small, batch=1000)


def test_adagrad_and_ftrl_rates_follow_the_typical_value():
    binary = defaults.DataStats(features=21.0)
    for name in ("adagrad", "ftrl"):
        assert defaults.learning_rate(name, binary, 1000, 3)[0] == pytest.approx(2 / 21), \
            "2 / features per row on binary data, as before"
        dense = defaults.DataStats(features=42.0)
        assert defaults.learning_rate(name, dense, 1000, 3)[0] == pytest.approx(1 / 21), \
            "rows twice as dense: half the rate"
        scaled = defaults.DataStats(features=21.0, typical=10.0)
        assert defaults.learning_rate(name, scaled, 1000, 3)[0] == pytest.approx(0.2 / 21)
    assert Optimizer("adagrad").with_default_lr(42.0).lr == pytest.approx(1 / 21)
    assert Optimizer("adagrad", lr=0.3).with_default_lr(42.0).lr == 0.3, "a set rate stays"


def test_adams_rate_is_a_tenth_of_adagrads_and_shrinks_with_the_epochs():
    binary = defaults.DataStats(features=21.0)
    rate, why = defaults.learning_rate("adam", binary, 1000, 3)
    assert rate == pytest.approx(0.2 / 21) and "sqrt" not in why
    rate, why = defaults.learning_rate("adam", binary, 1000, 3, epochs=4)
    assert rate == pytest.approx(0.1 / 21) and why.endswith("/ sqrt(4 epochs)")
    assert defaults.learning_rate("adagrad", binary, 1000, 3, epochs=4)[0] == \
        pytest.approx(2 / 21), "AdaGrad's own sum shrinks its steps: no horizon"


def test_batch_size_leaves_about_a_thousand_updates_per_epoch():
    assert defaults.batch_size([30000], exact=True) == 30
    assert defaults.batch_size([5_000_000, 6_000_000], exact=True) == 1000, "at most 1,000"
    assert defaults.batch_size([300], exact=True) == 1
    assert defaults.batch_size([0, 0], exact=True) == 1
    assert defaults.batch_size([], exact=False) == 1000, "not sampled: as before"
    assert defaults.batch_size([166672] * 3, exact=False) == 166, "estimated counts: as aimed"


@pytest.mark.parametrize("per_worker", [[10002, 9999, 9999], [20000], [166672, 166673],
                                        [45678, 45677, 45677, 45676], [1999]])
def test_no_worker_ends_an_epoch_with_a_nearly_empty_minibatch(per_worker):
    """A last minibatch of a few rows would be pushed as a full one: avoided when the row
    counts are known."""
    batch = defaults.batch_size(per_worker, exact=True)
    aim = max(min(per_worker) // 1000, 1)
    assert (aim + 1) // 2 <= batch <= aim
    for n in per_worker:
        assert n % batch == 0 or 2 * (n % batch) >= batch, (n, batch)


def test_when_no_size_fills_every_last_minibatch_the_fullest_is_taken():
    per_worker = [10002, 9998, 10000]   # aim 9: last minibatches of 3, 8 and 1 rows
    batch = defaults.batch_size(per_worker, exact=True)
    fullest = {b: min((n % b or b) / b for n in per_worker) for b in range(5, 10)}
    assert fullest[batch] == max(fullest.values()) > fullest[9]


def test_few_updates_are_warned_about():
    warning = defaults.clocks_warning([30000, 30000], 1000)
    assert "--batch-size 1000" in warning and "30 update(s) per epoch" in warning
    assert defaults.clocks_warning([30000], 300) is None
    assert defaults.clocks_warning([0], 1000) is None


def choose(rows, optimizer, lr=None, batch=None, **more):
    """defaults.choose for one worker with 3,000 rows (known)."""
    return defaults.choose(rows, [3000], True, workers=1, bias=True, optimizer=optimizer,
                           lr=lr, batch=batch, **more)


def test_choose_keeps_what_was_given_and_says_what_it_chose(census):
    rows = census[1]
    given = choose(rows, "sgd", lr=0.5, batch=10, beta=1.0)
    assert (given["batch_size"], given["lr"], given["warnings"]) == (10, 0.5, [])
    assert [n[:10] for n in given["notes"]] == ["sgd model:"], "nothing else was chosen"
    chosen = choose(rows, "adagrad")
    assert chosen["batch_size"] == 3
    assert chosen["lr"] == pytest.approx(2 / defaults.measure(rows, True).features)
    assert any("(set --batch-size to change)" in n for n in chosen["notes"])
    assert any(n.startswith("adagrad learning rate") and "(set --lr to change)" in n
               for n in chosen["notes"])
    resumed = choose(rows, "sgd", resumed_batch=250)
    assert resumed["batch_size"] == 250 and "as the run resumed" in resumed["notes"][0]
    few = choose(rows, "sgd", batch=1000)
    assert len(few["warnings"]) == 1 and few["batch_size"] == 1000


def test_data_that_could_not_be_sampled_gets_the_old_batch_and_a_rate_for_the_workers():
    empty = Rows(np.empty(0, np.float32), np.zeros(1, np.int64), np.empty(0, np.uint64),
                 np.empty(0, np.float32))
    for workers in (1, 4):
        chosen = defaults.choose(empty, [], False, workers=workers, bias=True, optimizer="sgd",
                                 lr=None, batch=None)
        assert chosen["batch_size"] == 1000
        assert chosen["lr"] == pytest.approx(1 / ((workers + 1 / 1000) / 4))
        assert chosen["average_from"] is None, "no row counts: no epoch to average after"


def test_ftrl_beta_and_adagrad_eps_are_the_per_example_one_in_minibatch_units(census):
    rows = census[1]
    ftrl = choose(rows, "ftrl", batch=250)
    assert ftrl["beta"] == ftrl["eps"] == pytest.approx(1 / 250)
    assert any(n.startswith("ftrl beta 0.004") for n in ftrl["notes"])
    assert choose(rows, "ftrl", batch=250, beta=0.5)["beta"] == 0.5
    adagrad = choose(rows, "adagrad", lr=0.1)
    assert adagrad["eps"] == pytest.approx(1 / adagrad["batch_size"])
    with pytest.raises(ValueError, match="no FTRL beta"):
        updates.update(Optimizer("ftrl", lr=0.1, beta=None), np.zeros((1, 3), np.float32),
                       np.zeros(1, np.int64), np.zeros((1, 1), np.float32))


@pytest.mark.parametrize("parts", [1, 3])
def test_a_small_file_is_sampled_whole_with_each_workers_rows(census, parts):
    path = census[0]
    sample = sample_rows(path, parts)
    assert sample.exact and len(sample.rows) == 3000
    assert sample.per_part == [sum(len(r) for r in TextShard(path, w, parts).rows())
                               for w in range(parts)]


def test_a_large_file_is_sampled_in_parts(census):
    path = census[0]
    sample = sample_rows(path, 2, whole_bytes=1000, samples=4, sample_bytes=16 << 10)
    assert not sample.exact and 500 < len(sample.rows) < 3000
    assert sum(sample.per_part) == pytest.approx(3000, rel=0.05)


def test_sgd_chooses_smaller_minibatches_and_averages_after_the_first_epoch(census):
    rows = census[1]
    sgd, adagrad = choose(rows, "sgd"), choose(rows, "adagrad")
    assert sgd["batch_size"] < adagrad["batch_size"], "rare keys need more, smaller steps"
    assert sgd["batch_size"] == defaults.batch_size([3000], True, defaults.SGD_CLOCKS_PER_EPOCH)
    assert sgd["average_from"] == round(defaults.AVERAGE_AFTER * -(-3000 // sgd["batch_size"]))
    assert any("the mean of the weights from clock" in n for n in sgd["notes"])
    assert adagrad["average_from"] is None
    assert choose(rows, "sgd", batch=100, average_after=2.5)["average_from"] == 75
    off = choose(rows, "sgd", average_after=None)
    assert off["average_from"] is None and any("--average-after off" in n for n in off["notes"])
    kept = choose(rows, "sgd", resumed_batch=10, resumed={"name": "sgd", "average_from": 7})
    assert kept["average_from"] == 7 and any("as the run resumed" in n for n in kept["notes"][1:])
