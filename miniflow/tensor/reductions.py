"""Reductions: ``sum``, ``mean``, ``prod``, ``var`` / ``std``, ``max`` / ``min`` (with ``dim``:
values and indices), ``amax`` / ``amin``, ``logsumexp``, ``norm``, ``cumsum``, ``cumprod`` and
``argmax`` / ``argmin``, with PyTorch's and NumPy's argument names; ``topk`` and ``sort`` (op
``top_k`` in a graph, NumPy eagerly), ``multinomial``, ``nonzero`` and ``argwhere`` of eager
tensors (computed with NumPy: no op)."""
from __future__ import annotations

import collections
import math
import numbers
from typing import TYPE_CHECKING

import numpy as np

from ..dtype import bool_, int64
from ..ops.common import norm_axes
from ..ops.reduce_max import top_k_reference
from .casts import _TYPE_NAMES
from .core import TensorCore
from ..random import generator as global_generator
from ..trace import current_tracer
from .create import _is_torch, apply, ones, tensor, zeros
from .dims import _dim

if TYPE_CHECKING:        # the composed class, for the annotations only
    from . import Tensor


MaxResult = collections.namedtuple("max", ["values", "indices"])
"""What ``Tensor.max(dim)`` returns (PyTorch's ``torch.return_types.max``)."""
MinResult = collections.namedtuple("min", ["values", "indices"])
"""What ``Tensor.min(dim)`` returns (PyTorch's ``torch.return_types.min``)."""
TopkResult = collections.namedtuple("topk", ["values", "indices"])
"""What ``Tensor.topk`` returns (PyTorch's ``torch.return_types.topk``)."""
SortResult = collections.namedtuple("sort", ["values", "indices"])
"""What ``Tensor.sort`` returns (PyTorch's ``torch.return_types.sort``)."""

class Reductions:
    """The reductions of :class:`miniflow.tensor.Tensor`."""

    def max(self, dim: int | None = None, keepdim: bool = False):
        """Without ``dim``: the largest element (a 0-d tensor; op ``reduce_max``). With ``dim``:
        ``(values, indices)`` along ``dim`` as PyTorch's ``torch.return_types.max`` (ops
        ``reduce_max`` and ``argmax``; NaN propagates, the first maximum's index). The
        gradient of ``values`` is shared equally by tied maxima (OneFlow's rule; PyTorch gives
        it to the one at ``indices``).

        Raises:
            IndexError: ``dim`` out of range. ValueError: an empty reduced dimension.
            TypeError: ``keepdim`` without ``dim``, or with a tensor ``other`` (as PyTorch: no
            such overload).

        ``x.max(other)`` with a tensor or an array ``other`` is PyTorch's elementwise maximum,
        :meth:`maximum`."""
        if _is_other(dim):
            _no_keepdim("max", keepdim)
            return self.maximum(dim)
        if dim is None:
            _keepdim_needs_dim("max", self, keepdim)
            flat = self.reshape(-1) if self.ndim != 1 else self
            return apply("reduce_max", [flat], axis=0).reshape(())
        d = _dim("max", dim, self.ndim)
        if self.ndim == 0:                   # PyTorch: (the element, index 0), 0-d
            flat = self.reshape(1)
            return MaxResult(apply("reduce_max", [flat], axis=0), apply("argmax", [flat], axis=0))
        return MaxResult(apply("reduce_max", [self], axis=d, keepdims=bool(keepdim)),
                         apply("argmax", [self], axis=d, keepdims=bool(keepdim)))

    def argmax(self, dim: int | None = None, keepdim: bool = False) -> "Tensor":
        """The int64 index of the largest element: in the flattened tensor (0-d; ``keepdim``
        gives it every dimension, of size 1) or along ``dim`` (op ``argmax``, as PyTorch's
        ``torch.argmax``: NaN counts as the largest, the first maximum's index). A floating or
        int64 tensor (int64 compared exactly, beyond 2**53 too). It has no gradient.

        Raises:
            IndexError: ``dim`` out of range; an empty tensor without ``dim``, or an empty
                reduced dimension (PyTorch's messages)."""
        return _arg_reduce("argmax", self, dim, keepdim)

    def min(self, dim: int | None = None, keepdim: bool = False):
        """The smallest element, or ``(values, indices)`` along ``dim``: :meth:`max` of ``-x``,
        negated (exact), with PyTorch's ``torch.min`` results (NaN propagates, the first
        minimum's index); of an int64 tensor the smallest of :meth:`topk` (``largest=False``:
        ``-x`` wraps at -2**63); raises as :meth:`max`. ``x.min(other)`` is :meth:`minimum`."""
        if _is_other(dim):
            _no_keepdim("min", keepdim)
            return self.minimum(dim)
        if dim is None:
            _keepdim_needs_dim("min", self, keepdim)
            return -(-self).max() if self.dtype.is_float else self.amin()
        d = _dim("min", dim, self.ndim)
        if not self.dtype.is_float:
            return MinResult(*_int_smallest(self, d, keepdim))
        values, indices = (-self).max(d, keepdim)
        return MinResult(-values, indices)

    def argmin(self, dim: int | None = None, keepdim: bool = False) -> "Tensor":
        """The int64 index of the smallest element (``torch.argmin``; NaN's where there is one,
        the first of ties): :meth:`argmax` of ``-x``; of an int64 tensor the index of the
        smallest of :meth:`topk` (``largest=False``; ``-x`` would wrap at -2**63). Arguments
        and errors as :meth:`argmax`."""
        return _arg_reduce("argmin", self, dim, keepdim)

    def amax(self, dim=(), keepdim: bool = False) -> "Tensor":
        """The largest element over ``dim`` (an int, a sequence of ints; ``()`` or None: every
        dim), ``torch.amax``: values only, NaN propagates, and the gradient is shared equally by
        every element equal to the maximum (as PyTorch's ``amax``). Op ``reduce_max`` over one
        axis: several dims are moved last and merged first (``transpose``, ``reshape``). An
        int64 tensor gives its int64 maximum, exactly (no gradient).

        Raises:
            ValueError: a dim out of range or repeated; an empty reduced dimension
                (PyTorch's "Expected reduction dim ... to have non-zero size").
            IndexError: a dim of a 0-d tensor other than 0 or -1 (PyTorch's message).
        """
        return _amax(self, dim, keepdim, "amax")

    def amin(self, dim=(), keepdim: bool = False) -> "Tensor":
        """The smallest element over ``dim``: :meth:`amax` of ``-x``, negated (exact;
        ``torch.amin``); arguments, gradient and errors as :meth:`amax`. Of an int64 tensor
        the smallest of :meth:`topk` (op ``top_k``, ``largest=False``), int64."""
        if not self.dtype.is_float:
            return _amax(self, dim, keepdim, "amin")
        return -_amax(-self, dim, keepdim, "amin")

    def logsumexp(self, dim, keepdim: bool = False) -> "Tensor":
        """``log(sum(exp(x)))`` over ``dim`` (an int or a sequence of ints), ``torch.logsumexp``,
        computed stably as ``m + log(sum(exp(x - m)))`` with ``m`` the (detached) :meth:`amax`
        clamped to the dtype's finite range: a slice of ``-inf`` gives ``-inf``, one holding
        ``inf`` gives ``inf``, as PyTorch's. Its gradient is the softmax of the slice.

        Raises: as :meth:`amax`.
        """
        from ..dtype import max_finite
        axes = norm_axes("logsumexp", _reduce_args("logsumexp", dim, False, None, None)[0],
                         self.ndim) if self.ndim else ()
        if math.prod(self.shape[i] for i in axes) == 0:   # an empty sum: log 0 = -inf
            return self.exp().sum(dim, keepdim).log()
        big = max_finite(self.dtype)
        m = self.detach().amax(dim, keepdim=True).clamp(-big, big)
        out = (self - m).exp().sum(dim, keepdim=True).log() + m
        if keepdim:
            return out
        return out.reshape(tuple(n for i, n in enumerate(self.shape) if i not in axes))

    def norm(self, p="fro", dim=None, keepdim: bool = False, dtype=None) -> "Tensor":
        """The vector ``p``-norm over ``dim`` (None: every element), ``torch.Tensor.norm``:
        ``p`` 2 or ``"fro"`` ``sqrt(sum(x^2))``, 1 ``sum(|x|)``, ``inf`` :meth:`amax` of
        ``|x|``, ``-inf`` :meth:`amin`, any other ``p > 0`` ``sum(|x|^p)^(1/p)``; ``dtype``:
        cast to it first. The 2-norm ``sqrt(s)``, ``s = sum(x^2)``, is computed in float32
        (float64 for float64; under AMP too, as PyTorch reduces a half tensor in float32), any
        other ``p``'s of a half tensor in float32 too (``|x|^3`` of float16 overflows at 41), and
        its gradient is PyTorch's, 0 for an all-zero slice (``sqrt``'s would be ``inf * 0``,
        NaN: ``F.normalize`` of a zero row poisoned the weights; ``_two_norm`` says how).

        Raises:
            ValueError: ``p`` 0, negative or ``"nuc"`` (not supported: count nonzeros with
                ``(x != 0).sum()`` of an eager tensor); a dim as :meth:`amax`.
        """
        x = self if dtype is None else self.to(dtype)
        dim = () if dim is None else dim
        if p in ("fro", 2, 2.0):
            return _two_norm(x, dim, keepdim)
        if p in (1, 1.0):
            return x.abs().sum(dim, keepdim)
        if p == math.inf:
            return x.abs().amax(dim, keepdim)
        if p == -math.inf:
            return x.abs().amin(dim, keepdim)
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not p > 0:
            raise ValueError(f"norm: p={p!r} is not supported: give 2 (or 'fro'), 1, inf, "
                             f"-inf or a number > 0")
        wide = x.float() if x.dtype.is_half else x     # |x|^p over- or underflows a half type
        n = wide.abs().pow(float(p)).sum(dim, keepdim).pow(1.0 / p)
        return n.to(x.dtype) if x.dtype.is_half else n

    def cumsum(self, dim: int, *, dtype=None) -> "Tensor":
        """The running sum along ``dim`` (``torch.cumsum``: ``out[..., j, ...]`` = the sum of
        ``x[..., :j+1, ...]``), op ``cumsum`` (OneFlow's): summed in order, in float32 for the
        half types and float32 (float64 for float64), each element rounded once; its gradient
        is the running sum of ``dy`` from the end (op ``cumsum_grad``). ``dtype``: cast to it
        first. An int64 tensor is summed exactly in int64 (wrapping on overflow, as PyTorch's),
        with no gradient.

        Raises:
            IndexError: ``dim`` out of range.
        """
        return _scan("cumsum", self, dim, dtype)

    def cumprod(self, dim: int, *, dtype=None) -> "Tensor":
        """The running product along ``dim`` (``torch.cumprod``: ``out[..., j, ...]`` = the
        product of ``x[..., :j+1, ...]``), op ``cumprod`` (OneFlow's): multiplied in order, in
        float32 for the half types and float32 (float64 for float64, int64 for int64, which
        wraps as PyTorch's), each element rounded once. Its gradient (op ``cumprod_grad``) is
        PyTorch's also where the row holds zeros: ``dx[k]`` = the sum over ``i >= k`` of
        ``dy[i]`` times the product of ``x[:i+1]`` but ``x[k]``. ``dtype``: cast to it first.

        Raises:
            IndexError: ``dim`` out of range.
        """
        return _scan("cumprod", self, dim, dtype)

    def prod(self, dim: int | None = None, keepdim: bool = False, *, dtype=None) -> "Tensor":
        """The product of every element, or over the one dim ``dim`` (kept as size 1 when
        ``keepdim``), ``torch.Tensor.prod``: the last of :meth:`cumprod`'s running products, so
        multiplied in order in float32 for the half types and float32 (int64 wrapping, as
        PyTorch's), rounded once, with cumprod's gradient, PyTorch's also where the slice holds
        zeros. A bool tensor's product is int64, as PyTorch's; the product of nothing is 1.
        ``dtype``: cast to it first.

        Raises:
            TypeError: ``keepdim`` without ``dim``, or a ``dim`` that is not one int (PyTorch's
                prod takes one). IndexError: ``dim`` out of range."""
        if dtype is not None or self.dtype is bool_:
            return self.to(int64 if dtype is None else dtype).prod(dim, keepdim)
        if dim is None:
            if keepdim:
                raise TypeError("prod(): keepdim=True needs a dim (PyTorch's prod takes keepdim "
                                "only with one int dim)")
            x, d, shape = self.reshape(-1), 0, ()
        else:
            if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
                raise TypeError(f"prod(): dim must be one int, as torch.prod's, got {dim!r} (for "
                                f"several dims take the product over one at a time)")
            d = _dim("prod", dim, self.ndim)
            x = self.reshape(1) if self.ndim == 0 else self
            shape = tuple(1 if i == d else n for i, n in enumerate(self.shape)
                          if keepdim or i != d)
        if x.shape[d] == 0:
            return ones(shape, dtype=self.dtype)
        return x.cumprod(d).narrow(d, x.shape[d] - 1, 1).reshape(shape)

    def var(self, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
        """Variance over ``dim`` (None: every dim) with Bessel's ``correction`` (default 1:
        ``sum((x - mean)^2) / (n - correction)``), PyTorch's ``torch.Tensor.var``; ``unbiased``
        is its older spelling (True: correction 1, False: 0). A float16 / bfloat16 input is
        computed in float32 and rounded once, as PyTorch does.

        Raises:
            TypeError: both ``unbiased`` and ``correction`` given.
            ValueError: ``n - correction <= 0`` (PyTorch gives nan or inf with a warning).
            RuntimeError: an int64 or bool tensor (PyTorch's message: cast it with ``.float()``
                first).
        """
        return self._moment("var", dim, unbiased, keepdim, correction, sqrt=False)

    def std(self, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
        """Standard deviation: the square root of :meth:`var` (same arguments and errors),
        ``torch.Tensor.std``; its gradient is 0 where the deviation is 0 (a constant slice), as
        PyTorch's (the square root's would be NaN)."""
        return self._moment("std", dim, unbiased, keepdim, correction, sqrt=True)

    def _moment(self, fn, dim, unbiased, keepdim, correction, sqrt: bool):
        if not self.dtype.is_float:
            raise RuntimeError(f"{fn}(): std and var only support floating point and complex "
                               f"dtypes. Got: {_TYPE_NAMES[self.dtype.name]} (cast it first: "
                               f"t.float().{fn}())")
        if unbiased is not None and correction is not None:
            raise TypeError(f"{fn}: got both unbiased={unbiased!r} and correction="
                            f"{correction!r}; pass one (unbiased=False is correction=0)")
        c = float(correction if correction is not None else 1 if unbiased in (None, True) else 0)
        dim, keepdim = _reduce_args(fn, dim, keepdim, None, None)
        axes = norm_axes(fn, dim, self.ndim) if self.ndim else ()
        n = math.prod(self.shape[a] for a in axes)
        kept = [d for i, d in enumerate(self.shape) if i not in axes]
        if n - c <= 0 and 0 not in kept:
            raise ValueError(f"{fn}: dims {list(axes)} of shape {list(self.shape)} hold {n} "
                             f"element{'s' * (n != 1)} per result, and correction={c:g} leaves "
                             f"{n - c:g} degrees of freedom (PyTorch gives nan or inf): pass "
                             f"correction=0, or reduce over more elements")
        x = self.to("float32") if self.dtype.is_half else self
        deviation = x - x.mean(dim, keepdim=True)
        v = apply("scalar_div", [deviation.square().sum(dim, keepdim)], scalar=max(n - c, 1.0))
        v = _sqrt_of_sum(v) if sqrt else v
        return v.to(self.dtype) if self.dtype.is_half else v

    def sum(self, dim=None, keepdim: bool = False, *, dtype=None, axis=None, keepdims=None):
        """Sum over ``dim`` (an int, a sequence of ints, or None or ``()``: every dim, as in
        torch 2.x), keeping the reduced dims as size 1 when ``keepdim`` (``torch.Tensor.sum``;
        NumPy's names ``axis=`` / ``keepdims=`` are accepted too, as torch accepts them). Op
        ``reduce_sum`` (OneFlow's attributes ``axis`` and ``keepdims``). A bool tensor (inside
        ``build`` too: it is data) and an eager int64 one outside ``build`` are summed exactly
        with NumPy into an eager int64 tensor (a bool one counts its True values, as PyTorch's:
        ``(pred == y).sum().item()``); an int64 one inside ``build`` exactly too
        (:func:`_int64_sum`). ``dtype``: cast to it first, as PyTorch's (``mask.sum(dtype=
        torch.float32)`` counts in float32).

        Raises:
            TypeError: a dim given twice (``dim`` and ``axis``, ``keepdim`` and ``keepdims``).
            IndexError: a dim of a 0-d tensor other than 0 or -1 (PyTorch's message).
        """
        dim, keepdim = _reduce_args("sum", dim, keepdim, axis, keepdims)
        if dtype is not None:
            return self.to(dtype).sum(dim, keepdim)
        if self.ndim == 0 and dim is not None:
            _check_0d_dims("sum", dim)
            dim = None
        if self.dtype is bool_ or not self.dtype.is_float and current_tracer() is None:
            axes = None if dim is None else norm_axes("sum", dim, self.ndim)
            return tensor(np.sum(self.numpy(), axis=axes, dtype=np.int64, keepdims=keepdim))
        if not self.dtype.is_float:
            return _int64_sum(self, norm_axes("sum", dim, self.ndim), keepdim)
        return apply("reduce_sum", [self], axis=dim, keepdims=keepdim)

    def mean(self, dim=None, keepdim: bool = False, *, dtype=None, axis=None, keepdims=None):
        """Mean over ``dim`` (arguments as :meth:`sum`, ``torch.Tensor.mean``): traced as
        ``reduce_sum`` then ``scalar_mul(1/n)`` (no mean op type). A float16 / bfloat16 input is
        cast to float32 first and the mean cast back at the end (one rounding), as PyTorch
        accumulates half types in float32: a float16 sum beyond 65504 does not make the mean inf.
        The mean of nothing (reduced dims of size 0: ``zeros(0).mean()``, a (0, 3) tensor's
        ``mean(0)``) is NaN, as PyTorch's (``scalar_mul`` by NaN); its gradient is the input's
        empty one, so nothing before it gets a NaN. ``dtype``: cast to it first, as PyTorch's
        (``ids.mean(dtype=torch.float64)``).

        Raises:
            TypeError: as :meth:`sum`. RuntimeError: an int64 or bool tensor without a floating
                ``dtype`` (PyTorch's message: cast it with ``.float()`` first).
        """
        if dtype is not None:
            return self.to(dtype).mean(dim, keepdim, axis=axis, keepdims=keepdims)
        if not self.dtype.is_float:
            raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either "
                               f"a floating point or complex dtype. Got: "
                               f"{_TYPE_NAMES[self.dtype.name]} (cast it first: t.float().mean())")
        dim, keepdim = _reduce_args("mean", dim, keepdim, axis, keepdims)
        x = self.to("float32") if self.dtype.is_half else self
        s = x.sum(dim, keepdim)
        axes = norm_axes("mean", dim, self.ndim) if self.ndim else ()
        n = math.prod(self.shape[a] for a in axes)   # the count of each mean: the reduced dims
        m = apply("scalar_mul", [s], scalar=1.0 / n if n else math.nan)
        return m.to(self.dtype) if self.dtype.is_half else m


def _reduce_args(op: str, dim, keepdim, axis, keepdims) -> tuple:
    """``(dim, keepdim)`` from PyTorch's and NumPy's names (:meth:`Tensor.sum`).

    Raises:
        TypeError: both names of one argument given; a dim that is no int (a bool: PyTorch
            refuses ``x.sum(True)``, which read as dim 1).
    """
    if axis is not None:
        if dim is not None:
            raise TypeError(f"{op}: got both dim={dim!r} and axis={axis!r}; pass one")
        dim = axis
    for d in dim if isinstance(dim, (tuple, list)) else () if dim is None else (dim,):
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise TypeError(f"{op}: dim must be an int, a sequence of ints or None, got {dim!r}")
    if keepdims is not None:
        if keepdim is not False:
            raise TypeError(f"{op}: got both keepdim and keepdims; pass one")
        keepdim = keepdims
    if isinstance(dim, (tuple, list)) and len(dim) == 0:
        dim = None   # torch 2.x: an empty dim list reduces over every dim, as None does
    return dim, bool(keepdim)


def _is_other(dim) -> bool:
    """Whether ``dim`` of ``max`` / ``min`` is a tensor or an array: PyTorch's elementwise
    ``x.max(other)`` / ``x.min(other)``."""
    return isinstance(dim, (TensorCore, np.ndarray)) or _is_torch(dim)


def _keepdim_needs_dim(fn: str, x, keepdim) -> None:
    """``x.max(keepdim=True)`` / ``x.min(keepdim=True)``: PyTorch has no such overload."""
    if keepdim:
        raise TypeError(f"{fn}(): keepdim=True needs a dim (the tensor has shape "
                        f"{list(x.shape)}): pass dim=..., or reshape the 0-d result, "
                        f"x.{fn}().reshape({(1,) * x.ndim})")


def _arg_reduce(fn: str, x, dim, keepdim: bool):
    """:meth:`Reductions.argmax` (``fn`` "argmax") or ``argmin`` of ``x``: flattened without
    ``dim``, a 0-d ``x`` as one element, PyTorch's errors for empty ones."""
    if dim is None:
        if x.numel() == 0:
            raise IndexError(f"{fn}(): Expected reduction dim to be specified for "
                             f"input.numel() == 0.")
        index = _arg_along(fn, x.reshape(-1), 0, False)
        return index.reshape((1,) * x.ndim) if keepdim else index
    d = _dim(fn, dim, x.ndim)
    if x.ndim == 0:
        return _arg_along(fn, x.reshape(1), 0, False)
    if x.shape[d] == 0:
        raise IndexError(f"{fn}(): Expected reduction dim {d} to have non-zero size.")
    return _arg_along(fn, x, d, bool(keepdim))


def _arg_along(fn: str, x, d: int, keepdim: bool):
    """Op ``argmax`` of ``x`` (argmin: of ``-x``; of an int64 ``x`` :func:`_int_smallest`)
    along ``d``, a non-empty dim of ``x``."""
    if fn == "argmin" and not x.dtype.is_float:
        return _int_smallest(x, d, keepdim)[1]
    return apply("argmax", [x if fn == "argmax" else -x], axis=d, keepdims=keepdim)


def _int_smallest(x, d: int, keepdim: bool):
    """``(values, indices)`` of the smallest elements of the int64 ``x`` along ``d``: the first
    of ``topk(1, largest=False)`` (the first of ties; ``-x`` would wrap at -2**63)."""
    one = x.reshape(1) if x.ndim == 0 else x
    values, indices = one.topk(1, d, largest=False)
    if keepdim and x.ndim:
        return values, indices
    shape = tuple(n for i, n in enumerate(one.shape) if i != d)
    return values.reshape(shape), indices.reshape(shape)


def _merged_last(x, axes: tuple):
    """``x`` with the dims ``axes`` moved last (``transpose``) and merged into one
    (``reshape``), the other dims in order before it."""
    kept = [i for i in range(x.ndim) if i not in axes]
    moved = x.permute(*kept, *axes) if kept + list(axes) != list(range(x.ndim)) else x
    return moved.reshape(*(x.shape[i] for i in kept), math.prod(x.shape[i] for i in axes))


def _int64_sum(x, axes: tuple, keepdim: bool):
    """The sum of an int64 ``x`` over ``axes`` inside ``build``, exact (wrapping at 2**63, as
    PyTorch's): the last of op ``cumsum``'s running sums (op ``reduce_sum`` adds in floats) of
    the reduced dims merged last; of no element an int64 zero constant."""
    shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape) if keepdim or i not in axes)
    if 0 in x.shape:
        return zeros(shape, dtype=int64)
    return _merged_last(x, axes).cumsum(-1)[..., -1].reshape(shape)


def _check_0d_dims(fn: str, dim) -> None:
    """PyTorch's IndexError for a dim of a 0-d tensor other than 0 or -1 (``dim`` an int or a
    sequence of them)."""
    for d in dim if isinstance(dim, (tuple, list)) else (dim,):
        _dim(fn, d, 0)


def _amax(x, dim, keepdim: bool, fn: str):
    """:meth:`Reductions.amax` of ``x`` (``fn`` names it in the errors: ``amin`` calls it on
    ``-x``, or on an int64 ``x``, whose minimum it then takes): the reduced dims moved last and
    merged, one ``reduce_max`` (``top_k`` for an int64 minimum: ``-x`` would wrap at -2**63); a
    kept dim of size 0 gives an empty result, an empty reduced one PyTorch's error."""
    dim, keepdim = _reduce_args(fn, dim, keepdim, None, None)
    if x.ndim == 0 and dim is not None:
        _check_0d_dims(fn, dim)
    axes = norm_axes(fn, dim, x.ndim) if x.ndim else ()
    if math.prod(x.shape[i] for i in axes) == 0:
        raise ValueError(f"{fn}(): Expected reduction dim {list(axes)} to have non-zero size.")
    flat = _merged_last(x, axes)
    if fn == "amin" and not x.dtype.is_float:
        out = flat.topk(1, largest=False).values.reshape(flat.shape[:-1])
    else:
        out = apply("reduce_max", [flat], axis=flat.ndim - 1)
    if keepdim:
        out = out.reshape(tuple(1 if i in axes else n for i, n in enumerate(x.shape)))
    return out


def _scan(op: str, x, dim, dtype):
    """Op ``op`` (``cumsum``, ``cumprod``) of ``x`` along ``dim``, cast to ``dtype`` first; a 0-d
    ``x`` as one element."""
    x = x if dtype is None else x.to(dtype)
    d = _dim(op, dim, max(x.ndim, 1))
    if x.ndim == 0:
        return apply(op, [x.reshape(1)], dim=0).reshape(())
    return apply(op, [x], dim=d)


def _two_norm(x, dim, keepdim: bool):
    """``sqrt(sum(x^2))`` over ``dim`` as :meth:`Reductions.norm` says: in float32 (float64 for
    float64; a float32 tensor pinned there under AMP by ``amp_black_identity``), the result in
    x's dtype. As ``sqrt(max(s, tiny)) - sqrt(tiny)``, ``tiny`` the smallest positive float
    (1.4e-45 in float32): 0 for an all-zero slice, with a finite ``sqrt`` gradient there that
    the clamp then stops, so ``dx`` is 0 as PyTorch's norm backward gives (``sqrt(s)``'s is
    ``inf * 0``, NaN); the value of ``sqrt(s)`` otherwise (``sqrt(tiny)``, 3.7e-23, is below half
    an ulp of every norm above 1e-15), inf for inf, NaN for NaN."""
    if x.dtype.is_half:
        wide = x.float()
    else:
        wide = x if x.dtype.itemsize == 8 else apply("amp_black_identity", [x])
    n = _sqrt_of_sum(wide.square().sum(dim, keepdim))
    return n.to(x.dtype) if x.dtype.is_half else n


def _sqrt_of_sum(s):
    """``sqrt(s)`` of a sum of squares ``s >= 0`` whose gradient is 0 where ``s`` is 0, as
    PyTorch's norm and std backward give it (``sqrt``'s, ``inf * 0``, is NaN): as
    ``sqrt(max(s, tiny)) - sqrt(tiny)``, ``tiny`` the dtype's smallest positive float, where the
    clamp stops the finite gradient of ``sqrt(tiny)``; :func:`_two_norm` says why the value is
    ``sqrt(s)``'s."""
    tiny = float(np.finfo(s.dtype.np).smallest_subnormal)
    return s.clamp(min=tiny).sqrt() - math.sqrt(tiny)


def _no_keepdim(fn: str, keepdim) -> None:
    """``x.max(other, keepdim=True)``: PyTorch has no such overload (the elementwise form keeps
    every dim); refused rather than ignored."""
    if keepdim:
        raise TypeError(f"{fn}(): keepdim applies to a reduction over dim, not to the elementwise "
                        f"{fn}(other) (which keeps every dim): drop keepdim")


def _eager(fn: str, x) -> np.ndarray:
    """``x``'s values, for a method computed with NumPy (no op: no graph can hold it).

    Raises:
        RuntimeError: inside ``nn.Graph.build``: a lazy tensor has no values, and a parameter's
            or buffer's would be read once, at trace time, into a constant of the graph."""
    if current_tracer() is not None:
        raise RuntimeError(f"{fn}: miniflow has no {fn} op, so it takes eager tensors only, "
                           f"outside nn.Graph.build: return the tensor from build and call "
                           f"{fn} on the call's result (as nanoGPT's generate does, eagerly)")
    return x.numpy()


class Sampling:
    """``topk``, ``sort``, and ``multinomial``, ``nonzero``, ``argwhere`` (eager only) of
    :class:`miniflow.tensor.Tensor`."""

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
        """``(values, indices)`` of the ``k`` largest (``largest=False``: smallest) elements
        along ``dim`` (``torch.topk``; nanoGPT's ``v, _ = torch.topk(logits, k)``, the ImageNet
        example's ``output.topk(5, 1, True, True)``), in order (``sorted`` is taken: the result
        is always sorted), as PyTorch's ``torch.return_types.topk``; NaN counts as the largest,
        equal elements keep the lower index first (PyTorch does not say how it orders them).

        Inside ``build``: op ``top_k`` (OneFlow's, along the last axis: ``dim`` is moved there
        and back with ``transpose``) gives the indices and ``dim_gather`` the values, whose
        gradient reaches this tensor (floating tensors; int64 ones too, without a gradient).
        Eager tensors of any dtype are computed with the op's NumPy reference.

        Raises:
            RuntimeError: ``k`` out of range (PyTorch's "selected index k out of range").
            IndexError: ``dim`` out of range. TypeError: ``k`` not an int.
        """
        d = _dim("topk", dim, max(self.ndim, 1))
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"topk(): argument 'k' must be int, not {type(k).__name__}")
        size = self.shape[d] if self.ndim else 1
        if not 0 <= k <= size:
            raise RuntimeError(f"topk: selected index k out of range (k={k}, dimension {d} of "
                               f"size {size})")
        attrs = {"k": int(k), "largest": bool(largest)}
        if current_tracer() is None:       # (a parameter inside build is eager until used)
            a = np.moveaxis(self.numpy().reshape(self.shape or (1,)), d, -1)
            idx = top_k_reference([a], attrs)[0]
            out = [np.moveaxis(v, -1, d) for v in (np.take_along_axis(a, idx, axis=-1), idx)]
            return TopkResult(*(tensor(v.reshape(()) if self.ndim == 0 else v) for v in out))
        x = self.reshape(1) if self.ndim == 0 else self
        last = x.ndim - 1
        moved = x.transpose(d, last) if d != last else x
        idx = apply("top_k", [moved], **attrs)
        values = moved.gather(last, idx)
        if d != last:
            values, idx = values.transpose(d, last), idx.transpose(d, last)
        if self.ndim == 0:
            values, idx = values.reshape(()), idx.reshape(())
        return TopkResult(values, idx)

    def sort(self, dim: int = -1, descending: bool = False, *, stable: bool = False):
        """``(values, indices)`` of this tensor sorted along ``dim``, ascending (``descending``:
        largest first), as PyTorch's ``torch.return_types.sort``: :meth:`topk` of every
        element (``largest=descending``), so NaN sorts last ascending and first descending, as
        PyTorch's, and equal elements keep their index order (``stable`` is taken either way).
        Inside ``build`` op ``top_k`` (its kernels merge-sort each row: ``O(n log n)``), whose
        values train (floating tensors).

        Raises: as :meth:`topk` (``dim`` out of range)."""
        d = _dim("sort", dim, max(self.ndim, 1))
        top = self.topk(self.shape[d] if self.ndim else 1, d, largest=bool(descending))
        return SortResult(*top)

    def nonzero(self, *, as_tuple: bool = False):
        """The int64 indices of the nonzero elements (NaN counts), in C order
        (``torch.nonzero``): ``[n, ndim]`` (a 0-d tensor: ``[1, 0]`` or ``[0, 0]``), or with
        ``as_tuple`` one 1-D tensor per dimension (a 0-d tensor as 1-D), as PyTorch's. Computed
        with NumPy, eagerly.

        Raises:
            RuntimeError: inside ``nn.Graph.build`` (the result's shape depends on the values:
                OneFlow's ``argwhere`` has a dynamic shape, which miniflow's graphs have not).
        """
        if current_tracer() is not None:
            raise RuntimeError("nonzero: its shape depends on the values (OneFlow's argwhere has "
                               "a dynamic shape; miniflow's graphs have static ones), so it "
                               "takes eager tensors only: inside nn.Graph.build keep the mask "
                               "and use masked_fill or miniflow.where instead")
        a = self.numpy()
        if as_tuple:
            return tuple(tensor(i.astype(np.int64)) for i in np.nonzero(np.atleast_1d(a)))
        return tensor(np.argwhere(a).astype(np.int64))

    def argwhere(self) -> "Tensor":
        """``torch.argwhere``: :meth:`nonzero` as ``[n, ndim]``; raises as it."""
        return self.nonzero()

    def multinomial(self, num_samples: int, replacement: bool = False, *, generator=None):
        """``num_samples`` int64 category indices per row, drawn with probabilities
        proportional to this tensor's non-negative weights (``torch.multinomial``: 1-D
        ``[C]`` gives ``[num_samples]``, 2-D ``[N, C]`` gives ``[N, num_samples]``; without
        ``replacement`` a category is drawn once per row). From miniflow's generator
        (``miniflow.manual_seed``): PyTorch's distribution, not its numbers. Eager tensors only.

        Raises:
            RuntimeError: a lazy tensor inside ``build``; not 1-D or 2-D; weights that are
                negative, inf or NaN, or sum to 0; more samples than categories without
                replacement (PyTorch's messages).
            TypeError: a ``generator`` (seed miniflow's with ``manual_seed``).
        """
        w = _eager("multinomial", self).astype(np.float64)
        if generator is not None:
            raise TypeError("multinomial: generator= is not supported: miniflow draws from its "
                            "one generator; seed it with miniflow.manual_seed")
        if w.ndim not in (1, 2):
            raise RuntimeError(f"multinomial: prob_dist must be 1 or 2 dim (got shape "
                               f"{list(w.shape)})")
        rows = w.reshape(-1, w.shape[-1])
        if not np.isfinite(rows).all() or (rows < 0).any():
            raise RuntimeError("multinomial: probability tensor contains either `inf`, `nan` "
                               "or element < 0")
        if (rows.sum(axis=1) <= 0).any():
            raise RuntimeError("multinomial: invalid multinomial distribution (sum of "
                               "probabilities <= 0)")
        if not replacement and num_samples > rows.shape[1]:
            raise RuntimeError(f"multinomial: cannot sample n_sample ({num_samples}) > "
                               f"prob_dist.size(-1) ({rows.shape[1]}) samples without "
                               f"replacement")
        if not replacement and ((rows > 0).sum(axis=1) < num_samples).any():
            raise RuntimeError("multinomial: invalid multinomial distribution (with "
                               "replacement=False, not enough non-negative category to sample)")
        g = global_generator()
        out = np.stack([g.choice(rows.shape[1], size=num_samples, replace=replacement,
                                 p=r / r.sum()) for r in rows])
        return tensor(out.reshape(w.shape[:-1] + (num_samples,)).astype(np.int64))
