"""Which scalar function each elementwise op type runs, and the elementwise builders, in one place
for every backend.

A backend supplies its step makers (``map_steps(fn, x, out)``, ``zip_steps(fn, x, y, out,
y_shape=None)`` with NumPy broadcasting, ``cast_steps(x, out)``), a builder factory
``with_scalar(fn)`` and ``scratch(like, shape, dtype)`` (a buffer in its memory), and gets the
builders of all elementwise op types from :func:`builders`; adding an elementwise op is one scalar
function in ``scalar.py``, one op definition and one line here.
"""
from __future__ import annotations

import numpy as np

from . import scalar

__all__ = ["UNARY", "WITH_SCALAR", "BINARY", "builders"]

UNARY = {"negative": scalar.neg, "exp": scalar.exp, "log": scalar.log, "relu": scalar.relu,
         "tanh": scalar.tanh, "sigmoid": scalar.sigmoid, "identity": scalar.identity,
         "amp_white_identity": scalar.identity, "amp_black_identity": scalar.identity,
         "reciprocal": scalar.reciprocal}
"""``out[i] = fn(x[i])``."""

WITH_SCALAR = {"scalar_add": scalar.add, "scalar_mul": scalar.mul}
"""``out[i] = fn(x[i], attrs["scalar"])``."""

BINARY = {"broadcast_add": scalar.add, "broadcast_sub": scalar.sub, "broadcast_mul": scalar.mul,
          "broadcast_div": scalar.div, "relu_grad": scalar.relu_grad,
          "tanh_grad": scalar.tanh_grad, "sigmoid_grad": scalar.sigmoid_grad}
"""``out[idx] = fn(x[idx], y[idx])`` with NumPy broadcasting."""


def builders(map_steps, with_scalar, zip_steps, cast_steps, scratch) -> dict:
    """Op type -> builder ``(node, ins, outs) -> steps`` for every elementwise op type."""
    def unary(fn):
        return lambda node, ins, outs: map_steps(fn, ins[0], outs[0])

    def binary(fn):
        return lambda node, ins, outs: zip_steps(fn, ins[0], ins[1], outs[0])

    def bias_add(node, ins, outs):
        """``out = a + b``, 1-D ``b`` along ``attrs["axis"]``: ``out[i, j, k] = a[i, j, k] + b[j]``."""
        a, b = ins
        b_shape = [1] * len(a.shape)
        b_shape[node.attrs["axis"] % len(a.shape)] = b.shape[0]
        return zip_steps(scalar.add, a, b, outs[0], y_shape=tuple(b_shape))

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
        steps = zip_steps(scalar.add, ins[0], ins[1], acc if len(ins) > 2 else out)
        for k, x in enumerate(ins[2:], start=3):
            steps += zip_steps(scalar.add, acc, x, out if k == len(ins) else acc)
        return steps

    def cast(node, ins, outs):
        """``out = x.astype(attrs["dtype"])``, bit-exact with NumPy (one rounding, NaN stays NaN)."""
        return cast_steps(ins[0], outs[0])

    return {**{op: unary(fn) for op, fn in UNARY.items()},
            **{op: with_scalar(fn) for op, fn in WITH_SCALAR.items()},
            **{op: binary(fn) for op, fn in BINARY.items()},
            "bias_add": bias_add, "add_n": add_n, "cast": cast}
