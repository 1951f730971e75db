"""Gradient accumulation pass: the mean of the micro-batches' parameter gradients
(``config.set_gradient_accumulation_steps(n)``, OneFlow's name).

Assumes: the compile driver split every graph input into ``settings.accumulation_steps``
micro-batches (``unpack``) and packed every output (``pack``) while tracing, as OneFlow's lazy interpreter does
(``GradAccTryInsertUnpackAfterInput`` / ``GradAccTryInsertPackBeforeOutput``), so the forward and
backward nodes run once per micro-batch (``miniflow.ir.Graph.micro_batch_schedule``); autograd and
AMP ran. Guarantees: every gradient result is ``scalar_mul(acc(g), 1/n)``, once per call: the
gradient cast to its parameter's dtype first (``passes.master_grad``: a float16 gradient is
summed in float32), summed over the micro-batches (``acc``, OneFlow's ``GradAccCollect``) and
divided by ``n`` (OneFlow's ``ScaleModelDiffByLossInstanceNum``, which divides the model diffs by
the loss's element count times its time shape ``n``). For a mean-reduced loss over micro-batches
of equal size that is the gradient of the whole mini-batch.

The passes after it see one gradient per parameter, as without accumulation: the loss-scale
pass unscales the mean and counts its non-finite values once (a micro-batch that overflowed
makes the sum non-finite, so the whole update is skipped), while the initial gradient is scaled
in every micro-batch (it is made once per micro-batch); clipping and the updates run once.
"""
from __future__ import annotations

from ..ir import Graph, grad_name
from ..ops import emitter
from .master_grad import master_grad

__all__ = ["gradient_accumulation"]


def gradient_accumulation(graph: Graph, ctx) -> Graph:
    """Make every gradient result the mean over the micro-batches (no-op for one micro-batch or
    a graph without gradients)."""
    n = ctx.settings.accumulation_steps
    if n == 1 or not graph.grads:
        return graph
    emit = emitter(graph)
    for name, g in graph.grads.items():
        total = emit("acc", master_grad(graph, graph.variables[name], g), max_acc_num=n)
        graph.results[grad_name(name)] = emit("scalar_mul", total, scalar=1.0 / n)
    return graph
