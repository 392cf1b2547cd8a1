"""Optimizer kernels against the formulas, written out in numpy."""
import numpy as np
import pytest
from reference import weights_after_each_step

from mpips.optimizer import Optimizer


@pytest.mark.parametrize("name, l1", [("sgd", 0.0), ("adagrad", 0.0), ("ftrl", 0.0), ("ftrl", 0.05)])
@pytest.mark.parametrize("width", [1, 3])
def test_kernel_equals_formula(name, l1, width):
    opt = Optimizer(name, lr=0.3, l1=l1, l2=0.01, beta=0.5)
    rng = np.random.default_rng(2)
    steps = rng.normal(size=(25, 6, width)).astype(np.float32)
    state = np.zeros((6, opt.state_columns(width)), np.float32)
    slots = np.arange(6)
    for g in steps:
        opt.update(state, slots, g)
    np.testing.assert_array_equal(state[:, :width], weights_after_each_step(opt, steps)[-1])


def test_l1_makes_ftrl_sparse():
    opt = Optimizer("ftrl", lr=0.1, l1=1.0)
    state = np.zeros((1, 3), np.float32)
    opt.update(state, np.array([0]), np.float32([[0.5]]))
    assert state[0, 0] == 0 and state[0, 1] == 0.5


def test_the_default_rate_halves_when_rows_are_twice_as_dense():
    sparse = Optimizer("adagrad").with_default_lr(21.0)
    dense = Optimizer("adagrad").with_default_lr(42.0)
    assert dense.lr == pytest.approx(sparse.lr / 2)
    assert Optimizer("adagrad", lr=0.3).with_default_lr(42.0).lr == 0.3, "a set rate stays"
    with pytest.raises(ValueError, match="no learning rate"):
        Optimizer("sgd").update(np.zeros((1, 1), np.float32), np.zeros(1, np.int64),
                                np.zeros((1, 1), np.float32))
