"""``amp_report``: what the AMP pass decided, node by node, as a table (``nn.Graph.amp_report()``).

One row per node the AMP pass colored (forward and backward, in graph order): the node, its color,
its output dtype(s) and the rule or neighbouring node that decided it; then the casts the pass
inserted, the inputs it left float32 beside float16 ones (an op's no-cast inputs, OneFlow's
``REGISTER_NO_CAST_REGISTRY``: batch norm's statistics and affine parameters), and the counts of
float16 nodes, float32 nodes and casts. The counts are the AMP pass's
decisions: a node that a later pass fused into a ``fused_elementwise`` kernel still computes in the
dtype AMP chose, so it is counted; the AMP identities, which ``prune_amp_identity`` removes, are
marked and left out. Values are named as the graph printed right after the AMP pass names them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ops.amp_ops import AMP_IDENTITY_OPS as PRUNED

__all__ = ["AmpRow", "AmpReport", "amp_report"]


@dataclass
class AmpRow:
    """One node: ``op``, its ``outputs`` (``"%5"``), ``color``, ``dtype`` (``"f16"``, comma-separated
    for several outputs), ``reason``, and ``kept`` (False for the pruned AMP identities)."""

    op: str
    outputs: str
    color: str
    dtype: str
    reason: str
    kept: bool


@dataclass
class AmpReport:
    """Rows, the inserted casts (printed IR lines), the no-cast inputs (one line each: node,
    input and why it stays float32) and the counts of kept nodes and casts."""

    rows: list
    casts: list
    n_fp16: int
    n_fp32: int
    n_casts: int
    no_cast: list
    half: str = "float16"
    """The half type AMP runs the white nodes in (``"bfloat16"`` under ``enable_amp(True,
    bfloat16)``)."""

    def __str__(self) -> str:
        lines = [f"AMP: {self.n_fp16} {self.half} nodes, {self.n_fp32} float32 nodes, "
                 f"{self.n_casts} inserted casts",
                 f"  {'node':<42} {'color':<9} {'dtype':<8} reason"]
        for r in self.rows:
            note = "" if r.kept else "  [pruned after AMP]"
            lines.append(f"  {r.op + ' ' + r.outputs:<42} {r.color:<9} {r.dtype:<8} {r.reason}{note}")
        lines.append("inserted casts:")
        lines.extend("  " + c for c in self.casts)
        if self.no_cast:
            lines.append("float32 inputs of float16 nodes (no-cast inputs, as OneFlow's "
                         "REGISTER_NO_CAST_REGISTRY):")
            lines.extend("  " + c for c in self.no_cast)
        return "\n".join(lines)


def amp_report(result, graph=None) -> AmpReport:
    """The report of ``result`` (the ``AmpState`` the AMP pass stored). ``graph``, the compiled IR,
    is accepted for symmetry with ``nn.Graph.amp_report`` and not needed."""
    names = result.names
    rows = [AmpRow(d.node.op.name, ", ".join("%" + names[v] for v in d.node.outputs), d.color,
                   ",".join(v.dtype.short for v in d.node.outputs), d.reason,
                   d.node.op.name not in PRUNED)
            for d in result.decisions]
    kept = [r for r in rows if r.kept]
    no_cast = [f"{node.op.name} %{names[node.outputs[0]]} reads %{names[node.inputs[k]]} "
               f"({name}, input {k}) as {node.inputs[k].dtype.short}: the op never casts it"
               for node, k, name in result.no_cast]
    return AmpReport(rows, [c.format(names) for c in result.casts],
                     n_fp16=sum(r.color == "white" for r in kept),
                     n_fp32=sum(r.color != "white" for r in kept), n_casts=len(result.casts),
                     no_cast=no_cast, half="bfloat16" if any(
                         r.color == "white" and "bf16" in r.dtype for r in kept) else "float16")
