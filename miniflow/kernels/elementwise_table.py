"""Which scalar function each elementwise op type runs, in one place for every backend.

A backend supplies its step makers (``map_steps(fn, x, out)``, ``zip_steps(fn, x, y, out)`` with
NumPy broadcasting) and a builder factory ``with_scalar(fn)``, and gets the builders of all
elementwise op types from :func:`builders`; adding an elementwise op is one scalar function in
``scalar.py``, one op definition and one line here.
"""
from __future__ import annotations

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


def builders(map_steps, with_scalar, zip_steps) -> dict:
    """Op type -> builder ``(node, ins, outs) -> steps`` for every op in the three tables."""
    def unary(fn):
        return lambda node, ins, outs: map_steps(fn, ins[0], outs[0])

    def binary(fn):
        return lambda node, ins, outs: zip_steps(fn, ins[0], ins[1], outs[0])

    return {**{op: unary(fn) for op, fn in UNARY.items()},
            **{op: with_scalar(fn) for op, fn in WITH_SCALAR.items()},
            **{op: binary(fn) for op, fn in BINARY.items()}}
