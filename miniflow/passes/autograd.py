"""Graph autograd: reverse-mode differentiation as a pass that emits backward nodes into the IR.

Assumes: ``graph.loss`` (the ``"loss"`` result) is set by ``loss.backward()`` in build, or the
graph is inference-only.
Guarantees: the initial gradient is ``ones_like(loss)`` (the loss is its real input, as in OneFlow),
recorded as ``ctx.state[AutogradState].initial_grad`` so later passes find it
(``ctx.settings.initial_grad_identity``, when set, is applied on top of it and seeds the backward
pass); every trainable variable reachable from the loss has its gradient Value in
``graph.results["grad:<name>"]``; fan-out gradients are summed with one ``add_n``; gradients are
emitted only for values on a path from a trainable variable to the loss, and backward nodes that
no parameter gradient needs are removed before the pass returns.

Source: OneFlow ``oneflow/core/job_rewriter/autograd.cpp`` (backward ops generated into the same
job); the gradient rules are a table over the IR, walked in reverse (tinygrad's
``mixin/gradient.py``, micrograd's ``backward``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Graph, Value, grad_name
from ..ops import emitter

__all__ = ["AutogradState", "autograd"]


@dataclass(frozen=True)
class AutogradState:
    """What autograd hands on (``ctx.state[AutogradState]``, read by the loss-scale pass):
    ``initial_grad``, the ``ones_like(loss)`` Value that seeds the backward pass (before
    ``settings.initial_grad_identity``, if any, is applied on top of it)."""

    initial_grad: Value


def _needs_grad(graph: Graph, trainable: set) -> set:
    """The Values that depend on a trainable variable AND that the loss depends on."""
    fwd = {graph.variables[n] for n in trainable if n in graph.variables}
    for node in graph.nodes:
        if any(v in fwd for v in node.inputs):
            fwd.update(node.outputs)
    back = {graph.loss}
    for node in reversed(graph.nodes):
        if any(v in back for v in node.outputs):
            back.update(node.inputs)
    return fwd & back


def autograd(graph: Graph, ctx) -> Graph:
    """Emit the backward graph of ``graph.loss`` w.r.t. ``settings.trainable`` (variable names);
    stores an :class:`AutogradState`."""
    if graph.loss is None:
        return graph
    settings = ctx.settings
    forward = list(graph.nodes)
    needs = _needs_grad(graph, set(settings.trainable))
    emit = emitter(graph)
    seed = initial = emit("ones_like", graph.loss)
    ctx.state[AutogradState] = AutogradState(initial)
    if settings.initial_grad_identity is not None:
        seed = emit(settings.initial_grad_identity, seed)
    contributions: dict = {graph.loss: [seed]}

    def total(v):
        parts = contributions.pop(v, None)
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else emit("add_n", *parts)

    for node in reversed(forward):
        if not any(v in needs for v in node.inputs):
            continue
        out_grads = [total(v) for v in node.outputs]
        if all(g is None for g in out_grads):
            continue
        if node.op.grad is None:
            raise NotImplementedError(f"autograd: op {node.op.name!r} has no gradient rule "
                                      f"(node: {node.format(graph.names())})")
        for v, g in zip(node.inputs, node.op.grad(node, out_grads, emit)):
            if g is not None and v in needs:
                contributions.setdefault(v, []).append(g)
    for name in settings.trainable:
        v = graph.variables.get(name)
        if v is not None and v in contributions:
            graph.results[grad_name(name)] = total(v)
    _drop_unused_backward(graph, len(forward), initial)
    return graph


def _drop_unused_backward(graph: Graph, n_forward: int, initial_grad) -> None:
    """Remove backward nodes that no parameter gradient needs.

    A gradient rule emits a gradient for every input (matmul's ``dx`` for a graph input ``x`` too).
    OneFlow's autograd never generates those; left in, they would be sinks that the AMP pass colors.
    """
    live = set(graph.grads.values()) | {initial_grad}
    kept = []
    for node in reversed(graph.nodes[n_forward:]):
        if any(v in live for v in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    graph.nodes = graph.nodes[:n_forward] + kept[::-1]
