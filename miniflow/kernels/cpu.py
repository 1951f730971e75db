"""The CPU backend: ``KERNELS``, op type -> kernel builder.

A builder is ``builder(node, ins, outs) -> list[(fn, args)]``. ``ins`` / ``outs`` are the node's
preallocated C-contiguous NumPy buffers (float16 as ``np.float16``); the builder runs once, when the
plan is built, and precomputes everything a step needs (fp16 ``uint16`` views, 1-D/transposed views,
stride tables, scratch buffers), so that a step is one call ``fn(*args)`` that writes every output
(update ops write their variable inputs instead) and allocates nothing.

Kernels live in ``cpu_elementwise`` (map / zip / broadcast / cast), ``cpu_fused`` (generated
kernels of ``fused_elementwise``), ``cpu_reduce`` (reduce_sum, softmax family, cross entropy),
``cpu_matmul`` (NumPy's BLAS and loops for skinny shapes), ``cpu_update`` (SGD, Adam) and
``cpu_loss_scale``; this module adds the data-movement ops (``np.copyto``: no arithmetic, nothing to
convert).

Precision: f16 and f32 compute in float32, f64 in float64; sums accumulate in that type; matmul on
f16 widens to float32, multiplies in float32 and rounds the product to f16 (a GPU fp16 GEMM's
contract). float16 conversions: ``miniflow.kernels.fp16``.
"""
from __future__ import annotations

import numpy as np

from . import cpu_elementwise, cpu_fused, cpu_loss_scale, cpu_reduce, cpu_update
from .cpu_matmul import build_matmul
from .cpu_common import PARALLEL_MIN_SIZE  # re-exported; builders read cpu_common.PARALLEL_MIN_SIZE

__all__ = ["KERNELS", "PARALLEL_MIN_SIZE"]


def build_reshape(node, ins, outs):
    """``out = x.reshape(attrs["shape"])`` (a copy: outputs are separate buffers)."""
    return [(np.copyto, (outs[0].reshape(-1), ins[0].reshape(-1)))]


def build_transpose(node, ins, outs):
    """``out = x.transpose(attrs["perm"])``: ``out[i, j, ...] = x[perm-permuted index]``."""
    return [(np.copyto, (outs[0], ins[0].transpose(tuple(node.attrs["perm"]))))]


def build_broadcast_like(node, ins, outs):
    """``out = broadcast_to(x, like.shape)``; x is like's shape with ``broadcast_axes`` removed or 1."""
    x, out = ins[0], outs[0]
    axes = tuple(node.attrs["broadcast_axes"])
    if x.ndim < out.ndim:
        shape = list(x.shape)
        for ax in sorted(ax % out.ndim for ax in axes):
            shape.insert(ax, 1)
        x = x.reshape(shape)
    return [(np.copyto, (out, x))]


def _fill(out: np.ndarray, value: float):
    """Steps for ``out[...] = value``: converted once here (overflow to inf without a warning)."""
    with np.errstate(over="ignore"):
        v = np.array(value, out.dtype)
    return [(np.copyto, (out, v))]


def build_ones_like(node, ins, outs):
    """``out[...] = 1`` (x is read for its shape only)."""
    return _fill(outs[0], 1.0)


def build_constant(node, ins, outs):
    """``out[...] = attrs["value"]`` (rounded once to out's dtype, as NumPy does)."""
    return _fill(outs[0], float(node.attrs["value"]))


KERNELS = {
    **cpu_elementwise.BUILDERS,
    **cpu_reduce.BUILDERS,
    **cpu_update.BUILDERS,
    **cpu_loss_scale.BUILDERS,
    "matmul": build_matmul,
    "reshape": build_reshape,
    "transpose": build_transpose,
    "broadcast_like": build_broadcast_like,
    "ones_like": build_ones_like,
    "constant": build_constant,
    "fused_elementwise": cpu_fused.build_fused_elementwise,
}
"""Op type -> builder ``(node, ins, outs) -> [(fn, args), ...]`` for the CPU backend."""
