"""Elementwise CUDA kernels and their step makers: map, map with a scalar, zip, broadcasting zip,
cast (:data:`STEPS`; the builders of every elementwise op come from ``kernels.common.elementwise``).

Every kernel is a 1-D grid-stride loop (``for i in range(cuda.grid(1), n, cuda.gridsize(1))``) over
flat views, launched by ``launch.flat_steps``. Map and zip kernels come from one factory each,
keyed by an op's scalar function (``OpDef.scalar``) compiled with ``cuda.jit(device=True)`` (the
same functions the CPU kernels use) and by the compute/storage types (``common``): loads widen to
the compute type, ``fn``'s result is rounded to the compute type and then stored, exactly as the
CPU kernels do.

Broadcasting is planned once in the step maker (``kernels.common.layout.broadcast_plan``: dims
aligned, size-1 dims dropped, mergeable dims merged); the strided kernel gets the collapsed shape
and each operand's element strides (0 = broadcast) as tuples.
"""
from __future__ import annotations

import functools

from numba import cuda

from .common import (device, flat, jit, load_type, scratch, short, storage_type, strided_offset,
                     types_of)
from .launch import flat_steps
from ..common import accumulation
from ..common.elementwise import StepMakers, builders
from ..common.layout import broadcast_plan
from ..common.precision import compute_scalars

__all__ = ["map_kernel", "map_scalar_kernel", "zip_kernel", "zip_strided_kernel", "cast_kernel",
           "map_steps", "map_scalar_steps", "zip_steps", "cast_steps", "STEPS", "BUILDERS"]


# ----------------------------------------------------------------------------- kernel factories
@functools.cache
def map_kernel(fn, ld, ct, st):
    """``kernel(x, out)``: ``out[i] = fn(x[i])``."""
    f = device(fn)

    @jit
    def kernel(x, out):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = st(ct(f(ld(x[i]))))

    return kernel


@functools.cache
def map_scalar_kernel(fn, ld, ct, st):
    """``kernel(x, s, out)``: ``out[i] = fn(x[i], *s)``, ``s`` a tuple of scalars of the compute
    type (:func:`map_scalar_steps` converts them)."""
    f = device(fn)

    @jit
    def kernel(x, s, out):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = st(ct(f(ld(x[i]), *s)))

    return kernel


@functools.cache
def zip_kernel(fn, ld, ld_y, ct, st):
    """``kernel(x, y, out)``: ``out[i] = fn(x[i], y[i])`` (same sizes)."""
    f = device(fn)

    @jit
    def kernel(x, y, out):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = st(ct(f(ld(x[i]), ld_y(y[i]))))

    return kernel


@functools.cache
def zip_strided_kernel(fn, ld, ld_y, ct, st):
    """``kernel(x, y, out, shape, xst, yst)``: ``out[idx] = fn(x[idx . xst], y[idx . yst])``
    over the collapsed ``shape`` (tuples; strides in elements, 0 = broadcast)."""
    f = device(fn)

    @jit
    def kernel(x, y, out, shape, xst, yst):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            v = f(ld(x[strided_offset(i, shape, xst)]), ld_y(y[strided_offset(i, shape, yst)]))
            out[i] = st(ct(v))

    return kernel


@functools.cache
def cast_kernel(ld, st):
    """``kernel(x, out)``: ``out[i] = st(ld(x[i]))``: x's element loaded exactly (widened to its
    compute type), then stored with one rounding (NumPy ``astype``); a copy when the dtypes
    agree."""

    @jit
    def kernel(x, out):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] = st(ld(x[i]))

    return kernel


# ----------------------------------------------------------------------------- step makers
def _types(*arrays):
    """The loads of the inputs (each its own: add_n adds a float32 accumulator to half inputs),
    then the compute type and the store of the output (the last array)."""
    out = arrays[-1]
    return (*(load_type(a.dtype) for a in arrays[:-1]), *types_of(out)[1:])


def map_steps(fn, x, out):
    """Steps for ``out = fn(x)`` elementwise (same shape)."""
    return flat_steps(map_kernel(fn, *_types(x, out)), out.size, (flat(x), flat(out)),
                      f"map[{fn.__name__}] {short(out.dtype)}")


def map_scalar_steps(fn, x, s: tuple, out):
    """Steps for ``out = fn(x, *s)`` elementwise (same shape; ``s`` a tuple of Python floats,
    each rounded once to the compute type here, as a cast in the kernel would)."""
    return flat_steps(map_scalar_kernel(fn, *_types(x, out)), out.size,
                      (flat(x), compute_scalars(out.dtype, s), flat(out)),
                      f"map_scalar[{fn.__name__}] {short(out.dtype)}")


def cast_steps(x, out):
    """Steps for ``out = x.astype(out.dtype)`` (same size; a copy when the dtypes agree)."""
    return flat_steps(cast_kernel(load_type(x.dtype), storage_type(out.dtype)), out.size,
                      (flat(x), flat(out)),
                      f"cast {short(x.dtype)}->{short(out.dtype)}")


def zip_steps(fn, x, y, out, y_shape=None):
    """Steps for ``out = fn(x, y)`` with NumPy broadcasting.

    ``y_shape`` overrides y's shape for broadcasting (bias_add passes its bias as
    ``(1, n, 1, ...)``); the arrays themselves are C-contiguous.
    """
    plan = broadcast_plan(out.shape, x.shape, y.shape if y_shape is None else y_shape)
    if plan is None:
        return []
    shape, (xst, yst) = plan
    label = short(out.dtype)
    if len(shape) == 1 and xst[0] == 1 and yst[0] == 1:
        return flat_steps(zip_kernel(fn, *_types(x, y, out)), out.size,
                          (flat(x), flat(y), flat(out)),
                          f"zip[{fn.__name__}] {label}")
    shape, xst, yst = (tuple(int(s) for s in t) for t in (shape, xst, yst))
    return flat_steps(zip_strided_kernel(fn, *_types(x, y, out)), out.size,
                      (flat(x), flat(y), flat(out), shape, xst, yst),
                      f"zip_strided[{fn.__name__}] {label}")


STEPS = StepMakers(map=map_steps, map_scalar=map_scalar_steps, zip=zip_steps, cast=cast_steps,
                   scratch=scratch)
"""The CUDA backend's elementwise step makers (for ``kernels.common.elementwise``)."""

BUILDERS = {**builders(STEPS), **accumulation.builders(STEPS)}
"""Op type -> builder of the elementwise ops with their own rules (the others are derived) and
of gradient accumulation's copies and adds (``unpack``, ``acc``, ``pack``)."""
