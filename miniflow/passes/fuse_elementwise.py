"""Elementwise fusion: merge chains of elementwise ops (casts included) into ``fused_elementwise``
nodes, each run by one generated kernel (``miniflow/kernels/cpu/fused.py``).

Assumes: the IR is final but for dead code (autograd, AMP, loss scaling and the optimizer pass have
run), so dtypes and casts are decided. Fusible nodes: ops whose definition has a scalar function
(``OpDef.scalar``, any op declared that way, so a new elementwise op fuses without a change here)
with a floating output (an int64 ``identity`` is left alone) and casts to a float dtype
(``cast``, and ``cast_like``, a cast to its output's dtype, decided once AMP ran: its
``dtype_like`` input gives the dtype only, so the group does not read it);
``bias_add`` only along the last axis, where it is NumPy broadcasting (``broadcast_add``'s
function); ``scalar_mul_by_tensor`` (the loss scaler's unscale, the clip factor) where its
one-element tensor has no more dims than the output, NumPy broadcasting too (``broadcast_mul``'s
function): with AMP the cast of each float16 gradient to float32 and its unscale become one kernel.
AMP identities stay visible (a user put them there; AMP prunes them).

Guarantees: the graph computes the same bits as before: the fused expression rounds every result to
its dtype where the unfused node stored it (``ops/fused.py``). A fused node takes the place of the
last node of its group and reuses the group's Values, so readers need no rewiring. Every Value read
outside its group or named by a result (``graph.results``: outputs, loss, gradients, counts, all
alike) is an output of its fused node; the others live only in registers. A group is
formed only if every outside reader of its values comes after its last node and no update op writes
one of its inputs in between. A group has one output shape; a producer of a smaller shape (the cast
of a bias) joins only when nothing outside the group reads it, and is then recomputed per element,
which is exact. Groups of one node are left alone.

Greedy, in node order: each fusible node joins the groups of the producers of its inputs where that
is legal. Source: XLA's loop and multi-output fusion (``xla/service/instruction_fusion.cc``), TVM's
``FuseOps`` pass for injective ops.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Value
from ..ops import get_op
from ..ops.amp_ops import AMP_IDENTITY_OPS
from ..ops.fused import CASTS
from ..ops.fused import broadcast_kinds, format_program
from .dead_code_elimination import dead_code_elimination

__all__ = ["fuse_elementwise"]

_CASTS = {dtype.name: fn for fn, dtype in CASTS.items()}
"""Cast target dtype name -> the expression language's cast function (``f16`` ...)."""


def fuse_elementwise(graph: Graph, ctx=None) -> Graph:
    """Replace each fusible group of two or more nodes by one ``fused_elementwise`` node.

    Dead nodes are removed first: a dead member would add an input its expression never reads."""
    graph = dead_code_elimination(graph)
    fusion = _Fusion(graph)
    groups = fusion.groups()
    last = {g[-1]: g for g in groups}
    fused = {n for g in groups for n in g}
    nodes = []
    for node in graph.nodes:
        if node in last:
            nodes.append(fusion.fused_node(last[node]))
        elif node not in fused:
            nodes.append(node)
    graph.nodes = nodes
    return graph


def _read(node: Node) -> list:
    """The inputs whose values ``node`` reads: all but its op's ``shape_inputs``
    (``cast_like``'s ``dtype_like``)."""
    return [v for k, v in enumerate(node.inputs) if k not in node.op.shape_inputs]


def _term(node: Node, args: list):
    """The expression term of ``node`` applied to argument terms ``args`` (of :func:`_read`)."""
    op = node.op
    if op.name in ("cast", "cast_like"):
        return ("call", _CASTS[node.outputs[0].dtype.name], tuple(args))
    if op.name == "bias_add":            # along the last axis: NumPy broadcasting of an add
        op = get_op("broadcast_add")
    elif op.name == "scalar_mul_by_tensor":     # a one-element tensor: NumPy broadcasting
        op = get_op("broadcast_mul")
    args = args + [("num", v) for v in op.scalar_args(node.attrs)]
    return ("call", op.scalar.__name__, tuple(args))


def _fusible(node: Node) -> bool:
    out = node.outputs[0] if len(node.outputs) == 1 else None
    name = node.op.name
    if out is None or out.size == 0 or name in AMP_IDENTITY_OPS:
        return False
    if name in ("cast", "cast_like"):
        ok = out.dtype.name in _CASTS
    elif name == "bias_add":
        ok = node.attrs["axis"] == len(out.shape) - 1
    elif name == "scalar_mul_by_tensor":
        ok = len(node.inputs[1].shape) <= len(out.shape)
    else:
        ok = node.op.scalar is not None and out.dtype.is_float
    return ok and broadcast_kinds(out.shape, [v.shape for v in _read(node)]) is not None


class _Fusion:
    """The grouping of one graph's nodes, then the fused node of each group."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.readers = graph.users()
        self.pos = {n: i for i, n in enumerate(graph.nodes)}
        self.pinned = set(graph.results.values())
        self.writes: dict = {}                      # Value -> positions of nodes writing it
        for i, n in enumerate(graph.nodes):
            for v in n.written:
                self.writes.setdefault(v, []).append(i)

    def groups(self) -> list:
        """Lists of nodes (in graph order), one per group of two or more."""
        group_of: dict = {}
        for i, node in enumerate(self.graph.nodes):
            if not _fusible(node):
                continue
            members = [node]
            for g in self._producer_groups(node, group_of):
                if self._legal(g, g + members, i):
                    members = sorted(g + members, key=lambda n: self.pos[n])
            for n in members:
                group_of[n] = members
        unique = {id(g): g for g in group_of.values() if len(g) > 1}
        return list(unique.values())

    @staticmethod
    def _producer_groups(node: Node, group_of: dict) -> list:
        out, seen = [], set()
        for v in _read(node):
            g = group_of.get(v.producer) if v.producer is not None else None
            if g is not None and id(g) not in seen:
                seen.add(id(g))
                out.append(g)
        return out

    def _outside_readers(self, v: Value, members: list) -> list:
        inside = set(members)
        return [n for n in self.readers.get(v, []) if n not in inside]

    def _legal(self, group: list, members: list, last: int) -> bool:
        """Whether ``members`` (``group`` and the node at ``last``) can be one node there."""
        shape = self.graph.nodes[last].outputs[0].shape
        group_shape = group[-1].outputs[0].shape
        same_shape = group_shape == shape
        for n in group:
            for v in n.outputs:
                outside = self._outside_readers(v, members)
                if not same_shape and (outside or v in self.pinned):
                    return False            # a smaller shape is recomputed, so it cannot be output
                if any(self.pos[r] < last for r in outside):
                    return False            # a reader would run before the fused node
        if not same_shape and tuple(np.broadcast_shapes(group_shape, shape)) != shape:
            return False
        ins = self._inputs(members)
        for n in members:                   # an update op between a read and the fused node
            for v in n.inputs:
                if any(self.pos[n] < p < last for p in self.writes.get(v, ())):
                    return False
        return broadcast_kinds(shape, [v.shape for v in ins]) is not None

    @staticmethod
    def _inputs(members: list) -> list:
        """Values the group reads from outside, in order of first use."""
        made = {v for n in members for v in n.outputs}
        out, seen = [], set()
        for n in members:
            for v in _read(n):
                if v not in made and v not in seen:
                    seen.add(v)
                    out.append(v)
        return out

    def fused_node(self, members: list) -> Node:
        """The ``fused_elementwise`` node computing ``members``' outside-visible values."""
        inputs = self._inputs(members)
        index = {v: k for k, v in enumerate(inputs)}
        uses: dict = {}
        for n in members:
            for v in _read(n):
                uses[v] = uses.get(v, 0) + 1
        terms, statements, outputs, temps = {}, [], [], 0
        for n in members:
            v = n.outputs[0]
            args = [("x", index[a]) if a in index else terms[a] for a in _read(n)]
            term = _term(n, args)
            if self._outside_readers(v, members) or v in self.pinned:
                name = f"y{len(outputs)}"
                outputs.append(v)
            elif uses.get(v, 0) > 1:
                name, temps = f"t{temps}", temps + 1
            else:
                terms[v] = term
                continue
            statements.append((name, term))
            terms[v] = ("ref", name)
        node = Node(get_op("fused_elementwise"), inputs, outputs,
                    {"expr": format_program(statements)})
        for v in outputs:
            v.producer = node
        return node
