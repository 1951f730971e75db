"""Functional ops (``torch.nn.functional`` names and arguments) built from registered op types;
the activation functions (``relu``, ...) are ``miniflow.nn.activations``' and the losses
(``cross_entropy``, ``nll_loss``, ``mse_loss``, ``l1_loss``) ``miniflow.nn.loss``', re-exported
here.

The convolution, pooling and batch-norm functions take PyTorch's arguments and emit OneFlow's ops
(``conv2d`` + ``bias_add``, ``max_pool_2d``, ``avg_pool_2d``, ``adaptive_avg_pool2d``,
``normalization``, ``flatten``), converting as OneFlow's functional layer does: batch norm's
``momentum`` becomes the op's ``1 - momentum``.
"""
from __future__ import annotations

import numbers
import warnings

import numpy as np

from ..checks import is_integer
from ..dtype import check_fill, int64
from ..tensor import Tensor, apply, tensor, zeros
from ..tensor.core import LISTED, not_there
from . import activations
from .activations import *  # noqa: F401,F403  (the activation functions: relu ...)
from .attention import scaled_dot_product_attention
from .dropout import dropout
from .layer_norm import layer_norm, rms_norm
from .loss import (binary_cross_entropy_with_logits, cross_entropy, kl_div, l1_loss, mse_loss,
                   nll_loss)
from .sparse import embedding

__all__ = ["softmax", "log_softmax", "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "linear",
           "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "batch_norm", "flatten",
           "white_identity", "dropout", "layer_norm", "rms_norm", "embedding",
           "scaled_dot_product_attention", "black_identity", "normalize", "one_hot", "pad",
           "binary_cross_entropy_with_logits", "kl_div",
           *(name for name in activations.__all__ if name.islower())]


def _implicit_dim(op: str, x: Tensor, dim):
    """``dim``, or without one PyTorch's deprecated implicit choice with its warning
    (``torch.nn.functional._get_softmax_dim``): dim 0 for 0-, 1- and 3-d inputs, else dim 1."""
    if dim is not None:
        return dim
    warnings.warn(f"Implicit dimension choice for {op} has been deprecated. Change the call to "
                  f"include dim=X as an argument.", UserWarning, stacklevel=3)
    return 0 if x.ndim in (0, 1, 3) else 1


def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3,
            dtype=None) -> Tensor:
    """exp(x) / sum(exp(x)) along ``dim`` (op ``softmax``; max-subtracted). Without ``dim``,
    PyTorch's implicit dim and warning: dim 0 for a 0-, 1- or 3-d ``input``, else dim 1.
    ``dtype``: ``input`` is cast to it first (op ``cast``; ``torch.nn.functional.softmax``'s
    ``dtype``). ``_stacklevel``: PyTorch's (its warning's), in its place; unused.

    Raises:
        IndexError: ``dim`` out of range for ``input`` (PyTorch's message). TypeError: a
            ``dtype`` miniflow lacks.
    """
    input = input if dtype is None else input.to(dtype)
    return input.softmax(_implicit_dim("softmax", input, dim))


def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3,
                dtype=None) -> Tensor:
    """x - logsumexp(x) along ``dim`` (op ``log_softmax``); without ``dim``, with
    ``_stacklevel`` and ``dtype`` as :func:`softmax`.

    Raises:
        IndexError: ``dim`` out of range for ``input`` (PyTorch's message). TypeError: a
            ``dtype`` miniflow lacks.
    """
    input = input if dtype is None else input.to(dtype)
    return input.log_softmax(_implicit_dim("log_softmax", input, dim))


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., in] @ weight[out, in].T (+ bias[out]) -> [..., out] (ops ``matmul``, ``bias_add``)."""
    lead = input.shape[:-1]
    x2 = input if input.ndim in (0, 2) else input.reshape(-1, input.shape[-1])
    y = apply("matmul", [x2, weight], transpose_b=True)
    if bias is not None:
        y = apply("bias_add", [y, bias], axis=1)
    return y if input.ndim == 2 else y.reshape(*lead, weight.shape[0])


def _padding(fn: str, padding, kernel_size, dilation, stride):
    """PyTorch's ``padding`` (an int, a pair, ``"valid"`` or ``"same"``) as a pair (a string
    checked as ``torch.nn.Conv2d.__init__`` checks it; ``nn.Conv2d`` calls this there).

    Raises:
        ValueError: another string; ``"same"`` with a stride other than 1 or an even dilated
            kernel (asymmetric padding).
    """
    if isinstance(padding, str):
        if padding == "valid":
            return 0
        if padding == "same":
            if stride not in (1, (1, 1), [1, 1]):
                raise ValueError(f"{fn}: padding='same' is only supported with stride 1, got "
                                 f"stride={stride} (as in PyTorch)")
            k = (kernel_size, kernel_size) if isinstance(kernel_size, numbers.Integral) \
                else tuple(kernel_size)
            d = (dilation, dilation) if isinstance(dilation, numbers.Integral) else tuple(dilation)
            spans = [dd * (kk - 1) for kk, dd in zip(k, d)]
            if any(span % 2 for span in spans):
                raise ValueError(f"{fn}: padding='same' needs an odd dilated kernel (symmetric "
                                 f"padding), got kernel_size={kernel_size}, dilation={dilation}")
            return tuple(span // 2 for span in spans)
        raise ValueError(f"{fn}: padding must be an int, a pair, 'valid' or 'same', got "
                         f"{padding!r}")
    return padding


def _batched(fn: str, input: Tensor) -> tuple:
    """``(input as [N, C, H, W], unbatched)``: a 3-D (unbatched) ``[C, H, W]`` input gets a batch
    of one (op ``reshape``), as PyTorch's ``conv2d`` and pools take it (their docs' "Input:
    (N, C, H, W) or (C, H, W)"); :func:`_unbatch` removes it from the result.

    Raises:
        ValueError: an input that is neither 3-D nor 4-D, naming the op and the shape.
    """
    if input.ndim == 4:
        return input, False
    if input.ndim == 3:
        return input.reshape((1,) + tuple(input.shape)), True
    raise ValueError(f"{fn}: expected a 3-D (unbatched) [C, H, W] or 4-D (batched) "
                     f"[N, C, H, W] input, but got input of shape {list(input.shape)} "
                     f"({input.ndim}-D)")


def _unbatch(y: Tensor, unbatched: bool) -> Tensor:
    """``y [1, ...]`` without its batch dim when the input was unbatched (op ``reshape``)."""
    return y.reshape(tuple(y.shape[1:])) if unbatched else y


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1) -> Tensor:
    """2-D convolution (cross-correlation) of ``input [N, C, H, W]`` (or unbatched ``[C, H,
    W]``) with ``weight [O, C/groups, kh, kw]`` (+ ``bias [O]``) -> ``[N, O, OH, OW]`` (``[O,
    OH, OW]``), as ``torch.nn.functional.conv2d`` (``padding="same"`` for stride 1 and odd
    dilated kernels).

    Ops ``conv2d`` {strides, padding_before, dilation_rate, groups} and ``bias_add`` (axis 1);
    an unbatched input is reshaped to a batch of one and back.

    Raises:
        ValueError: an input that is neither 3-D nor 4-D (PyTorch's "Expected 3D (unbatched) or
            4D (batched) input"). ValueError / TypeError at trace time (the op's inference):
            channels that do not match the weight, a kernel larger than the padded input, a
            non-4-D weight, groups that do not divide the channels, bad strides or paddings.
    """
    input, unbatched = _batched("conv2d", input)
    kernel = tuple(weight.shape[2:]) if weight.ndim == 4 else 1
    y = apply("conv2d", [input, weight], strides=stride,
              padding_before=_padding("conv2d", padding, kernel, dilation, stride),
              dilation_rate=dilation, groups=groups)
    y = y if bias is None else apply("bias_add", [y, bias], axis=1)
    return _unbatch(y, unbatched)


def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode: bool = False, return_indices: bool = False):
    """Max over each window of ``input [N, C, H, W]`` or ``[C, H, W]``
    (``torch.nn.functional.max_pool2d``); with ``return_indices`` also the int64 flat ``H*W``
    index of each window's first maximum. Op ``max_pool_2d`` (its gradient scatters to those
    indices).

    Raises:
        ValueError: an input that is neither 3-D nor 4-D; bad window arguments (the op's)."""
    input, unbatched = _batched("max_pool2d", input)
    y, indices = apply("max_pool_2d", [input], kernel_size=kernel_size, stride=stride,
                       padding=padding, dilation=dilation, ceil_mode=ceil_mode)
    y = _unbatch(y, unbatched)
    return (y, _unbatch(indices, unbatched)) if return_indices else y


def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override=None) -> Tensor:
    """Mean over each window of ``input [N, C, H, W]`` or ``[C, H, W]``
    (``torch.nn.functional.avg_pool2d``: ``count_include_pad`` counts the padding in the
    divisor, ``divisor_override`` replaces it). Op ``avg_pool_2d``.

    Raises:
        ValueError: an input that is neither 3-D nor 4-D; bad window arguments (the op's).
        RuntimeError: ``divisor_override=0`` (PyTorch's "divisor must be not zero").
        TypeError: a ``divisor_override`` that is not an int (PyTorch's)."""
    input, unbatched = _batched("avg_pool2d", input)
    return _unbatch(apply("avg_pool_2d", [input], kernel_size=kernel_size, stride=stride,
                          padding=padding, ceil_mode=ceil_mode,
                          count_include_pad=count_include_pad,
                          divisor_override=divisor_attr(divisor_override)), unbatched)


def divisor_attr(divisor_override) -> int:
    """``avg_pool2d``'s ``divisor_override`` as op ``avg_pool_2d``'s attr (0: none; a negative
    divisor is PyTorch's too).

    Raises:
        RuntimeError: 0 (PyTorch's "divisor must be not zero"). TypeError: not an int."""
    if divisor_override is None:
        return 0
    if isinstance(divisor_override, (bool, np.bool_)) or not is_integer(divisor_override):
        raise TypeError(f"avg_pool2d(): argument 'divisor_override' must be int, not "
                        f"{type(divisor_override).__name__} (None: the window's size)")
    if divisor_override == 0:
        raise RuntimeError("avg_pool2d: divisor must be not zero (divisor_override=0); leave "
                           "it None to divide by the window's size")
    return int(divisor_override)


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """Mean over PyTorch's adaptive windows of ``input [N, C, H, W]`` or ``[C, H, W]`` giving
    ``output_size`` (an int, or a pair whose None entries keep the input's size). Op
    ``adaptive_avg_pool2d``.

    Raises:
        ValueError: an input that is neither 3-D nor 4-D; a bad output size (the op's)."""
    input, unbatched = _batched("adaptive_avg_pool2d", input)
    if isinstance(output_size, (tuple, list)):
        output_size = tuple(input.shape[2 + i] if s is None else s
                            for i, s in enumerate(output_size))
    return _unbatch(apply("adaptive_avg_pool2d", [input], output_size=output_size), unbatched)


def batch_norm(input: Tensor, running_mean: Tensor, running_var: Tensor,
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Batch normalization over every dim of ``input [N, C, ...]`` but dim 1
    (``torch.nn.functional.batch_norm``). Training uses the batch statistics and updates
    ``running_mean`` / ``running_var`` in place (PyTorch's ``momentum``: ``new = (1 - momentum)
    * old + momentum * batch``, the variance unbiased); eval uses the running statistics.
    ``weight`` / ``bias`` default to ones / zeros. Op ``normalization`` with OneFlow's attribute
    ``momentum = 1 - momentum`` (OneFlow's ``NormalizationFunctor`` converts the same way). An
    empty input (an empty batch, or H or W 0) has no statistics: it is normalized as in eval
    mode (an empty output; zero gradients for ``weight`` / ``bias``) and updates nothing, as
    PyTorch's ``batch_norm`` returns early for an input with no element.

    Training without running statistics (``running_mean`` and ``running_var`` both None, as
    PyTorch's ``F.batch_norm(x, None, None, training=True)``) normalizes by the batch
    statistics alone, composed of ``mean``, ``rsqrt`` and arithmetic ops (the biased variance;
    a half input in float32, rounded once), and updates nothing.

    Raises:
        ValueError: one of the running statistics None (PyTorch's message), a ``momentum`` that
            is None (PyTorch's cumulative average is not supported) or outside [0, 1], training
            with an ``eps`` that is not positive or with one value per channel (at trace time
            with running statistics).
        RuntimeError: no running statistics in eval mode (PyTorch's message).
    """
    if (running_mean is None) != (running_var is None):
        raise ValueError("batch_norm: running_mean and running_var must either both be None or "
                         "neither be None (PyTorch's rule)")
    if running_mean is None:
        if not training:
            raise RuntimeError("batch_norm: running_mean must be defined in evaluation mode "
                               "(pass running statistics, or training=True)")
        return _batch_statistics_norm(input, weight, bias, eps)
    if momentum is None or not 0.0 <= float(momentum) <= 1.0:
        raise ValueError(f"batch_norm: momentum must be a number in [0, 1], got {momentum!r} "
                         f"(the cumulative moving average, momentum=None, is not supported)")
    c = input.shape[1] if input.ndim > 1 else 0
    training = bool(training) and 0 not in input.shape
    if training and not float(eps) > 0.0:       # a constant channel would divide by 0: NaN
        raise ValueError(f"batch_norm: eps must be positive during training, got {eps!r} "
                         "(PyTorch's check)")
    dtype = running_mean.dtype
    weight = weight if weight is not None else tensor(np.ones(c), dtype=dtype)
    bias = bias if bias is not None else tensor(np.zeros(c), dtype=dtype)
    outs = apply("normalization", [input, running_mean, running_var, weight, bias], axis=1,
                 epsilon=float(eps), momentum=1.0 - float(momentum), training=bool(training))
    return outs[0] if training else outs


def _batch_statistics_norm(input: Tensor, weight, bias, eps: float) -> Tensor:
    """:func:`batch_norm` in training without running statistics: ``(x - mean) / sqrt(var +
    eps) * weight + bias``, the statistics over every dim but 1, the variance biased."""
    if input.ndim < 2 or not float(eps) > 0.0:
        raise ValueError(f"batch_norm: training without running statistics needs an input [N, "
                         f"C, ...] and a positive eps, got {list(input.shape)} and eps={eps!r}")
    if input.numel() and input.numel() // input.shape[1] <= 1:
        raise ValueError(f"batch_norm: Expected more than 1 value per channel when training, "
                         f"got input size {list(input.shape)}")
    axes = (0, *range(2, input.ndim))
    x = input.float() if input.dtype.is_half else input
    deviation = x - x.mean(axes, keepdim=True)
    y = deviation * (deviation.square().mean(axes, keepdim=True) + float(eps)).rsqrt()
    shape = (1, input.shape[1]) + (1,) * (input.ndim - 2)
    if weight is not None:
        y = y * weight.to(x.dtype).reshape(shape)
    if bias is not None:
        y = y + bias.to(x.dtype).reshape(shape)
    return y.to(input.dtype) if input.dtype.is_half else y


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """``input`` with dims ``start_dim .. end_dim`` merged into one (``torch.flatten``). Op
    ``flatten``."""
    return apply("flatten", [input], start_dim=start_dim, end_dim=end_dim)


def white_identity(x: Tensor) -> Tensor:
    """x, unchanged (op ``amp_white_identity``, white list): under AMP, the gray ops between it and
    another white op or a graph sink run in float16. Pruned after the AMP pass (no run-time cost)."""
    return apply("amp_white_identity", [x])


def black_identity(x: Tensor) -> Tensor:
    """x, unchanged (op ``amp_black_identity``, black list): under AMP, the gray ops after it (and
    their gradients) run in float32. Pruned after the AMP pass (no run-time cost)."""
    return apply("amp_black_identity", [x])


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12,
              out=None) -> Tensor:
    """``input / max(||input||_p, eps)`` along ``dim`` (``torch.nn.functional.normalize``):
    the norm of :meth:`Tensor.norm` kept as a dim of size 1, clamped below at ``eps``
    (``clip_by_scalar``), broadcast back over ``dim``.

    Raises:
        TypeError: ``out`` given (miniflow has no ``out=``). Others as :meth:`Tensor.norm`.
    """
    if out is not None:
        raise TypeError("normalize: out= is not supported; use the returned tensor")
    return input / input.norm(p, dim, keepdim=True).clamp(min=eps)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """``torch.nn.functional.one_hot``: an int64 tensor of shape ``(*tensor.shape,
    num_classes)``, 1 at each index's class and 0 elsewhere, from an int64 tensor of class
    indices (a NumPy integer array is taken too); ``num_classes=-1``: the largest index + 1.
    Op ``dim_scatter_update_scalar`` of a zero tensor (no gradient: int64), so inside ``build``
    a computed index works when ``num_classes`` is given.

    Raises:
        RuntimeError: an index tensor that is not int64 ("one_hot is only applicable to index
            tensor."), a negative class or one not below ``num_classes``, ``num_classes=-1``
            of an empty tensor or of an index computed inside ``build`` (PyTorch's messages
            where it has them).
    """
    index = tensor if isinstance(tensor, Tensor) else _index_tensor(tensor)
    if index.dtype.is_float:
        raise RuntimeError("one_hot is only applicable to index tensor.")
    known = None if index._value is not None else index.numpy()
    if known is not None and known.size:
        if known.min() < 0:
            raise RuntimeError("Class values must be non-negative.")
        if num_classes != -1 and known.max() >= num_classes:
            raise RuntimeError("Class values must be smaller than num_classes.")
    if num_classes == -1:
        if known is None:
            raise RuntimeError("one_hot: num_classes=-1 reads the largest index, which a "
                               "tensor computed inside nn.Graph.build has not at trace time: "
                               "give num_classes")
        if not known.size:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(known.max()) + 1
    return zeros(*index.shape, num_classes, dtype=int64).scatter(-1, index.unsqueeze(-1), 1)


def _index_tensor(value) -> Tensor:
    """An integer array as an int64 tensor (one_hot's input)."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise RuntimeError("one_hot is only applicable to index tensor.")
    return tensor(arr.astype(np.int64))


def pad(input: Tensor, pad, mode: str = "constant", value=None) -> Tensor:
    """``torch.nn.functional.pad`` in ``"constant"`` mode: ``pad`` lists (before, after)
    counts from the last dimension backwards (``(1, 2)`` pads the last dim by 1 and 2;
    ``(1, 1, 2, 2)`` the last two); ``value`` (0 by default) fills the new places. Op
    ``slice_update`` of the input into a constant filled with ``value``; a negative count
    crops (op ``slice``), as PyTorch's. The gradient is the input's part of ``dy``.

    Raises:
        NotImplementedError: another ``mode`` ("reflect", "replicate", "circular": not
            supported). ValueError: ``pad`` of odd length or longer than
            twice the input's dims (PyTorch's "Padding length must be divisible by 2" /
            "Padding length too large"). TypeError: counts that are not ints.
            RuntimeError: a crop that leaves a negative size; a finite ``value`` beyond the
            input's floating dtype (``1e9`` into a float16 tensor), as PyTorch's "value cannot
            be converted to type at::Half without overflow". Under AMP the traced tensor is
            float32, so the check passes, and the pad runs in float32 (``slice_update`` is in
            no AMP list): the value stays, and a float16 op that reads it (a white ``matmul``)
            rounds it to inf.
    """
    if mode != "constant":
        raise NotImplementedError(f"pad: mode={mode!r} is not supported; miniflow pads with "
                                  f"mode='constant' (a value) only")
    pad = tuple(pad)
    if any(isinstance(n, bool) or not isinstance(n, numbers.Integral) for n in pad):
        raise TypeError(f"pad: the counts must be ints, got {pad!r}")
    if len(pad) % 2:
        raise ValueError("Padding length must be divisible by 2")
    if len(pad) // 2 > input.ndim:
        raise ValueError("Padding length too large")
    counts = [(0, 0)] * input.ndim
    for i in range(len(pad) // 2):
        counts[input.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    shape = tuple(n + b + a for n, (b, a) in zip(input.shape, counts))
    if any(n < 0 for n in shape):
        raise RuntimeError(f"pad: the padded size of the input of shape {list(input.shape)} "
                           f"with pad {list(pad)} would be {list(shape)}: sizes must be >= 0")
    crop = tuple(slice(max(-b, 0), n - max(-a, 0)) for n, (b, a) in zip(input.shape, counts))
    inner = input[crop] if any(b < 0 or a < 0 for b, a in counts) else input
    value = 0.0 if value is None else float(value)
    if input.dtype.is_float:
        check_fill("pad", value, input.dtype)
    out = tensor(np.full(shape, value), dtype=input.dtype)
    if 0 in inner.shape:
        return out
    start = tuple(max(b, 0) for b, _ in counts)
    return apply("slice_update", [out, inner], start=start,
                 stop=tuple(s + n for s, n in zip(start, inner.shape)), step=(1,) * len(start))


def __getattr__(name):
    """Only for a name the module has not (PyTorch's ``torch.nn.functional`` has many more).

    Raises:
        AttributeError: always; one of ``miniflow.tensor.core.NOT_THERE`` says what to write
            instead, another public name's error points to ``docs/differences.md``, which lists
            the PyTorch names miniflow has and lacks."""
    raise not_there("module 'miniflow.nn.functional'", name,
                    "" if name.startswith("_") else LISTED)
