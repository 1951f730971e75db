"""Pooling (NCHW) and ``flatten``, with OneFlow's op names, inputs and attributes
(``oneflow/user/ops/max_pool_op.cpp``, ``avg_pool_op.cpp``, ``adaptive_pool_op.cpp``,
``flatten_op.cpp``; ``OneFlowBase.td``):

* ``max_pool_2d(x) -> y, indice`` {kernel_size, stride, padding, dilation, ceil_mode}: each
  window's max (padding counts as ``-inf``) and the int64 flat index ``ih * W + iw`` in its
  ``H*W`` plane of the first maximum in scan order (rows, then columns); a NaN wins, and a later
  NaN replaces it (OneFlow's and PyTorch's ``val > max || isnan(val)``). A window with no element
  inside the input (possible only with dilation) gives ``-inf`` and index -1.
  ``max_pool_2d_grad(x, indice, dy) -> dx`` adds each ``dy`` to the element its index names.
* ``avg_pool_2d(x) -> y`` {kernel_size, stride, padding, ceil_mode, count_include_pad,
  divisor_override}: each window's sum over the input divided by ``divisor_override``, else the
  window's size clipped to the padded input (``count_include_pad``, PyTorch's default True) or
  to the input. ``avg_pool_2d_grad(x, dy) -> dx`` spreads each ``dy / divisor`` over its window.
* ``adaptive_avg_pool2d(x) -> y`` {output_size}: cell ``(i, j)`` is the mean of
  ``x[..., floor(i H / OH):ceil((i + 1) H / OH), floor(j W / OW):ceil((j + 1) W / OW)]``
  (PyTorch's windows); ``adaptive_avg_pool2d_grad(x, dy) -> dx`` is its adjoint.
* ``flatten(x) -> out`` {start_dim 0, end_dim -1}: dims ``start_dim .. end_dim`` merged into one.

A missing ``stride`` defaults to ``kernel_size`` (PyTorch); ``ceil_mode`` follows PyTorch (the
last window must start inside the input or its left padding). AMP lists (OneFlow): max pools are
clear, average pools gray; ``adaptive_avg_pool2d`` and ``flatten`` are in no list.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..dtype import int64
from .common import check_arity, check_float, float_samples, fmt, rand
from .geometry import adaptive_attrs, adaptive_output_size, adaptive_window, pool_attrs, \
    pool_geometry
from .registry import register

__all__ = ["max_pool_reference", "avg_pool_reference", "avg_divisors", "POOL_SAMPLE_ATTRS"]


# ----------------------------------------------------------------------------- references
def _windows(g):
    """``(i, j, [(ih, iw), ...])`` for every output cell: the in-range input positions of its
    window, in scan order (rows, then columns)."""
    for i in range(g.oh):
        for j in range(g.ow):
            cells = [(i * g.sh - g.ph + p * g.dh, j * g.sw - g.pw + q * g.dw)
                     for p in range(g.kh) for q in range(g.kw)]
            yield i, j, [(a, b) for a, b in cells if 0 <= a < g.h and 0 <= b < g.w]


def max_pool_reference(arrays, attrs):
    """``[y, indice] = max_pool_2d(x)`` in float64 (indices int64)."""
    (x,) = arrays
    g = pool_geometry("max_pool_2d", x.shape, attrs, avg=False)
    y = np.full(g.y_shape, -np.inf)
    ind = np.full(g.y_shape, -1, np.int64)
    for i, j, cells in _windows(g):
        for a, b in cells:
            v = x[:, :, a, b]
            take = (ind[:, :, i, j] < 0) | (v > y[:, :, i, j]) | np.isnan(v)
            y[:, :, i, j] = np.where(take, v, y[:, :, i, j])
            ind[:, :, i, j] = np.where(take, a * g.w + b, ind[:, :, i, j])
    return [y, ind]


def _max_pool_grad_ref(arrays, attrs):
    """``[dx]``: each ``dy`` added at the index its window picked; -1 adds nothing."""
    x, ind, dy = arrays
    g = pool_geometry("max_pool_2d_grad", x.shape, attrs, avg=False)
    dx = np.zeros((g.planes, g.h * g.w))
    flat_ind, flat_dy = ind.astype(np.int64).reshape(g.planes, -1), dy.reshape(g.planes, -1)
    for pl in range(g.planes):
        keep = flat_ind[pl] >= 0
        np.add.at(dx[pl], flat_ind[pl][keep], flat_dy[pl][keep])
    return [dx.reshape(x.shape)]


def avg_divisors(g, attrs: dict) -> np.ndarray:
    """The divisor of every output cell, ``[OH, OW]`` (PyTorch's ``avg_pool2d``):
    ``divisor_override`` if set, else the window clipped to the padded input
    (``count_include_pad``) or to the input. Used by the reference and the CPU kernels."""
    i, j = np.arange(g.oh)[:, None], np.arange(g.ow)[None, :]
    hs, ws = i * g.sh - g.ph, j * g.sw - g.pw
    he, we = np.minimum(hs + g.kh, g.h + g.ph), np.minimum(ws + g.kw, g.w + g.pw)
    if attrs["divisor_override"]:
        return np.full((g.oh, g.ow), float(attrs["divisor_override"]))
    if attrs["count_include_pad"]:
        return ((he - hs) * (we - ws)).astype(np.float64)
    return ((np.minimum(he, g.h) - np.maximum(hs, 0))
            * (np.minimum(we, g.w) - np.maximum(ws, 0))).astype(np.float64)


def avg_pool_reference(arrays, attrs):
    """``[y] = avg_pool_2d(x)`` in float64."""
    (x,) = arrays
    g = pool_geometry("avg_pool_2d", x.shape, attrs, avg=True)
    y = np.zeros(g.y_shape)
    for i, j, cells in _windows(g):
        for a, b in cells:
            y[:, :, i, j] += x[:, :, a, b]
    return [y / avg_divisors(g, attrs)]


def _avg_pool_grad_ref(arrays, attrs):
    """``[dx]``: each ``dy / divisor`` added to every input element of its window."""
    x, dy = arrays
    g = pool_geometry("avg_pool_2d_grad", x.shape, attrs, avg=True)
    share = dy / avg_divisors(g, attrs)
    dx = np.zeros(x.shape)
    for i, j, cells in _windows(g):
        for a, b in cells:
            dx[:, :, a, b] += share[:, :, i, j]
    return [dx]


def _adaptive_ref(arrays, attrs):
    (x,) = arrays
    oh, ow = attrs["output_size"]
    h, w = x.shape[2:]
    y = np.empty((*x.shape[:2], oh, ow))
    for i in range(oh):
        hs, he = adaptive_window(i, h, oh)
        for j in range(ow):
            ws, we = adaptive_window(j, w, ow)
            y[:, :, i, j] = x[:, :, hs:he, ws:we].mean(axis=(2, 3))
    return [y]


def _adaptive_grad_ref(arrays, attrs):
    x, dy = arrays
    oh, ow = attrs["output_size"]
    h, w = x.shape[2:]
    dx = np.zeros(x.shape)
    for i in range(oh):
        hs, he = adaptive_window(i, h, oh)
        for j in range(ow):
            ws, we = adaptive_window(j, w, ow)
            dx[:, :, hs:he, ws:we] += (dy[:, :, i, j] / ((he - hs) * (we - ws)))[:, :, None, None]
    return [dx]


# ----------------------------------------------------------------------------- declarations
def _pool_norm(op, avg):
    def normalize(inputs, attrs):
        return pool_attrs(op, attrs, avg)
    return normalize


def _max_pool_infer(inputs, attrs):
    check_arity("max_pool_2d", inputs, 1)
    x = inputs[0]
    dt = check_float("max_pool_2d", x)
    shape = pool_geometry("max_pool_2d", x.shape, attrs, avg=False).y_shape
    return [(shape, dt), (shape, int64)]


def _check_dy(op, x, dy, shape):
    if dy.shape != shape or dy.dtype is not x.dtype:
        raise ValueError(f"{op}: dy {fmt(dy)} must be {x.dtype.short}{list(shape)}, the pooled "
                         f"shape of x {fmt(x)}")


def _max_pool_grad_infer(inputs, attrs):
    op = "max_pool_2d_grad"
    check_arity(op, inputs, 3)
    x, ind, dy = inputs
    dt = check_float(op, x)
    shape = pool_geometry(op, x.shape, attrs, avg=False).y_shape
    if ind.dtype is not int64 or ind.shape != shape:
        raise TypeError(f"{op}: indice {fmt(ind)} must be i64{list(shape)} (max_pool_2d's "
                        f"second output)")
    _check_dy(op, x, dy, shape)
    return [(x.shape, dt)]


def _avg_pool_infer(inputs, attrs):
    check_arity("avg_pool_2d", inputs, 1)
    x = inputs[0]
    dt = check_float("avg_pool_2d", x)
    return [(pool_geometry("avg_pool_2d", x.shape, attrs, avg=True).y_shape, dt)]


def _avg_pool_grad_infer(inputs, attrs):
    op = "avg_pool_2d_grad"
    check_arity(op, inputs, 2)
    x, dy = inputs
    dt = check_float(op, x)
    _check_dy(op, x, dy, pool_geometry(op, x.shape, attrs, avg=True).y_shape)
    return [(x.shape, dt)]


def _adaptive_infer(inputs, attrs):
    op = "adaptive_avg_pool2d"
    check_arity(op, inputs, 1)
    x = inputs[0]
    dt = check_float(op, x)
    oh, ow = adaptive_output_size(op, x.shape, attrs)
    return [((*x.shape[:2], oh, ow), dt)]


def _adaptive_grad_infer(inputs, attrs):
    op = "adaptive_avg_pool2d_grad"
    check_arity(op, inputs, 2)
    x, dy = inputs
    dt = check_float(op, x)
    oh, ow = adaptive_output_size(op, x.shape, attrs)
    _check_dy(op, x, dy, (*x.shape[:2], oh, ow))
    return [(x.shape, dt)]


def _flatten_norm(inputs, attrs):
    ndim = max(len(inputs[0].shape), 1) if inputs else 1
    out = {}
    for k, default in (("start_dim", 0), ("end_dim", -1)):
        d = attrs.get(k, default)
        if not isinstance(d, numbers.Integral) or not -ndim <= d < ndim:
            raise ValueError(f"flatten: {k}={d!r} is out of range for a tensor of rank {ndim}")
        out[k] = int(d) % ndim
    if out["start_dim"] > out["end_dim"]:
        raise ValueError(f"flatten: start_dim {out['start_dim']} comes after end_dim "
                         f"{out['end_dim']}")
    return out


def _flatten_shape(shape, a):
    s, e = a["start_dim"], a["end_dim"]
    if not shape:
        return (1,)
    return tuple(shape[:s]) + (int(np.prod(shape[s:e + 1], dtype=np.int64)),) + tuple(shape[e + 1:])


def _flatten_infer(inputs, attrs):
    check_arity("flatten", inputs, 1)
    return [(_flatten_shape(inputs[0].shape, attrs), inputs[0].dtype)]


# ----------------------------------------------------------------------------- samples
POOL_SAMPLE_ATTRS = [
    ("3x3-s2-p1", {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("2x2", {"kernel_size": 2}),
    ("3x2-dilated-ceil", {"kernel_size": (3, 2), "stride": (1, 2), "padding": 1,
                          "dilation": (2, 1), "ceil_mode": True}),
    ("3x3-s2-ceil", {"kernel_size": 3, "stride": 2, "padding": (1, 0), "ceil_mode": True}),
]
"""Pooling windows of the samples (the average pools drop ``dilation``)."""
AVG_SAMPLE_ATTRS = [
    ("exclude-pad", {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}),
    ("divisor-override", {"kernel_size": (2, 3), "stride": (1, 2), "divisor_override": 5}),
]
ADAPTIVE_SAMPLE_SIZES = [(1, 1), (3, 2), (5, 7), (2, 9)]
_SHAPE = (2, 3, 7, 9)


def _avg(attrs):
    return {k: v for k, v in attrs.items() if k != "dilation"}


def _max_samples(grad):
    def make(dt):
        out = []
        r = np.random.default_rng(1)
        x = rand(*_SHAPE, dtype=dt, r=r)
        for _, attrs in POOL_SAMPLE_ATTRS:
            if not grad:
                out.append(([x], attrs))
                continue
            a = pool_attrs("max_pool_2d", attrs, avg=False)
            _, ind = max_pool_reference([x.astype(np.float64)], a)
            out.append(([x, ind, rand(*ind.shape, dtype=dt, r=r)], attrs))
        ties = np.array([[[[np.nan, 3.0, 1.0, 0.0], [np.nan, 2.0, 5.0, 5.0]]]], dt)
        if not grad:
            out.append(([ties], {"kernel_size": 2}))
        return out
    return lambda: float_samples(make)


def _avg_samples(grad):
    def make(dt):
        out = []
        r = np.random.default_rng(2)
        x = rand(*_SHAPE, dtype=dt, r=r)
        for _, attrs in POOL_SAMPLE_ATTRS + AVG_SAMPLE_ATTRS:
            attrs = _avg(attrs)
            if grad:
                shape = pool_geometry("avg_pool_2d", x.shape, attrs, avg=True).y_shape
                out.append(([x, rand(*shape, dtype=dt, r=r)], attrs))
            else:
                out.append(([x], attrs))
        return out
    return lambda: float_samples(make)


def _adaptive_samples(grad):
    def make(dt):
        r = np.random.default_rng(3)
        x = rand(*_SHAPE, dtype=dt, r=r)
        return [([x, rand(*_SHAPE[:2], *size, dtype=dt, r=r)] if grad else [x],
                 {"output_size": size}) for size in ADAPTIVE_SAMPLE_SIZES]
    return lambda: float_samples(make)


register("max_pool_2d", _max_pool_infer, normalize=_pool_norm("max_pool_2d", False),
         grad=lambda n, gs, emit: [emit("max_pool_2d_grad", n.inputs[0], n.outputs[1], gs[0],
                                        **n.attrs)],
         reference=max_pool_reference, samples=_max_samples(False), amp="clear",
         doc="y, indice = max and first argmax of each window (NaN wins)")
register("max_pool_2d_grad", _max_pool_grad_infer, normalize=_pool_norm("max_pool_2d_grad", False),
         reference=_max_pool_grad_ref, samples=_max_samples(True), amp="clear",
         doc="dx = dy added at the indices max_pool_2d picked")
register("avg_pool_2d", _avg_pool_infer, normalize=_pool_norm("avg_pool_2d", True),
         grad=lambda n, gs, emit: [emit("avg_pool_2d_grad", n.inputs[0], gs[0], **n.attrs)],
         reference=avg_pool_reference, samples=_avg_samples(False), amp="gray",
         doc="y = each window's sum / its divisor")
register("avg_pool_2d_grad", _avg_pool_grad_infer, normalize=_pool_norm("avg_pool_2d_grad", True),
         reference=_avg_pool_grad_ref, samples=_avg_samples(True), amp="gray",
         doc="dx = each dy / divisor spread over its window")
register("adaptive_avg_pool2d", _adaptive_infer,
         normalize=lambda ins, a: adaptive_attrs("adaptive_avg_pool2d", a),
         grad=lambda n, gs, emit: [emit("adaptive_avg_pool2d_grad", n.inputs[0], gs[0],
                                        **n.attrs)],
         reference=_adaptive_ref, samples=_adaptive_samples(False), amp=None,
         amp_note="not in OneFlow's lists: it runs in float32 (a global average pool sums many "
                  "values)",
         doc="y = the mean of each adaptive window (output_size cells)")
register("adaptive_avg_pool2d_grad", _adaptive_grad_infer,
         normalize=lambda ins, a: adaptive_attrs("adaptive_avg_pool2d_grad", a),
         reference=_adaptive_grad_ref, samples=_adaptive_samples(True), amp=None,
         amp_note="not in OneFlow's lists", doc="dx = each dy / area spread over its window")
register("flatten", _flatten_infer, normalize=_flatten_norm,
         grad=lambda n, gs, emit: [emit("reshape", gs[0], shape=n.inputs[0].shape)],
         reference=lambda xs, a: [xs[0].reshape(_flatten_shape(xs[0].shape, a))], amp=None,
         amp_note="not in OneFlow's lists (reshape is clear; flatten is not)",
         samples=lambda: float_samples(lambda dt: [
             ([rand(2, 3, 4, 5, dtype=dt)], {"start_dim": 1}),
             ([rand(2, 3, 4, dtype=dt)], {"start_dim": 0, "end_dim": 1}),
             ([rand(3, dtype=dt)], {})]),
         doc="out = x with dims start_dim..end_dim merged (C order, a copy)")
