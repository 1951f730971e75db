"""The one step-maker protocol of the kernel families (``pool``, ``conv``, ``normalization``,
``movement``, ``reduce``): what a backend writes is a :class:`StepMaker` per op type, what every
backend plans the same way is the family's ``plan_of(node, ins, outs)`` in
``kernels/common/<family>.py``, and :func:`record` joins them into the builders of the backend's record of the family, its
``BUILDERS``::

    BUILDERS = conv.builders(fill_steps, conv2d=conv2d_steps, ...)   # in kernels/cpu/conv.py

A new op of a family adds one step maker and one keyword per backend (and, where the family plans
by op type, its plan in the family's module), never a parameter of a shared signature.
``tests/test_layering.py`` checks that every backend fills every family's record (:data:`OPS`
of each family module) through :func:`record`.

The builder contract (``builder(node, ins, outs) -> [(kernel, args), ...]``) is
``miniflow.runtime.backend.Backend``'s.
"""
from __future__ import annotations

from typing import Callable, Protocol

__all__ = ["StepMaker", "record", "PROTOCOL_FAMILIES"]

PROTOCOL_FAMILIES = ("pool", "conv", "normalization", "movement", "reduce")
"""The families whose records are built by :func:`record` (each module has ``OPS``, the library's
op types of the family, and ``builders``)."""


class StepMaker(Protocol):
    """What every step maker of every protocol family is: ``steps(ins, outs, plan, attrs)`` -> the
    node's steps. ``ins`` / ``outs``: the node's arrays, in the op's input and output order;
    ``plan``: what the family's ``plan_of`` planned for the node (a geometry, a layout, a value);
    ``attrs``: its normalized attributes. Not called when ``plan_of`` says there is nothing to do
    (it returned None)."""

    def __call__(self, ins: list, outs: list, plan, attrs: dict) -> list: ...


def record(family: str, plan_of: Callable, steps: dict) -> dict:
    """Op type -> builder of ``family`` over a backend's ``steps`` (op type -> :class:`StepMaker`):
    ``plan_of(node, ins, outs)`` (None: no step), then the op's step maker. Each builder carries
    ``family`` and its ``step_maker`` (read by the test that every backend fills every record).

    Raises:
        TypeError: a step maker is not callable (naming the family and the op type).
    """
    def builder(op: str, make) -> Callable:
        if not callable(make):
            raise TypeError(f"{family}.builders: the step maker of {op!r} must be callable "
                            f"steps(ins, outs, plan, attrs), got {make!r}")

        def build(node, ins, outs):
            plan = plan_of(node, ins, outs)
            return [] if plan is None else make(ins, outs, plan, node.attrs)

        build.__doc__ = (f"The {family} builder of ``{op}``: the family's ``plan_of``, then "
                         f"``{getattr(make, '__name__', make)}``.")
        build.family, build.step_maker = family, make
        return build

    return {op: builder(op, make) for op, make in steps.items()}
