"""Data movement on CUDA: ``reshape`` (a flat copy), ``transpose`` and ``broadcast_like`` (a strided
gather), and the fills (``ones_like``, ``constant``). Grid-stride kernels over flat views
(``launch.flat_steps``); no arithmetic, float16 is copied as it is stored."""
from __future__ import annotations

import functools

from numba import cuda

from .common import flat, jit, short, storage_type, strided_offset
from .elementwise import cast_steps
from .launch import flat_steps
from ..common import movement
from ..common.layout import broadcast_plan, unsqueezed

__all__ = ["fill_kernel", "gather_kernel", "c_strides", "fill_steps", "gather_steps",
           "transpose_steps", "BUILDERS"]


@functools.cache
def fill_kernel(st):
    """``kernel(out, value)``: ``out[i] = st(value)`` (the float64 ``value`` rounded once)."""

    @jit
    def kernel(out, value):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = st(value)

    return kernel


@functools.cache
def gather_kernel():
    """``kernel(x, out, shape, xst)``: ``out[idx] = x[idx . xst]``, idx over ``shape`` (out's)."""

    @jit
    def kernel(x, out, shape, xst):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = x[strided_offset(i, shape, xst)]

    return kernel


def c_strides(shape) -> list:
    """Element strides of a C-contiguous array of ``shape``."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


def fill_steps(out, value: float):
    """Steps for ``out[...] = value``."""
    return flat_steps(fill_kernel(storage_type(out.dtype)), out.size, (flat(out), float(value)),
                      f"fill {short(out.dtype)}")


def gather_steps(x, out, shape, xst, label: str):
    """Steps for ``out[idx] = x[idx . xst]`` over ``shape`` (out's shape, any collapse of it)."""
    shape = tuple(int(s) for s in shape) or (1,)
    xst = tuple(int(s) for s in xst) or (0,)
    return flat_steps(gather_kernel(), out.size, (flat(x), flat(out), shape, xst),
                      f"{label} {short(out.dtype)}")


def transpose_steps(x, shape, perm, out):
    """Steps for ``out = x.reshape(shape).transpose(perm)``: a gather with x's strides permuted."""
    xst = c_strides(shape)
    return gather_steps(x, out, [shape[p] for p in perm], [xst[p] for p in perm], "transpose")


def build_reshape(node, ins, outs):
    """``out = x.reshape(attrs["shape"])``: a flat copy."""
    return cast_steps(ins[0], outs[0])


def build_transpose(node, ins, outs):
    """``out = x.transpose(perm)``: ``out[idx] = x[idx . (x's strides permuted by perm)]``."""
    return transpose_steps(ins[0], tuple(ins[0].shape), node.attrs["perm"], outs[0])


def build_broadcast_like(node, ins, outs):
    """``out = broadcast_to(x, like.shape)``; x: like's shape, ``broadcast_axes`` removed or 1."""
    x, out = ins[0], outs[0]
    plan = broadcast_plan(out.shape, unsqueezed(x.shape, node.attrs["broadcast_axes"],
                                                len(out.shape)))
    if plan is None:
        return []
    shape, (xst,) = plan
    return gather_steps(x, out, shape, xst, "broadcast")


BUILDERS = {"reshape": build_reshape, "flatten": build_reshape, "detach": build_reshape,
            "transpose": build_transpose,
            "broadcast_like": build_broadcast_like, **movement.builders(fill_steps)}
"""Op type -> builder for the data-movement ops and the fills."""
