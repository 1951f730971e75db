"""The elementwise builders of every backend, derived from the op registry.

Every op that declares a scalar function (``OpDef.scalar``) gets a builder by its form:
``out[i] = fn(x[i])`` (map), ``out[i] = fn(x[i], attrs[scalar_attr])`` (map with a scalar) or
``out[idx] = fn(x[idx], y[idx])`` with NumPy broadcasting (zip). Three elementwise ops that are not
of that form have their own small rules here: ``bias_add`` (a zip with the bias broadcast along
``axis``), ``add_n`` (pairwise zips) and ``cast`` (one rounding). A new elementwise op therefore
needs no change in any backend.

A backend supplies its step makers (``map_steps(fn, x, out)``, ``zip_steps(fn, x, y, out,
y_shape=None)`` with NumPy broadcasting, ``cast_steps(x, out)``), a builder factory
``with_scalar(fn, attr)`` and ``scratch(like, shape, dtype)`` (a buffer in its memory), and gets
the builders from :func:`builders`.
"""
from __future__ import annotations

import numpy as np

from ..ops.registry import all_ops, get_op

__all__ = ["elementwise_ops", "builders"]


def elementwise_ops() -> dict:
    """Op type name -> OpDef of every registered op with a scalar function."""
    return {name: op for name, op in all_ops().items() if op.scalar is not None}


def builders(map_steps, with_scalar, zip_steps, cast_steps, scratch) -> dict:
    """Op type -> builder ``(node, ins, outs) -> steps`` for every elementwise op type."""
    def derived(op):
        fn = op.scalar
        if op.scalar_attr is not None:
            return with_scalar(fn, op.scalar_attr)
        if op.tensor_arity == 1:
            return lambda node, ins, outs: map_steps(fn, ins[0], outs[0])
        return lambda node, ins, outs: zip_steps(fn, ins[0], ins[1], outs[0])

    add = get_op("broadcast_add").scalar

    def bias_add(node, ins, outs):
        """``out = a + b``, 1-D ``b`` along ``attrs["axis"]``: ``out[i, j, k] = a[i, j, k] + b[j]``."""
        a, b = ins
        b_shape = [1] * len(a.shape)
        b_shape[node.attrs["axis"] % len(a.shape)] = b.shape[0]
        return zip_steps(add, a, b, outs[0], y_shape=tuple(b_shape))

    def add_n(node, ins, outs):
        """``out = x0 + x1 + ...``, pairwise zips summed in the compute type (a float32 scratch
        accumulator for float16 with more than two inputs)."""
        out = outs[0]
        if len(ins) == 1:
            return cast_steps(ins[0], out)
        if len(ins) == 2 or out.dtype != np.float16:
            acc = out
        else:
            acc = scratch(out, out.shape, np.float32)
        steps = zip_steps(add, ins[0], ins[1], acc if len(ins) > 2 else out)
        for k, x in enumerate(ins[2:], start=3):
            steps += zip_steps(add, acc, x, out if k == len(ins) else acc)
        return steps

    def cast(node, ins, outs):
        """``out = x.astype(attrs["dtype"])``, bit-exact with NumPy (one rounding, NaN stays NaN)."""
        return cast_steps(ins[0], outs[0])

    return {**{name: derived(op) for name, op in elementwise_ops().items()},
            "bias_add": bias_add, "add_n": add_n, "cast": cast}
