"""Dead-code elimination: drop nodes whose outputs nothing uses.

Keeps: nodes of side-effecting ops (update ops, which write variables), nodes producing graph
outputs or the non-finite counts the grad scaler reads, and everything they depend on. Unused inputs stay declared (the caller still passes them).
"""
from __future__ import annotations

from ..ir import Graph
from ..ops import get_op

__all__ = ["dead_code_elimination"]


def dead_code_elimination(graph: Graph, ctx=None) -> Graph:
    """Remove dead nodes in place; returns the graph."""
    live = {id(v) for v in graph.outputs}
    if graph.nonfinite_counts is not None:  # read back by the grad scaler after every step
        live.add(id(graph.nonfinite_counts))
    kept = []
    for node in reversed(graph.nodes):
        if get_op(node.op).side_effect or any(id(v) in live for v in node.outputs):
            kept.append(node)
            live.update(id(v) for v in node.inputs)
    graph.nodes = kept[::-1]
    used = [v for n in graph.nodes for v in n.inputs] + graph.outputs
    used_ids = {id(v) for v in used}
    used_constants = {v.name for v in used if v.kind == "constant"}
    for name in [k for k, v in graph.variables.items() if id(v) not in used_ids]:
        del graph.variables[name]
        del graph.variable_data[name]
    for name in [k for k in graph.constant_data if k not in used_constants]:
        del graph.constant_data[name]
    return graph
