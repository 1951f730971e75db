"""Activation functions, each as a functional form and a Module side by side (``torch.nn``'s names:
``relu`` / ``ReLU``). ``miniflow.nn`` and ``miniflow.nn.functional`` re-export everything listed
in ``__all__``, so a new activation is declared here and nowhere else in ``nn``.
"""
from __future__ import annotations

from ..tensor import Tensor, apply
from .module import Module

__all__ = ["relu", "ReLU", "gelu", "GELU", "silu", "SiLU"]


def relu(x: Tensor) -> Tensor:
    """max(x, 0), NaN propagating (op ``relu``)."""
    return apply("relu", [x])


class ReLU(Module):
    """``max(x, 0)`` elementwise (op ``relu``)."""

    def forward(self, x):
        return relu(x)


def gelu(x: Tensor) -> Tensor:
    """x * Phi(x), Phi the standard normal CDF: the exact (erf) GELU, PyTorch's default
    ``approximate='none'`` (op ``gelu``; gradient op ``gelu_grad``)."""
    return apply("gelu", [x])


class GELU(Module):
    """``x * Phi(x)`` elementwise, the erf form (op ``gelu``)."""

    def forward(self, x):
        return gelu(x)


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x) (op ``silu``; gradient op ``silu_grad``)."""
    return apply("silu", [x])


class SiLU(Module):
    """``x * sigmoid(x)`` elementwise (op ``silu``)."""

    def forward(self, x):
        return silu(x)
