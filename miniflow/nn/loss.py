"""The losses: ``nn.functional.cross_entropy`` and ``nn.CrossEntropyLoss``, with PyTorch's
arguments and semantics (``torch.nn.functional.cross_entropy``, ``torch.nn.CrossEntropyLoss``:
``reduction``, ``label_smoothing``, ``ignore_index``), on OneFlow's ``sparse_softmax_cross_entropy``
op; ``nll_loss`` and ``nn.NLLLoss`` (``torch.nn.functional.nll_loss``: ``weight``,
``ignore_index``, the weighted mean), a composition of ``gather`` and casts (below);
``mse_loss`` / ``nn.MSELoss`` and ``l1_loss`` / ``nn.L1Loss`` (``torch.nn.functional.mse_loss``,
``l1_loss``), compositions of ``broadcast_sub``, ``scalar_pow`` or ``abs`` and a sum or mean;
``binary_cross_entropy_with_logits`` / ``nn.BCEWithLogitsLoss`` (op ``softplus``) and ``kl_div`` /
``nn.KLDivLoss``, compositions too.

``ignore_index`` is a composition of existing ops (miniflow has no integer comparison op): the
labels are cast to float64 (exact for every int64 label below 2**53), ``label - ignore_index``
cast back to int64 is nonzero exactly where a label is kept, and ``masked_fill`` turns that
into the ignored rows' mask. Ignored rows get label 0 for the op (any valid class) and their
loss is filled with 0 (``masked_fill``, whose gradient is ``masked_fill(dy, mask, 0)``: they
get no gradient). PyTorch's ``nll_loss`` (``aten/src/ATen/native/LossNLL.cpp``) and OneFlow's
``nll`` op skip them the same way; "mean" divides by the number of kept rows (0 / 0 = nan when
every row is ignored, as PyTorch).

``nll_loss`` picks ``input[i, target[i]]`` with one ``gather`` of the flattened ``[M * C]``
input at ``i * C + target[i]`` (the flat index made in float64 from the safe labels, exact
below 2**53, and cast to int64; the gradient is the gather's scatter-add), and the class weights
``weight[target[i]]`` with a ``gather`` of ``weight`` (ones without one) at the safe labels:
that gather is also the range check of the targets, as its kernel refuses an index outside
``[0, C)``. OneFlow's ``nll`` op (``oneflow/user/ops/nll_op.cpp``) computes the same
``-weight[t] * input[i, t]`` per row.
"""
from __future__ import annotations

import numpy as np

from ..checks import is_integer, is_real
from ..dtype import float64, int64
from ..tensor import Tensor, apply, tensor
from .module import Module

__all__ = ["cross_entropy", "CrossEntropyLoss", "nll_loss", "NLLLoss", "mse_loss", "MSELoss",
           "l1_loss", "L1Loss", "binary_cross_entropy_with_logits", "BCEWithLogitsLoss",
           "kl_div", "KLDivLoss"]

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(fn: str, reduction) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{fn}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _check(reduction, label_smoothing, ignore_index, weight) -> None:
    _check_reduction("cross_entropy", reduction)
    if not is_real(label_smoothing) or not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be a number between 0.0 and 1.0, "
                         f"got {label_smoothing!r}")
    if isinstance(weight, str):
        raise TypeError(f"cross_entropy: weight must be a [C] tensor of class weights, got "
                        f"{weight!r}; the third positional argument is weight, as PyTorch's: "
                        f"give reduction={weight!r} by keyword")
    if weight is not None and float(label_smoothing) != 0.0:
        raise ValueError(f"cross_entropy: a class weight with label_smoothing="
                         f"{label_smoothing!r} is not supported; give one of them")
    if ignore_index is not None and not is_integer(ignore_index):
        raise TypeError(f"cross_entropy: ignore_index must be an int (a label value to skip, "
                        f"PyTorch's -100) or None, got {ignore_index!r}")


def _masked_labels(labels: Tensor, ignore_index: int) -> tuple:
    """``(safe float64 labels, ignored float64 mask, ignored int64 mask)`` of int64 ``labels``:
    the labels as float64 with 0 at the ignored rows, and the mask 1 at the ignored rows."""
    as_float = labels.to(float64)
    kept = (as_float - float(ignore_index)).to(int64)               # nonzero where kept
    ignored_f = tensor(np.ones(labels.shape)).masked_fill(kept, 0.0)  # 1.0 where ignored
    ignored = ignored_f.to(int64)
    return as_float.masked_fill(ignored, 0.0), ignored_f, ignored


def _ignored(labels: Tensor, ignore_index: int) -> tuple:
    """``(safe labels, ignored mask, kept count)``: int64 labels with 0 at the ignored rows, an
    int64 mask nonzero at the ignored rows, and the float64 number of kept rows (0-d)."""
    safe, ignored_f, ignored = _masked_labels(labels, ignore_index)
    count = (ignored_f.sum() * -1.0) + float(labels.shape[0])
    return safe.to(int64), ignored, count


def cross_entropy(input: Tensor, target, weight=None, size_average=None,
                  ignore_index: int | None = None, reduce=None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross-entropy of logits ``input [N, C]`` (float) against int64 class indices
    ``target [N]`` (``torch.nn.functional.cross_entropy``, its positional order; class
    probabilities as targets are not supported). ``reduction``: ``"mean"`` (over the kept rows),
    ``"sum"`` or ``"none"`` (the ``[N]`` per-row losses).

    ``weight``: a ``[C]`` tensor (or array) of class weights, PyTorch's weighted loss: it is
    ``nll_loss(input.log_softmax(1), target, weight, ...)`` (see :func:`nll_loss`: the weighted
    mean divides by the sum of the kept rows' weights; ``ignore_index`` None there is -100).

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
            "must be between 0.0 and 1.0"); shape errors from the op name both shapes.
            Targets outside [0, C) (other than ``ignore_index``) raise ValueError when the
            graph runs, naming the first one. ``size_average`` / ``reduce`` given (PyTorch's
            deprecated arguments); a weight with label_smoothing (not supported); a weight
            :func:`nll_loss` refuses. (An empty batch with "mean" is nan, as PyTorch's.)
        TypeError: ``ignore_index`` not an int; a string as ``weight`` (a reduction given
            positionally: it is the seventh argument, as PyTorch's).
    """
    _legacy("cross_entropy", size_average, reduce)
    _check(reduction, label_smoothing, ignore_index, weight)
    if weight is not None:
        return nll_loss(input.log_softmax(1), target, weight,
                        ignore_index=-100 if ignore_index is None else ignore_index,
                        reduction=reduction)
    eps = float(label_smoothing)
    labels = target if isinstance(target, Tensor) else tensor(target)
    if ignore_index is not None and labels.dtype is int64:
        labels, ignored, count = _ignored(labels, ignore_index)
    else:
        ignored = None
    _, per_row = apply("sparse_softmax_cross_entropy", [input, labels])
    if eps != 0.0:
        classes = max(input.shape[-1], 1)      # no class: the op's label error, not a 1/0
        uniform = apply("log_softmax", [input]).sum(-1) * (-eps / classes)
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


def _legacy(fn: str, size_average, reduce) -> None:
    """Refuse PyTorch's deprecated ``size_average`` / ``reduce`` (a third positional argument
    of a loss lands there in PyTorch, and its legacy rule turns ``"sum"`` into a mean)."""
    if size_average is not None or reduce is not None:
        raise ValueError(f"{fn}: size_average and reduce are deprecated in PyTorch and not "
                         f"supported; give reduction='mean' | 'sum' | 'none' by keyword")


def _paired(fn: str, input: Tensor, target) -> Tensor:
    """``target`` as a Tensor of ``input``'s shape and dtype (an array is made a tensor of
    ``input``'s dtype), for the elementwise losses.

    Raises:
        ValueError: shapes that differ. TypeError: dtypes that differ."""
    target = _as_tensor(target, input)
    if target.shape != input.shape:
        raise ValueError(f"{fn}: target size {list(target.shape)} is different from the "
                         f"input size {list(input.shape)} (PyTorch would broadcast them, "
                         f"likely not what you meant): reshape the target to the input's shape")
    return _same_dtype(fn, "target", target, input)


def _same_dtype(fn: str, what: str, value: Tensor, input: Tensor) -> Tensor:
    """``value`` (the loss's ``what``: its target, its weight) if its dtype is ``input``'s.

    Raises:
        TypeError: another dtype (miniflow does not promote), naming both."""
    if value.dtype is not input.dtype:
        raise TypeError(f"{fn}: input {input.dtype.name} and {what} {value.dtype.name} "
                        f"have different dtypes; cast the {what} with "
                        f".to(miniflow.{input.dtype.name})")
    return value


def _weight(fn: str, weight, input: Tensor):
    """The elementwise losses' ``weight`` (PyTorch's, per element): None, or a Tensor (an
    array is made one of ``input``'s dtype) of ``input``'s shape and dtype.

    Raises:
        ValueError: another shape (PyTorch's "Weights and input must have the same size.").
        TypeError: another dtype."""
    if weight is None:
        return None
    weight = weight if isinstance(weight, Tensor) else tensor(weight, dtype=input.dtype)
    if weight.shape != input.shape:
        raise ValueError(f"{fn}: Weights and input must have the same size. (weight "
                         f"{list(weight.shape)}, input {list(input.shape)})")
    return _same_dtype(fn, "weight", weight, input)


def _reduce(per: Tensor, reduction: str, weight: Tensor | None = None) -> Tensor:
    """``per`` (times ``weight`` where given) reduced; a weighted mean is PyTorch's: the sum
    divided by the weights' sum."""
    if weight is not None:
        per = per * weight
        if reduction == "mean":
            return per.sum() / weight.sum()
    if reduction == "none":
        return per
    return per.sum() if reduction == "sum" else per.mean()


def mse_loss(input: Tensor, target, size_average=None, reduce=None,
             reduction: str = "mean", weight=None) -> Tensor:
    """The squared error ``(input - target)^2`` per element, averaged (``"mean"``), summed
    (``"sum"``) or returned as is (``"none"``): ``torch.nn.functional.mse_loss``, with its
    signature; ``weight`` (of ``input``'s shape) multiplies each element's loss, "mean" then
    divides by the weights' sum (PyTorch's). ``target``
    has ``input``'s shape (a Tensor, or an array made a tensor of ``input``'s dtype). Ops
    ``broadcast_sub``, ``scalar_pow`` and ``reduce_sum`` (``scalar_mul(1/n)`` for "mean"; a
    half input is averaged in float32, as :meth:`Tensor.mean`).

    Raises:
        ValueError: an unknown reduction; ``size_average`` or ``reduce`` given (PyTorch's
            deprecated arguments; a positional third argument lands there); shapes that differ
            (PyTorch broadcasts them with a warning that the result is likely wrong); a weight
            of another shape than ``input``. ("mean" of an empty input is nan, as PyTorch's.)
        TypeError: ``target`` or ``weight`` of another dtype than ``input`` (naming both).
    """
    _legacy("mse_loss", size_average, reduce)
    _check_reduction("mse_loss", reduction)
    target = _paired("mse_loss", input, target)
    return _reduce((input - target).square(), reduction, _weight("mse_loss", weight, input))


class _Loss(Module):
    """The base of the loss modules with a ``reduction`` (PyTorch's
    ``torch.nn.modules.loss._Loss``): PyTorch's signature, the deprecated ``size_average`` /
    ``reduce`` refused and ``reduction`` checked at construction; ``forward(input, target)``
    calls the functional form :attr:`function` with it.

    Raises:
        ValueError: an unknown reduction, or ``size_average`` / ``reduce`` given.
    """

    function = None
    """The functional form (a staticmethod: ``mse_loss`` ...), whose name the errors give."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean"):
        super().__init__()
        name = self.function.__name__
        _legacy(name, size_average, reduce)
        _check_reduction(name, reduction)
        self.reduction = reduction

    def forward(self, input, target):
        return self.function(input, target, reduction=self.reduction)


class MSELoss(_Loss):
    """``mse_loss`` as a module (``torch.nn.MSELoss``): ``MSELoss(reduction="mean")`` then
    ``loss(input, target)``; raises as :class:`_Loss`."""

    function = staticmethod(mse_loss)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class CrossEntropyLoss(_Loss):
    """``cross_entropy`` as a module (``torch.nn.CrossEntropyLoss``, its signature):
    ``CrossEntropyLoss(weight=None, size_average=None, ignore_index=None, reduce=None,
    reduction="mean", label_smoothing=0.0)`` then ``loss(input [N, C], target [N])``.
    ``weight`` is a buffer, as PyTorch registers it (in the state dict as ``weight`` when
    given); ``ignore_index`` defaults to None here (see :func:`cross_entropy`).

    Raises:
        ValueError / TypeError: the arguments :func:`cross_entropy` refuses, at construction.
    """

    function = staticmethod(cross_entropy)

    def __init__(self, weight=None, size_average=None, ignore_index: int | None = None,
                 reduce=None, reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__(size_average, reduce, reduction)
        _check(reduction, label_smoothing, ignore_index, weight)
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.label_smoothing = float(label_smoothing)

    def forward(self, input, target):
        return cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                             reduction=self.reduction, label_smoothing=self.label_smoothing)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}")


def l1_loss(input: Tensor, target, size_average=None, reduce=None,
            reduction: str = "mean", weight=None) -> Tensor:
    """The absolute error ``|input - target|`` per element, averaged (``"mean"``), summed
    (``"sum"``) or returned as is (``"none"``): ``torch.nn.functional.l1_loss``, with its
    signature and ``weight`` (as :func:`mse_loss`'s). ``target`` has ``input``'s shape and
    dtype, as for :func:`mse_loss`. Ops ``broadcast_sub``, ``abs`` and ``reduce_sum``
    (``scalar_mul(1/n)`` for "mean"). The gradient is ``sign(input - target)`` (/ n for
    "mean"), 0 where they are equal, as PyTorch's.

    Raises:
        ValueError: an unknown reduction; ``size_average`` or ``reduce`` given (PyTorch's
            deprecated arguments; a positional third argument lands there); shapes that differ
            (PyTorch broadcasts them with a warning); a weight of another shape than ``input``.
            ("mean" of an empty input is nan, as PyTorch's.)
        TypeError: ``target`` or ``weight`` of another dtype than ``input`` (naming both).
    """
    _legacy("l1_loss", size_average, reduce)
    _check_reduction("l1_loss", reduction)
    target = _paired("l1_loss", input, target)
    return _reduce((input - target).abs(), reduction, _weight("l1_loss", weight, input))


class L1Loss(_Loss):
    """``l1_loss`` as a module (``torch.nn.L1Loss``): ``L1Loss(reduction="mean")`` then
    ``loss(input, target)``; raises as :class:`_Loss`."""

    function = staticmethod(l1_loss)


def binary_cross_entropy_with_logits(input: Tensor, target, weight=None,
                                     size_average=None, reduce=None, reduction: str = "mean",
                                     pos_weight=None) -> Tensor:
    """The binary cross entropy of ``sigmoid(input)`` against ``target`` (probabilities of
    ``input``'s shape), ``torch.nn.functional.binary_cross_entropy_with_logits``, in PyTorch's
    stable form: ``(1 - t) * x + w_p * softplus(-x)`` with ``softplus(-x) = max(-x, 0) +
    log1p(exp(-|x|))`` (op ``softplus`` with no threshold) and ``w_p = 1 + (pos_weight - 1) *
    t`` (1 without ``pos_weight``); ``weight`` multiplies each element's loss. ``weight`` and
    ``pos_weight`` broadcast against the loss (``pos_weight`` along the last dim, one per
    class); tensors of ``input``'s dtype, or arrays made so. Reduced as :func:`mse_loss`.

    Raises:
        ValueError: an unknown reduction, ``size_average`` / ``reduce`` given; a target of
            another shape (PyTorch's "Target size ... must be the same as input size").
        TypeError: a target, weight or pos_weight of another dtype than ``input``.
    """
    fn = "binary_cross_entropy_with_logits"
    _legacy(fn, size_average, reduce)
    _check_reduction(fn, reduction)
    t = _as_tensor(target, input)
    if t.shape != input.shape:
        raise ValueError(f"Target size ({list(t.shape)}) must be the same as input size "
                         f"({list(input.shape)})")
    t = _same_dtype(fn, "target", t, input)
    log_sigmoid = apply("softplus", [-input], beta=1.0, threshold=float("inf"))
    if pos_weight is not None:
        pw = _same_dtype(fn, "pos_weight", _as_tensor(pos_weight, input), input)
        log_sigmoid = log_sigmoid * ((pw - 1.0) * t + 1.0)
    loss = (1.0 - t) * input + log_sigmoid
    if weight is not None:
        loss = loss * _same_dtype(fn, "weight", _as_tensor(weight, input), input)
    return _reduce(loss, reduction)


def _as_tensor(value, input: Tensor) -> Tensor:
    """``value`` itself if a Tensor, else a tensor of ``input``'s dtype."""
    return value if isinstance(value, Tensor) else tensor(value, dtype=input.dtype)


class BCEWithLogitsLoss(_Loss):
    """:func:`binary_cross_entropy_with_logits` as a module (``torch.nn.BCEWithLogitsLoss``:
    ``weight``, ``size_average``, ``reduce``, ``reduction``, ``pos_weight``), the weights
    kept as given.

    Raises:
        ValueError: as :class:`_Loss`."""

    function = staticmethod(binary_cross_entropy_with_logits)

    def __init__(self, weight=None, size_average=None, reduce=None, reduction: str = "mean",
                 pos_weight=None):
        super().__init__(size_average, reduce, reduction)
        self.weight, self.pos_weight = weight, pos_weight

    def forward(self, input, target):
        return binary_cross_entropy_with_logits(input, target, self.weight,
                                                reduction=self.reduction,
                                                pos_weight=self.pos_weight)


_TINY = {"float64": 2.0 ** -1022, "float16": 2.0 ** -14}
"""The smallest normal number of each dtype (float32's and bfloat16's: 2**-126)."""


def kl_div(input: Tensor, target, size_average=None, reduce=None, reduction: str = "mean",
           log_target: bool = False) -> Tensor:
    """The Kullback-Leibler divergence of ``target`` from ``input`` (log-probabilities),
    ``torch.nn.functional.kl_div``: per element ``target * (log(target) - input)``, 0 where
    ``target`` is 0 (PyTorch's ``xlogy``: here ``target * log(max(target, tiny))`` with
    ``tiny`` the dtype's smallest normal number, the same for every other target but the
    subnormal ones); with ``log_target``, ``exp(target) * (target - input)``. ``reduction``:
    ``"mean"`` over every element (PyTorch's default, which it warns about), ``"batchmean"``
    (the sum over the batch size ``input.shape[0]``: the mathematical KL divergence), ``"sum"``
    or ``"none"``. ``target`` of ``input``'s shape and dtype (an array made so).

    Raises:
        ValueError: an unknown reduction; ``size_average`` / ``reduce`` given; shapes that
            differ. TypeError: a target of another dtype.
    """
    _legacy("kl_div", size_average, reduce)
    if reduction != "batchmean":
        _check_reduction("kl_div", reduction)
    t = _paired("kl_div", input, target)
    if log_target:
        per = t.exp() * (t - input)
    else:
        per = t * t.clamp(min=_TINY.get(input.dtype.name, 2.0 ** -126)).log() - t * input
    if reduction == "batchmean":
        return per.sum() / (input.shape[0] if input.ndim else 1)
    return _reduce(per, reduction)


class KLDivLoss(_Loss):
    """:func:`kl_div` as a module (``torch.nn.KLDivLoss``: ``size_average``, ``reduce``,
    ``reduction``, ``log_target``).

    Raises:
        ValueError: as :class:`_Loss` ("batchmean" is taken)."""

    function = staticmethod(kl_div)

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean",
                 log_target: bool = False):
        super().__init__(size_average, reduce,
                         "mean" if reduction == "batchmean" else reduction)
        self.reduction, self.log_target = reduction, log_target

    def forward(self, input, target):
        return kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


def _nll_target(input: Tensor, target) -> Tensor:
    """``target`` as an int64 Tensor of the shape ``input`` wants (PyTorch's messages).

    Raises:
        ValueError: a 0-d input, or a target of another shape. TypeError: a floating target."""
    if not isinstance(target, Tensor):
        arr = np.asarray(target)
        target = tensor(arr.astype(np.int64) if arr.dtype.kind in "iu" else arr)
    if target.dtype is not int64:
        raise TypeError(f"nll_loss: expected target dtype to be Long (int64), but got "
                        f"{target.dtype.name} (class indices; PyTorch's message)")
    shape, want = tuple(target.shape), tuple(input.shape[:1]) + tuple(input.shape[2:])
    if input.ndim == 0:
        raise ValueError("nll_loss: Expected 1 or more dimensions (got 0)")
    if input.ndim == 1:
        if shape not in ((), (1,)):
            raise ValueError(f"nll_loss: For 1D input, 1D target must have size 1, but got "
                             f"target size: {list(shape)}")
    elif input.ndim == 2 and shape[:1] != want:
        raise ValueError(f"nll_loss: Expected input batch_size ({input.shape[0]}) to match "
                         f"target batch_size ({shape[0] if shape else 'none: a 0-d target'}).")
    elif shape != want:
        raise ValueError(f"nll_loss: Expected target size {list(want)}, got {list(shape)}")
    return target


def _nll_weight(input: Tensor, weight, classes: int) -> Tensor:
    """``weight`` (ones without one) as a ``[C]`` Tensor of ``input``'s dtype.

    Raises:
        ValueError: another shape. TypeError: another dtype. RuntimeError: a weight that
            requires grad (PyTorch's)."""
    if weight is None:
        return tensor(np.ones(classes), dtype=input.dtype)
    weight = _as_tensor(weight, input)
    if tuple(weight.shape) != (classes,):
        raise ValueError(f"nll_loss: weight tensor should be defined either for all {classes} "
                         f"classes or no classes but got weight tensor of shape: "
                         f"{list(weight.shape)}")
    _same_dtype("nll_loss", "weight", weight, input)
    if getattr(weight, "requires_grad", False):
        raise RuntimeError("nll_loss: the function is not differentiable with respect to "
                           "argument 'weight' (PyTorch's rule): pass a buffer or a frozen "
                           "parameter (requires_grad=False)")
    return weight


def _check_targets(target: Tensor, classes: int, ignore_index: int) -> None:
    """A target known now (not computed in a build) outside ``[0, C)`` other than
    ``ignore_index`` is PyTorch's IndexError; a computed one is refused by the op's ``gather``
    when the graph runs."""
    if target.is_lazy:
        return
    t = target.numpy().reshape(-1)
    bad = t[((t < 0) | (t >= classes)) & (t != ignore_index)]
    if bad.size:
        raise IndexError(f"nll_loss: Target {int(bad[0])} is out of bounds. (classes are "
                         f"[0, {classes}); ignore_index={ignore_index})")


def nll_loss(input: Tensor, target, weight=None, size_average=None, ignore_index: int = -100,
             reduce=None, reduction: str = "mean") -> Tensor:
    """The negative log likelihood loss ``-weight[t] * input[..., t, ...]``
    (``torch.nn.functional.nll_loss``, its signature and defaults), with ``input`` log
    probabilities (``log_softmax``'s output: nothing is normalized here).

    Shapes: ``input [N, C]`` with ``target [N]``, ``[C]`` with a 0-d target (unbatched), or
    ``[N, C, d1, ..., dk]`` with ``target [N, d1, ..., dk]``; ``target`` int64 class indices
    in ``[0, C)`` (a Tensor or an integer array), ``weight`` a ``[C]`` tensor (or array) of
    ``input``'s floating dtype, taken as a constant. Rows whose target equals ``ignore_index``
    (-100) add no loss and no gradient. ``reduction``: ``"none"`` (the per-element losses, of
    ``target``'s shape), ``"sum"``, or ``"mean"``: PyTorch's weighted mean, the sum divided by
    the sum of ``weight[t]`` over the kept elements (nan when every element is ignored or the
    batch is empty, as PyTorch). Ops: see the module docstring; gradient ``-weight[t]`` at
    ``input[i, t]`` (divided by the weight sum for "mean"), 0 elsewhere.

    Raises:
        ValueError: an unknown reduction; ``size_average`` / ``reduce`` given (deprecated);
            shapes that do not fit (PyTorch's messages: "Expected input batch_size (3) to
            match target batch_size (2).", "Expected target size [2, 5], got [2, 4]", the
            weight's "should be defined either for all C classes or no classes").
        TypeError: a floating target, ``ignore_index`` not an int, an integer input, a weight
            of another dtype.
        IndexError: a target known at the call (an array, an eager tensor) outside ``[0, C)``
            and not ``ignore_index`` ("Target 4 is out of bounds."); a target computed in a
            build is refused when the graph runs (the ``gather``'s IndexError, naming it).
        RuntimeError: a weight that requires grad (PyTorch's).
    """
    _legacy("nll_loss", size_average, reduce)
    _check_reduction("nll_loss", reduction)
    if not is_integer(ignore_index):
        raise TypeError(f"nll_loss: ignore_index must be an int, got {ignore_index!r}")
    if not input.dtype.is_float:
        raise TypeError(f"nll_loss: input must be floating point (log probabilities), got "
                        f"{input.dtype.name}")
    target = _nll_target(input, target)
    classes = input.shape[0] if input.ndim == 1 else input.shape[1]
    weight = _nll_weight(input, weight, classes)
    _check_targets(target, classes, int(ignore_index))
    if input.ndim > 2:      # classes last, then one row per element
        input = input.permute(0, *range(2, input.ndim), 1)
    rows = input.reshape(-1, classes)
    labels = target.reshape(-1)
    safe, _, ignored = _masked_labels(labels, ignore_index)
    picked_w = apply("gather", [weight, safe.to(int64)], axis=0).masked_fill(ignored, 0.0)
    offsets = tensor(np.arange(rows.shape[0], dtype=np.float64) * classes)
    flat = apply("gather", [rows.reshape(-1), (safe + offsets).to(int64)], axis=0)
    per = (-(flat * picked_w)).masked_fill(ignored, 0.0)
    if reduction == "none":
        return per.reshape(tuple(target.shape) if input.ndim > 1 else ())
    return per.sum() if reduction == "sum" else per.sum() / picked_w.sum()


class NLLLoss(_Loss):
    """``nll_loss`` as a module (``torch.nn.NLLLoss``): ``NLLLoss(weight=None,
    size_average=None, ignore_index=-100, reduce=None, reduction="mean")`` then ``loss(input,
    target)``. ``weight`` is a buffer, as PyTorch registers it: in the state dict as ``weight``
    when given.

    Raises:
        ValueError: an unknown reduction, or PyTorch's deprecated ``size_average`` /
            ``reduce``, at construction. TypeError: ``ignore_index`` not an int.
    """

    function = staticmethod(nll_loss)

    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean"):
        super().__init__(size_average, reduce, reduction)
        if not is_integer(ignore_index):
            raise TypeError(f"nll_loss: ignore_index must be an int, got {ignore_index!r}")
        self.register_buffer("weight", weight)
        self.ignore_index = int(ignore_index)

    def forward(self, input, target):
        return nll_loss(input, target, self.weight, ignore_index=self.ignore_index,
                        reduction=self.reduction)
