"""``reduce_max`` and ``argmax`` over one axis (OneFlow's op names; PyTorch's ``Tensor.max(dim)``
returns both), and ``reduce_max_grad``.

* ``reduce_max(x)`` {axis, keepdims False}: the maximum along ``axis``, NaN if the slice holds a
  NaN (PyTorch's and NumPy's). An empty axis is an error (PyTorch: "Expected reduction dim to
  have non-zero size").
* ``argmax(x)`` {axis, keepdims False}: int64 index of the first maximum along ``axis`` (of the
  first NaN if there is one, as PyTorch), no gradient.
* ``reduce_max_grad(x, y, dy)`` {axis, keepdims}: ``dx = dy`` shared equally by the elements equal
  to the maximum ``y`` (OneFlow's ``reduce_max`` backward: ``dy * (x == y) / count``); where the
  maximum is NaN, by the NaN elements.

In none of OneFlow's AMP lists: they run in float32 under AMP.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..dtype import int64
from .common import check_arity, check_float, float_samples, fmt, rand
from .registry import register

__all__ = ["reduce_max_reference", "argmax_reference"]


def _norm(op):
    def norm(inputs, attrs):
        ndim = len(inputs[0].shape) if inputs else 0
        axis = attrs.get("axis", -1)
        if isinstance(axis, (tuple, list)) and len(axis) == 1:
            axis = axis[0]
        if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
            raise TypeError(f"{op}: axis must be one int (miniflow reduces one axis), got "
                            f"{axis!r}")
        if not -max(ndim, 1) <= axis < max(ndim, 1) or ndim == 0:
            raise ValueError(f"{op}: axis {axis} is out of range for a tensor of rank {ndim}")
        return {"axis": int(axis) % ndim, "keepdims": bool(attrs.get("keepdims", False))}
    return norm


def _out_shape(shape, attrs):
    a = attrs["axis"]
    return shape[:a] + ((1,) if attrs["keepdims"] else ()) + shape[a + 1:]


def _infer(op):
    def infer(inputs, attrs):
        check_arity(op, inputs, 1)
        x = inputs[0]
        check_float(op, x)
        if x.shape[attrs["axis"]] == 0:
            raise ValueError(f"{op}: Expected reduction dim {attrs['axis']} to have non-zero "
                             f"size, got {fmt(x)}")
        return [(_out_shape(x.shape, attrs), x.dtype if op == "reduce_max" else int64)]
    return infer


def reduce_max_reference(arrays, attrs):
    """``[max]`` of ``arrays[0]`` along ``attrs["axis"]`` in float64 (NaN propagates)."""
    return [np.max(arrays[0], axis=attrs["axis"], keepdims=attrs["keepdims"])]


def argmax_reference(arrays, attrs):
    """``[argmax]`` (int64), the first NaN counting as the maximum."""
    x, a = arrays[0], attrs["axis"]
    nan = np.isnan(x)
    idx = np.where(nan.any(axis=a), np.argmax(nan, axis=a), np.argmax(np.where(nan, 0, x), axis=a))
    return [np.expand_dims(idx, a) if attrs["keepdims"] else idx]


def _grad(n, gs, emit):
    return [emit("reduce_max_grad", n.inputs[0], n.outputs[0], gs[0], **n.attrs)]


def _grad_infer(inputs, attrs):
    op = "reduce_max_grad"
    check_arity(op, inputs, 3)
    x, y, dy = inputs
    check_float(op, x, y, dy)
    want = _out_shape(x.shape, attrs)
    if y.shape != want or dy.shape != want:
        raise ValueError(f"{op}: y {fmt(y)} and dy {fmt(dy)} must have the reduced shape "
                         f"{list(want)} of x {fmt(x)}")
    return [(x.shape, x.dtype)]


def _grad_reference(arrays, attrs):
    x, y, dy = arrays
    a = attrs["axis"]
    yk, dyk = (v if attrs["keepdims"] else np.expand_dims(v, a) for v in (y, dy))
    hit = (x == yk) | (np.isnan(x) & np.isnan(yk))
    return [hit * dyk / hit.sum(axis=a, keepdims=True)]


def _samples():
    def make(dt):
        r = np.random.default_rng(43)
        return [([rand(3, 4, 5, dtype=dt, r=r)], {"axis": 1}),
                ([rand(4, 6, dtype=dt, r=r)], {"axis": -1, "keepdims": True}),
                ([np.array([[1.0, 3.0, 3.0], [np.nan, 2.0, 5.0], [-np.inf, -np.inf, -1.0]], dt)],
                 {"axis": 1}),
                ([rand(0, 3, dtype=dt, r=r)], {"axis": 1})]
    return float_samples(make)


def _grad_samples():
    def make(dt):
        r = np.random.default_rng(44)
        out = []
        for x, attrs in ((rand(3, 4, 5, dtype=dt, r=r), {"axis": 1, "keepdims": False}),
                         (np.array([[1.0, 3.0, 3.0], [0.0, 2.0, 5.0]], dt),
                          {"axis": 1, "keepdims": True})):
            y = np.max(x, axis=attrs["axis"], keepdims=attrs["keepdims"])
            out.append(([x, y, rand(*y.shape, dtype=dt, r=r)], attrs))
        return out
    return float_samples(make)


_NOTE = "in none of OneFlow's lists: stays float32 under AMP"

register("reduce_max", _infer("reduce_max"), normalize=_norm("reduce_max"), grad=_grad,
         reference=reduce_max_reference, samples=_samples, amp=None, amp_note=_NOTE,
         doc="out = max of x along axis (NaN propagates)")
register("argmax", _infer("argmax"), normalize=_norm("argmax"),
         grad=lambda n, gs, emit: [None], reference=argmax_reference, samples=_samples,
         amp=None, amp_note=_NOTE + " (its output is int64)",
         doc="out = int64 index of the first maximum of x along axis")
register("reduce_max_grad", _grad_infer, normalize=_norm("reduce_max_grad"),
         reference=_grad_reference, samples=_grad_samples, amp=None, amp_note=_NOTE,
         doc="dx = dy shared equally by the elements of x equal to the maximum y")
