"""Optimizer kernels against the formulas, written out in numpy."""
import numpy as np
import pytest
from reference import weights_after_each_step

from mpips.models import updates
from mpips.models.optimizer import NAMES, Optimizer


@pytest.mark.parametrize("name, l1", [("sgd", 0.0), ("adagrad", 0.0), ("ftrl", 0.0), ("ftrl", 0.05),
                                      ("adam", 0.0)])
@pytest.mark.parametrize("width", [1, 3])
def test_kernel_equals_formula(name, l1, width):
    opt = Optimizer(name, lr=0.3, l1=l1, l2=0.01, beta=0.5)
    rng = np.random.default_rng(2)
    steps = rng.normal(size=(25, 6, width)).astype(np.float32)
    state = np.zeros((6, opt.state_columns(width)), np.float32)
    slots = np.arange(6)
    for g in steps:
        updates.update(opt, state, slots, g)
    np.testing.assert_array_equal(state[:, :width], weights_after_each_step(opt, steps)[-1])


def test_l1_makes_ftrl_sparse():
    opt = Optimizer("ftrl", lr=0.1, l1=1.0)
    state = np.zeros((1, 3), np.float32)
    updates.update(opt, state, np.array([0]), np.float32([[0.5]]))
    assert state[0, 0] == 0 and state[0, 1] == 0.5


def test_the_default_rate_halves_when_rows_are_twice_as_dense():
    sparse = Optimizer("adagrad").with_default_lr(21.0)
    dense = Optimizer("adagrad").with_default_lr(42.0)
    assert dense.lr == pytest.approx(sparse.lr / 2)
    assert Optimizer("adagrad", lr=0.3).with_default_lr(42.0).lr == 0.3, "a set rate stays"
    with pytest.raises(ValueError, match="no learning rate"):
        updates.update(Optimizer("sgd"), np.zeros((1, 1), np.float32), np.zeros(1, np.int64),
                       np.zeros((1, 1), np.float32))


@pytest.mark.parametrize("width", [1, 2])
def test_averaged_sgd_is_the_mean_of_the_weights_since_its_first_clock(width):
    """Keys pushed at some clocks only (several pushes in a clock, as from several workers):
    each key's model is the mean of the weights it held after each clock from `first` on,
    though its state is brought up to date only when it is pushed."""
    first, clocks, keys = 7, 40, 5
    opt = Optimizer("sgd", lr=0.2, l2=0.01, average_from=first)
    rng = np.random.default_rng(3)
    state = np.zeros((keys, opt.state_columns(width)), np.float32)
    plain = np.zeros_like(state)   # the same steps, not averaged
    after = []   # the weights after each clock
    for clock in range(clocks):
        for _ in range(2):   # two workers' pushes of the clock
            slots = np.flatnonzero(rng.random(keys) < 0.4)
            g = rng.normal(size=(slots.shape[0], width)).astype(np.float32)
            updates.update(opt, state, slots, g, clock)
            updates.update(Optimizer("sgd", lr=0.2, l2=0.01), plain, slots, g, clock)
        after.append(plain[:, :width].copy())
        np.testing.assert_array_equal(state[:, :width], plain[:, :width])
    expected = np.mean(np.array(after[first:], np.float64), axis=0)
    np.testing.assert_allclose(updates.weights(opt, state, width, clocks), expected, rtol=1e-5,
                               atol=1e-6)
    assert not np.allclose(expected, state[:, :width], atol=1e-3), "the mean is not the last"
    assert np.array_equal(updates.weights(opt, state, width, first), state[:, :width]), \
        "nothing averaged yet: the last weights"
    assert np.array_equal(updates.weights(Optimizer("sgd", lr=0.2), state, width, clocks),
                          state[:, :width]), "no averaging"


def test_adam_corrects_each_key_by_its_own_count_of_pushes():
    """Lazy Adam: a key pushed for the first time at step 10 moves by the full rate (its
    moments corrected for one push, not ten), whatever the others did meanwhile."""
    opt = Optimizer("adam", lr=0.01, eps=1e-12)
    state = np.zeros((2, opt.state_columns(1)), np.float32)
    for _ in range(9):
        updates.update(opt, state, np.array([0]), np.float32([[1.0]]))
    updates.update(opt, state, np.array([0, 1]), np.float32([[1.0], [-3.0]]))
    assert state[1, 0] == pytest.approx(0.01, rel=1e-6) and state[1, 3] == 1
    assert state[0, 3] == 10 and state[0, 0] == pytest.approx(-0.1, rel=1e-5)


def test_update_rules_are_registered_by_name():
    assert NAMES == ("sgd", "adagrad", "ftrl", "adam")   # the order --optimizer lists them
    assert tuple(updates.RULES) == NAMES   # one rule for each name
    for rule in updates.RULES.values():
        assert set(rule.parameters) <= {"lr", "l1", "l2", "beta", "eps", "average_from"}
    with pytest.raises(ValueError, match="no FTRL beta"):
        updates.update(Optimizer("ftrl", lr=0.1, beta=None), np.zeros((1, 3), np.float32),
                       np.zeros(1, np.int64), np.zeros((1, 1), np.float32))
