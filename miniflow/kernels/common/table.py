"""A backend's kernel table and its lookup: every backend package has the kernel modules
:data:`MODULES` (mirrored file names); ``KERNELS`` is merged from their ``BUILDERS``
(:func:`kernel_table`); :func:`builder_for` finds an op's builder there, or derives it from the
op's scalar function when the plan is built. :func:`backend_kernels` makes both for a package;
:class:`GroupBuilder` is what a backend's ``group_builder(op)`` returns."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from .elementwise import StepMakers, derived_builder

__all__ = ["MODULES", "kernel_table", "builder_for", "backend_kernels", "GroupBuilder"]

MODULES = ("elementwise", "movement", "reduce", "matmul", "update", "loss_scale", "clip", "fused",
           "collective", "conv", "normalization", "pool", "indexing",
           "dropout")
"""The kernel modules of every backend package, each with its ``BUILDERS`` (``elementwise`` also
has ``STEPS``, the step makers of the derived elementwise builders)."""


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


def backend_kernels(package: str) -> tuple:
    """``(KERNELS, builder_for)`` of the backend package ``package`` (``"miniflow.kernels.cpu"``):
    the table merged from its :data:`MODULES` and the lookup over it.

    Raises:
        ModuleNotFoundError: the package lacks one of :data:`MODULES` (the backends mirror them).
        ValueError: two modules build the same op type (:func:`kernel_table`).
    """
    modules = [importlib.import_module(f"{package}.{name}") for name in MODULES]
    kernels = kernel_table(*modules)
    steps = modules[MODULES.index("elementwise")].STEPS

    def lookup(op):
        return builder_for(op, kernels, steps)

    lookup.__doc__ = (f"The {package.rsplit('.', 1)[-1].upper()} builder of ``op`` (an OpDef), "
                      f"found in KERNELS or derived from its scalar function.")
    return kernels, lookup


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
