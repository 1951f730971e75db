"""``nn.LayerNorm`` and ``nn.functional.layer_norm``: PyTorch's arguments, defaults and state-dict
keys (``weight``, ``bias``), on OneFlow's ``layer_norm`` op (``miniflow.ops.layer_norm``; Ba, Kiros
and Hinton 2016). Under AMP the op is gray: it runs in float16 between float16 producers and
consumers, its row statistics float32. ``nn.RMSNorm`` and ``nn.functional.rms_norm`` (Zhang and
Sennrich 2019; PyTorch >= 2.4) are a composition of elementwise ops and a mean, its mean of squares
float32 under AMP."""
from __future__ import annotations

import numbers

import numpy as np

from ..checks import is_integer
from ..tensor import Tensor, apply
from .factory import param_dtype
from .module import Module, Parameter

__all__ = ["LayerNorm", "layer_norm", "RMSNorm", "rms_norm"]


def _normalized(fn: str, normalized_shape) -> tuple:
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) \
        else tuple(normalized_shape)
    if not shape or not all(is_integer(d) and d > 0 for d in shape):
        raise ValueError(f"{fn}: normalized_shape must be a positive int or a non-empty sequence "
                         f"of positive ints, got {normalized_shape!r}")
    return tuple(int(d) for d in shape)


def _check_input(fn: str, input: Tensor, shape: tuple, eps, params: dict) -> None:
    """The checks both norms make of their input: its trailing dimensions are ``shape``
    (PyTorch's message), ``eps >= 0``, and each given parameter has the input's dtype."""
    if tuple(input.shape[input.ndim - len(shape):]) != shape or input.ndim < len(shape):
        raise ValueError(f"{fn}: Given normalized_shape={list(shape)}, expected input with "
                         f"shape [*, {', '.join(str(d) for d in shape)}], but got input of size"
                         f"{list(input.shape)}")
    if eps is not None and not float(eps) >= 0.0:
        raise ValueError(f"{fn}: eps must be >= 0, got {eps!r}")
    layer = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm"}[fn]
    for name, p in params.items():
        if isinstance(input, Tensor) and p is not None and p.dtype is not input.dtype:
            dt = input.dtype.name
            raise TypeError(f"{fn}: input {dt}{list(input.shape)} and {name} "
                            f"{p.dtype.name}{list(p.shape)} have different dtypes; cast the "
                            f"input with .to(miniflow.{p.dtype.name})"
                            + (f", or make the {layer} with dtype=miniflow.{dt}"
                               if input.dtype.is_float else ""))


def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the trailing ``normalized_shape``
    dimensions of ``input [*, *normalized_shape]`` (biased variance;
    ``torch.nn.functional.layer_norm``). Op ``layer_norm`` (its mean and inv_variance outputs
    are dropped); ``weight`` / ``bias`` of shape ``normalized_shape`` (a missing one is ones /
    zeros).

    Raises:
        ValueError: ``input``'s trailing dimensions are not ``normalized_shape`` (PyTorch's
            message), or a bad ``normalized_shape`` / ``eps``.
        TypeError: ``weight`` or ``bias`` of another dtype than ``input`` (naming both).
    """
    shape = _normalized("layer_norm", normalized_shape)
    _check_input("layer_norm", input, shape, eps, {"weight": weight, "bias": bias})
    axis = input.ndim - len(shape)
    params = []
    if weight is not None or bias is not None:
        from ..tensor import tensor
        params = [weight if weight is not None else tensor(np.ones(shape), dtype=input.dtype),
                  bias if bias is not None else tensor(np.zeros(shape), dtype=input.dtype)]
    return apply("layer_norm", [input, *params], begin_norm_axis=axis, begin_params_axis=axis,
                 epsilon=float(eps))[0]


class LayerNorm(Module):
    """Layer normalization over the trailing ``normalized_shape`` dimensions
    (``torch.nn.LayerNorm``).

    Args:
        normalized_shape: an int or a shape: the trailing dimensions normalized.
        eps: added to the variance (1e-5).
        elementwise_affine: learn ``weight`` (ones) and, with ``bias``, ``bias`` (zeros), both
            float32 of ``normalized_shape``.
        bias: whether ``bias`` is learned (PyTorch >= 2.1's argument).
        device, dtype: PyTorch's factory keywords (``nn.factory.param_dtype``; float32 by
            default).

    Raises:
        ValueError: a bad ``normalized_shape`` or ``eps``, a device other than the process's;
            at trace time, an input whose trailing dimensions are not ``normalized_shape``.
        TypeError: a dtype that is not a floating dtype of miniflow; at trace time, an input
            of another dtype than the parameters.
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        dt = param_dtype("LayerNorm", device, dtype)
        self.normalized_shape = _normalized("LayerNorm", normalized_shape)
        if not float(eps) >= 0.0:
            raise ValueError(f"LayerNorm: eps must be >= 0, got {eps!r}")
        self.eps, self.elementwise_affine = float(eps), bool(elementwise_affine)
        self.weight = Parameter(np.ones(self.normalized_shape, dt)) \
            if elementwise_affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, dt)) \
            if elementwise_affine and bias else None

    def forward(self, x):
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing ``normalized_shape`` dimensions
    of ``input [*, *normalized_shape]`` (Zhang and Sennrich 2019, arXiv:1910.07467;
    ``torch.nn.functional.rms_norm``: a float16 / bfloat16 input and weight are computed in
    float32 and the result rounded once, as PyTorch's fused CPU kernel). ``eps=None``: the machine
    epsilon of the computing dtype (float32's for half inputs), as PyTorch. Ops ``scalar_pow``,
    ``reduce_sum``, ``scalar_add``, ``rsqrt`` and ``broadcast_mul``. Under AMP the mean of
    squares runs in float32 (squares of float16 activations above 256 overflow): its gray chain
    ends in ``rsqrt``, in no OneFlow list (float32), so OneFlow's rules keep it out of the white
    set; the normalized output follows its neighbours, as a gray ``layer_norm``'s (float16
    between float16 ops). PyTorch's autocast runs all of ``rms_norm`` in float32.

    Raises:
        ValueError: ``input``'s trailing dimensions are not ``normalized_shape`` (PyTorch's
            message), or a bad ``normalized_shape`` / ``eps``.
        TypeError: ``weight`` of another dtype than ``input`` (naming both).
    """
    shape = _normalized("rms_norm", normalized_shape)
    _check_input("rms_norm", input, shape, eps, {"weight": weight})
    x = input.to("float32") if input.dtype.is_half else input
    if eps is None:
        eps = float(np.finfo(x.dtype.np).eps)
    dims = tuple(range(input.ndim - len(shape), input.ndim))
    y = x * (x.square().mean(dims, keepdim=True) + float(eps)).rsqrt()
    if weight is not None:
        y = y * (weight.to("float32") if weight.dtype.is_half else weight)
    return y.to(input.dtype) if input.dtype.is_half else y


class RMSNorm(Module):
    """Root mean square layer normalization over the trailing ``normalized_shape`` dimensions
    (``torch.nn.RMSNorm``, PyTorch >= 2.4; :func:`rms_norm`).

    Args:
        normalized_shape: an int or a shape: the trailing dimensions normalized.
        eps: added to the mean of squares; None (the default): the input's machine epsilon.
        elementwise_affine: learn ``weight`` (ones, of ``normalized_shape``).
        device, dtype: PyTorch's factory keywords (``nn.factory.param_dtype``; float32 by
            default).

    Raises:
        ValueError: a bad ``normalized_shape`` or ``eps``, a device other than the process's;
            at trace time, an input whose trailing dimensions are not ``normalized_shape``.
        TypeError: a dtype that is not a floating dtype of miniflow; at trace time, an input
            of another dtype than ``weight``.
    """

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None):
        super().__init__()
        dt = param_dtype("RMSNorm", device, dtype)
        self.normalized_shape = _normalized("RMSNorm", normalized_shape)
        if eps is not None and not float(eps) >= 0.0:
            raise ValueError(f"RMSNorm: eps must be >= 0 or None, got {eps!r}")
        self.eps = None if eps is None else float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.weight = Parameter(np.ones(self.normalized_shape, dt)) \
            if elementwise_affine else None

    def forward(self, x):
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")
