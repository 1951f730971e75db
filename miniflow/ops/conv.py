"""Convolutions (NCHW): ``conv2d`` and its gradients ``conv_data_grad``, ``conv_filter_grad``,
``conv_bias_grad``, with OneFlow's op names, inputs and attributes
(``oneflow/user/ops/conv_op.cpp``; ``OneFlowUserOps.td``):

* ``conv2d(in [N, C, H, W], weight [O, C/groups, kh, kw]) -> out [N, O, OH, OW]`` {kernel_size,
  strides, padding_before, dilation_rate, groups}:
  ``out[n, o, i, j] = sum_{c, p, q} xpad[n, g*Cg + c, i*sh + p*dh, j*sw + q*dw] * w[o, c, p, q]``
  with ``g = o // (O / groups)`` and ``xpad`` zero-padded by ``padding_before`` on both sides. A
  bias is a separate ``bias_add`` (axis 1), whose gradient on a 4-D input is ``conv_bias_grad``.
* ``conv_data_grad(dy, filter, x_like) -> dx`` (shape of ``x_like``, read for its shape only) and
  ``conv_filter_grad(dy, x) -> filter_diff [dy.C, x.C/groups, kh, kw]``: the adjoints of
  ``conv2d`` in its input and weight (OneFlow's ``conv`` gradient function emits both).
* ``conv_bias_grad(dy [N, C, H, W]) -> [C]``: ``dy`` summed over N, H and W.

All four are in OneFlow's AMP white list: under AMP they run in float16 storage with float32
accumulation. The references are written the obvious way (one ``einsum`` per kernel tap on a
zero-padded copy), the gradients as the adjoints of the forward (scatter what it gathers).
"""
from __future__ import annotations

import numpy as np

from .common import check_arity, check_float, float_samples, fmt, rand
from .geometry import (CHANNELS_FIRST, conv_attrs, conv_data_grad_geometry,
                       conv_filter_grad_geometry, conv_geometry)
from .registry import register

__all__ = ["conv_reference", "conv_data_grad_reference", "conv_filter_grad_reference",
           "CONV_SAMPLE_GEOMETRIES"]


# ----------------------------------------------------------------------------- references
def _taps(g):
    """``(p, q, rows, cols)`` for every kernel tap: the slices of the padded input it reads."""
    for p in range(g.kh):
        for q in range(g.kw):
            rows = slice(p * g.dh, p * g.dh + g.sh * (g.oh - 1) + 1, g.sh)
            cols = slice(q * g.dw, q * g.dw + g.sw * (g.ow - 1) + 1, g.sw)
            yield p, q, rows, cols


def _pad(x, g):
    return np.pad(x, ((0, 0), (0, 0), (g.ph, g.ph), (g.pw, g.pw)))


def _grouped(a, groups):
    """``[N, C, ...]`` as ``[N, groups, C / groups, ...]``."""
    return a.reshape(a.shape[0], groups, a.shape[1] // groups, *a.shape[2:])


def conv_reference(arrays, attrs):
    """``[out] = conv2d(in, weight)`` in float64 (see the module docstring)."""
    x, w = arrays
    g = conv_geometry("conv2d", x.shape, w.shape, attrs)
    xg = _grouped(_pad(x, g), g.groups)                      # [N, G, Cg, Hp, Wp]
    wg = w.reshape(g.groups, g.og, g.cg, g.kh, g.kw)
    out = np.zeros((g.n, g.groups, g.og, g.oh, g.ow))
    for p, q, rows, cols in _taps(g):
        out += np.einsum("ngchw,goc->ngohw", xg[..., rows, cols], wg[..., p, q])
    return [out.reshape(g.y_shape)]


def conv_data_grad_reference(arrays, attrs):
    """``[dx] = conv_data_grad(dy, filter, x_like)``: every product the forward adds into ``out``
    scattered back into the padded input, then the padding cropped."""
    dy, w, x_like = arrays
    g = conv_data_grad_geometry("conv_data_grad", dy.shape, w.shape, x_like.shape, attrs)
    dyg = _grouped(dy, g.groups)                             # [N, G, Og, OH, OW]
    wg = w.reshape(g.groups, g.og, g.cg, g.kh, g.kw)
    dxp = _grouped(np.zeros((g.n, g.c, g.h + 2 * g.ph, g.w + 2 * g.pw)), g.groups)
    for p, q, rows, cols in _taps(g):
        dxp[..., rows, cols] += np.einsum("ngohw,goc->ngchw", dyg, wg[..., p, q])
    dx = dxp.reshape(g.n, g.c, *dxp.shape[3:])
    return [dx[:, :, g.ph:g.ph + g.h, g.pw:g.pw + g.w].copy()]


def conv_filter_grad_reference(arrays, attrs):
    """``[filter_diff] = conv_filter_grad(dy, x)``:
    ``dw[o, c, p, q] = sum_{n, i, j} dy[n, o, i, j] * xpad[n, g*Cg + c, i*sh + p*dh, j*sw + q*dw]``."""
    dy, x = arrays
    g = conv_filter_grad_geometry("conv_filter_grad", dy.shape, x.shape, attrs)
    xg = _grouped(_pad(x, g), g.groups)
    dyg = _grouped(dy, g.groups)
    dw = np.zeros((g.groups, g.og, g.cg, g.kh, g.kw))
    for p, q, rows, cols in _taps(g):
        dw[..., p, q] = np.einsum("ngohw,ngchw->goc", dyg, xg[..., rows, cols])
    return [dw.reshape(g.w_shape)]


# ----------------------------------------------------------------------------- declarations
def _weight_norm(op, arity):
    """OneFlow's attributes with defaults; ``kernel_size`` defaults to the weight's (input 1)."""
    def normalize(inputs, attrs):
        if len(inputs) != arity or len(inputs[1].shape) != 4:
            return attrs            # infer names the problem
        return conv_attrs(op, {"kernel_size": tuple(inputs[1].shape[2:]), **attrs})
    return normalize


def _filter_grad_norm(inputs, attrs):
    """OneFlow's attributes with defaults (``kernel_size`` is required: no weight to read)."""
    return conv_attrs("conv_filter_grad", attrs)


def _conv2d_infer(inputs, attrs):
    check_arity("conv2d", inputs, 2)
    x, w = inputs
    dt = check_float("conv2d", x, w)
    g = conv_geometry("conv2d", x.shape, w.shape, attrs)
    return [(g.y_shape, dt)]


def _conv2d_grad(node, gs, emit):
    x, w = node.inputs
    a = node.attrs
    return [emit("conv_data_grad", gs[0], w, x, **a), emit("conv_filter_grad", gs[0], x, **a)]


def _data_grad_infer(inputs, attrs):
    op = "conv_data_grad"
    check_arity(op, inputs, 3)
    dy, w, x_like = inputs
    dt = check_float(op, dy, w, x_like)
    conv_data_grad_geometry(op, dy.shape, w.shape, x_like.shape, attrs)
    return [(x_like.shape, dt)]


def _filter_grad_infer(inputs, attrs):
    op = "conv_filter_grad"
    check_arity(op, inputs, 2)
    dy, x = inputs
    dt = check_float(op, dy, x)
    g = conv_filter_grad_geometry(op, dy.shape, x.shape, attrs)
    return [(g.w_shape, dt)]


def _bias_grad_norm(inputs, attrs):
    fmt_ = attrs.get("data_format", CHANNELS_FIRST)
    if fmt_ != CHANNELS_FIRST or set(attrs) - {"data_format"}:
        raise ValueError(f"conv_bias_grad: takes only data_format='channels_first', got {attrs}")
    return {}


def _bias_grad_infer(inputs, attrs):
    check_arity("conv_bias_grad", inputs, 1)
    dy = inputs[0]
    dt = check_float("conv_bias_grad", dy)
    if len(dy.shape) != 4:
        raise ValueError(f"conv_bias_grad: dy {fmt(dy)} must be 4-D [N, C, H, W]")
    return [((dy.shape[1],), dt)]


def _bias_grad_ref(arrays, attrs):
    return [arrays[0].sum(axis=(0, 2, 3))]


# ----------------------------------------------------------------------------- samples
def _attrs(k, s=1, p=0, d=1, groups=1) -> dict:
    return {"kernel_size": k, "strides": s, "padding_before": p, "dilation_rate": d,
            "groups": groups}


CONV_SAMPLE_GEOMETRIES = [
    # (label, n, c, h, w, o, attrs)
    ("3x3-pad", 2, 3, 5, 4, 4, _attrs(3, 1, 1)),
    ("stride-dilation-groups", 2, 4, 7, 6, 6, _attrs((3, 2), (2, 1), (1, 2), (1, 2), 2)),
    ("pointwise", 3, 5, 4, 5, 3, _attrs(1)),
    ("1x1-stride2", 2, 4, 5, 5, 3, _attrs(1, 2)),
    ("7x7-stride2-pad3", 1, 1, 7, 7, 2, _attrs(7, 2, 3)),
    ("depthwise", 2, 3, 5, 5, 3, _attrs(3, 1, 1, groups=3)),
    ("stride-larger-than-kernel", 2, 2, 7, 7, 2, _attrs(2, 3, 0)),
    ("winograd-3x3", 1, 1, 12, 16, 2, _attrs(3, 1, 1)),
]
"""Geometries of the samples, reaching every path of the CPU kernels' default choices: padding,
strides (the rows a data gradient skips), dilation, groups, pointwise and strided 1x1 products, a
depthwise convolution, one sample (the per-sample im2col layout), the batched layout (small maps)
and Winograd F(2x2, 3x3) (48 tiles). Small, because the CUDA simulator lane runs them (~1 ms per
simulated thread and tile step; all but ``winograd-3x3``, whose CUDA path is ``3x3-pad``'s:
``tests/cuda_cases.py``); ``tests/test_conv.py`` forces every CPU algorithm on more geometries."""


def conv_sample_inputs(dt, n, c, h, w, o, attrs, seed=0):
    """``x, weight, dy`` of dtype ``dt`` for a convolution (dy shaped like its output)."""
    r = np.random.default_rng(seed)
    kh, kw = conv_attrs("conv2d", attrs)["kernel_size"]
    x = rand(n, c, h, w, dtype=dt, lo=-1.0, hi=1.0, r=r)
    wt = rand(o, c // attrs["groups"], kh, kw, dtype=dt, lo=-1.0, hi=1.0, r=r)
    y_shape = conv_geometry("conv2d", x.shape, wt.shape, attrs).y_shape
    return x, wt, rand(*y_shape, dtype=dt, lo=-1.0, hi=1.0, r=r)


def _samples(op):
    def make(dt):
        out = []
        for k, (_, n, c, h, w, o, attrs) in enumerate(CONV_SAMPLE_GEOMETRIES):
            x, wt, dy = conv_sample_inputs(dt, n, c, h, w, o, attrs, seed=k)
            ins = {"conv2d": [x, wt], "conv_data_grad": [dy, wt, x],
                   "conv_filter_grad": [dy, x]}[op]
            out.append((ins, dict(attrs)))
        return out
    return lambda: float_samples(make)


def _bias_grad_samples():
    def make(dt):
        r = np.random.default_rng(3)
        return [([rand(2, 3, 4, 5, dtype=dt, r=r)], {}), ([rand(1, 2, 1, 1, dtype=dt, r=r)], {}),
                ([np.full((2, 2, 3, 3), 8000.0, dt)], {})]
    return float_samples(make)


_WHITE = "white list (OneFlow): float16 storage, float32 accumulation"

register("conv2d", _conv2d_infer, normalize=_weight_norm("conv2d", 2), grad=_conv2d_grad,
         reference=conv_reference, samples=_samples("conv2d"), amp="white",
         amp_note=_WHITE,
         doc="out = x (*) weight: 2-D cross-correlation, NCHW, with strides, padding, dilation, "
             "groups")
register("conv_data_grad", _data_grad_infer, normalize=_weight_norm("conv_data_grad", 3),
         reference=conv_data_grad_reference,
         samples=_samples("conv_data_grad"), amp="white", amp_note=_WHITE,
         doc="dx = the adjoint of conv2d in its input, applied to dy (x_like: dx's shape)")
register("conv_filter_grad", _filter_grad_infer, normalize=_filter_grad_norm,
         reference=conv_filter_grad_reference,
         samples=_samples("conv_filter_grad"), amp="white", amp_note=_WHITE,
         doc="dw = the adjoint of conv2d in its weight, applied to dy")
register("conv_bias_grad", _bias_grad_infer, normalize=_bias_grad_norm, reference=_bias_grad_ref,
         samples=_bias_grad_samples, amp="white", amp_note=_WHITE,
         doc="db[c] = sum of dy[:, c] over N, H, W (the gradient of bias_add on NCHW)")
