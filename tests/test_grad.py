"""Every gradient rule against central finite differences in float64 (through autograd + a plan):
the hand-picked cases below, and for every other differentiable op its first registered sample in
float64 (so a newly declared op is grad-checked without a change here)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from miniflow.ops import all_ops
from miniflow.testing import check_grad

R = np.random.default_rng(0)


def u(*shape, lo=-1.0, hi=1.0):
    return R.uniform(lo, hi, shape)


CASES = [
    ("matmul", [u(3, 4), u(4, 2)], {}),
    ("matmul", [u(4, 3), u(4, 2)], {"transpose_a": True}),
    ("matmul", [u(3, 4), u(2, 4)], {"transpose_b": True}),
    ("matmul", [u(4, 3), u(2, 4)], {"transpose_a": True, "transpose_b": True}),
    ("broadcast_add", [u(3, 4), u(4)], {}),
    ("broadcast_sub", [u(2, 1, 3), u(4, 1)], {}),
    ("broadcast_mul", [u(3, 4), u(3, 1)], {}),
    ("broadcast_div", [u(3, 4), u(1, 4, lo=0.5, hi=2.0)], {}),
    ("bias_add", [u(5, 3), u(3)], {"axis": 1}),
    ("bias_add", [u(2, 3, 4), u(3)], {"axis": 1}),
    ("scalar_add", [u(3, 2)], {"scalar": 2.5}),
    ("scalar_mul", [u(3, 2)], {"scalar": -1.5}),
    ("negative", [u(4)], {}),
    ("exp", [u(2, 3)], {}),
    ("log", [u(2, 3, lo=0.5, hi=3.0)], {}),
    ("relu", [u(3, 4) + np.sign(u(3, 4)) * 0.1], {}),
    ("tanh", [u(3, 4)], {}),
    ("sigmoid", [u(3, 4, lo=-4, hi=4)], {}),
    ("identity", [u(3)], {}),
    ("cumprod", [np.array([[1.5, 0.0, -0.5, 2.0], [0.0, 0.0, 1.5, 0.5], [0.5, -1.5, 0.0, 1.0]])],
     {"dim": 1}),    # zeros first, inside, twice: PyTorch's gradient there
    ("amp_white_identity", [u(3)], {}),
    ("amp_black_identity", [u(2, 2)], {}),
    ("reduce_sum", [u(3, 4, 5)], {"axis": (0, 2)}),
    ("reduce_sum", [u(3, 4)], {"axis": (1,), "keepdims": True}),
    ("reduce_sum", [u(3, 4)], {"axis": None}),
    ("reshape", [u(3, 4)], {"shape": (2, 6)}),
    ("transpose", [u(2, 3, 4)], {"perm": (2, 0, 1)}),
    ("softmax", [u(3, 5, lo=-3, hi=3)], {}),
    ("log_softmax", [u(3, 5, lo=-3, hi=3)], {}),
    ("sparse_softmax_cross_entropy", [u(4, 5, lo=-3, hi=3), np.array([0, 4, 2, 2])], {}),
    ("add_n", [u(2, 3), u(2, 3), u(2, 3)], {}),
    ("broadcast_like", [u(3), u(2, 3)], {"broadcast_axes": (0,)}),
    ("broadcast_like", [u(2, 1), u(2, 4)], {"broadcast_axes": (1,)}),
    ("expand", [u(2, 1)], {"expand_shape": (3, 2, 4)}),
    ("broadcast_maximum", [u(3, 4), u(4)], {}),
    ("broadcast_pow", [u(3, 4, lo=0.5, hi=2.0), u(4)], {}),
    ("broadcast_minimum", [u(2, 1, 3), u(4, 1)], {}),
    ("expand", [u(1, 3)], {"expand_shape": (2, 3)}),
    ("cast", [u(3, 2)], {"dtype": "float32"}),
    ("scalar_mul_by_tensor", [u(3, 2), u(1, lo=0.5, hi=2.0)], {}),
    ("reciprocal", [u(2, 3, lo=0.5, hi=2.0)], {}),
    # softplus jumps at beta * x = threshold (x = 2.5 here): points 0.05 or more from it, both sides
    ("softplus", [np.linspace(-4.0, 4.0, 12).reshape(3, 4)], {"beta": 2.0, "threshold": 5.0}),
    ("softplus", [u(3, 4, lo=-6.0, hi=6.0)], {}),
    # leaky_relu and elu have a kink at 0 (elu's unless alpha is 1): points 0.27 or more from it
    ("leaky_relu", [np.linspace(-3.0, 3.0, 12).reshape(3, 4)], {"alpha": 0.2}),
    ("leaky_relu", [np.linspace(-3.0, 3.0, 12).reshape(3, 4)], {"alpha": -0.5}),
    ("leaky_relu", [np.linspace(-3.0, 3.0, 12).reshape(3, 4)], {}),
    ("elu", [np.linspace(-3.0, 3.0, 12).reshape(3, 4)], {"alpha": 0.5}),
    ("elu", [np.linspace(-3.0, 3.0, 12).reshape(3, 4)], {"alpha": 0.0}),
    ("elu", [u(3, 4, lo=-4.0, hi=4.0)], {}),
    # the first samples of these fill with -inf, where finite differences are NaN
    ("tril", [u(2, 4, 4)], {"diagonal": 0, "fill_value": -3.0}),
    ("tril", [u(3, 5)], {"diagonal": -1}),
    ("masked_fill", [u(2, 3, 4), np.array([[1, 0, 0, 1]] * 3, np.int64)], {"value": 2.0}),
]


NOT_CHECKED = ("ones_like", "constant", "detach", "argmax", "top_k", "dropout")
"""Ops whose gradient rule returns no gradient (creation ops, detach, argmax, top_k): nothing to
check; and ``dropout``,
whose every run draws a new mask (it advances its random stream in place), so finite differences
see a different function at each evaluation: ``tests/test_dropout.py`` checks its gradient against
``dy * mask / (1 - rate)`` instead."""


def _differentiable() -> set:
    return {n for n, d in all_ops().items() if d.grad is not None and n not in NOT_CHECKED}


def _from_samples() -> list:
    """The first sample (in float64) of every differentiable op that has no case in CASES."""
    covered = {c[0] for c in CASES}
    out = []
    for name in sorted(_differentiable() - covered):
        inputs, attrs = all_ops()[name].samples()[0]
        out.append((name, [a.astype(np.float64) if a.dtype.kind == "f" else a for a in inputs],
                    attrs))
    return out


ALL_CASES = CASES + _from_samples()


@pytest.mark.parametrize("op,inputs,attrs", ALL_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(ALL_CASES)])
def test_gradient_matches_finite_differences(op, inputs, attrs):
    if op == "cast":  # f64 -> f32 -> loss: check with a looser tolerance (f32 rounding)
        check_grad(op, inputs, attrs, eps=1e-3, rtol=1e-3, atol=1e-4)
    else:
        check_grad(op, inputs, attrs)


def test_every_differentiable_forward_op_has_a_case():
    assert _differentiable() <= {c[0] for c in ALL_CASES}


def _broadcast_pair(draw):
    nd = draw(st.integers(1, 3))
    out = draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    a = [d if draw(st.booleans()) else 1 for d in out]
    b = [d if draw(st.booleans()) else 1 for d in out]
    b = b[draw(st.integers(0, nd - 1)):]  # b may have lower rank
    return tuple(a), tuple(b)


@given(st.data(), st.sampled_from(["broadcast_add", "broadcast_sub", "broadcast_mul",
                                   "broadcast_div"]))
def test_broadcast_gradients_reduce_to_input_shapes(data, op):
    sa, sb = _broadcast_pair(data.draw)
    a = u(*sa)
    b = u(*sb, lo=0.5, hi=1.5) if op == "broadcast_div" else u(*sb)
    check_grad(op, [a, b], {})


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
def test_reduce_sum_any_axes(shape, data):
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    keep = data.draw(st.booleans())
    check_grad("reduce_sum", [u(*shape)], {"axis": tuple(axes) or None, "keepdims": keep})


class _SplitGraph:
    """loss = sum(w * f(x)) for a parameter x [4, 6] (SGD, lr 1: the step shows the gradient)."""

    @staticmethod
    def run(fn):
        import miniflow as mf

        class G(mf.nn.Graph):
            def __init__(self):
                super().__init__()
                self.m = mf.nn.Module()
                self.m.x = mf.nn.Parameter(np.arange(24, dtype=np.float32).reshape(4, 6) / 7)
                self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=1.0))

            def build(self):
                fn(self.m.x).backward()
                return self.m.x * 1.0

        g = G()
        x = g.m.x.numpy().copy()
        g()
        ops = [n.op.name for n in next(reversed(g.plans.values())).graph.nodes]
        return x, x - g.m.x.numpy(), ops


W = np.arange(8, dtype=np.float32).reshape(4, 2) - 3.0


def test_slices_tiling_a_tensor_get_one_cat_as_their_gradient():
    """The q, k, v split: the parts' gradients joined by one ``cat`` (no zero-filled
    ``slice_grad`` and ``add_n``), equal to the NumPy gradient."""
    def loss(x):
        q, k, v = x.split(2, dim=1)
        return (q * W).sum() + (k * (W * 2.0)).sum() + (v * 3.0).sum()

    _, grad, ops = _SplitGraph.run(loss)
    assert ops.count("cat") == 1 and "slice_grad" not in ops and "add_n" not in ops, ops
    want = np.concatenate([W, W * 2.0, np.full((4, 2), 3.0)], axis=1)
    np.testing.assert_allclose(grad, want, rtol=1e-6)


@pytest.mark.parametrize("parts", [((0, 4), (2, 6)), ((0, 2), (4, 6)), ((0, 2), (2, 6), (0, 6))])
def test_slices_that_overlap_or_leave_gaps_are_summed(parts):
    def loss(x):
        return sum((x[:, a:b] * (i + 1.0)).sum() for i, (a, b) in enumerate(parts))

    _, grad, ops = _SplitGraph.run(loss)
    assert "cat" not in ops and "add_n" in ops, ops
    want = np.zeros((4, 6), np.float32)
    for i, (a, b) in enumerate(parts):
        want[:, a:b] += i + 1.0
    np.testing.assert_allclose(grad, want, rtol=1e-5)


def test_int64_values_computed_from_a_parameter_get_no_gradient():
    """An int64 value that depends on a parameter (its cast, then ``clone``, ``flip``, an index,
    ``cumsum``, ``amax``: ops that take int64) carries no gradient, as in PyTorch (cast's rule
    gives none to an int64 input, gather's none from an int64 one): the step trains through the
    float path alone, and no backward op takes an int64 value."""
    def loss(x):
        ids = x.long().clone().flip(1)[[3, 0]].cumsum(0)
        return (x[:, :2] * W).sum() + ids.amax().float() + ids.float().sum() * 0.0

    _, grad, ops = _SplitGraph.run(loss)
    np.testing.assert_allclose(grad[:, :2], W, rtol=1e-6)
    assert not grad[:, 2:].any()
    assert "unsorted_segment_sum_like" not in ops and "cumsum_grad" not in ops, ops
