"""Convolutions: the CPU kernels under every algorithm (batched and per-sample im2col, the
transposed filter-gradient products, Winograd F(2x2, 3x3)) against the float64 references on
fixed geometries that reach every path and on random ones (hypothesis), float16 as the float32
path rounded once, the parallel variants; the gradient rules against central finite differences
in float64 (hypothesis over shapes, strides, padding, dilation and groups); PyTorch's forward and
backward in float64 (skipped without torch); and the trace-time errors; ``nn.Conv2d``'s padding
strings checked at construction and zero-size inputs, against ``torch.nn.Conv2d``.

The registry-wide tests run every sample of these ops on both backends too (``test_registry.py``,
``tests/cuda``); this file forces the algorithms those default choices do not reach.
"""
import contextlib
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import miniflow as mf
from miniflow.kernels import cpu
from miniflow.kernels.cpu import conv as cpu_conv
from miniflow.ops.conv import conv_sample_inputs
from miniflow.testing import check_grad, gradient_graph

from op_cases import Case, assert_matches_reference, host_buffers, make_node, run_cpu as run

try:
    import torch
    import torch.nn.functional as F
except ImportError:   # torch is optional: its comparisons skip
    torch = F = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

FLOATS = [np.float16, np.float32, np.float64]
ALGORITHMS = ["batched", "per-sample", "winograd"]


def attrs(k, s=1, p=0, d=1, groups=1):
    return {"kernel_size": k, "strides": s, "padding_before": p, "dilation_rate": d,
            "groups": groups}


GEOMETRIES = [
    # (label, n, c, h, w, o, attrs)
    ("3x3-pad", 2, 3, 7, 6, 4, attrs(3, 1, 1)),
    ("3x3-no-pad-odd", 2, 3, 7, 9, 2, attrs(3)),
    ("stride-dilation-groups", 2, 4, 9, 8, 6, attrs((3, 2), (2, 1), (1, 2), (1, 2), 2)),
    ("pointwise", 3, 5, 4, 5, 3, attrs(1)),
    ("pointwise-groups", 2, 6, 3, 4, 4, attrs(1, groups=2)),
    ("1x1-stride2", 2, 4, 7, 7, 3, attrs(1, 2)),
    ("7x7-stride2-pad3", 1, 2, 11, 10, 3, attrs(7, 2, 3)),
    ("depthwise", 2, 3, 5, 5, 3, attrs(3, 1, 1, groups=3)),
    ("stride-larger-than-kernel", 2, 2, 9, 9, 2, attrs(2, 3, 0)),
    ("3x3-pad2", 2, 2, 6, 5, 3, attrs(3, 1, 2)),
    ("batch-1", 1, 3, 6, 6, 2, attrs(3, 2, 1)),
    ("1x1-map-3x3-pad1", 3, 4, 1, 1, 2, attrs(3, 1, 1)),
    ("2x2-map-3x3-s2-pad1", 2, 2, 2, 3, 3, attrs(3, 2, 1)),
]
"""Geometries reaching every convolution path under each forced algorithm: padding (also 2,
Winograd's data gradient limit), strides (the rows a data gradient skips), dilation, groups,
pointwise and strided 1x1 products, a depthwise convolution, one sample, odd output sizes (the
Winograd tiles cut at the edge), and maps so small that padding hides kernel taps."""


@contextlib.contextmanager
def algorithm(name):
    """Force the CPU convolutions' algorithm: im2col GEMMs over the whole batch or per sample
    (``BATCH_BELOW``; per sample also with the transposed filter-gradient products wherever
    ``K > O/G``, ``TRANSPOSED_FROM``), or Winograd F(2x2, 3x3) wherever it applies
    (``WINOGRAD_FROM``). The builders read these when the plan is built."""
    below = 1 << 30 if name == "batched" else 0
    wino = 1 if name == "winograd" else 1 << 30
    transposed = 1 if name == "per-sample" else 1 << 30
    with mock.patch.object(cpu_conv, "BATCH_BELOW", below), \
            mock.patch.object(cpu_conv, "WINOGRAD_FROM", wino), \
            mock.patch.object(cpu_conv, "TRANSPOSED_FROM", transposed):
        yield


def cases(x, w, dy, a):
    """The four convolution ops on one geometry."""
    return [Case("conv2d", [x, w], a), Case("conv_data_grad", [dy, w, x], a),
            Case("conv_filter_grad", [dy, x], a), Case("conv_bias_grad", [dy], {})]


def step_names(case) -> set:
    node = make_node(case)
    ins, outs = host_buffers(case, node)
    return {getattr(fn, "__name__", "") for fn, _ in cpu.builder_for(node.op)(node, ins, outs)}


# ----------------------------------------------------------------------------- fixed cases
@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.__name__)
@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda g: g[0])
def test_kernels_match_the_reference(geo, dt, algo):
    _, n, c, h, w, o, a = geo
    with algorithm(algo):
        for case in cases(*conv_sample_inputs(dt, n, c, h, w, o, a), a):
            assert_matches_reference(case, run(case))


def test_winograd_is_used_exactly_for_3x3_stride_1_without_groups():
    """The "winograd" algorithm really reaches the Winograd kernels, and only where it applies
    (its 16 GEMMs are one ``np.matmul`` step)."""
    from miniflow.kernels.common.conv import live_taps
    from miniflow.ops.geometry import conv_geometry
    for label, n, c, h, w, o, a in GEOMETRIES:
        x, wt, dy = conv_sample_inputs(np.float32, n, c, h, w, o, a)
        uncropped = live_taps(conv_geometry("conv2d", x.shape, wt.shape, a)) is None
        applies = a["kernel_size"] == 3 and a["strides"] == 1 and a["dilation_rate"] == 1 \
            and a["groups"] == 1 and uncropped
        with algorithm("winograd"):
            for case in cases(x, wt, dy, a)[:3]:
                data_grad_pad_ok = case.op != "conv_data_grad" or np.max(a["padding_before"]) <= 2
                assert ("matmul" in step_names(case)) == (applies and data_grad_pad_ok), \
                    (label, case.op)


def test_taps_hidden_by_padding_are_cropped():
    """On a 1x1 map a padded 3x3 kernel reads only its centre; on a 2x2 map with stride 2 the
    single output reads rows and columns 0-1 of the input through taps 1-2."""
    from miniflow.kernels.common.conv import cropped, live_taps
    from miniflow.ops.geometry import conv_geometry
    one = conv_geometry("conv2d", (2, 4, 1, 1), (2, 4, 3, 3), attrs(3, 1, 1))
    assert live_taps(one) == (1, 2, 1, 2)
    small = cropped(one, live_taps(one))
    assert (small.kh, small.kw, small.ph, small.pw, small.oh, small.ow) == (1, 1, 0, 0, 1, 1)
    two = conv_geometry("conv2d", (2, 2, 2, 2), (3, 2, 3, 3), attrs(3, 2, 1))
    assert live_taps(two) == (1, 3, 1, 3)
    assert live_taps(conv_geometry("conv2d", (1, 1, 5, 5), (1, 1, 3, 3), attrs(3, 1, 1))) is None
    x, wt, _ = conv_sample_inputs(np.float32, 3, 4, 1, 1, 2, attrs(3, 1, 1))
    assert "copyto" in step_names(Case("conv2d", [x, wt], attrs(3, 1, 1)))


def test_default_choice_by_size():
    """Without forcing: Winograd from 48 tiles of 2x2 outputs, the batched layout below 128
    outputs per sample (with more than one sample), per sample otherwise."""
    small = conv_sample_inputs(np.float32, 2, 2, 6, 6, 2, attrs(3, 1, 1))
    big = conv_sample_inputs(np.float32, 2, 2, 12, 16, 2, attrs(3, 1, 1))
    assert "matmul" not in step_names(Case("conv2d", small[:2], attrs(3, 1, 1)))
    assert "matmul" in step_names(Case("conv2d", big[:2], attrs(3, 1, 1)))
    g = lambda n, hw: cpu_conv._Conv(mf.ops.geometry.conv_geometry(  # noqa: E731
        "conv2d", (n, 2, hw, hw), (2, 2, 1, 1), {}), np.float32).batched
    assert g(2, 11) and not g(2, 12) and not g(1, 4)


def test_parallel_variants():
    """Every algorithm with its parallel kernels (chosen for big arrays when BLAS has one
    thread)."""
    with mock.patch.object(cpu_conv, "use_parallel", lambda size: True):
        for dt in (np.float16, np.float32):
            for _, n, c, h, w, o, a in GEOMETRIES[:4]:
                for algo in ALGORITHMS:
                    with algorithm(algo):
                        for case in cases(*conv_sample_inputs(dt, n, c, h, w, o, a), a):
                            assert_matches_reference(case, run(case))


def test_float16_is_the_float32_path_rounded_once():
    """float16 storage computes exactly what float32 computes on the widened inputs, rounded
    once: no arithmetic in float16, no double rounding."""
    for algo in ALGORITHMS:
        with algorithm(algo):
            for _, n, c, h, w, o, a in GEOMETRIES:
                for case in cases(*conv_sample_inputs(np.float16, n, c, h, w, o, a), a):
                    wide = Case(case.op, [x.astype(np.float32) for x in case.inputs], case.attrs)
                    (got16,), (got32,) = run(case), run(wide)
                    np.testing.assert_array_equal(got16, got32.astype(np.float16),
                                                  err_msg=f"{algo} {case.op}")


@st.composite
def geometries(draw):
    """``(n, c, h, w, o, attrs)`` of a small valid convolution: groups, kernel, stride, padding
    and dilation drawn independently, the input at least as large as the window."""
    groups = draw(st.integers(1, 3))
    c, o = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 7))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 7))
    n = draw(st.integers(1, 2))
    return n, c, h, w, o, attrs((kh, kw), (sh, sw), (ph, pw), (dh, dw), groups)


@settings(max_examples=40, deadline=None)
@given(geometries(), st.sampled_from(FLOATS), st.sampled_from(ALGORITHMS))
def test_random_geometries_match_the_reference(geo, dt, algo):
    n, c, h, w, o, a = geo
    with algorithm(algo):
        for case in cases(*conv_sample_inputs(dt, n, c, h, w, o, a, seed=n * c + h), a):
            assert_matches_reference(case, run(case))


# ----------------------------------------------------------------------------- gradients
@settings(max_examples=25, deadline=None)
@given(geometries())
def test_gradients_match_finite_differences(geo):
    """The gradient rule (conv_data_grad, conv_filter_grad through the autograd pass and a plan)
    against central differences of the float64 forward."""
    n, c, h, w, o, a = geo
    x, wt, _ = conv_sample_inputs(np.float64, n, c, h, w, o, a, seed=h * w)
    check_grad("conv2d", [x, wt], a)


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_gradient_kernels_are_the_adjoints_under_every_algorithm(algo):
    """<dy, conv(x + eps v)> - <dy, conv(x - eps v)> = 2 eps <dx, v> (and for w), with the
    forward and both gradient kernels forced to one algorithm."""
    rng = np.random.default_rng(5)
    with algorithm(algo):
        for _, n, c, h, w, o, a in GEOMETRIES:
            x, wt, dy = conv_sample_inputs(np.float64, n, c, h, w, o, a, seed=7)
            (dx,) = run(Case("conv_data_grad", [dy, wt, x], a))
            (dw,) = run(Case("conv_filter_grad", [dy, x], a))
            for grad, vary in ((dx, 0), (dw, 1)):
                v = rng.standard_normal(grad.shape)
                ins = [x, wt]

                def f(sign):
                    moved = list(ins)
                    moved[vary] = ins[vary] + sign * 1e-6 * v
                    return float(np.sum(dy * run(Case("conv2d", moved, a))[0]))
                fd = (f(1) - f(-1)) / 2e-6
                assert abs(fd - np.sum(grad * v)) <= 1e-6 * (1 + abs(fd))


# ----------------------------------------------------------------------------- PyTorch
@needs_torch
@settings(max_examples=30, deadline=None)
@given(geometries(), st.booleans())
def test_forward_and_backward_match_torch_in_float64(geo, bias):
    """conv2d (+ bias_add) and its gradients through autograd and a plan, against
    ``torch.nn.functional.conv2d`` and ``torch.autograd`` in float64, to 1e-5."""
    n, c, h, w, o, a = geo
    x, wt, _ = conv_sample_inputs(np.float64, n, c, h, w, o, a, seed=o * c)
    b = np.random.default_rng(1).standard_normal(o)
    g, plan, _ = gradient_graph("conv2d", [x, wt], a, seed=3)
    loss, gx, gw = plan.run([])
    weights = next(iter(g.constant_data.values()))          # the fixed random w of the loss
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(wt, requires_grad=True)
    ty = F.conv2d(tx, tw, stride=a["strides"], padding=a["padding_before"],
                  dilation=a["dilation_rate"], groups=a["groups"])
    tl = (ty * torch.tensor(weights)).sum()
    tgx, tgw = torch.autograd.grad(tl, (tx, tw))
    for got, want in ((loss, tl), (gx, tgx), (gw, tgw)):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-5)
    if bias:   # the bias gradient of sum((conv(x) + b) * weights): conv_bias_grad(weights)
        (gb,) = run(Case("conv_bias_grad", [weights], {}))
        tb = torch.tensor(b, requires_grad=True)
        ty = F.conv2d(tx, tw, tb, stride=a["strides"], padding=a["padding_before"],
                      dilation=a["dilation_rate"], groups=a["groups"])
        (tgb,) = torch.autograd.grad((ty * torch.tensor(weights)).sum(), (tb,))
        np.testing.assert_allclose(gb, tgb.numpy(), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- errors
class ConvGraph(mf.nn.Graph):
    """Calls ``nn.functional.conv2d`` in build (traced: errors come from the op's inference)."""

    def __init__(self, weight, **kw):
        super().__init__()
        self.weight, self.kw = weight, kw

    def build(self, x):
        return mf.nn.functional.conv2d(x, mf.tensor(self.weight), **self.kw)


@pytest.mark.parametrize("x_shape,w_shape,kw,message", [
    ((1, 4, 5, 5), (2, 3, 3, 3), {},
     r"conv2d: the input has 4 channels but the weight expects 3 \* groups 1 = 3"),
    ((1, 3, 2, 5), (2, 3, 3, 3), {},
     r"conv2d: the kernel \(extent 3 = dilation 1 \* \(kernel 3 - 1\) \+ 1 along H\) is larger "
     r"than the padded input \(2 \+ 2 \* 0\)"),
    ((1, 3, 4, 4), (2, 3, 3, 3), {"dilation": 2, "padding": 0},
     r"conv2d: the kernel \(extent 5 = dilation 2 \* \(kernel 3 - 1\) \+ 1 along H\)"),
    ((5, 5), (2, 3, 3, 3), {},
     r"conv2d: expected a 3-D \(unbatched\) \[C, H, W\] or 4-D \(batched\) \[N, C, H, W\] "
     r"input, but got input of shape \[5, 5\] \(2-D\)"),
    ((1, 3, 5, 5), (2, 3, 3), {},
     r"conv2d: the weight must be 4-D \[N, C, H, W\], got shape \(2, 3, 3\)"),
    ((1, 4, 5, 5), (3, 2, 3, 3), {"groups": 2},
     r"conv2d: groups=2 must divide the input channels \(4\) and the output channels \(3\)"),
    ((1, 3, 5, 5), (2, 3, 3, 3), {"stride": 0}, r"conv2d: strides must be >= 1, got 0"),
])
def test_bad_input_raises_at_trace_time_naming_the_op_and_shapes(x_shape, w_shape, kw, message):
    graph = ConvGraph(np.zeros(w_shape, np.float32), **kw)
    with pytest.raises(ValueError, match=message):
        graph(np.zeros(x_shape, np.float32))
    assert graph.compile_count == 0                # raised while tracing, before any plan


def test_gradient_ops_check_their_shapes():
    dy, w, x = np.zeros((1, 2, 4, 4)), np.zeros((2, 3, 3, 3)), np.zeros((1, 3, 5, 5))
    with pytest.raises(ValueError, match=r"conv_data_grad: dy has shape \(1, 2, 4, 4\), but the "
                                         r"convolution of \(1, 3, 5, 5\) with a \(2, 3, 3, 3\) "
                                         r"weight gives \(1, 2, 3, 3\)"):
        make_node(Case("conv_data_grad", [dy, w, x], {}))
    with pytest.raises(ValueError, match=r"conv_filter_grad: attribute kernel_size is required"):
        make_node(Case("conv_filter_grad", [dy, x], {}))
    with pytest.raises(ValueError, match=r"conv_bias_grad: dy .* must be 4-D"):
        make_node(Case("conv_bias_grad", [np.zeros((2, 3))], {}))
    with pytest.raises(TypeError, match=r"conv2d: inputs have different dtypes"):
        make_node(Case("conv2d", [x.astype(np.float32), w], {}))
    with pytest.raises(ValueError, match=r"conv2d: data_format='channels_last' is not supported"):
        make_node(Case("conv2d", [x, w], {"data_format": "channels_last"}))


def test_empty_batch_gives_zero_filter_and_bias_gradients():
    a = attrs(3, 1, 1)
    dy, x = np.zeros((0, 2, 4, 4), np.float32), np.zeros((0, 3, 4, 4), np.float32)
    (dw,) = run(Case("conv_filter_grad", [dy, x], a))
    (db,) = run(Case("conv_bias_grad", [dy], {}))
    assert dw.shape == (2, 3, 3, 3) and not dw.any() and db.shape == (2,) and not db.any()


# ----------------------------------------------------------------------------- nn.Conv2d arguments
@pytest.mark.parametrize("kw,message", [
    (dict(padding="foo"), r"Conv2d: padding must be an int, a pair, 'valid' or 'same', got 'foo'"),
    (dict(padding="same", stride=2), r"Conv2d: padding='same' is only supported with stride 1, "
                                     r"got stride=\(2, 2\)"),
    (dict(padding="same", stride=(1, 2)), r"only supported with stride 1, got stride=\(1, 2\)"),
    (dict(padding="same", kernel_size=4), r"Conv2d: padding='same' needs an odd dilated kernel"),
])
def test_conv2d_checks_string_padding_at_construction(kw, message):
    """``torch.nn.Conv2d.__init__`` (``_ConvNd``) refuses a padding string other than 'valid' /
    'same' and 'same' with a stride; miniflow also refuses 'same' with an even dilated kernel
    there (it pads symmetrically only)."""
    kw = {"kernel_size": 3, **kw}
    with pytest.raises(ValueError, match=message):
        mf.nn.Conv2d(3, 33, **kw)
    if torch is not None and kw.get("kernel_size") != 4:
        with pytest.raises(ValueError):
            torch.nn.Conv2d(3, 33, **kw)


def test_conv2d_with_valid_and_same_padding_constructs_and_runs():
    x = mf.tensor(np.zeros((1, 3, 8, 8), np.float32))
    for padding, size in (("valid", 6), ("same", 8)):
        conv = mf.nn.Conv2d(3, 4, 3, padding=padding, dilation=1)
        assert conv.padding == padding and conv(x).shape == (1, 4, size, size)


@needs_torch
@pytest.mark.parametrize("shape", [(0, 3, 8, 8), (0, 3, 2, 2)], ids=str)
def test_an_empty_batch_convolves_to_an_empty_batch_as_torch(shape):
    conv, ref = mf.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(3, 4, 3, padding=1)
    y = conv(mf.tensor(np.zeros(shape, np.float32)))
    assert y.shape == tuple(ref(torch.zeros(shape)).shape) == (0, 4, *shape[2:])


@pytest.mark.parametrize("shape,message", [
    ((2, 0, 8, 8), r"conv2d: the input has 0 channels but the weight expects 3"),
    ((2, 3, 0, 8), r"conv2d: the kernel \(extent 3 .* along H\) is larger than the"),
])
def test_an_empty_channel_or_plane_is_refused_as_torch_refuses_it(shape, message):
    conv = mf.nn.Conv2d(3, 4, 3)
    with pytest.raises(ValueError, match=message):
        conv(mf.tensor(np.zeros(shape, np.float32)))
    if torch is not None:
        with pytest.raises(RuntimeError):
            torch.nn.Conv2d(3, 4, 3)(torch.zeros(shape))


@needs_torch
@pytest.mark.parametrize("bias", [True, False])
def test_an_unbatched_input_convolves_as_torch(bias):
    """``nn.Conv2d`` takes ``[C, H, W]`` as well as ``[N, C, H, W]`` (PyTorch's ``Conv2d`` doc:
    "Input: (N, C_in, H_in, W_in) or (C_in, H_in, W_in)"; ``test_nn.py``'s
    ``test_conv_modules_raise_error_on_incorrect_input_size`` / unbatched module tests): the
    output, and the gradients of a training step, are PyTorch's."""
    torch.manual_seed(0)
    ref = torch.nn.Conv2d(3, 4, 3, padding=1, bias=bias)
    conv = mf.nn.Conv2d(3, 4, 3, padding=1, bias=bias)
    conv.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    x = np.random.default_rng(3).standard_normal((3, 6, 5)).astype(np.float32)
    want = ref(torch.tensor(x))
    np.testing.assert_allclose(conv(mf.tensor(x)).numpy(), want.detach().numpy(), rtol=1e-5,
                               atol=1e-5)
    want.square().sum().backward()

    class Step(mf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.conv = conv
            self.add_optimizer(mf.optim.SGD(conv.parameters(), lr=1.0))

        def build(self, a):
            y = self.conv(a)
            (y * y).sum().backward()
            return y

    before = {k: v.copy() for k, v in conv.state_dict().items()}
    assert Step()(mf.tensor(x)).shape == (4, 6, 5)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(before[name] - conv.state_dict()[name], p.grad.numpy(),
                                   rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("shape", [(8, 8), (1, 1, 3, 8, 8)], ids=str)
def test_an_input_of_another_rank_names_conv2d_and_the_ranks_it_takes(shape):
    with pytest.raises(ValueError, match=r"conv2d: expected a 3-D \(unbatched\) \[C, H, W\] or "
                                         r"4-D \(batched\) \[N, C, H, W\] input, but got input "
                                         rf"of shape \[{', '.join(map(str, shape))}\]"):
        mf.nn.Conv2d(3, 4, 3)(mf.tensor(np.zeros(shape, np.float32)))
