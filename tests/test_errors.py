"""Bad input gets a clear error at the earliest point, naming the op, shapes, dtypes and the fix."""
import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.experiments.mlp import TrainGraph, mlp


class Fn(nn.Graph):
    """A graph whose build is a plain function, for error tests."""

    def __init__(self, fn, model=None, opt=False):
        super().__init__()
        self.fn = fn
        if model is not None:
            self.model = model
            if opt:
                self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.1))

    def build(self, *xs):
        return self.fn(self, *xs)


def test_shape_mismatch_while_tracing_names_op_and_shapes():
    g = Fn(lambda self, x: self.model(x), model=nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"matmul: inner dimensions differ.*f32\[3,5\].*f32\[2,4\]"):
        g(np.zeros((3, 5), np.float32))
    g2 = Fn(lambda self, a, b: a + b)
    with pytest.raises(ValueError, match=r"broadcast_add: shapes \[3,4\] of %input0 and \[5\] of %input1"):
        g2(np.zeros((3, 4), np.float32), np.zeros(5, np.float32))


def test_dtype_mismatch_and_unsupported_dtype():
    g = Fn(lambda self, x: self.model(x), model=nn.Linear(4, 2))
    with pytest.raises(TypeError, match=r"matmul: inputs have different dtypes.*f64.*f32.*\.to\(\)"):
        g(np.zeros((3, 4), np.float64))
    with pytest.raises(TypeError, match="graph input 0: unsupported dtype"):
        g(np.zeros((3, 4), np.int32))


def test_different_rank_gets_clear_error_and_valid_new_signature_gets_new_plan():
    g = Fn(lambda self, x: self.model(x), model=nn.Linear(4, 2))
    g(np.zeros((3, 4), np.float32))
    g(np.zeros((2, 3, 4), np.float32))  # Linear accepts [..., in]: a new, valid plan
    assert g.compile_count == 2
    with pytest.raises(ValueError, match=r"matmul.*f32\[1,7\]"):
        g(np.zeros(7, np.float32))


def test_wrong_number_of_inputs():
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    g = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match=r"build takes 2 input\(s\) \(x, y\), got 1"):
        g(np.zeros((2, 4), np.float32))


def test_labels_out_of_range():
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    g = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    x = np.zeros((2, 4), np.float32)
    w = model[0].weight.numpy()
    with pytest.raises(ValueError, match="label out of range") as e:
        g(x, np.array([0, 3]))
    assert "sparse_softmax_cross_entropy" in str(e.value)
    with pytest.raises(ValueError, match="label out of range"):
        g(x, np.array([-1, 0]))
    np.testing.assert_array_equal(w, model[0].weight.numpy())
    with pytest.raises(TypeError, match="label.*must be int64"):
        g(x, np.array([0.0, 1.0], np.float32))


def test_backward_on_non_scalar_or_twice():
    lin = nn.Linear(4, 2)

    def non_scalar(self, x):
        y = self.model(x)
        y.backward()
        return y

    with pytest.raises(RuntimeError, match=r"scalar loss.*shape \[3, 2\]"):
        Fn(non_scalar, model=lin, opt=True)(np.zeros((3, 4), np.float32))

    def twice(self, x):
        loss = self.model(x).sum()
        loss.backward()
        loss.backward()
        return loss

    with pytest.raises(RuntimeError, match="already called"):
        Fn(twice, model=lin, opt=True)(np.zeros((3, 4), np.float32))


def test_optimizer_without_backward():
    with pytest.raises(RuntimeError, match="never called loss.backward"):
        Fn(lambda self, x: self.model(x).sum(), model=nn.Linear(4, 2), opt=True)(
            np.zeros((3, 4), np.float32))


def test_bad_hyper_parameters():
    p = nn.Linear(2, 2).parameters()
    with pytest.raises(ValueError, match="lr must be > 0"):
        mf.optim.SGD(p, lr=0)
    with pytest.raises(ValueError, match="betas"):
        mf.optim.Adam(nn.Linear(2, 2).parameters(), betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="reduction"):
        nn.functional.cross_entropy(mf.tensor(np.zeros((2, 3))), [0, 1], reduction="avg")


def test_lazy_tensor_cannot_escape_build():
    kept = []

    def keep(self, x):
        kept.append(x * 2.0)
        return kept[-1]

    Fn(keep)(np.ones(3, np.float32))
    with pytest.raises(RuntimeError, match="outside nn.Graph.build"):
        kept[0] + 1.0
    with pytest.raises(RuntimeError, match="cannot read the value of lazy tensor"):
        Fn(lambda self, x: mf.tensor(x.numpy()))(np.ones(3, np.float32))
