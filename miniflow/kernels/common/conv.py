"""The builders of the convolution ops of every backend: ``conv2d``, ``conv_data_grad``,
``conv_filter_grad``, ``conv_bias_grad``. What is planned the same way everywhere is planned here:
the geometry (``miniflow.ops.geometry``, the function the ops' inference calls, so a kernel never
sees a geometry inference would refuse), empty outputs (no step), and products with nothing to
sum (an empty batch, zero channels: a fill with 0). The backend's step makers (one per op type,
``family.StepMaker``) run the algorithms: im2col + BLAS and Winograd on the CPU, implicit GEMM on
CUDA.
"""
from __future__ import annotations

import dataclasses

from ...ops.geometry import (ConvGeometry, conv_data_grad_geometry, conv_filter_grad_geometry,
                             conv_geometry)
from .family import record

__all__ = ["OPS", "plan_of", "terms", "builders", "live_taps", "cropped"]

OPS = ("conv2d", "conv_data_grad", "conv_filter_grad", "conv_bias_grad")
"""The library's convolution op types: every backend's record has a step maker for each."""


def _live(k: int, s: int, pad: int, d: int, size: int, out: int) -> tuple:
    hits = [t for t in range(k) if any(0 <= i * s - pad + t * d < size for i in range(out))]
    return (hits[0], hits[-1] + 1) if hits else (0, 1)


def live_taps(g: ConvGeometry):
    """``(p0, p1, q0, q1)``: the kernel rows ``[p0, p1)`` and columns ``[q0, q1)`` that some output
    position reads inside the input, or None when that is the whole kernel. On small maps the
    padding hides taps: a 3x3 convolution with padding 1 on a 1x1 map reads only the centre tap
    (ResNet-18's last stage on the 8x8 digits), so 8/9 of an im2col GEMM multiplies zeros."""
    (p0, p1), (q0, q1) = (_live(g.kh, g.sh, g.ph, g.dh, g.h, g.oh),
                          _live(g.kw, g.sw, g.pw, g.dw, g.w, g.ow))
    return None if (p0, p1, q0, q1) == (0, g.kh, 0, g.kw) else (p0, p1, q0, q1)


def cropped(g: ConvGeometry, taps) -> ConvGeometry:
    """The same convolution with the kernel cut to ``taps`` (:func:`live_taps`): the same
    output, read from the same input positions (the padding becomes the offset of the first live
    tap, possibly negative)."""
    p0, p1, q0, q1 = taps
    return dataclasses.replace(g, kh=p1 - p0, kw=q1 - q0, ph=g.ph - p0 * g.dh,
                               pw=g.pw - q0 * g.dw)


def _geometry(node, ins: list):
    """The node's plan: its ``ConvGeometry``, or ``(n, c, hw)`` of ``conv_bias_grad``'s dy."""
    op, a = node.op.name, node.attrs
    shapes = [tuple(x.shape) for x in ins]
    if op == "conv2d":
        return conv_geometry(op, shapes[0], shapes[1], a)
    if op == "conv_data_grad":
        return conv_data_grad_geometry(op, shapes[0], shapes[1], shapes[2], a)
    if op == "conv_filter_grad":
        return conv_filter_grad_geometry(op, shapes[0], shapes[1], a)
    n, c, h, w = shapes[0]
    return n, c, h * w


def terms(op: str, plan) -> int:
    """How many terms each output element of ``op`` sums, under its ``plan``."""
    if op == "conv2d":
        return plan.kg
    if op == "conv_data_grad":
        return plan.og * plan.kh * plan.kw
    if op == "conv_filter_grad":
        return plan.n * plan.oh * plan.ow
    n, _, hw = plan
    return n * hw


def plan_of(node, ins: list, outs: list):
    """The plan a convolution step maker gets: the ``ConvGeometry`` of ``conv2d``,
    ``conv_data_grad`` (dy, filter, x_like) or ``conv_filter_grad`` (dy, x), from the function
    the op's inference calls; ``(n, c, hw)`` for ``conv_bias_grad`` (dy ``[N, C, H, W]``). None
    (no step) for an empty output."""
    return None if outs[0].size == 0 else _geometry(node, ins)


def builders(fill_steps, **steps) -> dict:
    """Op type -> builder of the convolution ops, the backend's record of the family: its step
    makers by op type (``family.StepMaker``: ``steps(ins, outs, plan, attrs)``, ``plan`` from
    :func:`plan_of`), each called for a non-empty output whose elements sum terms; an output with
    nothing to sum (an empty batch, zero channels) is filled with 0 by the backend's
    ``fill_steps(out, value)``.

    * ``conv2d``: ``out = conv2d(x, w)`` (NCHW, no bias);
    * ``conv_data_grad``: ``dx = conv_data_grad(dy, w, x_like)`` (x_like: dx's shape);
    * ``conv_filter_grad``: ``dw = conv_filter_grad(dy, x)``;
    * ``conv_bias_grad``: ``out[c] = sum dy[n, c, hw]``.
    """
    def summing(op, make):
        def steps_(ins, outs, plan, attrs):
            if terms(op, plan) == 0:
                return fill_steps(outs[0], 0.0)
            return make(ins, outs, plan, attrs)
        steps_.__name__ = getattr(make, "__name__", op)
        return steps_

    return record("conv", plan_of, {op: summing(op, make) for op, make in steps.items()})
