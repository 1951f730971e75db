"""Pools and flatten: the CPU kernels against the float64 references on random windows
(hypothesis: kernel, stride, padding, dilation, ``ceil_mode``, ``count_include_pad``,
``divisor_override``) in f16/f32/f64, with their parallel variants, the max pool's NaN and tie
rule, the gradient rules against finite differences in float64, PyTorch's forward, indices and
backward in float64 (skipped without torch), and the errors; the nn pools' zero-size inputs
against PyTorch's."""
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import miniflow as mf
from miniflow.experiments.mlp import EvalGraph
from miniflow.kernels import cpu
from miniflow.kernels.cpu import pool as cpu_pool
from miniflow.ops.geometry import pooled_size
from miniflow.ops.pool import max_pool_reference
from miniflow.testing import check_grad

from op_cases import Case, assert_matches_reference, make_node, run_cpu as run

try:
    import torch
    import torch.nn.functional as F
except ImportError:   # torch is optional: its comparisons skip
    torch = F = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

FLOATS = [np.float16, np.float32, np.float64]




@st.composite
def windows(draw, avg: bool):
    """``(shape, attrs)`` of a small valid max (``avg=False``) or average pool."""
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    attrs = {"kernel_size": (kh, kw),
             "stride": (draw(st.integers(1, 3)), draw(st.integers(1, 3))),
             "padding": (draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2))),
             "ceil_mode": draw(st.booleans())}
    dh = dw = 1
    if avg:
        attrs["count_include_pad"] = draw(st.booleans())
        attrs["divisor_override"] = draw(st.sampled_from([0, 0, 3]))
    else:
        dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        attrs["dilation"] = (dh, dw)
    ceil = attrs["ceil_mode"]      # PyTorch's ceil mode keeps a window longer than the input
    h = draw(st.integers(1 if ceil else max(1, dh * (kh - 1) + 1 - 2 * attrs["padding"][0]), 9))
    w = draw(st.integers(1 if ceil else max(1, dw * (kw - 1) + 1 - 2 * attrs["padding"][1]), 9))
    try:
        for size, k, s, p, d in ((h, kh, attrs["stride"][0], attrs["padding"][0], dh),
                                 (w, kw, attrs["stride"][1], attrs["padding"][1], dw)):
            pooled_size("pool", size, k, s, p, d, ceil, "H")
    except ValueError:
        assume(False)              # no window: PyTorch's "Output size is too small" too
    return (draw(st.integers(1, 2)), draw(st.integers(1, 3)), h, w), attrs


def rand(shape, dt, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dt)


def max_cases(shape, attrs, dt, seed):
    x = rand(shape, dt, seed)
    from miniflow.ops.geometry import pool_attrs
    _, ind = max_pool_reference([x.astype(np.float64)], pool_attrs("max_pool_2d", attrs, False))
    return [Case("max_pool_2d", [x], attrs),
            Case("max_pool_2d_grad", [x, ind, rand(ind.shape, dt, seed + 1)], attrs)]


def avg_cases(shape, attrs, dt, seed):
    x = rand(shape, dt, seed)
    (y,) = run(Case("avg_pool_2d", [x], attrs))
    return [Case("avg_pool_2d", [x], attrs),
            Case("avg_pool_2d_grad", [x, rand(y.shape, dt, seed + 1)], attrs)]


@settings(max_examples=50, deadline=None)
@given(windows(avg=False), st.sampled_from(FLOATS), st.integers(0, 2 ** 16), st.booleans())
def test_max_pool_matches_the_reference(geo, dt, seed, parallel):
    with mock.patch.object(cpu_pool, "use_parallel", lambda size: parallel):
        for case in max_cases(*geo, dt, seed):
            assert_matches_reference(case, run(case))


@settings(max_examples=50, deadline=None)
@given(windows(avg=True), st.sampled_from(FLOATS), st.integers(0, 2 ** 16), st.booleans())
def test_avg_pool_matches_the_reference(geo, dt, seed, parallel):
    with mock.patch.object(cpu_pool, "use_parallel", lambda size: parallel):
        for case in avg_cases(*geo, dt, seed):
            assert_matches_reference(case, run(case))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 9), st.integers(1, 9),
       st.sampled_from(FLOATS), st.booleans())
def test_adaptive_avg_pool_matches_the_reference(h, w, oh, ow, dt, parallel):
    x, dy = rand((2, 3, h, w), dt, h), rand((2, 3, oh, ow), dt, w)
    with mock.patch.object(cpu_pool, "use_parallel", lambda size: parallel):
        for case in (Case("adaptive_avg_pool2d", [x], {"output_size": (oh, ow)}),
                     Case("adaptive_avg_pool2d_grad", [x, dy], {"output_size": (oh, ow)}),
                     Case("adaptive_avg_pool2d", [x], {"output_size": 1}),
                     Case("adaptive_avg_pool2d_grad", [x, dy[:, :, :1, :1]],
                          {"output_size": 1})):
            assert_matches_reference(case, run(case))


def test_max_pool_nan_and_ties():
    """A NaN wins its window and a later NaN replaces it (``val > max || isnan(val)``); ties go to
    the first maximum in scan order (rows, then columns), also across rows: (0, 2) before (1, 0);
    a window of -inf picks its first element."""
    x = np.array([[[[np.nan, 3.0, 1.0, 0.0, 7.0, -np.inf],
                    [np.nan, 2.0, 5.0, 5.0, 7.0, -np.inf]]]], np.float32)
    y, ind = run(Case("max_pool_2d", [x], {"kernel_size": 2}))
    assert np.isnan(y[0, 0, 0, 0]) and ind[0, 0, 0, 0] == 6
    assert y[0, 0, 0, 1] == 5.0 and ind[0, 0, 0, 1] == 8
    assert ind[0, 0, 0, 2] == 4                        # 7 at (0, 4) ties 7 at (1, 4)
    x = np.array([[[[1.0, 0.0, 9.0], [9.0, 0.0, 1.0]]]], np.float32)
    y, ind = run(Case("max_pool_2d", [x], {"kernel_size": (2, 3)}))
    assert ind[0, 0, 0, 0] == 2                        # (0, 2) comes before (1, 0)
    x = np.full((1, 1, 2, 2), -np.inf, np.float32)
    _, ind = run(Case("max_pool_2d", [x], {"kernel_size": 2}))
    assert ind[0, 0, 0, 0] == 0


@pytest.mark.parametrize("op,shape,attrs", [
    ("max_pool_2d", (2, 2, 5, 6), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("max_pool_2d", (1, 2, 7, 6), {"kernel_size": (3, 2), "stride": 1, "dilation": 2,
                                   "ceil_mode": True}),
    ("avg_pool_2d", (2, 2, 5, 6), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("avg_pool_2d", (2, 2, 5, 6), {"kernel_size": 3, "stride": 2, "padding": 1,
                                   "count_include_pad": False, "ceil_mode": True}),
    ("avg_pool_2d", (1, 2, 5, 6), {"kernel_size": (2, 3), "divisor_override": 5}),
    ("adaptive_avg_pool2d", (2, 2, 5, 7), {"output_size": (3, 2)}),
    ("adaptive_avg_pool2d", (2, 3, 4, 3), {"output_size": 1}),
    ("flatten", (2, 3, 2, 2), {"start_dim": 1}),
])
def test_gradients_match_finite_differences(op, shape, attrs):
    x = np.random.default_rng(4).permutation(np.prod(shape)).reshape(shape) / 10.0  # no ties
    check_grad(op, [x], attrs)


def _distinct(shape, seed):
    """Values with no ties (a max pool's gradient is defined), in float64."""
    return np.random.default_rng(seed).permutation(int(np.prod(shape))).reshape(shape) / 7.0


@settings(max_examples=25, deadline=None)
@given(windows(avg=False), st.integers(0, 2 ** 16))
def test_max_pool_gradient_matches_finite_differences_on_random_windows(geo, seed):
    shape, attrs = geo
    x = _distinct(shape, seed)
    y, _ = run(Case("max_pool_2d", [x], attrs))
    assume(np.isfinite(y).all())        # a window entirely in the padding has no derivative
    check_grad("max_pool_2d", [x], attrs)


@settings(max_examples=25, deadline=None)
@given(windows(avg=True), st.integers(0, 2 ** 16))
def test_avg_pool_gradient_matches_finite_differences_on_random_windows(geo, seed):
    shape, attrs = geo
    check_grad("avg_pool_2d", [_distinct(shape, seed)], attrs)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6), st.integers(1, 6))
def test_adaptive_avg_pool_gradient_matches_finite_differences(h, w, oh, ow):
    check_grad("adaptive_avg_pool2d", [_distinct((2, 2, h, w), h * w)], {"output_size": (oh, ow)})


@needs_torch
@settings(max_examples=40, deadline=None)
@given(windows(avg=False), st.integers(0, 2 ** 16))
def test_max_pool_matches_torch(geo, seed):
    shape, attrs = geo
    x = np.random.default_rng(seed).standard_normal(shape)
    tx = torch.tensor(x, requires_grad=True)
    ty, ti = F.max_pool2d(tx, attrs["kernel_size"], attrs["stride"], attrs["padding"],
                          attrs["dilation"], ceil_mode=attrs["ceil_mode"], return_indices=True)
    y, ind = run(Case("max_pool_2d", [x], attrs))
    if not np.isfinite(y).all():       # a window entirely in the padding: PyTorch differs there
        return
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ind, ti.numpy())
    dy = np.random.default_rng(seed + 1).standard_normal(y.shape)
    (gx,) = torch.autograd.grad(ty, (tx,), torch.tensor(dy))
    (dx,) = run(Case("max_pool_2d_grad", [x, ind, dy], attrs))
    np.testing.assert_allclose(dx, gx.numpy(), rtol=1e-5, atol=1e-5)


@needs_torch
@settings(max_examples=40, deadline=None)
@given(windows(avg=True), st.integers(0, 2 ** 16))
def test_avg_pool_matches_torch(geo, seed):
    shape, attrs = geo
    x = np.random.default_rng(seed).standard_normal(shape)
    tx = torch.tensor(x, requires_grad=True)
    ty = F.avg_pool2d(tx, attrs["kernel_size"], attrs["stride"], attrs["padding"],
                      ceil_mode=attrs["ceil_mode"], count_include_pad=attrs["count_include_pad"],
                      divisor_override=attrs["divisor_override"] or None)
    (y,) = run(Case("avg_pool_2d", [x], attrs))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    dy = np.random.default_rng(seed + 1).standard_normal(y.shape)
    (gx,) = torch.autograd.grad(ty, (tx,), torch.tensor(dy))
    (dx,) = run(Case("avg_pool_2d_grad", [x, dy], attrs))
    np.testing.assert_allclose(dx, gx.numpy(), rtol=1e-5, atol=1e-5)


@needs_torch
@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 9), st.integers(1, 9))
def test_adaptive_avg_pool_matches_torch(h, w, oh, ow):
    rng = np.random.default_rng(h * 100 + w)
    x = rng.standard_normal((2, 3, h, w))
    tx = torch.tensor(x, requires_grad=True)
    ty = F.adaptive_avg_pool2d(tx, (oh, ow))
    (y,) = run(Case("adaptive_avg_pool2d", [x], {"output_size": (oh, ow)}))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    dy = rng.standard_normal(y.shape)
    (gx,) = torch.autograd.grad(ty, (tx,), torch.tensor(dy))
    (dx,) = run(Case("adaptive_avg_pool2d_grad", [x, dy], {"output_size": (oh, ow)}))
    np.testing.assert_allclose(dx, gx.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,shape,attrs,error,message", [
    ("max_pool_2d", (1, 1, 5, 5), {"kernel_size": 3, "padding": 2}, ValueError,
     r"max_pool_2d: padding \(2, 2\) must be at most half of kernel_size \(3, 3\)"),
    ("avg_pool_2d", (1, 1, 2, 5), {"kernel_size": 3}, ValueError,
     r"avg_pool_2d: the window \(extent 3 along H\) is larger than the padded input "
     r"\(2 \+ 2 \* 0\)"),
    ("max_pool_2d", (1, 5, 5), {"kernel_size": 2}, ValueError,
     r"max_pool_2d: the input must be 4-D \[N, C, H, W\], got shape \(1, 5, 5\)"),
    ("adaptive_avg_pool2d", (1, 1, 2, 5), {"output_size": (0, 1)}, ValueError,
     r"adaptive_avg_pool2d: output_size must be >= 1"),
    ("avg_pool_2d", (1, 1, 4, 4), {"kernel_size": 2, "divisor_override": -1}, ValueError,
     r"avg_pool_2d: divisor_override must be an int >= 0"),
    ("max_pool_2d", (1, 1, 4, 4), {"kernel_size": 2, "return_index": True}, ValueError,
     r"max_pool_2d: unknown attribute\(s\) return_index"),
    ("flatten", (2, 3), {"start_dim": 1, "end_dim": 0}, ValueError,
     r"flatten: start_dim 1 comes after end_dim 0"),
])
def test_bad_input_names_the_op(op, shape, attrs, error, message):
    with pytest.raises(error, match=message):
        make_node(Case(op, [np.zeros(shape, np.float32)], attrs))


@needs_torch
@pytest.mark.parametrize("name,kw", [
    ("max_pool2d", dict(kernel_size=3, stride=3, ceil_mode=True)),
    ("avg_pool2d", dict(kernel_size=3, stride=3, ceil_mode=True)),
    ("max_pool2d", dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True)),
    ("avg_pool2d", dict(kernel_size=7, stride=5, padding=2, ceil_mode=True,
                        count_include_pad=False))])
def test_ceil_mode_keeps_a_window_longer_than_the_padded_input_as_torch(name, kw):
    """PyTorch's ``pooling_output_shape``: with ``ceil_mode`` a window that starts in the input
    counts even where it is longer than the padded input (a 2 x 2 input, a 3 x 3 window: one
    output); it was refused ("the window is larger than the padded input")."""
    x = np.arange(4, dtype=np.float64).reshape(1, 1, 2, 2)
    module = {"max_pool2d": mf.nn.MaxPool2d, "avg_pool2d": mf.nn.AvgPool2d}[name]
    want = getattr(F, name)(torch.tensor(x), **kw).numpy()
    np.testing.assert_allclose(module(**kw)(mf.tensor(x)).numpy(), want, rtol=1e-12)


def test_max_pool_grad_checks_its_indices():
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(TypeError, match=r"max_pool_2d_grad: indice %in1 \(f32\[1,1,2,2\]\) must "
                                        r"be i64\[1, 1, 2, 2\]"):
        make_node(Case("max_pool_2d_grad", [x, np.zeros((1, 1, 2, 2), np.float32),
                                            np.zeros((1, 1, 2, 2), np.float32)],
                       {"kernel_size": 2}))


# ----------------------------------------------------------------------------- zero-size inputs
_POOLS = {"MaxPool2d": ({"kernel_size": 2}, "max_pool_2d"),
          "AvgPool2d": ({"kernel_size": 2}, "avg_pool_2d"),
          "AdaptiveAvgPool2d": ({"output_size": 3}, "adaptive_avg_pool2d")}
"""nn class -> (constructor arguments, op type)."""

_ZERO_SHAPES = [(0, 3, 8, 8), (2, 0, 8, 8), (0, 0, 8, 8), (2, 3, 0, 8), (2, 3, 8, 0)]


@needs_torch
@pytest.mark.parametrize("shape", _ZERO_SHAPES, ids=str)
@pytest.mark.parametrize("name", list(_POOLS))
def test_zero_size_inputs_pool_or_raise_as_torch(name, shape):
    """PyTorch's pools on inputs with a 0 dim (``torch/_meta_registrations.py``'s shape checks):
    an empty batch pools to an empty batch; ``max_pool2d`` / ``avg_pool2d`` refuse an empty C,
    H or W ("non-zero size for non-batch dimensions"), ``adaptive_avg_pool2d`` an empty H or W
    (its 0 channels pool to 0 channels)."""
    kw, op = _POOLS[name]
    mine = getattr(mf.nn, name)(**kw)
    try:
        want = tuple(getattr(torch.nn, name)(**kw)(torch.zeros(shape)).shape)
    except RuntimeError:
        want = None
    x = np.zeros(shape, np.float32)
    if want is None:
        with pytest.raises(ValueError, match=rf"{op}: the input"):
            mine(mf.tensor(x))
        with pytest.raises(ValueError, match=rf"{op}: the input"):
            EvalGraph(mine)(x)
    else:
        assert mine(mf.tensor(x)).shape == want
        assert EvalGraph(mine)(x).shape == want


def test_a_pool_names_the_empty_dim():
    with pytest.raises(ValueError, match=r"max_pool_2d: the input \[N, C, H, W\] = \[2, 0, 8, 8\] "
                                         r"has an empty C dim; only the batch \(N\) may be 0"):
        mf.nn.MaxPool2d(2)(mf.tensor(np.zeros((2, 0, 8, 8), np.float32)))
    with pytest.raises(ValueError, match=r"avg_pool_2d: .* has an empty W dim"):
        mf.nn.AvgPool2d(1)(mf.tensor(np.zeros((2, 3, 8, 0), np.float32)))


@needs_torch
@pytest.mark.parametrize("name,kw", [("MaxPool2d", {"kernel_size": 2}),
                                     ("MaxPool2d", {"kernel_size": 3, "stride": 1, "padding": 1,
                                                    "return_indices": True}),
                                     ("AvgPool2d", {"kernel_size": 2, "ceil_mode": True}),
                                     ("AdaptiveAvgPool2d", {"output_size": (2, None)})])
def test_an_unbatched_input_pools_as_torch(name, kw):
    """The pools take ``[C, H, W]`` as well as ``[N, C, H, W]`` (PyTorch's ``MaxPool2d`` /
    ``AvgPool2d`` / ``AdaptiveAvgPool2d`` docs: "Input: (N, C, H_in, W_in) or (C, H_in,
    W_in)"), giving ``[C, OH, OW]`` (and the indices of that shape), in eager mode and in a
    graph."""
    x = np.random.default_rng(5).standard_normal((3, 7, 6)).astype(np.float32)
    want = getattr(torch.nn, name)(**kw)(torch.tensor(x))
    mine = getattr(mf.nn, name)(**kw)
    for got in (mine(mf.tensor(x)), EvalGraph(mine)(x)):
        pairs = zip(got, want) if kw.get("return_indices") else [(got, want)]
        for g, w in pairs:
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)


def test_a_pool_input_of_another_rank_names_the_pool():
    with pytest.raises(ValueError, match=r"max_pool2d: expected a 3-D \(unbatched\) \[C, H, W\] "
                                         r"or 4-D \(batched\) \[N, C, H, W\] input, but got "
                                         r"input of shape \[7, 6\]"):
        mf.nn.MaxPool2d(2)(mf.tensor(np.zeros((7, 6), np.float32)))


def test_a_zero_divisor_override_is_refused_as_pytorch():
    """``nn.AvgPool2d(2, divisor_override=0)`` averaged silently (0 was taken as "not set");
    PyTorch raises "divisor must be not zero": at construction here, and in the functional
    form; a divisor that is not an int is PyTorch's TypeError."""
    x = mf.tensor(np.ones((1, 1, 4, 4), np.float32))
    with pytest.raises(RuntimeError, match=r"avg_pool2d: divisor must be not zero "
                                           r"\(divisor_override=0\)"):
        mf.nn.AvgPool2d(2, divisor_override=0)
    with pytest.raises(RuntimeError, match="divisor must be not zero"):
        mf.nn.functional.avg_pool2d(x, 2, divisor_override=0)
    for bad in (2.5, True):
        with pytest.raises(TypeError, match=rf"argument 'divisor_override' must be int, not "
                                            rf"{type(bad).__name__}"):
            mf.nn.AvgPool2d(2, divisor_override=bad)
    np.testing.assert_array_equal(mf.nn.AvgPool2d(2, divisor_override=3)(x).numpy(),
                                  np.full((1, 1, 2, 2), 4 / 3, np.float32))
