"""Math: the arithmetic operators and their PyTorch method names, matmul, elementwise functions
(``exp``, ``relu``, ``pow``, ``log1p``, ``floor``, ``round`` ...), ``softmax`` / ``log_softmax``,
``clamp``, ``maximum`` / ``minimum``, ``masked_fill`` and ``where`` (also ``miniflow.where``);
``miniflow.einsum``."""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import numpy as np

from ..dtype import bool_, check_fill, float32
from .core import TensorCore
from .create import apply, as_numpy, tensor
from .dims import _dim

if TYPE_CHECKING:        # the composed class, for the annotations only
    from . import Tensor


_SYMBOLS = {"broadcast_add": "+", "broadcast_sub": "-", "broadcast_mul": "*", "broadcast_div": "/"}
"""The Python operator of each broadcast op, for ``_binary``'s errors."""


class Arithmetic:
    """The math methods and operators of :class:`miniflow.tensor.Tensor`."""

    def _binary(self, other, op, scalar_op, reverse=False):
        """``self (op) other``: a number as the scalar op, else the broadcast op; an int64
        operand is made floating first where PyTorch's type promotion makes the result floating
        (:func:`_promoted`).

        Raises:
            TypeError: integer arithmetic (int64 operands with no floating one, other than
                ``/``: miniflow has none), saying what to write for an index (``int(t)``) or
                for values (a cast)."""
        x, other = _promoted(op, self, other)
        for t in (x, other):
            if isinstance(t, TensorCore) and not t.dtype.is_float:
                raise TypeError(
                    f"'{_SYMBOLS[op]}': miniflow has no integer arithmetic (a {t.dtype.name} "
                    f"tensor of shape {list(t.shape)}); for an index or a count, int(t) gives "
                    f"the Python int of a one-element tensor (nanoGPT's data[i:i+block_size] "
                    f"is data[int(i):int(i) + block_size]); for values, cast with "
                    f".to(miniflow.float32) first")
        if isinstance(other, numbers.Number) and not isinstance(other, bool):
            return scalar_op(x, float(other))
        other = _other_tensor(x, other)
        a, b = (other, x) if reverse else (x, other)
        return apply(op, [a, b])

    def __add__(self, o):
        return self._binary(o, "broadcast_add", lambda t, s: apply("scalar_add", [t], scalar=s))

    __radd__ = __add__

    def __sub__(self, o):
        return self._binary(o, "broadcast_sub", lambda t, s: apply("scalar_add", [t], scalar=-s))

    def __rsub__(self, o):
        return self._binary(o, "broadcast_sub",
                            lambda t, s: apply("scalar_add", [-t], scalar=s), reverse=True)

    def __mul__(self, o):
        return self._binary(o, "broadcast_mul", lambda t, s: apply("scalar_mul", [t], scalar=s))

    __rmul__ = __mul__

    def __truediv__(self, o):
        return self._binary(o, "broadcast_div",  # x / 0 = +-inf or nan, as IEEE (and torch)
                            lambda t, s: apply("scalar_div", [t], scalar=s))

    def __rtruediv__(self, o):
        return self._binary(o, "broadcast_div",
                            lambda t, s: tensor(np.full(t.shape, s), dtype=t.dtype) / t,
                            reverse=True)

    def __matmul__(self, o):
        return _matmul(self, _other_tensor(self, o))

    def __rmatmul__(self, o):
        return _matmul(tensor(o, dtype=self.dtype), self)

    def __neg__(self):
        return apply("negative", [self])

    def neg(self):
        """``-x`` (``torch.Tensor.neg``; op ``negative``)."""
        return -self

    def add(self, other, *, alpha=1):
        """``self + alpha * other`` (``torch.Tensor.add``; the ops of ``+`` and ``*``)."""
        return self + (other if alpha == 1 else other * alpha)

    def sub(self, other, *, alpha=1):
        """``self - alpha * other`` (``torch.Tensor.sub``; the ops of ``-`` and ``*``)."""
        return self - (other if alpha == 1 else other * alpha)

    def mul(self, other):
        """``self * other`` (``torch.Tensor.mul``)."""
        return self * other

    def div(self, other, *, rounding_mode=None):
        """``self / other`` (``torch.Tensor.div``, true division).

        Raises:
            ValueError: a ``rounding_mode`` ("trunc", "floor": miniflow has no rounding ops)."""
        if rounding_mode is not None:
            raise ValueError(f"div: rounding_mode={rounding_mode!r} is not supported (miniflow "
                             f"has no rounding ops); true division only (rounding_mode=None)")
        return self / other

    def matmul(self, other):
        """``self @ other`` (``torch.Tensor.matmul``, with ``@``'s ranks)."""
        return self @ other

    def exp(self):
        """exp(x) elementwise (op ``exp``)."""
        return apply("exp", [self])

    def log(self):
        """Natural log elementwise (op ``log``); log(0) = -inf, log(x<0) = NaN."""
        return apply("log", [self])

    def relu(self):
        """max(x, 0) elementwise, NaN propagating (op ``relu``)."""
        return apply("relu", [self])

    def tanh(self):
        """tanh(x) elementwise (op ``tanh``)."""
        return apply("tanh", [self])

    def sigmoid(self):
        """1 / (1 + exp(-x)) elementwise (op ``sigmoid``)."""
        return apply("sigmoid", [self])

    def sin(self):
        """sin(x) elementwise (op ``sin``; ``torch.sin``, the PyTorch tutorial's sinusoidal
        positional encoding); its gradient is ``cos(x)``."""
        return apply("sin", [self])

    def cos(self):
        """cos(x) elementwise (op ``cos``; ``torch.cos``); its gradient is ``-sin(x)``."""
        return apply("cos", [self])

    def log1p(self):
        """log(1 + x) elementwise, exact for small x (op ``log1p``, OneFlow's; ``torch.log1p``);
        its gradient is ``dy / (1 + x)``. An int64 tensor is cast to float32 first (PyTorch's
        type promotion: ``torch.log1p(torch.tensor([3]))`` is float32)."""
        return apply("log1p", [self if self.dtype.is_float else self.to(float32)])

    def floor(self):
        """The largest integer <= x elementwise, in this dtype (op ``floor``, OneFlow's;
        ``torch.floor``); its gradient is 0, as PyTorch's. Of an int64 tensor a copy (op
        ``identity``), int64, as PyTorch's."""
        return apply("floor" if self.dtype.is_float else "identity", [self])

    def round(self, *, decimals: int = 0):
        """x rounded to the nearest integer, halves to the even one (op ``round``, OneFlow's;
        ``torch.round``: ``round(2.5) = 2``); with ``decimals``, as PyTorch computes it:
        ``round(x * 10**decimals) / 10**decimals`` (for negative decimals ``round(x /
        10**-decimals) * 10**-decimals``), in float32 for the half types, rounded once, as
        PyTorch's (``x * 10**decimals`` of a float16 overflows from 6.6 with ``decimals=4``).
        Its gradient is 0, as PyTorch's.

        Of an int64 tensor (``decimals`` 0) a copy (op ``identity``), int64, as PyTorch's.

        Raises:
            TypeError: ``decimals`` not an int.
            RuntimeError: ``decimals`` of an int64 tensor (PyTorch's "round_cpu" error)."""
        if isinstance(decimals, bool) or not isinstance(decimals, numbers.Integral):
            raise TypeError(f"round(): argument 'decimals' must be int, not "
                            f"{type(decimals).__name__}")
        if not self.dtype.is_float:
            if decimals != 0:
                raise RuntimeError(f"round(): decimals={decimals} of a {self.dtype.name} tensor "
                                   f"is not implemented (PyTorch's neither): cast it with "
                                   f".to(miniflow.float64) first")
            return apply("identity", [self])
        if decimals == 0:
            return apply("round", [self])
        wide = self.float() if self.dtype.is_half else self    # x * 10**d overflows a half
        scale = 10.0 ** abs(int(decimals))
        if decimals > 0:
            out = apply("round", [wide * scale]) / scale
        else:
            out = apply("round", [wide / scale]) * scale
        return out.to(self.dtype) if self.dtype.is_half else out

    def sqrt(self):
        """sqrt(x) elementwise (op ``sqrt``); sqrt(x<0) = NaN."""
        return apply("sqrt", [self])

    def rsqrt(self):
        """1 / sqrt(x) elementwise (op ``rsqrt``); rsqrt(0) = inf."""
        return apply("rsqrt", [self])

    def abs(self):
        """|x| elementwise (op ``abs``; its gradient is 0 at 0, as PyTorch's)."""
        return apply("abs", [self])

    __abs__ = abs

    def pow(self, exponent):
        """x ** exponent elementwise (``torch.pow``): a number ``exponent`` is op ``scalar_pow``
        (PyTorch's values: ``x ** 0.5`` is ``sqrt``, ``x ** 0`` is 1 with a zero gradient); a
        Tensor or an array (made a tensor of this dtype) is op ``broadcast_pow``, broadcast,
        with both gradients (the exponent's ``x ** y * log(x)``, 0 where x = 0 and y >= 0, as
        PyTorch's).

        An int64 operand beside a floating one (``x ** torch.tensor(2)``, ``ids ** 0.5``) is
        promoted as PyTorch's (:func:`_promoted`); int64 ``**`` an integer is not there.

        Raises:
            TypeError: an exponent of another floating dtype (the op's message), or a bool.
        """
        if isinstance(exponent, bool):
            raise TypeError("pow: the exponent must be a number or a tensor, got a bool")
        if isinstance(exponent, numbers.Real):
            x, _ = _promoted("scalar_pow", self, exponent)
            return apply("scalar_pow", [x], scalar=float(exponent))
        x, exponent = _promoted("broadcast_pow", self, exponent)
        return apply("broadcast_pow", [x, _other_tensor(x, exponent)])

    __pow__ = pow

    def __rpow__(self, base):
        """``base ** x`` of a number (or an array) ``base`` (``torch.pow(base, x)``; op
        ``broadcast_pow``, the base a constant of this dtype; an int64 ``x`` under a float
        base is promoted to float32, as PyTorch's): RoPE's ``theta ** (i / d)``."""
        x, _ = _promoted("broadcast_pow", self, base)
        return apply("broadcast_pow", [_other_tensor(x, base), x])

    def square(self):
        """x * x elementwise (op ``scalar_pow`` with exponent 2)."""
        return self.pow(2.0)

    def softmax(self, dim: int, dtype=None) -> "Tensor":
        """exp(x) / sum(exp(x)) along ``dim`` (op ``softmax``, max-subtracted; another axis than
        the last is moved last and back with ``transpose``); ``dtype``: cast to it first (op
        ``cast``, ``torch.Tensor.softmax``'s ``dtype``)."""
        return self._along("softmax", dim, dtype)

    def log_softmax(self, dim: int, dtype=None) -> "Tensor":
        """x - log(sum(exp(x))) along ``dim`` (op ``log_softmax``; ``torch.Tensor.log_softmax``),
        ``dtype`` as :meth:`softmax`'s."""
        return self._along("log_softmax", dim, dtype)

    def _along(self, op: str, dim: int, dtype) -> "Tensor":
        """Row op ``op`` (it works on the last axis) along ``dim``: another axis is moved last
        and back with ``transpose``."""
        if dtype is not None:
            return self.to(dtype)._along(op, dim, None)
        d = _dim(op, dim, self.ndim)
        if self.ndim == 0:                   # PyTorch: softmax 1 (nan for nan and inf)
            return apply(op, [self.reshape(1)]).reshape(())
        if d == self.ndim - 1:
            return apply(op, [self])
        perm = tuple(i for i in range(self.ndim) if i != d) + (d,)
        inv = tuple(perm.index(i) for i in range(self.ndim))
        moved = apply("transpose", [self], perm=perm)
        return apply("transpose", [apply(op, [moved])], perm=inv)

    def clamp(self, min=None, max=None) -> "Tensor":
        """Each element limited to ``[min, max]`` (``torch.clamp`` with number bounds; ``max``
        where ``min > max``, NaN propagates; op ``clip_by_scalar``, its gradient 1 inside the
        bounds). ``clip`` is the same.

        Raises:
            ValueError: neither bound given (PyTorch's message). TypeError: a bound that is not
                a number (tensor bounds are not supported).
        """
        if min is None and max is None:
            raise ValueError("clamp: At least one of 'min' or 'max' must not be None")
        for name, bound in (("min", min), ("max", max)):
            if bound is not None and (isinstance(bound, bool)
                                      or not isinstance(bound, numbers.Real)):
                raise TypeError(f"clamp: {name} must be a number, got {type(bound).__name__} "
                                f"(tensor bounds are not supported)")
        bounds = {k: float(v) for k, v in (("floating_min", min), ("floating_max", max))
                  if v is not None}
        return apply("clip_by_scalar", [self], **bounds)

    clip = clamp

    def maximum(self, other) -> "Tensor":
        """The elementwise larger of this tensor and ``other`` (a Tensor, or an array made a
        tensor of this dtype; broadcast), NaN where either is NaN, a tie's gradient split in
        halves: ``torch.maximum`` and ``x.max(other)``. Op ``broadcast_maximum`` (OneFlow's).
        An int64 operand beside a floating one takes its dtype, as PyTorch's promotion.

        Raises:
            TypeError: a number as ``other`` (PyTorch's ``maximum`` takes a tensor; a number
                bound is :meth:`clamp`); ``other`` of another floating dtype (the op's
                message), or both int64.
        """
        return apply("broadcast_maximum", list(_other("maximum", self, other, "min")))

    def minimum(self, other) -> "Tensor":
        """The elementwise smaller of this tensor and ``other``, as :meth:`maximum`
        (``torch.minimum``, ``x.min(other)``; op ``broadcast_minimum``)."""
        return apply("broadcast_minimum", list(_other("minimum", self, other, "max")))

    def masked_fill(self, mask, value) -> "Tensor":
        """``value`` where ``mask`` is True (nonzero), else this tensor's element (op
        ``masked_fill``). ``mask``: a bool or int64 Tensor or a bool or integer array that
        broadcasts to this tensor's shape (a bool one is data, read now, inside ``build`` too:
        it enters the graph as an int64 constant, as no graph value is bool).

        Raises:
            TypeError: a mask that is not an array or a Tensor (a Python bool: what ``t == 0``
                of a lazy tensor would be in PyTorch code), or a float array (PyTorch:
                "masked_fill_ only supports boolean masks").
            RuntimeError: a finite ``value`` beyond the dtype's range (-1e9 into a float16
                tensor), as PyTorch's "value cannot be converted to type at::Half without
                overflow". Under AMP the traced tensor is float32, so the check passes, and a
                float16 ``masked_fill`` the AMP pass makes fills -inf (OneFlow's cast).
        """
        if not isinstance(mask, TensorCore) or mask.dtype is bool_:
            arr = mask_array("masked_fill", mask)
            if arr.dtype.kind not in "biu":
                raise TypeError(f"masked_fill: only supports boolean masks (or integer ones: "
                                f"nonzero = fill), got an array of {arr.dtype}")
            mask = tensor(arr.astype(np.int64))
        value = float(value)
        if self.dtype.is_float:
            check_fill("masked_fill", value, self.dtype)
        return apply("masked_fill", [self, mask], value=value)

    def where(self, condition, y) -> "Tensor":
        """``torch.Tensor.where``: ``x.where(condition, y)`` is :func:`where` ``(condition, x,
        y)``."""
        return where(condition, self, y)

    def tril(self, diagonal: int = 0) -> "Tensor":
        """The lower triangle of the last two dimensions (``torch.tril``; nanoGPT's
        ``torch.tril(torch.ones(T, T))`` mask): ``out[..., i, j] = x[..., i, j]`` where
        ``j - i <= diagonal``, else 0. Floating tensors of at least 2 dimensions (op ``tril``;
        its gradient is the gradient's lower triangle).

        Raises:
            TypeError: ``diagonal`` not an int; an int64 tensor (the op's message).
            RuntimeError: fewer than 2 dimensions (PyTorch's message).
        """
        _triangle_checks("tril", self, diagonal)
        return apply("tril", [self], diagonal=int(diagonal))

    def triu(self, diagonal: int = 0) -> "Tensor":
        """The upper triangle of the last two dimensions (``torch.triu``): ``out[..., i, j] =
        x[..., i, j]`` where ``j - i >= diagonal``, else 0. Floating tensors of at least 2
        dimensions (op ``masked_fill`` with the lower part as its mask; gradient likewise).

        Raises: as :meth:`tril`.
        """
        _triangle_checks("triu", self, diagonal)
        if not self.dtype.is_float:
            raise TypeError(f"triu: a floating tensor is needed, got {self.dtype.name}")
        rows, cols = self.shape[-2:]
        below = np.arange(cols)[None, :] - np.arange(rows)[:, None] < int(diagonal)
        return self.masked_fill(below, 0.0)


def where(condition, input, other) -> "Tensor":
    """``input`` where ``condition`` is True (nonzero), else ``other`` (``torch.where(condition,
    input, other)``; OneFlow's op ``where``, here composed exactly of two ``masked_fill``: each
    operand is expanded to the broadcast shape, the places it does not take are filled with
    ``-0.0``, and the two are added: ``v + (-0.0)`` is ``v`` bit for bit, a ``-0.0`` taken
    included, so the result is the element taken, as PyTorch's; ``inf`` and NaN of the place
    not taken do not leak, and each gradient is ``dy`` where its operand was taken, summed back
    to its shape). ``condition``: a bool tensor (a comparison's result), a bool or integer array
    or an int64 Tensor, as :meth:`Arithmetic.masked_fill`'s mask; ``input`` and ``other``:
    floating tensors of one dtype, arrays or numbers (an array or a number takes the tensor's
    dtype; both numbers: float32, PyTorch's default).

    Raises:
        TypeError: a condition as :meth:`Arithmetic.masked_fill`'s mask; tensors of two dtypes
            (cast one); ``where(condition)`` alone (PyTorch's ``nonzero``: not there).
        RuntimeError: shapes that do not broadcast (PyTorch's message).
    """
    tensors = [v for v in (input, other) if isinstance(v, TensorCore)]
    if len(tensors) == 2 and input.dtype is not other.dtype:
        raise TypeError(f"where: input {input.dtype.name} and other {other.dtype.name} have "
                        f"different dtypes; cast one with .to(miniflow.{input.dtype.name})")
    dtype = tensors[0].dtype if tensors else float32
    for t in tensors:
        if not t.dtype.is_float:
            raise TypeError(f"where: a floating tensor is needed (masked_fill's), got "
                            f"{t.dtype.name}; cast it with .float() first")
    if isinstance(condition, TensorCore) and condition._value is not None:
        if condition.dtype.is_float:     # a lazy int64 mask; its complement by two casts
            raise TypeError(f"where: the condition must be a bool or integer mask, got a "
                            f"{condition.dtype.name} tensor")
        mask, keep = condition, (1.0 - condition.to(float32)).to("int64")
    else:
        mask = condition.numpy() if isinstance(condition, TensorCore) else mask_array(
            "where", condition)
        if mask.dtype.kind not in "biu":
            raise TypeError(f"where: the condition must be a bool or integer mask, got an array "
                            f"of {mask.dtype}")
        mask = mask.astype(bool)
        keep = np.logical_not(mask, out=np.empty_like(mask))    # 0-d stays an array
    shapes = [tuple(v.shape) for v in (mask, *tensors)]
    try:
        shape = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise RuntimeError(f"where: the shapes of condition, input and other "
                           f"{[list(s) for s in shapes]} do not broadcast together") from None
    x, y = (v if isinstance(v, TensorCore) else tensor(np.broadcast_to(v, shape), dtype=dtype)
            for v in (input, other))
    return x.expand(shape).masked_fill(keep, -0.0) + y.expand(shape).masked_fill(mask, -0.0)


def _promoted(op: str, t: TensorCore, other) -> tuple:
    """``(t, other)`` after PyTorch's type promotion where it makes an int64 tensor floating
    (https://pytorch.org/docs/stable/tensor_attributes.html#type-promotion-doc): beside a
    floating tensor the int64 one takes that tensor's dtype (RoPE's ``positions * inv_freq``);
    beside a Python float or a floating array, float32 (PyTorch's default dtype); ``/`` of
    integer operands is a true division, in float32 (``torch.arange(4) / 2``). Anything else is
    returned as given (integer arithmetic, which :meth:`Arithmetic._binary` refuses)."""
    def integer(v):
        return isinstance(v, TensorCore) and not v.dtype.is_float

    if not (integer(t) or integer(other)):
        return t, other
    if isinstance(other, TensorCore):
        floating = t.dtype if t.dtype.is_float else other.dtype if other.dtype.is_float else None
    elif isinstance(other, numbers.Number):
        floating = None if isinstance(other, numbers.Integral) else float32
    else:
        floating = float32 if as_numpy(other).dtype.kind == "f" else None
    if floating is None and op == "broadcast_div":
        floating = float32
    if floating is None:
        return t, other
    return (t.to(floating) if integer(t) else t), (other.to(floating) if integer(other) else other)


def _other_tensor(t: TensorCore, other) -> TensorCore:
    """``other`` as an operand of ``t``'s binary op: itself if a Tensor, else (a number, an
    array, a torch tensor) a tensor of ``t``'s dtype."""
    return other if isinstance(other, TensorCore) else tensor(other, dtype=t.dtype)


def _other(fn: str, t: TensorCore, other, bound: str) -> tuple:
    """The operands ``(t, other)`` of ``t.maximum(other)`` / ``t.minimum(other)``: an int64 one
    beside a floating one promoted as PyTorch's (:func:`_promoted`), ``other`` a Tensor (an
    array or a torch tensor made one of ``t``'s dtype).

    Raises:
        TypeError: a number (naming :meth:`Arithmetic.clamp`'s ``bound``) or a bool.
    """
    if isinstance(other, (numbers.Number, bool)):
        raise TypeError(f"{fn}(): argument 'other' must be a Tensor, not "
                        f"{type(other).__name__}: for a number write x.clamp({bound}={other!r})")
    t, other = _promoted(fn, t, other)
    return t, _other_tensor(t, other)


def _matmul(a: "Tensor", b: "Tensor") -> "Tensor":
    """``torch.matmul`` for the ranks miniflow has ops for: 2-D @ 2-D (op ``matmul``), N-D @ 2-D
    (the leading dimensions flattened, op ``matmul``), and N-D @ N-D with equal batch dimensions
    (op ``batch_matmul``).

    Raises:
        ValueError: other ranks, or batch dimensions that differ (no broadcasting)."""
    if a.ndim == 2 and b.ndim == 2:
        return apply("matmul", [a, b])
    if a.ndim > 2 and b.ndim == 2:
        out = apply("matmul", [a.reshape(-1, a.shape[-1]), b])
        return out.reshape(a.shape[:-1] + (b.shape[1],))
    if a.ndim >= 3 and a.ndim == b.ndim:
        return apply("batch_matmul", [a, b])
    raise ValueError(f"matmul: shapes {list(a.shape)} @ {list(b.shape)}: miniflow multiplies "
                     f"2-D @ 2-D, N-D @ 2-D and N-D @ N-D with equal batch dimensions (no "
                     f"broadcasting, no 1-D operand); expand or reshape the operands, e.g. a "
                     f"vector v to [k, 1], a batch of 1 with .expand(n, -1, -1)")


def einsum(equation: str, *operands) -> "Tensor":
    """``torch.einsum``: the sum of products of ``operands`` (tensors, or one list of them)
    that ``equation`` names by one letter per dimension (``"bij,bjk->bik"``; without ``->`` the
    output is the letters used once, in alphabetical order). ``...`` stands for the dimensions
    no letter names, broadcast across the operands as PyTorch's (right-aligned, a size 1
    stretches; in the output where ``->`` puts it, first without ``->``, summed when the output
    has none); a letter repeated within one operand takes its diagonal (``"ii->i"``, ``"ii"``
    the trace, ``"bii->bi"``). Composed exactly of ``permute``, ``reshape``, ``sum``,
    ``index_select`` (a diagonal: op ``gather`` of the flattened dims) and one batched product
    (``@``, op ``batch_matmul``) per pair of operands, left to right: the letters both share and
    a later operand or the output needs are the batch, the others they share are summed by the
    product, a letter of one operand alone that nothing later needs is summed first. Gradients
    are those ops'.

    Raises:
        RuntimeError: more or fewer operands than the equation's terms, a term of another
            length than its operand's dimensions, a stray ``.`` or a second ``...``, ``...``
            dimensions that do not broadcast, a repeated letter of two sizes in one operand, an
            output letter no input has or given twice, a letter of two sizes (PyTorch's
            messages; PyTorch broadcasts a size 1 of a letter, miniflow only ``...``'s).
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        more = "more" if len(operands) > len(terms) else "fewer"
        raise RuntimeError(f"einsum(): {more} operands were provided than specified in the "
                           f"equation")
    for i, t in enumerate(terms + ([out] if arrow else [])):
        _check_dots(t, f"operand {i}" if i < len(terms) else "output")
    operands, terms, dots = _spread_ellipsis(list(operands), terms)
    sizes = {}
    for i, (t, x) in enumerate(zip(terms, operands)):
        operands[i], terms[i] = x, t = _diagonals(x, t, i)
        for c, n in zip(t, x.shape):
            if sizes.setdefault(c, n) != n:
                raise RuntimeError(f"einsum(): subscript {c} has size {n} for operand {i} "
                                   f"which does not match the previously seen size "
                                   f"{sizes[c]}")
    letters = lhs.replace("...", "")
    if not arrow:
        out = dots + "".join(sorted(c for c in sizes if c not in dots and letters.count(c) == 1))
    out = out.replace("...", dots)
    for c in out:
        if c not in sizes:
            raise RuntimeError(f"einsum(): output subscript {c} does not appear in the "
                               f"equation for any input operand")
        if out.count(c) > 1:
            raise RuntimeError(f"einsum(): output subscript {c} appears more than once in the "
                               f"output")
    x, sx = operands[0], terms[0]
    for k in range(1, len(operands)):
        later = set(out).union(*terms[k + 1:])
        y, sy = operands[k], terms[k]
        x, sx = _summed(x, sx, later | set(sy))
        y, sy = _summed(y, sy, later | set(sx))
        batch = [c for c in sx if c in sy and c in later]
        inner = [c for c in sx if c in sy and c not in later]
        left, right = [c for c in sx if c not in sy], [c for c in sy if c not in sx]
        a = _ordered(x, sx, batch + left + inner)
        b = _ordered(y, sy, batch + inner + right)
        n = [math.prod(sizes[c] for c in part) for part in (batch, left, inner, right)]
        prod = a.reshape(n[0], n[1], n[2]) @ b.reshape(n[0], n[2], n[3])
        sx = "".join(batch + left + right)
        x = prod.reshape(tuple(sizes[c] for c in sx))
    x, sx = _summed(x, sx, set(out))
    return _ordered(x, sx, list(out))


def _check_dots(term: str, what: str) -> None:
    """PyTorch's errors for a ``.`` of ``term`` (``what``: ``operand i`` or ``output``) that is
    no ellipsis, or a second ``...`` (einsum)."""
    if term.count("...") > 1:
        raise RuntimeError(f"einsum(): found '.' for {what} for which an ellipsis was already "
                           f"found")
    if "." in term.replace("...", "", 1):
        raise RuntimeError(f"einsum(): found '.' for {what} that is not part of any ellipsis")


def _spread_ellipsis(operands: list, terms: list) -> tuple:
    """``(operands, terms, dots)``: each ``...`` replaced by one symbol per dimension it covers
    (``dots``, the symbols of the most, right-aligned as PyTorch broadcasts them), a dimension
    of size 1 where another operand's is larger dropped from its operand (the product then
    broadcasts it); the terms' lengths checked against the operands' dimensions (einsum)."""
    covered = []
    for i, (t, x) in enumerate(zip(terms, operands)):
        named = len(t.replace("...", ""))
        if "..." not in t and named != x.ndim:
            raise RuntimeError(f"einsum(): the number of subscripts in the equation ({named}) "
                               f"does not match the number of dimensions ({x.ndim}) for "
                               f"operand {i} and no ellipsis was given")
        if named > x.ndim:
            raise RuntimeError(f"einsum(): the number of subscripts in the equation ({named}) "
                               f"is more than the number of dimensions ({x.ndim}) for operand "
                               f"{i}")
        covered.append(x.ndim - named if "..." in t else 0)
    dots = "".join(chr(0x3b1 + k) for k in range(max(covered, default=0)))
    size = [1] * len(dots)
    for i, (t, x, m) in enumerate(zip(terms, operands, covered)):
        first = t.find("...")
        for k, n in enumerate(x.shape[first:first + m] if m else ()):
            d = len(dots) - m + k
            if n != 1 and size[d] not in (1, n):
                raise RuntimeError(f"einsum(): dimension {k} covered by ellipsis in operand "
                                   f"{i} has size {n} which does not broadcast with previously "
                                   f"seen ellipsis with size {size[d]} for the respective "
                                   f"dimension")
            size[d] = max(size[d], n)
    for i, (t, x, m) in enumerate(zip(terms, operands, covered)):
        mine = dots[len(dots) - m:]
        kept = "".join(c for c, n in zip(mine, x.shape[t.find("..."):])
                       if n != 1 or size[dots.index(c)] == 1)
        terms[i] = t.replace("...", kept)
        if len(kept) != m:
            operands[i] = x.reshape(tuple(n for c, n in zip(t.replace("...", mine), x.shape)
                                          if c not in mine or c in kept))
    return operands, terms, dots


def _diagonals(x: "Tensor", subs: str, i: int) -> tuple:
    """``(x, subs)`` with each letter repeated in ``subs`` (operand ``i``) taken once: its
    diagonal, the repeated dims moved last, merged and read at ``j * (1 + n + n^2 ...)`` by
    ``index_select`` (einsum)."""
    for c in dict.fromkeys(subs):
        where = [k for k, d in enumerate(subs) if d == c]
        if len(where) < 2:
            continue
        n = x.shape[where[0]]
        for k in where[1:]:
            if x.shape[k] != n:
                raise RuntimeError(f"einsum(): subscript {c} is repeated for operand {i} but "
                                   f"the sizes don't match, {x.shape[k]} != {n}")
        rest = [k for k in range(len(subs)) if k not in where]
        x = x.permute(*rest, *where) if rest + where != list(range(len(subs))) else x
        flat = x.reshape(*x.shape[:len(rest)], n ** len(where))
        step = sum(n ** j for j in range(len(where)))
        x, subs = flat.index_select(len(rest), np.arange(n) * step), \
            "".join(subs[k] for k in rest) + c
    return x, subs


def _summed(x: "Tensor", subs: str, needed: set) -> tuple:
    """``(x, subs)`` with the dims whose letters are not ``needed`` summed out (einsum)."""
    gone = tuple(i for i, c in enumerate(subs) if c not in needed)
    if not gone:
        return x, subs
    return x.sum(gone), "".join(c for c in subs if c in needed)


def _ordered(x: "Tensor", subs: str, order: list) -> "Tensor":
    """``x``, whose dims are ``subs``' letters, permuted to ``order``'s (einsum)."""
    perm = [subs.index(c) for c in order]
    return x.permute(*perm) if perm != list(range(len(perm))) else x


def _triangle_checks(fn: str, x: "Tensor", diagonal) -> None:
    """``tril`` / ``triu``'s argument checks."""
    if isinstance(diagonal, bool) or not isinstance(diagonal, numbers.Integral):
        raise TypeError(f"{fn}(): argument 'diagonal' must be int, not "
                        f"{type(diagonal).__name__}")
    if x.ndim < 2:
        raise RuntimeError(f"{fn}: input tensor must have at least 2 dimensions (got shape "
                           f"{list(x.shape)})")


def mask_array(fn: str, mask) -> np.ndarray:
    """``mask`` (an eager tensor, a NumPy array or a nested sequence of bools) as an array, for
    ``fn``'s error.

    Raises:
        TypeError: a Python or NumPy scalar, None or ``NotImplemented`` (a mask that PyTorch
            code computes as a bool tensor, e.g. ``buf == 0``, but that came out as a Python
            value): PyTorch refuses a non-tensor mask too.
    """
    if (isinstance(mask, (numbers.Number, np.generic)) or mask is None
            or mask is NotImplemented):
        raise TypeError(f"{fn}: the mask must be a bool array or a Tensor, got "
                        f"{type(mask).__name__} {mask!r}; compare a tensor's values "
                        f"(t == 0 of an eager tensor, or np.asarray(t) == 0) to make one")
    return mask.numpy() if isinstance(mask, TensorCore) else np.asarray(mask)
