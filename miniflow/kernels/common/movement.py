"""The movement family of every backend: the copies (``reshape``, ``flatten``, ``detach``,
``transpose``, ``broadcast_like``) and the fills (``ones_like``, ``constant``). Planned the same
way everywhere (:func:`plan_of`): the permutation of a transpose, the input's shape with the
broadcast axes put back as 1 (``layout.unsqueezed``), the value of a fill, and no step for an
empty output. The backend's step makers (``family.StepMaker``, one per op type) move the data
with the backend's own means; :func:`filling` makes the fills' from the backend's
``fill_steps(out, value)`` (``out[...] = value``, rounded once to out's dtype, as NumPy's
``fill``).

A backend fills its record, ``BUILDERS`` of its ``movement.py``, by op type::

    BUILDERS = movement.builders(reshape=copy_steps, ..., ones_like=filling(fill_steps), ...)
"""
from __future__ import annotations

from .family import StepMaker, record
from .layout import unsqueezed

__all__ = ["OPS", "plan_of", "filling", "builders"]

OPS = ("reshape", "flatten", "detach", "transpose", "broadcast_like", "expand", "ones_like",
       "constant")
"""The library's movement op types: every backend's record has a step maker for each."""


def plan_of(node, ins: list, outs: list):
    """The plan a movement step maker gets, or None (no step) for an empty output: ``perm`` of
    a ``transpose``; x's shape with the ``broadcast_axes`` as 1, of ``out``'s rank, for
    ``broadcast_like``, or with leading 1s for ``expand``; the value of a fill (``ones_like``:
    1.0, ``constant``: ``attrs["value"]`` as a float); ``()`` for the flat copies."""
    op, a = node.op.name, node.attrs
    if outs[0].size == 0:
        return None
    if op == "transpose":
        return tuple(a["perm"])
    if op == "broadcast_like":
        return unsqueezed(ins[0].shape, a["broadcast_axes"], outs[0].ndim)
    if op == "expand":
        return (1,) * (outs[0].ndim - ins[0].ndim) + tuple(ins[0].shape)
    if op == "ones_like":
        return 1.0
    if op == "constant":
        return float(a["value"])
    return ()


def filling(fill_steps) -> StepMaker:
    """The step maker of a fill over a backend's ``fill_steps(out, value)``: the first output
    filled with the plan's value (x, if any, is read for its shape only)."""
    def steps(ins, outs, value, attrs):
        return fill_steps(outs[0], value)

    steps.__name__ = f"filling({fill_steps.__name__})"
    return steps


def builders(**steps: StepMaker) -> dict:
    """Op type -> builder over a backend's step makers ``steps`` (keyword: op type, value: its
    ``family.StepMaker``, with the plan of :func:`plan_of`), the backend's record of the
    movement family."""
    return record("movement", plan_of, steps)
