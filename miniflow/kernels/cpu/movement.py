"""Data movement on the CPU: ``reshape``, ``transpose``, ``broadcast_like`` and the fills
(``ones_like``, ``constant``), all ``np.copyto`` (no arithmetic, nothing to convert: float16 is
copied as it is stored)."""
from __future__ import annotations

import numpy as np

from ..common import movement
from ..common.layout import unsqueezed

__all__ = ["transpose_steps", "fill_steps", "BUILDERS"]


def transpose_steps(x: np.ndarray, shape, perm, out: np.ndarray):
    """Steps for ``out = x.reshape(shape).transpose(perm)`` (out of any shape with that size)."""
    moved = out.reshape([shape[p] for p in perm])
    return [(np.copyto, (moved, x.reshape(shape).transpose(tuple(perm))))]


def fill_steps(out: np.ndarray, value: float):
    """Steps for ``out[...] = value``: converted once here (overflow to inf without a warning)."""
    with np.errstate(over="ignore"):
        v = np.array(value, out.dtype)
    return [(np.copyto, (out, v))]


def build_reshape(node, ins, outs):
    """``out = x.reshape(attrs["shape"])`` (a copy: outputs are separate buffers)."""
    return [(np.copyto, (outs[0].reshape(-1), ins[0].reshape(-1)))]


def build_transpose(node, ins, outs):
    """``out = x.transpose(attrs["perm"])``: ``out[i, j, ...] = x[perm-permuted index]``."""
    return transpose_steps(ins[0], ins[0].shape, node.attrs["perm"], outs[0])


def build_broadcast_like(node, ins, outs):
    """``out = broadcast_to(x, like.shape)``; x: like's shape, ``broadcast_axes`` removed or 1."""
    x, out = ins[0], outs[0]
    x = x.reshape(unsqueezed(x.shape, node.attrs["broadcast_axes"], out.ndim))
    return [(np.copyto, (out, x))]


BUILDERS = {"reshape": build_reshape, "flatten": build_reshape, "detach": build_reshape,
            "transpose": build_transpose,
            "broadcast_like": build_broadcast_like, **movement.builders(fill_steps)}
"""Op type -> builder for the data-movement ops and the fills."""
