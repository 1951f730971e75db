"""A backend's kernel table and its lookup: ``KERNELS`` is merged from the ``BUILDERS`` of the
backend's modules (:func:`kernel_table`); :func:`builder_for` finds an op's builder there, or
derives it from the op's scalar function when the plan is built."""
from __future__ import annotations

from .elementwise import StepMakers, derived_builder

__all__ = ["kernel_table", "builder_for"]


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
