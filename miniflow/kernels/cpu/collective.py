"""CPU kernel of ``all_reduce`` (semantics in ``miniflow.ops.collective``): the MPI collective
straight on the plan's host buffers, the inputs read and the outputs written
(``kernels.common.collective``)."""
from __future__ import annotations

from ..common.collective import all_reduce_step

__all__ = ["BUILDERS"]


def build_all_reduce(node, ins, outs):
    """One step: ``ins`` reduced across the ranks into ``outs``."""
    return [all_reduce_step(node, ins, outs)]


BUILDERS = {"all_reduce": build_all_reduce}
"""Op type -> builder for the collectives."""
