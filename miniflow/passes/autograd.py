"""Graph autograd: reverse-mode differentiation as a pass that emits backward nodes into the IR.

Assumes: ``graph.loss`` (the ``"loss"`` result) is set by ``loss.backward()`` in build, or the
graph is inference-only.
Guarantees: the initial gradient is ``ones_like(loss)`` (the loss is its real input, as in OneFlow),
recorded as ``ctx.state[AutogradState].initial_grad`` so later passes find it
(``ctx.settings.initial_grad_identity``, when set, is applied on top of it and seeds the backward
pass); every trainable variable reachable from the loss has its gradient Value in
``graph.results["grad:<name>"]``; fan-out gradients are summed with one ``add_n``, or joined by
one ``cat`` when they are the ``slice_grad`` s of slices that tile the value along one axis (the
q, k, v split of attention: no zero-filled buffers to add); gradients are
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
        if len(parts) == 1:
            return parts[0]
        tiles = _tiles(v, parts)
        return emit("cat", *tiles[1], axis=tiles[0]) if tiles else emit("add_n", *parts)

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


def _tiles(v: Value, parts: list):
    """``(axis, dys)`` when every part is a ``slice_grad(dy)`` of ``v``'s shape whose slices
    (unit steps, whole on every other axis) tile ``v`` along ``axis``: ``dys`` in the slices'
    order, whose ``cat`` is the sum of the parts. Else None."""
    shape, axis, spans = tuple(v.shape), None, []
    for p in parts:
        node = p.producer
        if node is None or node.op.name != "slice_grad":
            return None
        a = node.attrs
        cut = [d for d in range(len(shape)) if (a["start"][d], a["stop"][d]) != (0, shape[d])]
        if tuple(a["like_shape"]) != shape or any(k != 1 for k in a["step"]) or len(cut) != 1 \
                or axis not in (None, cut[0]) or node.inputs[0].dtype != parts[0].dtype:
            return None
        axis = cut[0]
        spans.append((a["start"][axis], a["stop"][axis], node.inputs[0]))
    spans.sort(key=lambda s: (s[0], s[1]))
    ends = [0] + [stop for _, stop, _ in spans]
    if any(start != end for (start, _, _), end in zip(spans, ends)) or ends[-1] != shape[axis]:
        return None
    return axis, [dy for _, _, dy in spans]


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
