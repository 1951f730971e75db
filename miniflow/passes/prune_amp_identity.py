"""Remove ``amp_white_identity`` / ``amp_black_identity`` nodes once AMP has colored the graph.

Assumes: the AMP pass has run, so the identities have done their only job (pinning the colors of their
neighbours; the casts the AMP pass inserted around them stay). Guarantees: no AMP identity node is
left; every reader of an identity's output, and every result that was it (``graph.replace_uses``),
reads its input instead. Identity in value and dtype, so the graph computes the same values with
fewer copies.

Source: OneFlow's ``PruneAmpWhiteIdentityOpPass`` (in ``oneflow/core/job_rewriter/``), which runs
right after AutoMixedPrecision and prunes both identity op types. Its first version never pruned
anything (its filter condition was always true); this one does.
"""
from __future__ import annotations

from ..ir import Graph
from ..ops.amp_ops import AMP_IDENTITY_OPS

__all__ = ["prune_amp_identity"]


def prune_amp_identity(graph: Graph, ctx=None) -> Graph:
    """Drop every AMP identity node, rewiring its readers to its input; returns the graph."""
    kept = []
    for node in graph.nodes:
        if node.op.name not in AMP_IDENTITY_OPS:
            kept.append(node)
            continue
        (src,), (out,) = node.inputs, node.outputs
        graph.replace_uses(out, src)
    graph.nodes = kept
    return graph
