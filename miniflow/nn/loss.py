"""The losses: ``nn.functional.cross_entropy`` and ``nn.CrossEntropyLoss``, with PyTorch's
arguments and semantics (``torch.nn.functional.cross_entropy``, ``torch.nn.CrossEntropyLoss``:
``reduction``, ``label_smoothing``, ``ignore_index``), on OneFlow's ``sparse_softmax_cross_entropy``
op; ``mse_loss`` and ``nn.MSELoss`` (``torch.nn.functional.mse_loss``), a composition of
``broadcast_sub``, ``scalar_pow`` and a sum or mean.

``ignore_index`` is a composition of existing ops (miniflow has no integer comparison op): the
labels are cast to float64 (exact for every int64 label below 2**53), ``label - ignore_index``
cast back to int64 is nonzero exactly where a label is kept, and ``masked_fill`` turns that
into the ignored rows' mask. Ignored rows get label 0 for the op (any valid class) and their
loss is filled with 0 (``masked_fill``, whose gradient is ``masked_fill(dy, mask, 0)``: they
get no gradient). PyTorch's ``nll_loss`` (``aten/src/ATen/native/LossNLL.cpp``) and OneFlow's
``nll`` op skip them the same way; "mean" divides by the number of kept rows (0 / 0 = nan when
every row is ignored, as PyTorch).
"""
from __future__ import annotations

import numpy as np

from ..checks import is_integer, is_real
from ..dtype import float64, int64
from ..tensor import Tensor, apply, tensor
from .module import Module

__all__ = ["cross_entropy", "CrossEntropyLoss", "mse_loss", "MSELoss"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(fn: str, reduction) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{fn}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _check(reduction, label_smoothing, ignore_index) -> None:
    _check_reduction("cross_entropy", reduction)
    if not is_real(label_smoothing) or not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be a number between 0.0 and 1.0, "
                         f"got {label_smoothing!r}")
    if ignore_index is not None and not is_integer(ignore_index):
        raise TypeError(f"cross_entropy: ignore_index must be an int (a label value to skip, "
                        f"PyTorch's -100) or None, got {ignore_index!r}")


def _ignored(labels: Tensor, ignore_index: int) -> tuple:
    """``(safe labels, ignored mask, kept count)``: int64 labels with 0 at the ignored rows, an
    int64 mask nonzero at the ignored rows, and the float64 number of kept rows (0-d)."""
    as_float = labels.to(float64)
    kept = (as_float - float(ignore_index)).to(int64)               # nonzero where kept
    ignored_f = tensor(np.ones(labels.shape)).masked_fill(kept, 0.0)  # 1.0 where ignored
    ignored = ignored_f.to(int64)
    safe = as_float.masked_fill(ignored, 0.0).to(int64)
    count = (ignored_f.sum() * -1.0) + float(labels.shape[0])
    return safe, ignored, count


def cross_entropy(input: Tensor, target, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int | None = None) -> Tensor:
    """Softmax cross-entropy of logits ``input [N, C]`` (float) against int64 class indices
    ``target [N]`` (``torch.nn.functional.cross_entropy``; PyTorch's ``weight`` and class
    probabilities as targets are not supported). ``reduction``: ``"mean"`` (over the kept
    rows), ``"sum"`` or ``"none"`` (the ``[N]`` per-row losses).

    Op ``sparse_softmax_cross_entropy``, then ``reduce_sum`` (and ``scalar_mul(1/N)`` for
    "mean").

    ``label_smoothing`` ε in [0, 1] (Szegedy et al., "Rethinking the Inception Architecture",
    CVPR 2016): the target is ``(1 - ε) onehot + ε / C``, so the per-row loss is
    ``(1 - ε) * nll - ε / C * sum_c log_softmax(input)_c`` (ops ``log_softmax``,
    ``reduce_sum`` and scalar multiplies added; their gradients give ``softmax - target``).

    ``ignore_index``: rows whose target equals it contribute neither loss nor gradient, and
    "mean" divides by the number of the other rows: every row ignored gives nan, as PyTorch
    (see the module docstring for the ops). PyTorch's default is -100; here it is None (no
    row ignored, the cheaper graph), so a target of -100 without ``ignore_index=-100`` is an
    out-of-range label.

    Raises:
        ValueError: an unknown reduction; label_smoothing not a number in [0, 1] (PyTorch's
            "must be between 0.0 and 1.0"); an empty batch with reduction "mean" (the mean of
            no rows); shape errors from the op name both shapes. Targets outside [0, C) (other
            than ``ignore_index``) raise ValueError when the graph runs, naming the first one.
        TypeError: ``ignore_index`` not an int.
    """
    _check(reduction, label_smoothing, ignore_index)
    if reduction == "mean" and input.ndim == 2 and input.shape[0] == 0:
        raise ValueError(f"cross_entropy: the batch is empty (input of shape "
                         f"{list(input.shape)}): reduction='mean' of no rows has no value "
                         f"(PyTorch returns nan); skip empty batches (drop_last=True, or a "
                         f"check of len(batch)), or use reduction='sum'")
    eps = float(label_smoothing)
    labels = target if isinstance(target, Tensor) else tensor(target)
    if ignore_index is not None and labels.dtype is int64:
        labels, ignored, count = _ignored(labels, ignore_index)
    else:
        ignored = None
    _, per_row = apply("sparse_softmax_cross_entropy", [input, labels])
    if eps != 0.0:
        uniform = apply("log_softmax", [input]).sum(-1) * (-eps / input.shape[-1])
        per_row = per_row * (1.0 - eps) + uniform
    if ignored is not None:
        per_row = per_row.masked_fill(ignored, 0.0)
    if reduction == "none":
        return per_row
    if reduction == "sum":
        return per_row.sum()
    if ignored is None:
        return per_row.mean()
    return per_row.sum() / count.to(per_row.dtype)


class CrossEntropyLoss(Module):
    """``cross_entropy`` as a module (``torch.nn.CrossEntropyLoss``): ``CrossEntropyLoss(
    ignore_index=None, reduction="mean", label_smoothing=0.0)`` then ``loss(input [N, C],
    target [N])``. PyTorch's ``weight``, ``size_average`` and ``reduce`` are not supported;
    ``ignore_index`` defaults to None here (see :func:`cross_entropy`).

    Raises:
        ValueError / TypeError: the arguments :func:`cross_entropy` refuses, at construction.
    """

    def __init__(self, *, ignore_index: int | None = None, reduction: str = "mean",
                 label_smoothing: float = 0.0):
        super().__init__()
        _check(reduction, label_smoothing, ignore_index)
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing = float(label_smoothing)

    def forward(self, input, target):
        return cross_entropy(input, target, self.reduction, self.label_smoothing,
                             self.ignore_index)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}")


def mse_loss(input: Tensor, target, reduction: str = "mean") -> Tensor:
    """The squared error ``(input - target)^2`` per element, averaged (``"mean"``), summed
    (``"sum"``) or returned as is (``"none"``): ``torch.nn.functional.mse_loss``. ``target``
    has ``input``'s shape (a Tensor, or an array made a tensor of ``input``'s dtype). Ops
    ``broadcast_sub``, ``scalar_pow`` and ``reduce_sum`` (``scalar_mul(1/n)`` for "mean"; a
    half input is averaged in float32, as :meth:`Tensor.mean`).

    Raises:
        ValueError: an unknown reduction; shapes that differ (PyTorch broadcasts them with a
            warning that the result is likely wrong); "mean" of an empty input.
        TypeError: ``target`` of another dtype than ``input`` (naming both).
    """
    _check_reduction("mse_loss", reduction)
    target = target if isinstance(target, Tensor) else tensor(target, dtype=input.dtype)
    if target.shape != input.shape:
        raise ValueError(f"mse_loss: target size {list(target.shape)} is different from the "
                         f"input size {list(input.shape)} (PyTorch would broadcast them, "
                         f"likely not what you meant): reshape the target to the input's shape")
    if target.dtype is not input.dtype:
        raise TypeError(f"mse_loss: input {input.dtype.name} and target {target.dtype.name} "
                        f"have different dtypes; cast the target with "
                        f".to(miniflow.{input.dtype.name})")
    squares = (input - target).square()
    if reduction == "none":
        return squares
    return squares.sum() if reduction == "sum" else squares.mean()


class MSELoss(Module):
    """``mse_loss`` as a module (``torch.nn.MSELoss``): ``MSELoss(reduction="mean")`` then
    ``loss(input, target)``. PyTorch's deprecated ``size_average`` and ``reduce`` are not
    supported.

    Raises:
        ValueError: an unknown reduction, at construction.
    """

    def __init__(self, *, reduction: str = "mean"):
        super().__init__()
        _check_reduction("mse_loss", reduction)
        self.reduction = reduction

    def forward(self, input, target):
        return mse_loss(input, target, self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"
