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
