"""Shapes of the convolution, pooling and batch-norm ops: attribute defaults, output sizes and the
checks that name the offending op, shapes and attributes. The op declarations' ``normalize`` /
``infer`` (``ops/conv.py``, ``ops/pool.py``, ``ops/normalization.py``), their references and both
backends' kernel builders use these same functions (kernels may import ops, never the reverse), so
inference, reference and kernels cannot disagree on a geometry.

Attribute names and layouts follow OneFlow (``oneflow/ir/include/OneFlow/OneFlowUserOps.td``,
``OneFlowBase.td``): NCHW only (``data_format="channels_first"``: accepted, checked and, being
the only layout, left out of the normalized attributes), every 2-D attribute a pair ``(h, w)`` (a
tuple once normalized), the same padding on both sides (OneFlow's ``padding_before``).

Output sizes (``oneflow/user/ops/nn_util.cpp`` ``CalcConvOut``, ``max_pool_kernel_util.cpp``
``GetWindowedOutputShape``; the same as PyTorch's):

* convolution: ``out = (in + 2 * pad - dilation * (k - 1) - 1) // stride + 1``
* pooling, ``ceil_mode=False``: the same formula; ``ceil_mode=True`` rounds the division up, and
  drops the last window if it would start in the right padding (PyTorch's
  ``pooling_output_shape``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..checks import is_integer

__all__ = ["CHANNELS_FIRST", "pair", "conv_attrs", "ConvGeometry", "conv_geometry",
           "conv_data_grad_geometry", "conv_filter_grad_geometry", "pool_attrs", "PoolGeometry",
           "pool_geometry", "pooled_size", "adaptive_attrs", "adaptive_output_size",
           "adaptive_window", "norm_layout"]

CHANNELS_FIRST = "channels_first"


def pair(op: str, name: str, value, minimum: int) -> tuple:
    """``value`` (an int or a sequence of two ints) as ``(h, w)``, each at least ``minimum``.

    Raises:
        ValueError: not one or two ints, or an entry below ``minimum``; names ``op`` and ``name``.
    """
    vals = [value, value] if is_integer(value) else \
        list(value) if isinstance(value, (list, tuple)) else [value]
    if len(vals) != 2 or not all(is_integer(v) for v in vals):
        raise ValueError(f"{op}: {name} must be an int or two ints (h, w), got {value!r}")
    if min(vals) < minimum:
        raise ValueError(f"{op}: {name} must be >= {minimum}, got {value!r}")
    return int(vals[0]), int(vals[1])


def _check_format(op: str, attrs: dict) -> None:
    fmt = attrs.get("data_format", CHANNELS_FIRST)
    if fmt != CHANNELS_FIRST:
        raise ValueError(f"{op}: data_format={fmt!r} is not supported; miniflow convolutions and "
                         f"pools are NCHW only (data_format='channels_first')")


def _check_4d(op: str, what: str, shape) -> None:
    if len(shape) != 4:
        raise ValueError(f"{op}: {what} must be 4-D [N, C, H, W], got shape {tuple(shape)}")


# ----------------------------------------------------------------------------- convolution
def conv_attrs(op: str, attrs: dict) -> dict:
    """The convolution attributes with OneFlow's names, defaults filled and pairs expanded:
    ``kernel_size`` (required), ``strides`` (1, 1), ``padding_before`` (0, 0), ``dilation_rate``
    (1, 1), ``groups`` 1 (``data_format`` may be given: "channels_first" only). Other keys are
    refused.

    Raises:
        ValueError: a missing ``kernel_size``, a bad pair, groups < 1, another data_format, an
            unknown attribute.
    """
    _check_format(op, attrs)
    unknown = sorted(set(attrs) - {"kernel_size", "strides", "padding_before", "dilation_rate",
                                   "groups", "data_format"})
    if unknown:
        raise ValueError(f"{op}: unknown attribute(s) {', '.join(unknown)}; a convolution takes "
                         f"kernel_size, strides, padding_before, dilation_rate, groups, "
                         f"data_format")
    if "kernel_size" not in attrs:
        raise ValueError(f"{op}: attribute kernel_size is required")
    groups = attrs.get("groups", 1)
    if not is_integer(groups) or groups < 1:
        raise ValueError(f"{op}: groups must be an int >= 1, got {groups!r}")
    return {"kernel_size": pair(op, "kernel_size", attrs["kernel_size"], 1),
            "strides": pair(op, "strides", attrs.get("strides", 1), 1),
            "padding_before": pair(op, "padding_before", attrs.get("padding_before", 0), 0),
            "dilation_rate": pair(op, "dilation_rate", attrs.get("dilation_rate", 1), 1),
            "groups": int(groups)}


@dataclass(frozen=True)
class ConvGeometry:
    """Everything a convolution kernel needs: input ``[n, c, h, w]``, weight
    ``[o, c // groups, kh, kw]``, output ``[n, o, oh, ow]``, strides, paddings, dilations."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    groups: int
    oh: int
    ow: int

    @property
    def cg(self) -> int:
        """Input channels per group."""
        return self.c // self.groups

    @property
    def og(self) -> int:
        """Output channels per group."""
        return self.o // self.groups

    @property
    def kg(self) -> int:
        """The GEMM's inner dimension per group: ``cg * kh * kw``."""
        return self.cg * self.kh * self.kw

    @property
    def x_shape(self) -> tuple:
        return (self.n, self.c, self.h, self.w)

    @property
    def w_shape(self) -> tuple:
        return (self.o, self.cg, self.kh, self.kw)

    @property
    def y_shape(self) -> tuple:
        return (self.n, self.o, self.oh, self.ow)

    @property
    def pointwise(self) -> bool:
        """A 1x1 convolution with stride 1 and no padding: the input is already its im2col."""
        return (self.kh == self.kw == 1 and self.sh == self.sw == 1
                and self.ph == self.pw == 0)

    def window(self) -> tuple:
        """``(kh, kw, sh, sw, ph, pw, dh, dw, oh, ow)``: the integers im2col-like kernels take."""
        return (self.kh, self.kw, self.sh, self.sw, self.ph, self.pw, self.dh, self.dw,
                self.oh, self.ow)


def _conv_out(op, size, k, s, p, d, axis):
    span = d * (k - 1) + 1
    if size + 2 * p < span:
        raise ValueError(f"{op}: the kernel (extent {span} = dilation {d} * (kernel {k} - 1) + 1 "
                         f"along {axis}) is larger than the padded input ({size} + 2 * {p}); "
                         f"use a smaller kernel or dilation, or more padding")
    return (size + 2 * p - span) // s + 1


def _geometry(op, x_shape, o, cg_w, a) -> ConvGeometry:
    n, c, h, w = x_shape
    g = a["groups"]
    if c % g or o % g:
        raise ValueError(f"{op}: groups={g} must divide the input channels ({c}) and the output "
                         f"channels ({o})")
    if cg_w is not None and cg_w * g != c:
        raise ValueError(f"{op}: the input has {c} channels but the weight expects "
                         f"{cg_w} * groups {g} = {cg_w * g} (weight [out, in/groups, kh, kw])")
    (kh, kw), (sh, sw) = a["kernel_size"], a["strides"]
    (ph, pw), (dh, dw) = a["padding_before"], a["dilation_rate"]
    oh = _conv_out(op, h, kh, sh, ph, dh, "H")
    ow = _conv_out(op, w, kw, sw, pw, dw, "W")
    return ConvGeometry(n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, g, oh, ow)


def conv_geometry(op: str, x_shape, w_shape, attrs: dict) -> ConvGeometry:
    """The geometry of ``conv2d(x [N, C, H, W], weight [O, C/groups, kh, kw])``.

    ``kernel_size`` defaults to the weight's; when given it must match it.

    Raises:
        ValueError: a non-4-D input or weight; channels that do not match the weight; groups that
            do not divide the channels; a kernel larger than the padded input; bad attributes.
    """
    _check_4d(op, "the input", x_shape)
    _check_4d(op, "the weight", w_shape)
    a = conv_attrs(op, {"kernel_size": tuple(w_shape[2:]), **attrs})
    if tuple(w_shape[2:]) != a["kernel_size"]:
        raise ValueError(f"{op}: kernel_size {a['kernel_size']} does not match the weight "
                         f"{tuple(w_shape)} (weight [out, in/groups, kh, kw])")
    return _geometry(op, tuple(x_shape), w_shape[0], w_shape[1], a)


def _check_dy(op, g: ConvGeometry, dy_shape):
    _check_4d(op, "dy", dy_shape)
    if tuple(dy_shape) != g.y_shape:
        raise ValueError(f"{op}: dy has shape {tuple(dy_shape)}, but the convolution of "
                         f"{g.x_shape} with a {g.w_shape} weight gives {g.y_shape}")


def conv_data_grad_geometry(op: str, dy_shape, w_shape, x_shape, attrs: dict) -> ConvGeometry:
    """The geometry of ``conv_data_grad(dy, filter, x_like)`` (checks dy against the forward).

    Raises:
        ValueError: as :func:`conv_geometry`, or a dy whose shape is not the forward's output.
    """
    g = conv_geometry(op, x_shape, w_shape, attrs)
    _check_dy(op, g, dy_shape)
    return g


def conv_filter_grad_geometry(op: str, dy_shape, x_shape, attrs: dict) -> ConvGeometry:
    """The geometry of ``conv_filter_grad(dy, x)``: the weight is ``[dy.C, x.C / groups, *kernel]``.

    Raises:
        ValueError: non-4-D dy or x; groups that do not divide the channels; a dy whose shape is
            not the forward's output; bad attributes (``kernel_size`` is required).
    """
    _check_4d(op, "dy", dy_shape)
    _check_4d(op, "x", x_shape)
    g = _geometry(op, tuple(x_shape), dy_shape[1], None, conv_attrs(op, attrs))
    _check_dy(op, g, dy_shape)
    return g


# ----------------------------------------------------------------------------- pooling
def pool_attrs(op: str, attrs: dict, avg: bool) -> dict:
    """Pooling attributes with OneFlow's names and defaults filled: ``kernel_size`` (required),
    ``stride`` (default: ``kernel_size``, as PyTorch), ``padding`` (0, 0), ``ceil_mode`` False;
    max pools: ``dilation`` (1, 1); average pools: ``count_include_pad`` True (PyTorch's default;
    OneFlow's op default is False, its Python API passes True), ``divisor_override`` 0 (none).

    Raises:
        ValueError: a missing kernel_size, a bad pair, padding above half the kernel, another
            data_format, a negative divisor_override, an unknown attribute.
    """
    _check_format(op, attrs)
    extra = {"count_include_pad", "divisor_override"} if avg else {"dilation"}
    unknown = sorted(set(attrs) - {"kernel_size", "stride", "padding", "ceil_mode",
                                   "data_format", *extra})
    if unknown:
        raise ValueError(f"{op}: unknown attribute(s) {', '.join(unknown)}")
    if "kernel_size" not in attrs:
        raise ValueError(f"{op}: attribute kernel_size is required")
    k = pair(op, "kernel_size", attrs["kernel_size"], 1)
    stride = attrs.get("stride")
    out = {"kernel_size": k,
           "stride": pair(op, "stride", k if stride in (None, [], ()) else stride, 1),
           "padding": pair(op, "padding", attrs.get("padding", 0), 0),
           "ceil_mode": bool(attrs.get("ceil_mode", False))}
    if any(2 * p > kk for p, kk in zip(out["padding"], k)):
        raise ValueError(f"{op}: padding {out['padding']} must be at most half of kernel_size {k}")
    if avg:
        out["count_include_pad"] = bool(attrs.get("count_include_pad", True))
        div = attrs.get("divisor_override", 0)
        if not is_integer(div) or div < 0:
            raise ValueError(f"{op}: divisor_override must be an int >= 0 (0: none), got {div!r}")
        out["divisor_override"] = int(div)
    else:
        out["dilation"] = pair(op, "dilation", attrs.get("dilation", 1), 1)
    return out


def pooled_size(op, size, k, s, p, d, ceil_mode, axis) -> int:
    """The pooled length of one axis (PyTorch's ``pooling_output_shape``: floor division,
    rounding toward minus infinity; with ``ceil_mode`` a last window that starts in the input
    or its left padding counts, even where the window is longer than the padded input).

    Raises:
        ValueError: no window (PyTorch's "Output size is too small"): without ``ceil_mode`` the
            window does not fit in the padded input.
    """
    span = d * (k - 1) + 1
    out = (size + 2 * p - span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    if out < 1:
        raise ValueError(f"{op}: the window (extent {span} along {axis}) is larger than the "
                         f"padded input ({size} + 2 * {p}): output size {out} is too small"
                         + ("" if ceil_mode else
                            " (ceil_mode=True keeps a window that starts in the input)"))
    return out


@dataclass(frozen=True)
class PoolGeometry:
    """A 2-D pool over ``[n, c, h, w]`` to ``[n, c, oh, ow]`` (dilation 1 for average pools)."""

    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    oh: int
    ow: int

    @property
    def planes(self) -> int:
        """``n * c``: the planes a pool treats independently."""
        return self.n * self.c

    @property
    def y_shape(self) -> tuple:
        return (self.n, self.c, self.oh, self.ow)

    def window(self) -> tuple:
        """``(h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw)``: the integers pool kernels take."""
        return (self.h, self.w, self.oh, self.ow, self.kh, self.kw, self.sh, self.sw, self.ph,
                self.pw, self.dh, self.dw)


def pool_geometry(op: str, x_shape, attrs: dict, avg: bool) -> PoolGeometry:
    """The geometry of a max (``avg=False``) or average pool of ``x [N, C, H, W]``.

    Raises:
        ValueError: a non-4-D input, an empty channel or plane dim (C, H or W is 0: only the
            batch may be empty, as in PyTorch's ``max_pool2d`` / ``avg_pool2d``), a window larger
            than the padded input, bad attributes.
    """
    _check_4d(op, "the input", x_shape)
    a = pool_attrs(op, attrs, avg)
    n, c, h, w = x_shape
    if 0 in (c, h, w):
        raise ValueError(f"{op}: the input [N, C, H, W] = {list(x_shape)} has an empty "
                         f"{'C' if c == 0 else 'H' if h == 0 else 'W'} dim; only the batch (N) "
                         f"may be 0, as in PyTorch")
    (kh, kw), (sh, sw), (ph, pw) = a["kernel_size"], a["stride"], a["padding"]
    dh, dw = (1, 1) if avg else a["dilation"]
    oh = pooled_size(op, h, kh, sh, ph, dh, a["ceil_mode"], "H")
    ow = pooled_size(op, w, kw, sw, pw, dw, a["ceil_mode"], "W")
    return PoolGeometry(n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow)


def adaptive_attrs(op: str, attrs: dict) -> dict:
    """``output_size`` as ``(oh, ow)`` (an int means both); ``data_format`` "channels_first" only.

    Raises:
        ValueError: a missing or non-positive output_size, another data_format.
    """
    _check_format(op, attrs)
    if "output_size" not in attrs:
        raise ValueError(f"{op}: attribute output_size is required")
    size = attrs["output_size"]
    if isinstance(size, (list, tuple)) and len(size) == 1:
        size = size[0]
    return {"output_size": pair(op, "output_size", size, 1)}


def adaptive_output_size(op: str, x_shape, attrs: dict) -> tuple:
    """``(oh, ow)`` of ``adaptive_avg_pool2d(x [N, C, H, W])``.

    Raises:
        ValueError: a non-4-D or empty-plane input, bad attributes.
    """
    _check_4d(op, "the input", x_shape)
    if x_shape[2] < 1 or x_shape[3] < 1:
        raise ValueError(f"{op}: the input's H and W must be >= 1, got shape {tuple(x_shape)}")
    return adaptive_attrs(op, attrs)["output_size"]


def adaptive_window(i: int, size: int, out: int) -> tuple:
    """``[start, end)`` of output cell ``i`` of ``out`` over an axis of ``size`` (PyTorch's
    ``start_index`` / ``end_index``: ``floor(i * size / out)``, ``ceil((i + 1) * size / out)``)."""
    return (i * size) // out, -(-((i + 1) * size) // out)


# ----------------------------------------------------------------------------- batch norm
def norm_layout(op: str, x_shape, axis: int) -> tuple:
    """``(outer, channels, inner)``: ``x`` viewed as ``[outer, C, inner]`` around ``axis``.

    Raises:
        ValueError: fewer than 2 dims, or ``axis`` out of range.
    """
    if len(x_shape) < 2:
        raise ValueError(f"{op}: x must have at least 2 dims [N, C, ...], got shape "
                         f"{tuple(x_shape)}")
    if not 0 <= axis < len(x_shape):
        raise ValueError(f"{op}: axis={axis} is out of range for x of shape {tuple(x_shape)}")
    return math.prod(x_shape[:axis]), x_shape[axis], math.prod(x_shape[axis + 1:])
