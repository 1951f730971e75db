"""``amp_report``: what the AMP pass decided, node by node, as a table (``nn.Graph.amp_report()``).

One row per node the AMP pass colored (forward and backward, in graph order): the node, its color,
its output dtype(s) and the rule or neighbouring node that decided it; then the casts the pass
inserted, and the counts of float16 nodes, float32 nodes and casts. Rows of nodes that later passes
removed (the pruned AMP identities) are marked and left out of the counts.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AmpRow", "AmpReport", "amp_report"]


@dataclass
class AmpRow:
    """One node: ``op``, its ``outputs`` (``"%5"``), ``color``, ``dtype`` (``"f16"``, comma-separated
    for several outputs), ``reason``, and ``kept`` (still in the compiled graph)."""

    op: str
    outputs: str
    color: str
    dtype: str
    reason: str
    kept: bool


@dataclass
class AmpReport:
    """Rows, the inserted casts (printed IR lines) and the counts of kept nodes and casts."""

    rows: list
    casts: list
    n_fp16: int
    n_fp32: int
    n_casts: int

    def __str__(self) -> str:
        lines = [f"AMP: {self.n_fp16} float16 nodes, {self.n_fp32} float32 nodes, "
                 f"{self.n_casts} inserted casts",
                 f"  {'node':<42} {'color':<9} {'dtype':<8} reason"]
        for r in self.rows:
            note = "" if r.kept else "  [removed after AMP]"
            lines.append(f"  {r.op + ' ' + r.outputs:<42} {r.color:<9} {r.dtype:<8} {r.reason}{note}")
        lines.append("inserted casts:")
        lines.extend("  " + c for c in self.casts)
        return "\n".join(lines)


def amp_report(result, graph) -> AmpReport:
    """The report of ``result`` (an ``AmpResult`` from the AMP pass) on compiled ``graph``."""
    final = set(graph.nodes)
    rows = [AmpRow(d.node.op, ", ".join("%" + v.name for v in d.node.outputs), d.color,
                   ",".join(v.dtype.short for v in d.node.outputs), d.reason, d.node in final)
            for d in result.decisions]
    kept = [r for r in rows if r.kept]
    casts = [c for c in result.casts if c in final]
    return AmpReport(rows, [c.format() for c in casts],
                     n_fp16=sum(r.color == "white" for r in kept),
                     n_fp32=sum(r.color != "white" for r in kept), n_casts=len(casts))
