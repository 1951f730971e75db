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
from ..common.layout import broadcast_plan
from ..common.movement import filling

__all__ = ["fill_kernel", "gather_kernel", "c_strides", "fill_steps", "gather_steps",
           "transpose_steps", "copy_steps", "permute_steps", "broadcast_steps", "BUILDERS"]


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


def copy_steps(ins, outs, plan, attrs):
    """``out = x`` as a flat copy (``reshape``, ``flatten``, ``detach``)."""
    return cast_steps(ins[0], outs[0])


def permute_steps(ins, outs, perm, attrs):
    """``out = x.transpose(perm)``: ``out[idx] = x[idx . (x's strides permuted by perm)]``."""
    return transpose_steps(ins[0], tuple(ins[0].shape), perm, outs[0])


def broadcast_steps(ins, outs, x_shape, attrs):
    """``out = broadcast_to(x, like.shape)``, x viewed as ``x_shape`` (its broadcast axes 1): a
    gather with stride 0 along them."""
    x, out = ins[0], outs[0]
    plan = broadcast_plan(out.shape, x_shape)
    if plan is None:
        return []
    shape, (xst,) = plan
    return gather_steps(x, out, shape, xst, "broadcast")


BUILDERS = movement.builders(reshape=copy_steps, flatten=copy_steps, detach=copy_steps,
                             transpose=permute_steps, broadcast_like=broadcast_steps,
                             expand=broadcast_steps, ones_like=filling(fill_steps),
                             constant=filling(fill_steps))
"""Op type -> builder for the data-movement ops and the fills."""
