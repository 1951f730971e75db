"""Activation functions, each as a functional form and a Module side by side (``torch.nn``'s names:
``relu`` / ``ReLU``). ``miniflow.nn`` and ``miniflow.nn.functional`` re-export everything listed
in ``__all__``, so a new activation is declared here and nowhere else in ``nn``.
"""
from __future__ import annotations

from ..checks import boolean, real_number
from ..tensor import Tensor, apply
from .module import Module

__all__ = ["relu", "ReLU", "gelu", "GELU", "silu", "SiLU", "tanh", "Tanh", "sigmoid", "Sigmoid",
           "softplus", "Softplus", "leaky_relu", "LeakyReLU", "elu", "ELU"]


def _inplace(owner: str, inplace) -> bool:
    """PyTorch's ``inplace`` argument, checked: miniflow computes every activation out of place
    (a graph has no in-place ops), so ``inplace=True`` returns the result as a new tensor and
    leaves the input as it was; code that uses the returned value (``x = relu(x, inplace=True)``,
    every torchvision model's ``ReLU(inplace=True)``) computes the same.

    Raises:
        TypeError: ``inplace`` is not a bool."""
    return boolean(owner, "inplace", inplace)


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(x, 0), NaN propagating (op ``relu``); ``inplace``: accepted, computed out of place
    (:func:`_inplace`)."""
    _inplace("relu", inplace)
    return apply("relu", [input])


class ReLU(Module):
    """``max(x, 0)`` elementwise (op ``relu``); ``inplace`` as :func:`relu`'s."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = _inplace("ReLU", inplace)

    def forward(self, x):
        return relu(x)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x), Phi the standard normal CDF: ``approximate='none'`` (PyTorch's default) is the
    exact (erf) GELU (op ``gelu``; gradient op ``gelu_grad``); ``'tanh'`` is Hendrycks & Gimpel's
    approximation (GPT-2's), ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``, composed of
    ``tanh`` and arithmetic ops, as ``torch.nn.functional.gelu(x, approximate='tanh')``: of a
    float16 or bfloat16 tensor in float32, the result rounded once to its dtype, as PyTorch's.

    Raises:
        ValueError: ``approximate`` is neither ``'none'`` nor ``'tanh'``."""
    if approximate == "tanh":
        x = input.float() if input.dtype.is_half else input   # rounded once, as PyTorch's
        inner = (x + x * x * x * 0.044715) * _SQRT_2_OVER_PI
        out = x * 0.5 * (inner.tanh() + 1.0)
        return out.to(input.dtype) if input.dtype.is_half else out
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh' (PyTorch's choices), got "
                         f"{approximate!r}")
    return apply("gelu", [input])


_SQRT_2_OVER_PI = 0.7978845608028654
"""sqrt(2 / pi), the tanh GELU's constant."""


class GELU(Module):
    """``x * Phi(x)`` elementwise, the erf form (op ``gelu``), or its tanh approximation with
    ``approximate='tanh'`` (:func:`gelu`)."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh' (PyTorch's choices), "
                             f"got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """x * sigmoid(x) (op ``silu``; gradient op ``silu_grad``); ``inplace``: accepted, computed
    out of place (:func:`_inplace`)."""
    _inplace("silu", inplace)
    return apply("silu", [input])


class SiLU(Module):
    """``x * sigmoid(x)`` elementwise (op ``silu``); ``inplace`` as :func:`silu`'s."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = _inplace("SiLU", inplace)

    def forward(self, x):
        return silu(x)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


def tanh(input: Tensor) -> Tensor:
    """The hyperbolic tangent (op ``tanh``; gradient op ``tanh_grad``)."""
    return apply("tanh", [input])


class Tanh(Module):
    """``tanh(x)`` elementwise (op ``tanh``)."""

    def forward(self, x):
        return tanh(x)


def sigmoid(input: Tensor) -> Tensor:
    """1 / (1 + e^-x), with no exponential that overflows (op ``sigmoid``; gradient op
    ``sigmoid_grad``)."""
    return apply("sigmoid", [input])


class Sigmoid(Module):
    """``1 / (1 + e^-x)`` elementwise (op ``sigmoid``)."""

    def forward(self, x):
        return sigmoid(x)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, and ``x`` where ``beta * x > threshold``
    (op ``softplus``, one kernel with both attributes; gradient op ``softplus_derivative`` times
    dy): PyTorch's ``torch.nn.functional.softplus``
    (https://pytorch.org/docs/stable/generated/torch.nn.Softplus.html). Shapes and float dtypes
    are x's.

    Raises:
        TypeError: ``beta`` or ``threshold`` is not a real number."""
    return apply("softplus", [input], beta=real_number("softplus", "beta", beta),
                 threshold=real_number("softplus", "threshold", threshold))


class Softplus(Module):
    """``softplus(x, beta, threshold)`` elementwise (op ``softplus``; :func:`softplus`), printed as
    PyTorch's ``Softplus(beta=1.0, threshold=20.0)``."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta = real_number("Softplus", "beta", beta)
        self.threshold = real_number("Softplus", "threshold", threshold)

    def forward(self, x):
        return softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """``x`` where ``x > 0``, else ``negative_slope * x`` (op ``leaky_relu``, its attribute
    ``alpha`` is ``negative_slope``; gradient op ``leaky_relu_derivative`` times dy): PyTorch's
    ``torch.nn.functional.leaky_relu``
    (https://pytorch.org/docs/stable/generated/torch.nn.LeakyReLU.html). Shapes and float dtypes
    are x's; ``inplace``: accepted, computed out of place (:func:`_inplace`).

    Raises:
        TypeError: ``negative_slope`` is not a real number, or ``inplace`` not a bool."""
    _inplace("leaky_relu", inplace)
    return apply("leaky_relu", [input],
                 alpha=real_number("leaky_relu", "negative_slope", negative_slope))


class LeakyReLU(Module):
    """``leaky_relu(x, negative_slope)`` elementwise (op ``leaky_relu``; :func:`leaky_relu`),
    printed as PyTorch's ``LeakyReLU(negative_slope=0.01)``."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope = real_number("LeakyReLU", "negative_slope", negative_slope)
        self.inplace = _inplace("LeakyReLU", inplace)

    def forward(self, x):
        return leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)`` (op ``elu``, attribute ``alpha``;
    gradient op ``elu_derivative`` times dy): PyTorch's ``torch.nn.functional.elu``
    (https://pytorch.org/docs/stable/generated/torch.nn.ELU.html). Shapes and float dtypes are
    x's; ``inplace``: accepted, computed out of place (:func:`_inplace`).

    Raises:
        TypeError: ``alpha`` is not a real number, or ``inplace`` not a bool."""
    _inplace("elu", inplace)
    return apply("elu", [input], alpha=real_number("elu", "alpha", alpha))


class ELU(Module):
    """``elu(x, alpha)`` elementwise (op ``elu``; :func:`elu`), printed as PyTorch's
    ``ELU(alpha=1.0)``."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = real_number("ELU", "alpha", alpha)
        self.inplace = _inplace("ELU", inplace)

    def forward(self, x):
        return elu(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")
