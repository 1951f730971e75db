"""The pool family: its one step-maker protocol (:class:`PoolStepMaker`) and :func:`builders`,
which makes a backend's pool builders from its step makers, one per op type: ``max_pool_2d``,
``avg_pool_2d``, ``adaptive_avg_pool2d``, their gradients, and any pool-like op added later.
Planned the same way everywhere: the window geometry (``miniflow.ops.geometry``, as the ops'
inference computes it) or the adaptive output size, and no step for an empty output. The
backend's step makers run the loops.

A backend fills its family record, ``BUILDERS`` of its ``pool.py``, by op type::

    BUILDERS = pool.builders(max_pool_2d=max_steps, ..., adaptive_avg_pool2d=adaptive_steps)

so a new pool-like op adds one step maker and one keyword per backend, and nothing here.
"""
from __future__ import annotations

from typing import Protocol

from ...ops.geometry import pool_geometry

__all__ = ["PoolStepMaker", "plan_of", "builders"]


class PoolStepMaker(Protocol):
    """What every pool step maker of every backend is: ``steps(ins, outs, plan, attrs)`` -> the
    node's steps (``[(kernel, args), ...]``, the contract of ``miniflow.runtime.backend.Backend``).
    ``ins`` / ``outs``: the node's arrays, in the op's input and output order; ``plan``: the
    node's :func:`plan_of`; ``attrs``: its normalized attributes. Called only for a non-empty
    first output."""

    def __call__(self, ins: list, outs: list, plan, attrs: dict) -> list: ...


def plan_of(node, x_shape: tuple):
    """The plan a pool step maker gets for ``node`` whose first input (``x``, for the gradients
    too) has shape ``x_shape``, read off its normalized attributes: ``(oh, ow)`` for an adaptive
    pool (it has ``output_size``), else the window's ``PoolGeometry`` (``pool_geometry``; an
    average-style window when it has ``count_include_pad``, as ``pool_attrs`` gives it)."""
    attrs = node.attrs
    if "output_size" in attrs:
        return tuple(attrs["output_size"])
    return pool_geometry(node.op.name, x_shape, attrs, avg="count_include_pad" in attrs)


def builders(**steps: PoolStepMaker) -> dict:
    """Op type -> builder over a backend's step makers ``steps`` (keyword: op type, value: its
    :class:`PoolStepMaker`)."""
    def builder(op, make):
        def build(node, ins, outs):
            return make(ins, outs, plan_of(node, tuple(ins[0].shape)), node.attrs) \
                if outs[0].size else []

        build.__doc__ = f"The builder of ``{op}``: the node's :func:`plan_of`, ``{make.__name__}``."
        return build

    return {op: builder(op, make) for op, make in steps.items()}
