"""Dead-code elimination: drop nodes whose outputs nothing uses.

Keeps: nodes that write variables in place (``Node.written``: update ops, a training-mode
``normalization``), nodes
producing a result (user outputs, the loss, gradients, the non-finite counts the grad scaler reads:
every ``graph.results`` entry alike), and everything they depend on. Unused variables and constants
are dropped; unused inputs stay declared (the caller still passes them).
"""
from __future__ import annotations

from ..ir import Graph

__all__ = ["dead_code_elimination"]


def dead_code_elimination(graph: Graph, ctx=None) -> Graph:
    """Remove dead nodes in place; returns the graph."""
    live = set(graph.results.values())
    kept = []
    for node in reversed(graph.nodes):
        if node.written or any(v in live for v in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    graph.nodes = kept[::-1]
    used = set(graph.results.values()).union(*(n.inputs for n in graph.nodes))
    for name in [k for k, v in graph.variables.items() if v not in used]:
        del graph.variables[name]
        del graph.variable_data[name]
    for name in [k for k, v in graph.constants.items() if v not in used]:
        del graph.constants[name]
        del graph.constant_data[name]
    return graph
