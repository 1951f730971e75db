"""``nn.Conv2d``: PyTorch's ``torch.nn.Conv2d`` (names, arguments, defaults, initialisation, state
dict keys ``weight`` / ``bias``), running OneFlow's ``conv2d`` op (+ ``bias_add``)."""
from __future__ import annotations

import math
import numbers

from ..checks import is_integer, positive_integer
from ..random import generator
from . import functional as F
from .factory import param_dtype
from .module import Module, Parameter

__all__ = ["Conv2d"]


def _pair(name: str, value, minimum: int) -> tuple:
    vals = (value, value) if isinstance(value, numbers.Integral) else tuple(value)
    if len(vals) != 2 or not all(is_integer(v) and v >= minimum for v in vals):
        raise ValueError(f"Conv2d: {name} must be an int or two ints >= {minimum}, got {value!r}")
    return tuple(int(v) for v in vals)


class Conv2d(Module):
    """2-D convolution over ``x [N, in_channels, H, W]`` -> ``[N, out_channels, OH, OW]``.

    An unbatched input ``[in_channels, H, W]`` gives ``[out_channels, OH, OW]``, as PyTorch's.

    weight: [out_channels, in_channels / groups, kh, kw], bias: [out_channels], float32 unless
    ``dtype``; both initialised U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in_channels /
    groups * kh * kw, as PyTorch's (``kaiming_uniform_(a=sqrt(5))``). ``padding`` is an int, a
    pair, ``"valid"`` or ``"same"`` (stride 1); ``padding_mode`` only ``"zeros"``. ``device`` /
    ``dtype``: PyTorch's factory keywords (``nn.factory.param_dtype``).

    Raises:
        ValueError: non-positive sizes, groups that do not divide the channels, an unsupported
            padding mode, a padding string other than ``"valid"`` / ``"same"``, ``"same"`` with
            a stride other than 1 or an even dilated kernel, a device other than the process's.
        TypeError: a dtype that is not a floating dtype of miniflow.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None):
        super().__init__()
        dt = param_dtype("Conv2d", device, dtype)
        self.in_channels = positive_integer("Conv2d", "in_channels", in_channels)
        self.out_channels = positive_integer("Conv2d", "out_channels", out_channels)
        self.groups = positive_integer("Conv2d", "groups", groups)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: groups={groups} must divide in_channels={in_channels} and "
                             f"out_channels={out_channels}")
        if padding_mode != "zeros":
            raise ValueError(f"Conv2d: padding_mode={padding_mode!r} is not supported; only "
                             f"'zeros'")
        self.kernel_size = _pair("kernel_size", kernel_size, 1)
        self.stride = _pair("stride", stride, 1)
        self.dilation = _pair("dilation", dilation, 1)
        if isinstance(padding, str):  # checked here, as torch.nn.Conv2d checks it
            F._padding("Conv2d", padding, self.kernel_size, self.dilation, self.stride)
            self.padding = padding
        else:
            self.padding = _pair("padding", padding, 0)
        self.padding_mode = padding_mode
        fan_in = in_channels // groups * self.kernel_size[0] * self.kernel_size[1]
        bound = 1.0 / math.sqrt(fan_in)
        g = generator()
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = Parameter(g.uniform(-bound, bound, shape).astype(dt))
        self.bias = (Parameter(g.uniform(-bound, bound, out_channels).astype(dt))
                     if bias else None)

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def extra_repr(self):
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding not in ((0, 0), "valid"):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + ("" if self.bias is not None else ", bias=False")
