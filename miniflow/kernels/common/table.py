"""A backend's kernel table and its lookup: ``KERNELS`` is merged from the ``BUILDERS`` of the
backend's modules (:func:`kernel_table`); :func:`builder_for` finds an op's builder there, or
derives it from the op's scalar function when the plan is built; :class:`GroupBuilder` is what
a backend's ``group_builder(op)`` returns."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .elementwise import StepMakers, derived_builder

__all__ = ["kernel_table", "builder_for", "GroupBuilder"]


def kernel_table(*modules) -> dict:
    """Op type -> builder, merged from each module's ``BUILDERS``.

    Raises:
        ValueError: two modules build the same op type, naming it and both modules.
    """
    table, owner = {}, {}
    for module in modules:
        for name, build in module.BUILDERS.items():
            if name in table:
                raise ValueError(f"kernel table: op {name!r} has builders in {owner[name]} and "
                                 f"{module.__name__}; keep one")
            table[name], owner[name] = build, module.__name__
    return table


def builder_for(op, table: dict, steps: StepMakers):
    """``op``'s builder on a backend: its entry in the backend's ``table``, else the one derived
    from its scalar function with the backend's ``steps`` (``elementwise.derived_builder``); None
    if neither."""
    builder = table.get(op.name)
    return builder if builder is not None else derived_builder(op, steps)


@dataclass(frozen=True)
class GroupBuilder:
    """The builder of a group of nodes of one op type run as one kernel (multi-tensor):
    ``build(nodes, ins, outs)`` with ``ins[j]`` / ``outs[j]`` node ``j``'s arrays. The plan
    groups only nodes whose shared inputs (:meth:`shared_inputs`) are the same values and whose
    attributes and input dtypes are equal (``runtime.plan.grouped_nodes``).

    ``shared``: the indices of the inputs every member shares (an update's learning rate and
    ``skip_if``); ``select``: instead, ``node -> indices``, or None when the node cannot be
    grouped (a ``fused_elementwise`` node: its one-element inputs, if it is one-dimensional)."""

    build: Callable
    shared: tuple = (2, 3)
    select: Callable | None = None

    def shared_inputs(self, node):
        """The indices of ``node``'s inputs its group shares, or None: it joins no group."""
        return self.shared if self.select is None else self.select(node)
