"""The elementwise builders of every backend, derived from the op registry.

Every op that declares a scalar function (``OpDef.scalar``) gets a builder by its form:
``out[i] = fn(x[i])`` (map), ``out[i] = fn(x[i], *op.scalar_args(attrs))`` (map with scalars) or
``out[idx] = fn(x[idx], y[idx])`` with NumPy broadcasting (zip). The builder is derived when a
plan is built (:func:`derived_builder`, called by ``table.builder_for``), so an op registered at
any time, by a tutorial or a test, runs on every backend at once. Five elementwise ops that are
not of that form have their own small rules here (:func:`builders`): ``bias_add`` (a zip with the
bias broadcast along ``axis``), ``add_n`` (pairwise zips), ``cast`` and ``cast_like`` (one
rounding) and ``scalar_mul_by_tensor`` (a zip against a one-element tensor). A new elementwise
op therefore needs no change in any backend.

A backend describes its loops with a :class:`StepMakers` record and gets its builders from
:func:`builders` and :func:`derived_builder` (the builder contract:
``miniflow.runtime.backend.Backend``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...ops.registry import all_ops, get_op

__all__ = ["StepMakers", "elementwise_ops", "derived_builder", "builders"]


@dataclass(frozen=True)
class StepMakers:
    """A backend's elementwise loops: each maker returns the steps ``[(fn, args), ...]`` that
    compute its loop over the backend's arrays (C-contiguous, any rank), planned once.

    Attributes:
        map: ``(fn, x, out)``: ``out[i] = fn(x[i])``, same shapes.
        map_scalar: ``(fn, x, s, out)``: ``out[i] = fn(x[i], *s)``, ``s`` a non-empty tuple of
            Python floats, each in x's compute type.
        zip: ``(fn, x, y, out, y_shape=None)``: ``out[idx] = fn(x[idx], y[idx])`` with NumPy
            broadcasting; ``y_shape`` overrides y's shape for broadcasting (y read flat).
        cast: ``(x, out)``: ``out = x.astype(out.dtype)``, one rounding.
        scratch: ``(like, shape, dtype)``: a buffer in ``like``'s memory, allocated at build time.
    """

    map: Callable
    map_scalar: Callable
    zip: Callable
    cast: Callable
    scratch: Callable


def elementwise_ops() -> dict:
    """Op type name -> OpDef of every registered op with a scalar function."""
    return {name: op for name, op in all_ops().items() if op.scalar is not None}


def derived_builder(op, steps: StepMakers):
    """The builder of ``op`` (an OpDef) from its scalar function, by its form; None for an op
    without one."""
    fn = op.scalar
    if fn is None:
        return None
    if op.scalar_attrs:
        return lambda node, ins, outs: steps.map_scalar(fn, ins[0], op.scalar_args(node.attrs),
                                                        outs[0])
    if op.tensor_arity == 1:
        return lambda node, ins, outs: steps.map(fn, ins[0], outs[0])
    return lambda node, ins, outs: steps.zip(fn, ins[0], ins[1], outs[0])


def builders(steps: StepMakers) -> dict:
    """Op type -> builder of the elementwise ops with their own rules (see the module docstring)."""
    add, mul = get_op("broadcast_add").scalar, get_op("broadcast_mul").scalar

    def bias_add(node, ins, outs):
        """``out = a + b``, 1-D ``b`` along ``attrs["axis"]``:
        ``out[i, j, k] = a[i, j, k] + b[j]``."""
        a, b = ins
        b_shape = [1] * len(a.shape)
        b_shape[node.attrs["axis"] % len(a.shape)] = b.shape[0]
        return steps.zip(add, a, b, outs[0], y_shape=tuple(b_shape))

    def add_n(node, ins, outs):
        """``out = x0 + x1 + ...``, pairwise zips summed in the compute type (a float32 scratch
        accumulator for a half type with more than two inputs)."""
        out = outs[0]
        if len(ins) == 1:
            return steps.cast(ins[0], out)
        if len(ins) == 2 or out.dtype.itemsize != 2:
            acc = out
        else:
            acc = steps.scratch(out, out.shape, np.float32)
        result = steps.zip(add, ins[0], ins[1], acc if len(ins) > 2 else out)
        for k, x in enumerate(ins[2:], start=3):
            result += steps.zip(add, acc, x, out if k == len(ins) else acc)
        return result

    def cast(node, ins, outs):
        """``out = x.astype(attrs["dtype"])``, bit-exact with NumPy (one rounding, NaN stays
        NaN); ``cast_like`` too, to the dtype of its output (``dtype_like``'s: not read)."""
        return steps.cast(ins[0], outs[0])

    def scalar_mul_by_tensor(node, ins, outs):
        """``out[i] = x[i] * scalar``: a broadcasting zip against the one-element scalar, whatever
        its shape (``[]``, ``[1]``, ``[1,1]`` ...): it is read flat and broadcast as
        ``(1,) * x.ndim``."""
        x, s = ins
        return steps.zip(mul, x, s, outs[0], y_shape=(1,) * len(x.shape))

    return {"bias_add": bias_add, "add_n": add_n, "cast": cast, "cast_like": cast,
            "scalar_mul_by_tensor": scalar_mul_by_tensor}
