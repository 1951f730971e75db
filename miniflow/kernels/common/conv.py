"""The builders of the convolution ops of every backend: ``conv2d``, ``conv_data_grad``,
``conv_filter_grad``, ``conv_bias_grad``. What is planned the same way everywhere is planned here:
the geometry (``miniflow.ops.geometry``, the function the ops' inference calls, so a kernel never
sees a geometry inference would refuse), empty outputs (no step), and products with nothing to
sum (an empty batch, zero channels: a fill with 0). The backend's step makers run the
algorithms: im2col + BLAS and Winograd on the CPU, implicit GEMM on CUDA.
"""
from __future__ import annotations

import dataclasses

from ...ops.geometry import (ConvGeometry, conv_data_grad_geometry, conv_filter_grad_geometry,
                             conv_geometry)

__all__ = ["builders", "live_taps", "cropped"]


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


def builders(*, forward_steps, data_grad_steps, filter_grad_steps, bias_grad_steps,
             fill_steps) -> dict:
    """Op type -> builder of the convolution ops, over a backend's step makers (``g`` is the
    ``ConvGeometry``; every output is non-empty and every sum has terms when they are called):

    * ``forward_steps(x, w, out, g)``: ``out = conv2d(x, w)``;
    * ``data_grad_steps(dy, w, dx, g)``: ``dx = conv_data_grad(dy, w)``;
    * ``filter_grad_steps(dy, x, dw, g)``: ``dw = conv_filter_grad(dy, x)``;
    * ``bias_grad_steps(dy, out, n, c, hw)``: ``out[c] = sum dy[n, c, hw]`` (dy ``[N, C, H, W]``);
    * ``fill_steps(out, value)``: ``out[...] = value`` (the backend's fill).
    """
    def zero_or(out, terms: int, steps):
        if out.size == 0:
            return []
        return fill_steps(out, 0.0) if terms == 0 else steps()

    def conv2d(node, ins, outs):
        """``out = conv2d(in, weight)`` (NCHW, no bias)."""
        x, w, out = ins[0], ins[1], outs[0]
        g = conv_geometry("conv2d", tuple(x.shape), tuple(w.shape), node.attrs)
        return zero_or(out, g.kg, lambda: forward_steps(x, w, out, g))

    def conv_data_grad(node, ins, outs):
        """``dx = conv_data_grad(dy, filter, x_like)`` (x_like: dx's shape)."""
        dy, w, x_like, dx = ins[0], ins[1], ins[2], outs[0]
        g = conv_data_grad_geometry("conv_data_grad", tuple(dy.shape), tuple(w.shape),
                                    tuple(x_like.shape), node.attrs)
        return zero_or(dx, g.og * g.kh * g.kw, lambda: data_grad_steps(dy, w, dx, g))

    def conv_filter_grad(node, ins, outs):
        """``filter_diff = conv_filter_grad(dy, x)``."""
        dy, x, dw = ins[0], ins[1], outs[0]
        g = conv_filter_grad_geometry("conv_filter_grad", tuple(dy.shape), tuple(x.shape),
                                      node.attrs)
        return zero_or(dw, g.n * g.oh * g.ow, lambda: filter_grad_steps(dy, x, dw, g))

    def conv_bias_grad(node, ins, outs):
        """``bias_diff = conv_bias_grad(dy)``: dy ``[N, C, H, W]`` summed over N, H, W."""
        dy, out = ins[0], outs[0]
        n, c, h, w = tuple(dy.shape)
        return zero_or(out, n * h * w, lambda: bias_grad_steps(dy, out, n, c, h * w))

    return {"conv2d": conv2d, "conv_data_grad": conv_data_grad,
            "conv_filter_grad": conv_filter_grad, "conv_bias_grad": conv_bias_grad}
