"""The pool family: its step-maker protocol (:class:`PoolStepMaker`, ``family.StepMaker``) and
:func:`builders`, which makes a backend's pool builders from its step makers, one per op type:
``max_pool_2d``, ``avg_pool_2d``, ``adaptive_avg_pool2d``, their gradients, and any pool-like op
added later.
Planned the same way everywhere: the window geometry (``miniflow.ops.geometry``, as the ops'
inference computes it) or the adaptive output size, and no step for an empty output. The
backend's step makers run the loops.

A backend fills its family record, ``BUILDERS`` of its ``pool.py``, by op type::

    BUILDERS = pool.builders(max_pool_2d=max_steps, ..., adaptive_avg_pool2d=adaptive_steps)

so a new pool-like op adds one step maker and one keyword per backend, and nothing here.
"""
from __future__ import annotations

from ...ops.geometry import pool_geometry
from .family import StepMaker, record

__all__ = ["OPS", "PoolStepMaker", "plan_of", "builders"]

OPS = ("max_pool_2d", "max_pool_2d_grad", "avg_pool_2d", "avg_pool_2d_grad",
       "adaptive_avg_pool2d", "adaptive_avg_pool2d_grad")
"""The library's pool op types: every backend's record has a step maker for each."""

PoolStepMaker = StepMaker
"""A pool step maker: ``steps(ins, outs, plan, attrs)`` (``family.StepMaker``) with ``plan`` the
node's :func:`plan_of`; called only for a non-empty first output."""


def plan_of(node, ins: list, outs: list):
    """The plan a pool step maker gets for ``node`` (first input ``x``, for the gradients too),
    read off its normalized attributes: ``(oh, ow)`` for an adaptive pool (it has
    ``output_size``), else the window's ``PoolGeometry`` (``pool_geometry``; an average-style
    window when it has ``count_include_pad``, as ``pool_attrs`` gives it); None (no step) for an
    empty first output."""
    attrs = node.attrs
    if outs[0].size == 0:
        return None
    if "output_size" in attrs:
        return tuple(attrs["output_size"])
    return pool_geometry(node.op.name, tuple(ins[0].shape), attrs,
                         avg="count_include_pad" in attrs)


def builders(**steps: PoolStepMaker) -> dict:
    """Op type -> builder over a backend's step makers ``steps`` (keyword: op type, value: its
    :class:`PoolStepMaker`), the backend's record of the pool family."""
    return record("pool", plan_of, steps)
