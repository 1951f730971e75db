"""Elementwise CUDA kernels and their builders: map, map with a scalar, zip, broadcasting zip, cast,
fill and strided gather (transpose, broadcast_like), plus the builders of the ops made of them.

Every kernel is a 1-D grid-stride loop (``for i in range(cuda.grid(1), n, cuda.gridsize(1))``) over
flat views, launched by ``cuda_launch.flat_steps``. Map and zip kernels come from one factory each,
keyed by an op's scalar function (``OpDef.scalar``) compiled with ``cuda.jit(device=True)`` (the
same functions the CPU kernels use) and by the compute/storage types (``cuda_common``): loads
widen to the compute type, ``fn``'s result is rounded to the compute type and then stored, exactly
as the CPU kernels do. The builders of every elementwise op come from ``elementwise_table``.

Broadcasting is planned once in the builder (``layout.broadcast_plan``: dims aligned, size-1 dims
dropped, mergeable dims merged); the strided kernel gets the collapsed shape and each operand's
element strides (0 = broadcast) as tuples.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from . import elementwise_table
from .cuda_common import compute_type, device, flat, jit, scratch, storage_type, strided_offset
from .cuda_launch import flat_steps
from .layout import broadcast_plan
from ..dtype import as_dtype

__all__ = ["map_kernel", "map_scalar_kernel", "zip_kernel", "zip_strided_kernel", "cast_kernel",
           "fill_kernel", "gather_kernel", "map_steps", "zip_steps", "cast_steps", "fill_steps",
           "gather_steps", "BUILDERS"]


def short(dtype) -> str:
    """``f16`` for float16 etc. (kernel labels)."""
    return as_dtype(np.dtype(dtype)).short


# ----------------------------------------------------------------------------- kernel factories
@functools.cache
def map_kernel(fn, ct, st):
    """``kernel(x, out)``: ``out[i] = fn(x[i])``."""
    f = device(fn)

    @jit
    def kernel(x, out):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = st(ct(f(ct(x[i]))))

    return kernel


@functools.cache
def map_scalar_kernel(fn, ct, st):
    """``kernel(x, s, out)``: ``out[i] = fn(x[i], s)`` with the float ``s`` in the compute type."""
    f = device(fn)

    @jit
    def kernel(x, s, out):
        c = ct(s)
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = st(ct(f(ct(x[i]), c)))

    return kernel


@functools.cache
def zip_kernel(fn, ct, st):
    """``kernel(x, y, out)``: ``out[i] = fn(x[i], y[i])`` (same sizes)."""
    f = device(fn)

    @jit
    def kernel(x, y, out):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = st(ct(f(ct(x[i]), ct(y[i]))))

    return kernel


@functools.cache
def zip_strided_kernel(fn, ct, st):
    """``kernel(x, y, out, shape, xst, yst)``: ``out[idx] = fn(x[idx . xst], y[idx . yst])``
    over the collapsed ``shape`` (tuples; strides in elements, 0 = broadcast)."""
    f = device(fn)

    @jit
    def kernel(x, y, out, shape, xst, yst):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            v = f(ct(x[strided_offset(i, shape, xst)]), ct(y[strided_offset(i, shape, yst)]))
            out[i] = st(ct(v))

    return kernel


@functools.cache
def cast_kernel(st):
    """``kernel(x, out)``: ``out[i] = st(x[i])``, one rounding (NumPy ``astype``); a copy when the
    dtypes agree."""

    @jit
    def kernel(x, out):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = st(x[i])

    return kernel


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


# ----------------------------------------------------------------------------- step helpers
def _types(out):
    return compute_type(out.dtype), storage_type(out.dtype)


def map_steps(fn, x, out):
    """Steps for ``out = fn(x)`` elementwise (same shape)."""
    return flat_steps(map_kernel(fn, *_types(out)), out.size, (flat(x), flat(out)),
                      f"map[{fn.__name__}] {short(out.dtype)}")


def cast_steps(x, out):
    """Steps for ``out = x.astype(out.dtype)`` (same size; a copy when the dtypes agree)."""
    return flat_steps(cast_kernel(storage_type(out.dtype)), out.size, (flat(x), flat(out)),
                      f"cast {short(x.dtype)}->{short(out.dtype)}")


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


def zip_steps(fn, x, y, out, x_shape=None, y_shape=None):
    """Steps for ``out = fn(x, y)`` with NumPy broadcasting.

    ``x_shape``/``y_shape`` override the shapes used for broadcasting (bias_add passes its bias as
    ``(1, n, 1, ...)``); the arrays themselves are C-contiguous.
    """
    plan = broadcast_plan(out.shape, x.shape if x_shape is None else x_shape,
                          y.shape if y_shape is None else y_shape)
    if plan is None:
        return []
    shape, (xst, yst) = plan
    label = short(out.dtype)
    if len(shape) == 1 and xst[0] == 1 and yst[0] == 1:
        return flat_steps(zip_kernel(fn, *_types(out)), out.size, (flat(x), flat(y), flat(out)),
                          f"zip[{fn.__name__}] {label}")
    shape, xst, yst = (tuple(int(s) for s in t) for t in (shape, xst, yst))
    return flat_steps(zip_strided_kernel(fn, *_types(out)), out.size,
                      (flat(x), flat(y), flat(out), shape, xst, yst),
                      f"zip_strided[{fn.__name__}] {label}")


# ----------------------------------------------------------------------------- builders
def _with_scalar(fn, attr: str):
    """Builder for ``out = fn(x, attrs[attr])``."""
    def build(node, ins, outs):
        out = outs[0]
        return flat_steps(map_scalar_kernel(fn, *_types(out)), out.size,
                          (flat(ins[0]), float(node.attrs[attr]), flat(out)),
                          f"map_scalar[{fn.__name__}] {short(out.dtype)}")
    return build


def build_reshape(node, ins, outs):
    """``out = x.reshape(attrs["shape"])``: a flat copy."""
    return cast_steps(ins[0], outs[0])


def c_strides(shape) -> list:
    """Element strides of a C-contiguous array of ``shape``."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


def build_transpose(node, ins, outs):
    """``out = x.transpose(perm)``: ``out[idx] = x[idx . (x's strides permuted by perm)]``."""
    x, out = ins[0], outs[0]
    xst = c_strides(x.shape)
    perm = node.attrs["perm"]
    return gather_steps(x, out, out.shape, [xst[p] for p in perm], "transpose")


def build_broadcast_like(node, ins, outs):
    """``out = broadcast_to(x, like.shape)``; x: like's shape, ``broadcast_axes`` removed or 1."""
    x, out = ins[0], outs[0]
    x_shape = list(x.shape)
    if len(x_shape) < len(out.shape):
        for ax in sorted(node.attrs["broadcast_axes"]):
            x_shape.insert(ax, 1)
    plan = broadcast_plan(out.shape, tuple(x_shape))
    if plan is None:
        return []
    shape, (xst,) = plan
    return gather_steps(x, out, shape, xst, "broadcast")


def build_ones_like(node, ins, outs):
    """``out[...] = 1`` (x is read for its shape only)."""
    return fill_steps(outs[0], 1.0)


def build_constant(node, ins, outs):
    """``out[...] = attrs["value"]``, rounded once to out's dtype (as NumPy's ``fill``)."""
    return fill_steps(outs[0], float(node.attrs["value"]))


BUILDERS = {
    **elementwise_table.builders(map_steps, _with_scalar, zip_steps, cast_steps,
                                 scratch),
    "reshape": build_reshape,
    "transpose": build_transpose,
    "broadcast_like": build_broadcast_like,
    "ones_like": build_ones_like,
    "constant": build_constant,
}
"""Op type -> builder for the elementwise, cast, fill and data-movement ops."""
