"""Automatic mixed precision (AMP): the op lists, the identity ops that pin colors, the report.

Turn it on inside an ``nn.Graph`` with ``self.config.enable_amp(True)``; the AMP pass
(``miniflow.passes.auto_mixed_precision``) then runs white ops in float16 and inserts casts.
``white_identity(x)`` / ``black_identity(x)`` pin the precision of the gray ops around them.
``GradScaler`` / ``StaticGradScaler`` scale the loss in the graph (``nn.Graph.set_grad_scaler``).
"""
from ..nn.functional import black_identity, white_identity
from .grad_scaler import GradScaler, NonFiniteGradientsError, StaticGradScaler
from .lists import AmpLists
from .report import AmpReport, amp_report

__all__ = ["AmpLists", "AmpReport", "GradScaler", "NonFiniteGradientsError", "StaticGradScaler",
           "amp_report", "black_identity", "white_identity"]

_NOT_IN_AMP = {"autocast": "AMP is a graph pass, not a context around eager code: "
                           "self.config.enable_amp(True, dtype=miniflow.bfloat16) in an "
                           "nn.Graph's __init__ (white ops then run in that half type, as under "
                           "torch.autocast); docs/differences.md"}
"""``torch.amp`` names miniflow has not, and what instead (``__getattr__``)."""


def __getattr__(name):
    """Raises:
        AttributeError: a name the package has not; ``autocast`` (nanoGPT's
            ``torch.amp.autocast(device_type=..., dtype=...)``) says how AMP is turned on."""
    why = _NOT_IN_AMP.get(name)
    raise AttributeError(f"module 'miniflow.amp' has no attribute {name!r}"
                         + (f": {why}" if why else ""))
