"""Pooling layers with PyTorch's names and arguments: ``nn.MaxPool2d``, ``nn.AvgPool2d``,
``nn.AdaptiveAvgPool2d`` (ops ``max_pool_2d``, ``avg_pool_2d``, ``adaptive_avg_pool2d``). Each
takes ``[N, C, H, W]`` or, as PyTorch's, an unbatched ``[C, H, W]`` (giving ``[C, OH, OW]``)."""
from __future__ import annotations

from . import functional as F
from .module import Module

__all__ = ["MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"]


class MaxPool2d(Module):
    """Max over ``kernel_size`` windows of ``x [N, C, H, W]`` (``torch.nn.MaxPool2d``: stride
    defaults to kernel_size; ``return_indices`` also returns the flat ``H*W`` indices)."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices: bool = False, ceil_mode: bool = False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode, self.return_indices)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}, "
                f"padding={self.padding}, dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """Mean over ``kernel_size`` windows of ``x [N, C, H, W]`` (``torch.nn.AvgPool2d``).

    Raises:
        RuntimeError / TypeError: a ``divisor_override`` of 0 / not an int, at construction
            (PyTorch's at the call: :func:`nn.functional.avg_pool2d`)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override=None):
        super().__init__()
        F.divisor_attr(divisor_override)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}, "
                f"padding={self.padding}")


class AdaptiveAvgPool2d(Module):
    """Mean over adaptive windows giving ``output_size`` (``torch.nn.AdaptiveAvgPool2d``; 1: a
    global average pool)."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"
