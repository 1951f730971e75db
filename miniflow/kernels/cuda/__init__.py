"""The CUDA backend's kernels (numba-cuda): :data:`KERNELS` (op type -> builder) and
:func:`builder_for`, which also derives the builder of every elementwise op from its scalar
function (the builder contract: ``miniflow.runtime.backend.Backend``).

Arrays are C-contiguous device arrays; a step is one kernel launch (a ``launch.Launch``) that copies
nothing between host and device. Modules, mirrored from ``kernels.cpu``: ``common`` (jit decorators,
compute/storage types, device helpers, the simulator's ``math``), ``elementwise`` (map / zip /
broadcast / cast), ``movement`` (reshape, transpose, broadcast_like, fills: gathers and copies),
``reduce`` (reduce_sum, softmax family, cross entropy), ``matmul`` (tiled), ``update`` (SGD, Adam,
Adadelta, multi-tensor), ``loss_scale`` (the loss-scale stage), ``clip`` (gradient clipping),
``collective`` (MPI collectives staged through host memory), ``fused`` (generated kernels of
``fused_elementwise``), ``conv`` (implicit GEMM), ``normalization`` (batch norm, layer norm),
``pool`` (max, average, adaptive average), ``indexing`` (gather and its scatter-add, slice, tril,
masked_fill, one-axis max / argmax), ``dropout`` (counter-based masks); CUDA only: ``launch`` (block
sizes, grids, the tiles), ``simulator`` (a thread-safe ``cuda.shared.array`` under numba's CUDA
simulator). Builders shared with the CPU backend come from ``kernels.common``.

Precision: the CPU backend's contract. f16 and f32 compute in float32, f64 in float64; f16 is
converted on load and store only; matmul accumulates in float32 (float64 for f64) and rounds the
result once.
"""
from __future__ import annotations

from . import (clip, collective, conv, dropout, elementwise, fused, indexing, loss_scale, matmul,
               movement, normalization, pool, reduce, update)
from ..common import table

__all__ = ["KERNELS", "builder_for", "fused_builder", "group_builder"]

KERNELS, builder_for = table.backend_kernels(__name__, [
    clip, collective, conv, dropout, elementwise, fused, indexing, loss_scale, matmul, movement,
    normalization, pool, reduce, update])
"""``KERNELS``: op type -> builder of the ops whose kernels are not derived from a scalar function
(merged from the ``BUILDERS`` of the families, ``table.FAMILIES``); ``builder_for(op)``: its
builder, found or derived."""


def fused_builder(producer, consumer):
    """The builder of op types ``producer`` then ``consumer`` (OpDefs) as one kernel, or None
    (``Backend.fused_builder``): ``reduce_sum`` then an elementwise map of one tensor operand
    (the mean loss: ``scalar_mul`` of the sum) is ``reduce.reduce_sum_then``."""
    if (producer.name == "reduce_sum" and consumer.scalar is not None
            and consumer.tensor_arity == 1):
        return reduce.reduce_sum_then(consumer)
    return None


def group_builder(op):
    """The builder of several nodes of op type ``op`` (an OpDef) as one launch, or None
    (``Backend.group_builder``): ``sgd_update``, ``adam_update`` and ``adadelta_update``
    (``update.GROUPS``), one-dimensional ``fused_elementwise`` (``fused.GROUPS``)."""
    return update.GROUPS.get(op.name) or fused.GROUPS.get(op.name)
