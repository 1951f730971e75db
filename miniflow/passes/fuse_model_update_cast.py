"""Fuse the AMP weight casts, the unscaling and the optimizer updates into multi-tensor updates with
cast, and count the non-finite gradient elements where the gradients are made.

Assumes: AMP, the loss-scale pass and the optimizer pass have run (``settings.amp`` is set): every
trained float32 parameter ``p`` has one update op (``sgd_update`` / ``adam_update`` /
``adadelta_update``) reading its gradient ``d``, which the loss-scale pass made as
``scalar_mul_by_tensor(cast(h), inv_scale)`` (dynamic scale), ``scalar_mul(cast(h)) {1/scale}``
(static) or ``cast(h)`` (no scaler), ``h`` the gradient the backward made (half, or float32: then no
cast); and AMP read ``p`` in half through ``cast(p) {dtype=half}`` nodes.

Guarantees, for every such parameter read through a half cast (the others are left alone):

* One half variable ``<p>.<half>_copy`` (``model.0.weight.float16_copy``) holds ``p`` rounded
  to the half type; every reader of the casts reads it instead, and the casts are gone. Its array
  is the parameter's own half copy (the compile driver binds it, ``FusedUpdateState.half_copies``,
  and makes it equal ``p`` rounded before a step whenever ``p`` was written by anything else).
* The update ops become ``multi_tensor_sgd_update_with_cast`` / ``multi_tensor_adam_update_with_
  cast`` / ``multi_tensor_adadelta_update_with_cast`` (miniflow's: OneFlow has no Adadelta), one
  per optimizer, hyper-parameters and gradient dtype (OneFlow's
  ``FuseModelUpdateCastOpsPass`` and ``MultiTensorModelUpdatePass``): they read ``h`` and
  ``inv_scale`` (a constant for a static scale, 1 without a scaler) and, in one pass over each
  weight, unscale, update, and write the half copy that the next step's matmuls read. The cast
  of ``h`` and the unscaling node go (dead-code elimination), and the ``grad:<p>`` result becomes
  ``h``, the gradient the fused update reads (scaled, in the backward's dtype).
* When anything else reads the unscaled gradient (gradient clipping: ``clip_grad_norm`` and the
  clipped product), the unscaling stays and the fused update reads the final gradient with scale
  1: the copy is still fused, nothing else is.
* Non-finite counting (skip all or nothing, as before): ``multi_count_not_finite`` counts ``h``
  instead of its unscaled value when the two counts are equal for every scale the scaler can
  have (``|h| <= max finite of h's dtype`` times ``1 / lowest scale`` is finite in float32: a
  float16 gradient under any scale above 2e-34; bfloat16 and float32 gradients when the scale
  stays >= 1), and when ``h`` comes from a matmul read by nothing else, the matmul counts it in
  the pass that rounds its product (``count_not_finite=True``, a second output) and the count
  node copies that count (``precounted``). The count still completes before any update runs:
  updates read ``skip_if``, the total. Otherwise the count reads the unscaled gradient, as before.

The fused graph computes the bits of the unfused one: the update kernels multiply the widened
gradient by ``inv_scale`` in float32 (the unscaling node's product), run the same update body,
and round the new weight as ``cast`` rounds it; the tests compare both, weights, optimizer state,
copies and skipped steps.

Source: OneFlow's ``fuse_model_update_cast_pass.cpp`` (its casts become ``mutable_cast_once``,
which casts at the first run only; here the copy is a variable the driver keeps equal to the
weight) and ``multi_tensor_model_update.cpp``; the kernels are OneFlow's
``multi_tensor_model_update_kernel``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..dtype import float32, max_finite
from ..ir import Graph, Node, Value, grad_name
from ..ops import get_op
from .dead_code_elimination import dead_code_elimination
from .loss_scale import LossScaleState

__all__ = ["fuse_model_update_cast", "FusedUpdateState", "copy_name", "count_commutes"]

_FUSED = {"sgd_update": "multi_tensor_sgd_update_with_cast",
          "adam_update": "multi_tensor_adam_update_with_cast",
          "adadelta_update": "multi_tensor_adadelta_update_with_cast"}


@dataclass
class FusedUpdateState:
    """What the pass hands on (``ctx.state[FusedUpdateState]``, read by the compile driver's
    ``HalfCopies``): ``half_copies``, the ``(parameter, copy variable)`` names of the half weight
    copies it declared, without data (the driver binds them). Absent when nothing was fused."""

    half_copies: list = field(default_factory=list)


def copy_name(param: str, dtype) -> str:
    """The variable name of ``param``'s half copy: ``model.0.weight.float16_copy``."""
    return f"{param}.{dtype.name}_copy"


def count_commutes(dtype, scaler) -> bool:
    """Whether counting the non-finite elements of a gradient of ``dtype`` gives the count of the
    gradient times ``inv_scale`` for every ``inv_scale`` the loss-scale stage can use (``scaler``
    None: no scaling): the largest ``inv_scale`` is float32's 1 / (lowest scale: the static scale,
    or the dynamic ``min_scale``, both as float32), and a finite element stays finite when
    ``max_finite(dtype) * largest inv_scale`` (exact in float64) is at most float32's max; inf
    and NaN stay what they are."""
    if scaler is None:
        return True
    lowest = np.float32(scaler.schedule_attrs()["min_scale"] if scaler.dynamic else scaler.scale)
    largest_inverse = float(np.float32(1.0 / float(lowest)))
    return (math.isfinite(largest_inverse)
            and max_finite(dtype) * largest_inverse <= max_finite(float32))


class _Update:
    """One update op and what fusing it takes: the gradient the fused op reads (``diff``), the
    scale it multiplies it by (a Value, or a float for a constant), the nodes that made the
    unscaled gradient (removed when nothing else reads them) and the parameter's half casts."""

    def __init__(self, node, name, casts, diff, scale, unscaled):
        self.node, self.name, self.casts = node, name, casts
        self.diff, self.scale, self.unscaled = diff, scale, unscaled


def _unscaling(users: dict, update: Node, count: Node | None, ctx):
    """``(diff, scale, unscaled)`` for ``update``'s gradient ``d``: the loss-scale stage's
    gradient before its cast and unscaling, the scale, and the Values the stage made from it (``d``
    first), when nothing but the next of those nodes, ``update`` and ``count`` reads them; else
    ``(d, 1.0, None)``."""
    d = update.inputs[1]
    as_is = (d, 1.0, None)
    scaler = ctx.settings.grad_scaler
    chain, v, scale = [], d, 1.0
    if scaler is not None:
        inv_scale = ctx.state[LossScaleState].inv_scale
        node = d.producer
        if node is None:
            return as_is
        if scaler.dynamic and node.op.name == "scalar_mul_by_tensor" \
                and node.inputs[1] is inv_scale:
            scale = inv_scale
        elif not scaler.dynamic and node.op.name == "scalar_mul" \
                and node.attrs["scalar"] == 1.0 / scaler.scale:
            scale = float(np.float32(1.0 / scaler.scale))
        else:
            return as_is
        chain.append(node)
        v = node.inputs[0]
    cast = v.producer
    if cast is not None and cast.op.name == "cast" and v.dtype is float32 \
            and cast.inputs[0].dtype.is_half:
        chain.append(cast)
        v = cast.inputs[0]
    if not chain:
        return as_is
    made = [n.outputs[0] for n in chain]
    for value in made:
        if not all(r is update or r is count or any(r is c for c in chain)
                   for r in users.get(value, [])):
            return as_is
    return v, scale, made


def fuse_model_update_cast(graph: Graph, ctx) -> Graph:
    """Rewrite ``graph`` as the module docstring says (no change without AMP, updates, or when
    ``settings.fuse_model_update_cast`` is off); stores a :class:`FusedUpdateState`."""
    settings = ctx.settings
    if settings.amp is None or not settings.fuse_model_update_cast:
        return graph
    half = settings.amp.dtype
    users = graph.users()
    names = {v: k for k, v in graph.variables.items()}
    counts = [n for n in graph.nodes if n.op.name == "multi_count_not_finite"]
    count = counts[0] if len(counts) == 1 else None
    fusable = []
    for node in graph.nodes:
        if node.op.name not in _FUSED:
            continue
        p = node.inputs[0]
        casts = [r for r in users.get(p, []) if r.op.name == "cast"
                 and r.attrs["dtype"] is half]
        if p.dtype is not float32 or not casts:
            continue
        diff, scale, unscaled = _unscaling(users, node, count, ctx)
        if unscaled and count is not None and any(v in count.inputs for v in unscaled) \
                and not count_commutes(diff.dtype, settings.grad_scaler):
            diff, scale, unscaled = node.inputs[1], 1.0, None   # the count needs the unscaled
        fusable.append(_Update(node, names[p], casts, diff, scale, unscaled))
    if not fusable:
        return graph
    ctx.state[FusedUpdateState] = FusedUpdateState(_rewrite(graph, fusable, count, half))
    return graph


def _group_key(u: _Update):
    n = u.node
    return (n.op.name, tuple(sorted(n.attrs.items())), n.inputs[2], n.inputs[3],
            u.diff.dtype.name, u.scale)


def _rewrite(graph: Graph, fusable: list, count, half) -> list:
    """Declare the copies, rewire the casts, emit the fused updates, move the counts; returns
    the ``(parameter, copy variable)`` names."""
    groups: dict = {}
    copies = []
    for u in fusable:
        groups.setdefault(_group_key(u), []).append(u)
    removed = set()
    for u in fusable:
        p = u.node.inputs[0]
        u.copy = graph.add_variable(copy_name(u.name, half), p.shape, half)
        copies.append((u.name, u.copy.name))
        for cast in u.casts:
            graph.replace_uses(cast.outputs[0], u.copy)
            removed.add(cast)
    for members in groups.values():
        first = members[0].node
        scale = members[0].scale
        if isinstance(scale, float):
            scale = graph.add_constant(np.array([scale], np.float32))
        lr, skip_if = first.inputs[2], first.inputs[3]
        per_tensor = [[u.node.inputs[0] for u in members], [u.diff for u in members],
                      [u.copy for u in members]]
        state = len(first.inputs) - 4            # momentum_buf; m, v, step; Adadelta's three
        per_tensor += [[u.node.inputs[4 + s] for u in members] for s in range(state)]
        with graph.inserting_before(first):
            graph.emit(get_op(_FUSED[first.op.name]), lr, skip_if, scale,
                       *(v for group in per_tensor for v in group), **first.attrs)
        removed.update(u.node for u in members)
    graph.nodes = [n for n in graph.nodes if n not in removed]
    for u in fusable:
        if u.unscaled:
            graph.results[grad_name(u.name)] = u.diff
            if count is not None:
                count.inputs = [u.diff if v in u.unscaled else v for v in count.inputs]
    if count is not None:
        _count_in_producers(graph, count, {u.diff for u in fusable if u.unscaled})
    return copies


def _count_in_producers(graph: Graph, count: Node, moved: set) -> None:
    """Let the matmuls that make a gradient the count node reads count it (``count_not_finite``:
    a second output) when nothing but a fused update and the count node reads that gradient
    (the unscaling nodes it replaced are removed first)."""
    dead_code_elimination(graph)
    users = graph.users()
    pre = set(count.attrs.get("precounted", ()))
    for k, v in enumerate(list(count.inputs)):
        node = v.producer
        if v not in moved or node is None or node.op.name != "matmul" \
                or len(node.outputs) != 1 \
                or not all(r is count or r.op.name in _FUSED.values() for r in users[v]):
            continue
        attrs = node.op.normalize_attrs(node.inputs, {**node.attrs, "count_not_finite": True})
        counted = Node(node.op, list(node.inputs), [], attrs, dict(node.meta))
        (_, _), (shape, dtype) = node.op.infer(counted.inputs, attrs)
        taken = Value(graph.fresh_name(), shape, dtype, producer=counted)
        counted.outputs = [v, taken]        # a new node: what AMP recorded about the old stays
        v.producer = counted
        graph.nodes[graph.nodes.index(node)] = counted
        count.inputs[k] = taken
        pre.add(k)
    if pre:
        count.attrs = {**count.attrs, "precounted": tuple(sorted(pre))}
