"""Tensor: an eager data holder, or a lazy proxy for an IR Value while an nn.Graph traces.

Every op goes through :func:`apply`: inside ``nn.Graph.build`` it records a Node (lazy); outside, it
runs the op's kernel at once (eager, forward only), on the same kernels a compiled plan uses.
"""
from __future__ import annotations

import collections
import functools
import math
import numbers
import sys

import numpy as np

from .checks import is_integer, positive_integer
from .dtype import DType, as_dtype, bfloat16
from .ops import get_op
from .ops.common import norm_axes
from .ops.indexing import first_bad
from .runtime.backend import check_device, get_backend
from .trace import current_tracer

__all__ = ["Tensor", "tensor", "apply", "mask_array", "as_numpy", "to_args"]

_COMPARE = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
            ">": np.greater, ">=": np.greater_equal}


_NO_DATA = ("miniflow tensors have no .data (PyTorch's tensor without autograd history): read "
            "the values with .numpy(); to replace a parameter's values, use "
            "module.load_state_dict({name: array}, strict=False), which copies them in place "
            "(compiled graphs see them at their next call)")


class Tensor:
    """A multi-dimensional array of one dtype.

    Eager tensors hold a backend array (``numpy()`` returns a host copy). Lazy tensors exist only
    during ``nn.Graph.build`` and stand for an IR Value; reading their data there is an error.
    """

    __array_priority__ = 100  # so ndarray (op) Tensor defers to Tensor's reflected operators

    def __init__(self, data=None, *, _value=None, _tracer=None):
        self._data = data
        self._value = _value
        self._tracer = _tracer

    # ------------------------------------------------------------------ properties
    @property
    def shape(self) -> tuple:
        """Tuple of ints."""
        return self._value.shape if self._value is not None else tuple(self._data.shape)

    @property
    def dtype(self) -> DType:
        """A miniflow DType."""
        return self._value.dtype if self._value is not None else as_dtype(self._data.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def data(self):
        """Not in miniflow: PyTorch's ``.data`` (the tensor without its autograd history, whose
        assignment replaces a parameter's values). Reading or assigning it raises, so that
        ``p.data = t`` is not silently kept as a plain attribute a compiled graph never reads.

        Raises:
            AttributeError: always, naming what to use instead.
        """
        raise AttributeError(_NO_DATA)

    @data.setter
    def data(self, value):
        raise AttributeError(_NO_DATA)

    @property
    def is_lazy(self) -> bool:
        """True while this tensor is a proxy in a trace."""
        return self._value is not None

    def numpy(self) -> np.ndarray:
        """A host copy of the data.

        Raises:
            RuntimeError: on a lazy tensor inside ``build`` (its value does not exist yet).
        """
        if self._value is not None:
            if current_tracer() is None:
                raise RuntimeError(_kept_from_trace(self))
            raise RuntimeError(f"cannot read the value of lazy tensor %{self._value.name} inside "
                               "nn.Graph.build: return it from build and read the call's result")
        return get_backend().to_numpy(self._data)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """``np.asarray(t)``, ``np.array(t)``: :meth:`numpy`'s array (``torch.Tensor.__array__``);
        without it NumPy would iterate the tensor into an object array of 0-d tensors.
        ``dtype`` converts as ``ndarray.astype``; ``copy`` is NumPy 2's keyword (the array is
        a host copy either way).

        Raises:
            RuntimeError: on a lazy tensor inside ``build`` (as :meth:`numpy`).
        """
        a = self.numpy()
        return a if dtype is None else a.astype(dtype, copy=False)

    def item(self) -> float:
        """The single element as a Python number.

        Raises:
            ValueError: the tensor does not have exactly one element.
        """
        a = self.numpy()
        if a.size != 1:
            raise ValueError(f"item(): the tensor has {a.size} elements (shape {list(a.shape)}); "
                             "only one-element tensors can be converted to Python numbers")
        return a.reshape(-1)[0].item()

    def tolist(self):
        """The data as nested Python lists of Python numbers (a number for a 0-d tensor), as
        PyTorch's ``Tensor.tolist``.

        Raises:
            RuntimeError: on a lazy tensor inside ``build`` (as :meth:`numpy`).
        """
        return self.numpy().tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        """``int(t)`` of a one-element tensor: its value truncated toward zero, as
        ``int(torch.tensor(2.7))`` is 2 (``int(x.argmax())`` in sampling code).

        Raises:
            ValueError: not one element (:meth:`item`), or NaN / inf (Python's ``int``).
            RuntimeError: a lazy tensor inside ``build`` (:meth:`numpy`)."""
        return int(self.item())

    def __index__(self) -> int:
        """The value of a one-element int64 tensor where Python wants an index
        (``itos[t]``, ``range(t)``, as ``torch.Tensor.__index__``).

        Raises:
            TypeError: a floating-point tensor or more than one element (PyTorch's message).
            RuntimeError: a lazy tensor inside ``build`` (:meth:`numpy`)."""
        if self.dtype.is_float or self.numel() != 1:
            raise TypeError(f"only integer tensors of a single element can be converted to an "
                            f"index (got {self.dtype.name}{list(self.shape)})")
        return int(self.item())

    def __format__(self, spec: str) -> str:
        """``f"{loss:.4f}"``: a 0-d eager tensor formats as its Python number
        (``torch.Tensor.__format__``); any other tensor, or a lazy one inside ``build``, as
        ``object.__format__`` (its repr with an empty spec, a TypeError with another)."""
        if self.ndim == 0 and self._value is None:
            return format(self.item(), spec)
        return object.__format__(self, spec)

    def cpu(self) -> "Tensor":
        """This tensor (``x.detach().cpu().numpy()`` in PyTorch code): miniflow has no
        per-tensor device; a tensor stays in its backend's memory, and :meth:`numpy` copies it
        to the host on any backend."""
        return self

    def __bool__(self) -> bool:
        if self._value is not None:
            raise RuntimeError(f"the truth value of lazy tensor %{self._value.name} is unknown "
                               "inside nn.Graph.build (no data-dependent Python control flow)")
        return bool(self.item())

    def _compare(self, other, symbol: str):
        """A comparison: refused on a lazy tensor (its value does not exist at trace time, as
        for ``float()``). miniflow has no comparison ops: an eager tensor against a number or a
        NumPy array gives the NumPy bool array of its values compared (a mask for
        :meth:`masked_fill`, as PyTorch's bool tensor), and so do two eager tensors under
        ``<``, ``<=``, ``>``, ``>=``; ``==`` and ``!=`` between two tensors are identity (so that
        tensors work in lists, dicts and sets)."""
        known = {}
        for t in (self, other):
            if isinstance(t, Tensor) and t._value is not None:
                known[id(t)] = _trace_time_value(t._tracer, t._value)
                if known[id(t)] is None:
                    raise RuntimeError(f"lazy tensor %{t._value.name} has no value at trace "
                                       f"time inside nn.Graph.build: '{symbol}' cannot be "
                                       "decided there (no data-dependent Python control flow); "
                                       "return it from build and compare the call's result")
        if isinstance(other, Tensor) and symbol not in ("==", "!="):
            other = known[id(other)] if id(other) in known else other.numpy()
        if isinstance(other, (numbers.Number, np.generic, np.ndarray)):
            return _COMPARE[symbol](known[id(self)] if id(self) in known else self.numpy(),
                                    other)
        return NotImplemented

    __eq__ = functools.partialmethod(_compare, symbol="==")
    __ne__ = functools.partialmethod(_compare, symbol="!=")
    __lt__ = functools.partialmethod(_compare, symbol="<")
    __le__ = functools.partialmethod(_compare, symbol="<=")
    __gt__ = functools.partialmethod(_compare, symbol=">")
    __ge__ = functools.partialmethod(_compare, symbol=">=")

    __hash__ = object.__hash__   # tensors are hashed and compared by identity (as torch.Tensor)

    def __repr__(self) -> str:
        if self._value is not None:
            return f"tensor(lazy %{self._value.name}: {self._value.type_str})"
        values = np.array2string(self.numpy(), precision=4, separator=", ", prefix="tensor(")
        return f"tensor({values}, dtype={self.dtype!r})"      # PyTorch's layout: rows aligned

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # ------------------------------------------------------------------ PyTorch's forward() surface
    def size(self, dim: int | None = None):
        """The shape (a tuple), or the length of dimension ``dim`` (negative counts from the end;
        ``torch.Tensor.size``).

        Raises:
            IndexError: ``dim`` out of range (PyTorch's message)."""
        if dim is None:
            return self.shape
        return self.shape[_dim("size", dim, self.ndim)]

    def dim(self) -> int:
        """The number of dimensions (``torch.Tensor.dim``)."""
        return self.ndim

    def numel(self) -> int:
        """The number of elements, the product of the shape (1 for a 0-d tensor;
        ``torch.Tensor.numel``): ``sum(p.numel() for p in model.parameters())``."""
        return math.prod(self.shape)

    def view(self, *shape) -> "Tensor":
        """The same elements in ``shape`` (one entry may be -1): op ``reshape`` (miniflow's
        tensors are always contiguous, so every view is valid)."""
        return self.reshape(*shape)

    def expand(self, *sizes) -> "Tensor":
        """This tensor repeated along its size-1 dims (and new leading dims) to ``sizes``
        (``torch.Tensor.expand``: -1 keeps a dim's size). Op ``broadcast_like`` (its ``like`` a
        ``constant`` of the new shape, read for its shape only; a copy, where PyTorch makes a
        view); the gradient sums over the expanded dims.

        Raises:
            ValueError: fewer sizes than dims, -1 or a negative size for a new leading dim, or a
                size other than a non-singleton dim's (PyTorch's messages).
        """
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) \
            else sizes
        target, axes = _expanded("expand", self.shape, sizes)
        if not axes:
            return self
        kept = tuple(1 if i in axes else n for i, n in enumerate(target))
        like = apply("constant", [], value=0.0, shape=target, dtype=self.dtype)
        return apply("broadcast_like", [self.reshape(kept), like], broadcast_axes=axes)

    def expand_as(self, other: "Tensor") -> "Tensor":
        """:meth:`expand` to ``other``'s shape (``torch.Tensor.expand_as``)."""
        return self.expand(other.shape)

    def repeat(self, *repeats) -> "Tensor":
        """This tensor tiled ``repeats[i]`` times along dim i (``torch.Tensor.repeat``; extra
        leading repeats add dims): each dim split in (1, n), expanded to (r, n) and merged.

        Raises:
            ValueError: fewer repeats than dims, or a negative one (PyTorch's messages).
        """
        repeats = tuple(repeats[0]) if len(repeats) == 1 and \
            isinstance(repeats[0], (tuple, list)) else repeats
        if len(repeats) < self.ndim:
            raise ValueError(f"repeat: Number of dimensions of repeat dims can not be smaller "
                             f"than number of dimensions of tensor (got {list(repeats)} for "
                             f"shape {list(self.shape)})")
        if any(not isinstance(r, numbers.Integral) or r < 0 for r in repeats):
            raise ValueError(f"repeat: Trying to create tensor with negative dimension: "
                             f"repeats {list(repeats)}")
        shape = (1,) * (len(repeats) - self.ndim) + self.shape
        split = self.reshape(tuple(d for n in shape for d in (1, n)))
        tiled = split.expand(tuple(d for r, n in zip(repeats, shape) for d in (int(r), n)))
        return tiled.reshape(tuple(int(r) * n for r, n in zip(repeats, shape)))

    def contiguous(self) -> "Tensor":
        """This tensor (miniflow's tensors are always contiguous)."""
        return self

    def unsqueeze(self, dim: int) -> "Tensor":
        """A dimension of size 1 inserted at ``dim`` (``-ndim - 1 <= dim <= ndim``; op
        ``reshape``).

        Raises:
            IndexError: ``dim`` out of range (PyTorch's message)."""
        d = _dim("unsqueeze", dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def squeeze(self, *dims, dim=None) -> "Tensor":
        """This tensor without its dimensions of size 1: all of them, or those listed that have
        size 1 (``squeeze(1)``, ``squeeze((0, 2))``, ``squeeze([0, 2])``, ``squeeze(0, 2)`` or
        ``dim=``); a listed dimension of another size stays, as in PyTorch's ``torch.squeeze``
        (op ``reshape``).

        Raises:
            IndexError: a dimension out of range. TypeError: a dimension that is not an int, or
            both positional dimensions and ``dim=``. RuntimeError: a dimension listed twice
            (PyTorch's message)."""
        if dims and dim is not None:
            raise TypeError("squeeze: give the dimensions positionally or as dim=, not both")
        if dim is None and len(dims) == 1:
            dim = dims[0]
        elif dims:
            dim = dims
        if dim is None:
            listed = [d for d, n in enumerate(self.shape) if n == 1]
        else:
            listed = [_dim("squeeze", d, self.ndim) for d in (dim if isinstance(dim, (tuple, list))
                                                               else (dim,))]
            if len(set(listed)) != len(listed):
                twice = next(d for d in listed if listed.count(d) > 1)
                raise RuntimeError(f"squeeze: dim {twice} appears multiple times in the list of "
                                   f"dims")
            listed = [d for d in listed if self.ndim and self.shape[d] == 1]
        return self.reshape(tuple(n for d, n in enumerate(self.shape) if d not in listed))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        """Dimensions ``start_dim .. end_dim`` merged into one (op ``flatten``)."""
        if self.ndim == 0:
            return self.reshape(1)
        return apply("flatten", [self], start_dim=start_dim, end_dim=end_dim)

    def detach(self) -> "Tensor":
        """The same values with no gradient flowing back through them (op ``detach``); eager: a
        tensor sharing this one's data, as in PyTorch."""
        if self._value is None:
            return Tensor(self._data)
        return apply("detach", [self])

    def float(self) -> "Tensor":
        """``to(float32)``: op ``cast`` (an eager float32 tensor itself, as PyTorch; inside
        ``build`` float32 kept under AMP, as :meth:`to`: ``logits.float()`` before a loss)."""
        return self.to("float32")

    def half(self) -> "Tensor":
        """``to(float16)`` (op ``cast``; see :meth:`to`)."""
        return self.to("float16")

    def double(self) -> "Tensor":
        """``to(float64)`` (op ``cast``; see :meth:`to`)."""
        return self.to("float64")

    def bfloat16(self) -> "Tensor":
        """``to(bfloat16)`` (op ``cast``; see :meth:`to`)."""
        return self.to("bfloat16")

    def long(self) -> "Tensor":
        """``to(int64)``: op ``cast``, rounding toward zero as PyTorch's ``long()``
        (``targets.long()`` before a loss; see :meth:`to`)."""
        return self.to("int64")

    def type_as(self, other: "Tensor") -> "Tensor":
        """``to(other.dtype)`` (``torch.Tensor.type_as``: ``norm(x.float()).type_as(x)``)."""
        return self.to(other.dtype)

    def is_floating_point(self) -> bool:
        """Whether the dtype is a floating-point one (``torch.Tensor.is_floating_point``)."""
        return self.dtype.is_float

    def clone(self) -> "Tensor":
        """A copy (op ``identity``; ``torch.Tensor.clone``: its gradient flows to this tensor)."""
        return apply("identity", [self])

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

    def max(self, dim: int | None = None, keepdim: bool = False):
        """Without ``dim``: the largest element (a 0-d tensor; op ``reduce_max``). With ``dim``:
        ``(values, indices)`` along ``dim`` as PyTorch's ``torch.return_types.max`` (ops
        ``reduce_max`` and ``argmax``; NaN propagates, the first maximum's index). The
        gradient of ``values`` is shared equally by tied maxima (OneFlow's rule; PyTorch gives
        it to the one at ``indices``).

        Raises:
            IndexError: ``dim`` out of range. ValueError: an empty reduced dimension.
            TypeError: ``keepdim`` without ``dim`` (as PyTorch: no such overload); a tensor
            as ``dim`` (PyTorch's elementwise ``x.max(other)``, not supported: the message
            says how to write it)."""
        _no_other("max", dim)
        if dim is None and keepdim:
            raise TypeError(f"max(): keepdim=True needs a dim (the tensor has shape "
                            f"{list(self.shape)}): pass dim=..., or reshape the 0-d maximum, "
                            f"x.max().reshape({(1,) * self.ndim})")
        if dim is None:
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
        ``torch.argmax``: NaN counts as the largest, the first maximum's index). It has no
        gradient.

        Raises:
            IndexError: ``dim`` out of range; an empty tensor without ``dim``, or an empty
                reduced dimension (PyTorch's messages). TypeError: an integer tensor (the op
                takes floating point; PyTorch's takes integers too)."""
        if not self.dtype.is_float:
            raise TypeError(f"argmax: the tensor of shape {list(self.shape)} is {self.dtype.name}; "
                            f"miniflow's argmax takes floating-point tensors: cast it with "
                            f".to(miniflow.float64) first (exact for integers up to 2**53)")
        if dim is None:
            if self.numel() == 0:
                raise IndexError("argmax(): Expected reduction dim to be specified for "
                                 "input.numel() == 0.")
            index = apply("argmax", [self.reshape(-1)], axis=0)
            return index.reshape((1,) * self.ndim) if keepdim else index
        d = _dim("argmax", dim, self.ndim)
        if self.ndim == 0:
            return apply("argmax", [self.reshape(1)], axis=0)
        if self.shape[d] == 0:
            raise IndexError(f"argmax(): Expected reduction dim {d} to have non-zero size.")
        return apply("argmax", [self], axis=d, keepdims=bool(keepdim))

    def min(self, dim: int | None = None, keepdim: bool = False):
        """The smallest element, or ``(values, indices)`` along ``dim``: :meth:`max` of ``-x``,
        negated (exact), with PyTorch's ``torch.min`` results (NaN propagates, the first
        minimum's index); raises as :meth:`max`."""
        _no_other("min", dim)
        if dim is not None:
            _dim("min", dim, self.ndim)
        if dim is None:
            return -(-self).max(None, keepdim)
        values, indices = (-self).max(dim, keepdim)
        return MinResult(-values, indices)

    def argmin(self, dim: int | None = None, keepdim: bool = False) -> "Tensor":
        """The int64 index of the smallest element (:meth:`argmax` of ``-x``; ``torch.argmin``);
        raises as :meth:`argmax`."""
        return (-self).argmax(dim, keepdim)

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

    def masked_fill(self, mask, value) -> "Tensor":
        """``value`` where ``mask`` is True (nonzero), else this tensor's element (op
        ``masked_fill``). ``mask``: a bool or integer array or an int64 Tensor that broadcasts
        to this tensor's shape (a bool array becomes int64: miniflow has no bool dtype).

        Raises:
            TypeError: a mask that is not an array or a Tensor (a Python bool: what ``t == 0``
                of a lazy tensor would be in PyTorch code), or a float array (PyTorch:
                "masked_fill_ only supports boolean masks").
        """
        if not isinstance(mask, Tensor):
            arr = mask_array("masked_fill", mask)
            if arr.dtype.kind not in "biu":
                raise TypeError(f"masked_fill: only supports boolean masks (or integer ones: "
                                f"nonzero = fill), got an array of {arr.dtype}")
            mask = tensor(arr.astype(np.int64))
        return apply("masked_fill", [self, mask], value=float(value))

    def split(self, split_size_or_sections, dim: int = 0) -> tuple:
        """Pieces of ``split_size`` along ``dim`` (the last one shorter), or of the given
        ``sections`` sizes (``torch.Tensor.split``); each an op ``slice``.

        Raises:
            ValueError: a ``split_size`` that is not a positive integer; sections that are not
                integers >= 0 (PyTorch: "split_with_sizes expects split_sizes have only
                non-negative entries") or that do not add up to the dimension's size.
            TypeError: neither an integer nor a sequence of them.
            RuntimeError: a 0-d tensor (PyTorch's message)."""
        _at_least_1d("split", self)
        d = _dim("split", dim, self.ndim)
        n = self.shape[d]
        if isinstance(split_size_or_sections, (numbers.Number, np.generic)):
            size = positive_integer("split", "split_size", split_size_or_sections)
            sizes = [min(size, n - a) for a in range(0, n, size)] or [0]
        else:
            if not isinstance(split_size_or_sections, (tuple, list, np.ndarray)):
                raise TypeError(f"split: split_size_or_sections must be an int or a list of "
                                f"ints, got {split_size_or_sections!r}")
            sizes = list(split_size_or_sections)
            if not all(is_integer(s) and s >= 0 for s in sizes):
                raise ValueError(f"split: split_sizes must be integers >= 0, got {sizes}")
            sizes = [int(s) for s in sizes]
            if sum(sizes) != n:
                raise ValueError(f"split: split_sizes {sizes} must sum to {n}, the size of "
                                 f"dimension {d} of {list(self.shape)}")
        out, start = [], 0
        for k in sizes:
            index = [slice(None)] * self.ndim
            index[d] = slice(start, start + k)
            out.append(self[tuple(index)])
            start += k
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        """At most ``chunks`` pieces along ``dim``, each ``ceil(size / chunks)`` long but the
        last (``torch.Tensor.chunk``: fewer pieces when the size is too small, e.g. 5 in 4
        chunks gives 2, 2, 1; an empty dim gives ``chunks`` empty pieces); :meth:`split` by
        that size.

        Raises:
            ValueError: ``chunks`` not a positive integer (PyTorch's "chunk expects `chunks` to
                be greater than 0"). IndexError: ``dim`` out of range. RuntimeError: a 0-d
                tensor (PyTorch's message)."""
        positive_integer("chunk", "chunks", chunks)
        _at_least_1d("chunk", self)
        n = self.shape[_dim("chunk", dim, self.ndim)]
        if n == 0:                                   # PyTorch: ``chunks`` empty pieces
            return self.split([0] * int(chunks), dim)
        return self.split(-(-n // int(chunks)), dim)

    def unbind(self, dim: int = 0) -> tuple:
        """The slices along ``dim``, that dim removed (``torch.Tensor.unbind``: ``q, k, v =
        qkv.unbind(0)``); each an op ``slice`` and ``reshape``, as ``x[i]``.

        Raises:
            IndexError: ``dim`` out of range (a 0-d tensor has none to unbind)."""
        if self.ndim == 0:
            raise IndexError("unbind: Dimension specified as 0 but tensor has no dimensions")
        d = _dim("unbind", dim, self.ndim)
        return tuple(self[(slice(None),) * d + (i,)] for i in range(self.shape[d]))

    def __getitem__(self, key) -> "Tensor":
        """Basic indexing as PyTorch: ints, slices (step > 0), ``None`` and ``...`` (op
        ``slice``, then ``reshape`` for the dimensions ints remove and ``None`` adds); an int64
        Tensor, a NumPy array or a list of ints selects along dimension 0 (op ``gather``), and
        one of them in a tuple along its dimension (``x[:, [-1], :]``, :meth:`_take`; a tuple
        there is a list, as in PyTorch: ``x[:, (0, 2)]``).

        Raises:
            IndexError: an index out of range or too many indices (PyTorch's messages).
            ValueError: a step <= 0. TypeError: another kind of index (a boolean mask, two
            array indices in a tuple)."""
        if isinstance(key, (np.ndarray, list)) or _is_torch(key):  # x[np.array([1, 0])], x[[1, 0]]
            key = _array_index(key, self.shape)
        if isinstance(key, Tensor):
            return apply("gather", [self, key], axis=0)
        key = key if isinstance(key, tuple) else (key,)
        arrays = [i for i, k in enumerate(key)   # a tuple in the tuple is a list (torch's)
                  if isinstance(k, (np.ndarray, list, tuple, Tensor)) or _is_torch(k)]
        if len(arrays) == 1:
            return self._take(key, arrays[0])
        index, out_shape = _basic_index(key, self.shape)
        sliced = self
        if any(s != slice(0, n, 1) for s, n in zip(index, self.shape)):
            sliced = apply("slice", [self], start=tuple(s.start for s in index),
                           stop=tuple(s.stop for s in index), step=tuple(s.step for s in index))
        return sliced if sliced.shape == out_shape else sliced.reshape(out_shape)

    def _take(self, key: tuple, pos: int) -> "Tensor":
        """``self[key]`` where ``key[pos]`` is the tuple's one array, list or int64 Tensor
        index (nanoGPT's ``x[:, [-1], :]``): the basic index with ``:`` there, then op
        ``gather`` along that dimension of the result, which the index's shape replaces in
        place. Ints of the tuple select first, as PyTorch's (``x[0, :, [1, 2]]`` of a
        ``[2, 3, 4]`` tensor is ``[3, 2]``; NumPy's is ``[2, 3]``)."""
        out = self[key[:pos] + (slice(None),) + key[pos + 1:]]
        used = sum(k is not None and k is not Ellipsis for k in key)
        axis = sum(self.ndim - used if k is Ellipsis else 1 for k in key[:pos]
                   if k is None or k is Ellipsis or isinstance(k, slice))   # of the result
        index = key[pos]
        if not isinstance(index, Tensor):
            dim = sum(self.ndim - used if k is Ellipsis else 1 for k in key[:pos]
                      if k is not None)                     # the dimension of self it indexes
            index = _array_index(index, out.shape[axis:], dim)
        return apply("gather", [out, index], axis=axis)

    # ------------------------------------------------------------------ conversions
    def to(self, *args, **kwargs) -> "Tensor":
        """This tensor in another dtype (op ``cast``), with ``torch.Tensor.to``'s forms:
        ``to(dtype)``, ``to(device)``, ``to(device, dtype)``, ``to(other)`` (``other``'s dtype)
        and the keywords ``dtype``, ``device``, ``non_blocking`` and ``copy`` (see
        :func:`to_args`; a device must be the process's backend and changes nothing). As in
        PyTorch, an eager tensor already of that dtype is returned itself, unless ``copy=True``;
        inside ``build`` a dtype is always op ``cast``, which keeps that dtype where the AMP pass
        would otherwise choose another (``x.float()`` under PyTorch's autocast computes on in
        float32), and ``to(device)`` alone is this tensor.

        Raises:
            TypeError: a dtype miniflow lacks, or arguments ``torch.Tensor.to`` does not take.
            ValueError: a device other than the process's backend.
        """
        dtype, copy = to_args("Tensor.to", args, kwargs)
        dt = self.dtype if dtype is None else as_dtype(dtype)
        if dt is self.dtype and not copy and (self._value is None or dtype is None):
            return self               # to(device) inside build: no cast, AMP's dtype stays
        return apply("cast", [self], dtype=dt)

    def backward(self) -> None:
        """Mark this scalar as the loss of the enclosing ``nn.Graph.build``.

        The backward nodes are emitted later by the autograd pass, not now.

        Raises:
            RuntimeError: outside build (eager mode is forward-only), twice, or on a non-scalar.
        """
        tr = current_tracer()
        if tr is None:
            raise RuntimeError("backward() works only inside nn.Graph.build: miniflow's "
                               "autograd is a graph pass (eager mode is forward-only)")
        tr.set_loss(self)

    # ------------------------------------------------------------------ math
    def _binary(self, other, op, scalar_op, reverse=False):
        if isinstance(other, numbers.Number) and not isinstance(other, bool):
            return scalar_op(self, float(other))
        other = other if isinstance(other, Tensor) else tensor(other, dtype=self.dtype)
        a, b = (other, self) if reverse else (self, other)
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
        return _matmul(self, o if isinstance(o, Tensor) else tensor(o, dtype=self.dtype))

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
        """x ** exponent elementwise for a number ``exponent`` (op ``scalar_pow``, PyTorch's
        values: ``x ** 0.5`` is ``sqrt``, ``x ** 0`` is 1 with a zero gradient).

        Raises:
            TypeError: a tensor or array exponent (only a number is supported; for ``e ** t``
                write ``(t * math.log(e)).exp()``).
        """
        if not isinstance(exponent, numbers.Real):
            raise TypeError(f"pow: the exponent must be a number, got "
                            f"{type(exponent).__name__} (a tensor exponent is not supported; "
                            f"for e ** t write (t * math.log(e)).exp())")
        return apply("scalar_pow", [self], scalar=float(exponent))

    __pow__ = pow

    def square(self):
        """x * x elementwise (op ``scalar_pow`` with exponent 2)."""
        return self.pow(2.0)

    def var(self, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
        """Variance over ``dim`` (None: every dim) with Bessel's ``correction`` (default 1:
        ``sum((x - mean)^2) / (n - correction)``), PyTorch's ``torch.Tensor.var``; ``unbiased``
        is its older spelling (True: correction 1, False: 0). A float16 / bfloat16 input is
        computed in float32 and rounded once, as PyTorch does.

        Raises:
            TypeError: both ``unbiased`` and ``correction`` given.
            ValueError: ``n - correction <= 0`` (PyTorch gives nan or inf with a warning).
        """
        return self._moment("var", dim, unbiased, keepdim, correction, sqrt=False)

    def std(self, dim=None, unbiased=None, keepdim: bool = False, *, correction=None):
        """Standard deviation: the square root of :meth:`var` (same arguments and errors),
        ``torch.Tensor.std``."""
        return self._moment("std", dim, unbiased, keepdim, correction, sqrt=True)

    def _moment(self, fn, dim, unbiased, keepdim, correction, sqrt: bool):
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
        v = v.sqrt() if sqrt else v
        return v.to(self.dtype) if self.dtype.is_half else v

    def sum(self, dim=None, keepdim: bool = False, *, axis=None, keepdims=None):
        """Sum over ``dim`` (an int, a sequence of ints, or None or ``()``: every dim, as in
        torch 2.x), keeping the reduced dims as size 1 when ``keepdim`` (``torch.Tensor.sum``;
        NumPy's names ``axis=`` / ``keepdims=`` are accepted too, as torch accepts them). Op
        ``reduce_sum`` (OneFlow's attributes ``axis`` and ``keepdims``).

        Raises:
            TypeError: a dim given twice (``dim`` and ``axis``, ``keepdim`` and ``keepdims``).
            IndexError: a dim of a 0-d tensor other than 0 or -1 (PyTorch's message).
        """
        dim, keepdim = _reduce_args("sum", dim, keepdim, axis, keepdims)
        if self.ndim == 0 and dim is not None:   # PyTorch: dim 0 or -1 of a 0-d tensor
            for d in dim if isinstance(dim, (tuple, list)) else (dim,):
                _dim("sum", d, 0)
            dim = None
        return apply("reduce_sum", [self], axis=dim, keepdims=keepdim)

    def mean(self, dim=None, keepdim: bool = False, *, axis=None, keepdims=None):
        """Mean over ``dim`` (arguments as :meth:`sum`, ``torch.Tensor.mean``): traced as
        ``reduce_sum`` then ``scalar_mul(1/n)`` (no mean op type). A float16 / bfloat16 input is
        cast to float32 first and the mean cast back at the end (one rounding), as PyTorch
        accumulates half types in float32: a float16 sum beyond 65504 does not make the mean inf.

        Raises:
            TypeError: as :meth:`sum`. ValueError: the reduced dims hold no element while
                the result has some (a (0, 3) tensor's ``mean(1)`` is empty, its
                ``mean(0)`` an error).
        """
        dim, keepdim = _reduce_args("mean", dim, keepdim, axis, keepdims)
        x = self.to("float32") if self.dtype.is_half else self
        s = x.sum(dim, keepdim)
        axes = norm_axes("mean", dim, self.ndim) if self.ndim else ()
        n = math.prod(self.shape[a] for a in axes)   # the count of each mean: the reduced dims
        if n == 0 and 0 not in s.shape:
            raise ValueError(f"mean: dims {list(axes)} of shape {list(self.shape)} hold no "
                             f"element (the mean of nothing; PyTorch gives NaN): skip empty "
                             f"inputs or reduce over dims of nonzero size")
        m = apply("scalar_mul", [s], scalar=1.0 / max(n, 1))
        return m.to(self.dtype) if self.dtype.is_half else m

    def reshape(self, *shape):
        """A tensor with the same elements in ``shape`` (one entry may be -1)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return apply("reshape", [self], shape=shape)

    def transpose(self, dim0: int, dim1: int | None = None):
        """This tensor with dims ``dim0`` and ``dim1`` swapped (``torch.Tensor.transpose``;
        negative dims count from the end). Op ``transpose`` with OneFlow's ``perm`` attribute
        (the identity with the two dims exchanged); for any other order use :meth:`permute`.

        Raises:
            TypeError: not two dims, or a dim that is not an int. IndexError: a dim out of range.
        """
        if dim1 is None:
            raise TypeError(f"transpose(dim0, dim1) swaps two dims, as torch.Tensor.transpose; "
                            f"got only {dim0!r}: for an order of all dims use permute(*dims)")
        a, b = (_wrap_dim("transpose", d, self.ndim) for d in (dim0, dim1))
        perm = list(range(self.ndim))
        if perm:
            perm[a], perm[b] = perm[b], perm[a]
        return apply("transpose", [self], perm=tuple(perm))

    def permute(self, *dims):
        """This tensor with its dims reordered: dim ``i`` of the result is dim ``dims[i]`` of
        this one (``torch.Tensor.permute``: ``x.permute(2, 0, 1)`` or ``x.permute((2, 0, 1))``;
        negative dims count from the end). Op ``transpose`` with ``perm=dims``.

        Raises:
            TypeError: a dim that is not an int. IndexError: a dim out of range.
            ValueError: not one entry per dim, or a dim repeated.
        """
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        perm = tuple(_wrap_dim("permute", d, self.ndim) for d in dims)
        if len(perm) != self.ndim or len(set(perm)) != len(perm):
            raise ValueError(f"permute: dims {tuple(dims)} must name each of the {self.ndim} dims "
                             f"of the tensor of shape {list(self.shape)} once")
        return apply("transpose", [self], perm=perm)

    @property
    def T(self):
        """The tensor with its dims reversed (``torch.Tensor.T``; op ``transpose``)."""
        return self.permute(*reversed(range(self.ndim)))

    def t(self):
        """A 2-D tensor transposed, a 0-d or 1-D one itself (``torch.Tensor.t``: ``x @ w.t()``).

        Raises:
            RuntimeError: more than 2 dims (PyTorch's message)."""
        if self.ndim > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is "
                               f"{self.ndim}D (shape {list(self.shape)}): use transpose(-2, -1) "
                               f"or .mT")
        return self.transpose(0, -1) if self.ndim == 2 else self

    @property
    def mT(self):
        """The last two dims swapped (``torch.Tensor.mT``, batches of matrices).

        Raises:
            RuntimeError: fewer than 2 dims (PyTorch's message)."""
        if self.ndim < 2:
            raise RuntimeError(f"tensor.mT is only supported on matrices or batches of "
                               f"matrices. Got {self.ndim}-D tensor.")
        return self.transpose(-2, -1)


_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "hip", "meta")
"""PyTorch's device types a string may name (``"cuda:1"``): a device, not a dtype, to ``to``."""


def _is_device(value) -> bool:
    """Whether ``value`` is a PyTorch device: a ``torch.device`` or a string naming one."""
    if isinstance(value, str):
        return value.partition(":")[0] in _DEVICE_TYPES
    return type(value).__name__ == "device" and hasattr(value, "index")


def to_args(owner: str, args: tuple, kwargs: dict) -> tuple:
    """``(dtype or None, copy)`` of the arguments of ``torch.Tensor.to`` / ``torch.nn.Module.to``:
    ``(dtype)``, ``(device)``, ``(device, dtype)``, ``(tensor)`` (its dtype), and the keywords
    ``dtype``, ``device``, ``non_blocking`` (accepted: nothing is asynchronous) and ``copy``.
    The device is checked to be the process's backend (``runtime.backend.check_device``:
    miniflow has no per-tensor device, so it changes nothing).

    Raises:
        TypeError: more than two positional arguments, a dtype or device given twice, or an
            unknown keyword. ValueError: a device other than the process's backend.
    """
    unknown = sorted(set(kwargs) - {"dtype", "device", "non_blocking", "copy"})
    if unknown or len(args) > 2:
        raise TypeError(f"{owner}: takes (dtype), (device), (device, dtype) or (tensor) and the "
                        f"keywords dtype, device, non_blocking, copy; got {len(args)} positional "
                        f"arguments{f' and {unknown}' if unknown else ''}")
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    rest = list(args)
    if rest and isinstance(rest[0], Tensor):
        rest[0] = rest[0].dtype
    elif rest and _is_device(rest[0]):
        if device is not None:
            raise TypeError(f"{owner}: the device is given twice ({rest[0]!r} and device=)")
        device = rest.pop(0)
    if rest:
        if dtype is not None or len(rest) > 1:
            raise TypeError(f"{owner}: the dtype is given twice ({rest} and dtype={dtype!r})")
        dtype = rest[0]
    check_device(owner, device)
    return dtype, bool(kwargs.get("copy", False))


def _wrap_dim(op: str, dim, ndim: int) -> int:
    """``dim`` in ``[0, ndim)`` (a negative one counts from the end; a 0-d tensor takes 0 and
    -1, as in torch).

    Raises:
        TypeError: not an int. IndexError: out of range, with the range.
    """
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{op}: a dim must be an int, got {dim!r}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{op}: dim {dim} is out of range for a tensor of {ndim} dims "
                         f"(expected a dim in [{-n}, {n - 1}])")
    return int(dim) % n if ndim else 0


def _reduce_args(op: str, dim, keepdim, axis, keepdims) -> tuple:
    """``(dim, keepdim)`` from PyTorch's and NumPy's names (:meth:`Tensor.sum`).

    Raises:
        TypeError: both names of one argument given.
    """
    if axis is not None:
        if dim is not None:
            raise TypeError(f"{op}: got both dim={dim!r} and axis={axis!r}; pass one")
        dim = axis
    if keepdims is not None:
        if keepdim is not False:
            raise TypeError(f"{op}: got both keepdim and keepdims; pass one")
        keepdim = keepdims
    if isinstance(dim, (tuple, list)) and len(dim) == 0:
        dim = None   # torch 2.x: an empty dim list reduces over every dim, as None does
    return dim, bool(keepdim)


def _expanded(fn: str, shape: tuple, sizes: tuple) -> tuple:
    """``(target shape, broadcast axes)`` of expanding ``shape`` to ``sizes`` (PyTorch's rules:
    new dims lead, -1 keeps a dim, only a size-1 dim changes). Raises ValueError as PyTorch."""
    lead = len(sizes) - len(shape)
    if lead < 0:
        raise ValueError(f"{fn}: the number of sizes provided ({len(sizes)}) must be greater or "
                         f"equal to the number of dimensions in the tensor ({len(shape)})")
    target, axes = [], []
    for i, s in enumerate(sizes):
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"{fn}: sizes must be ints, got {s!r} in {list(sizes)}")
        old = shape[i - lead] if i >= lead else None
        if old is None and s < 0:
            raise ValueError(f"{fn}: The expanded size of the tensor ({s}) isn't allowed in a "
                             f"leading, non-existing dimension {i}")
        s = old if s == -1 else int(s)
        if old is not None and old != 1 and s != old:
            raise ValueError(f"{fn}: The expanded size of the tensor ({s}) must match the "
                             f"existing size ({old}) at non-singleton dimension {i}.  Target "
                             f"sizes: {list(sizes)}.  Tensor sizes: {list(shape)}")
        if s < 0:
            raise ValueError(f"{fn}: negative size {s} in {list(sizes)}")
        target.append(s)
        if old is None or (old == 1 and s != 1):
            axes.append(i)
    return tuple(target), tuple(axes)


MaxResult = collections.namedtuple("max", ["values", "indices"])
"""What ``Tensor.max(dim)`` returns (PyTorch's ``torch.return_types.max``)."""
MinResult = collections.namedtuple("min", ["values", "indices"])
"""What ``Tensor.min(dim)`` returns (PyTorch's ``torch.return_types.min``)."""


def _at_least_1d(fn: str, t: "Tensor") -> None:
    """RuntimeError as PyTorch's for ``fn`` (``split``, ``chunk``) of a 0-d tensor."""
    if t.ndim == 0:
        raise RuntimeError(f"{fn} expects at least a 1-dimensional tensor (got a 0-d "
                           f"{t.dtype.name} tensor)")


def _dim(fn: str, dim, ndim: int) -> int:
    """``dim`` made non-negative for ``ndim`` dimensions; IndexError as PyTorch's."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{fn}: dim must be an int, got {dim!r}")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"{fn}: Dimension out of range (expected to be in range of "
                         f"[{-max(ndim, 1)}, {max(ndim, 1) - 1}], but got {dim})")
    return int(dim) % max(ndim, 1)


def _no_other(fn: str, dim) -> None:
    """Raises TypeError where ``dim`` of ``max`` / ``min`` is a tensor or array: PyTorch's
    ``x.max(other)``, the elementwise maximum (``torch.maximum``), which miniflow lacks; the
    message gives the ``clamp`` form of its values (to rounding; a tie's gradient goes to
    ``x``, where ``torch.maximum`` halves it)."""
    if isinstance(dim, (Tensor, np.ndarray)) or _is_torch(dim):
        word, side = ("maximum", "min") if fn == "max" else ("minimum", "max")
        raise TypeError(f"{fn}(other): the elementwise {word} of two tensors "
                        f"(torch.{word}) is not supported (dim must be an int); write "
                        f"other + (x - other).clamp({side}=0)")


def _is_torch(value) -> bool:
    """Whether ``value`` is a torch tensor (an index, read as an array; :func:`as_numpy`)."""
    return not isinstance(value, Tensor) and callable(getattr(value, "detach", None))


def _array_index(key, shape: tuple, dim: int = 0) -> "Tensor":
    """A NumPy array or list index of a tensor of ``shape`` as the int64 Tensor that
    ``gather`` takes along its dim 0 (negative entries count from the end, as in torch);
    ``dim``: the dimension it indexes, for the messages (``x[:, [7]]`` indexes dimension 1).

    Raises:
        TypeError: a boolean mask (its result's shape depends on its values, which a traced
            graph cannot have) or an array that is not of integers.
        IndexError: a 0-d tensor (nothing to index), or an index outside ``[-n, n)`` (PyTorch's
            message, naming the index as given, unsigned ones included, and its position).
    """
    try:
        arr = as_numpy(key)
    except ValueError:   # a ragged list
        arr = np.asarray(key, dtype=object)
    if arr.size == 0 and isinstance(key, (list, tuple)):   # x[:, []]: no index, no dtype
        arr = arr.astype(np.int64)
    if arr.dtype == np.bool_:
        raise TypeError(f"tensor index: a boolean mask of shape {list(arr.shape)} is not "
                        f"supported (the result's shape would depend on its values); select "
                        f"the rows by their int64 indices instead: x[np.flatnonzero(mask)]")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"tensor index {key!r}: an array or list index must hold integers (got "
                        f"{arr.dtype}); miniflow supports ints, slices, None, ... and one integer "
                        f"array, list or int64 Tensor")
    if not shape:
        raise IndexError("too many indices for tensor of dimension 0")
    found = first_bad(arr, shape[0], -shape[0])   # before the int64 cast: uint64 may not fit
    if found is not None:
        pos, value, count = found
        raise IndexError(f"index {value} is out of bounds for dimension {dim} with size "
                         f"{shape[0]} (the index array's element {list(pos)}; {count} of "
                         f"{arr.size} out of bounds)")
    return tensor(np.where(arr < 0, arr + shape[0], arr).astype(np.int64))


def _basic_index(key: tuple, shape: tuple) -> tuple:
    """``(slices, out_shape)`` of a basic-indexing key: one normalised ``slice(start, stop,
    step)`` per dimension of ``shape`` and the result's shape (ints removed, None added)."""
    if any(isinstance(k, (np.ndarray, list, tuple, Tensor)) for k in key):
        raise TypeError(f"tensor index {key!r}: one array, list or Tensor index is supported "
                        f"(x[idx], x[:, [0, 3]]), not several in a tuple (advanced indexing over "
                        f"several dimensions): index one dimension at a time")
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(k is not None and k is not Ellipsis for k in key)
    if used > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
    if Ellipsis in key:
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - used) + key[at + 1:]
    else:
        key = key + (slice(None),) * (len(shape) - used)
    slices, out_shape, d = [], [], 0
    for k in key:
        if k is None:
            out_shape.append(1)
            continue
        n = shape[d]
        if isinstance(k, numbers.Integral) and not isinstance(k, bool):
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for dimension {d} with size {n}")
            k = int(k) % n
            slices.append(slice(k, k + 1, 1))
        elif isinstance(k, slice):
            if k.step is not None and k.step <= 0:
                raise ValueError(f"step must be greater than zero, got {k.step} (dimension {d})")
            a, b, st = k.indices(n)
            b = max(a, b)
            slices.append(slice(a, b, st))
            out_shape.append(len(range(a, b, st)))
        else:
            raise TypeError(f"tensor index {k!r} ({type(k).__name__}): miniflow supports ints, "
                            f"slices, None, ... and one integer array, list or int64 Tensor")
        d += 1
    return slices, tuple(out_shape)


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


_LAYOUT_OPS = ("slice", "reshape", "transpose", "flatten")


def _trace_time_value(tracer, v):
    """The NumPy value of lazy Value ``v`` at trace time where it only rearranges a buffer or a
    constant lifted into the trace (ops ``slice``, ``reshape``, ``transpose``, ``flatten``:
    indexing, ``view``, ``unsqueeze`` ...), as nanoGPT's ``self.bias[:, :, :T, :T] == 0`` of a
    ``tril`` buffer reads it (the buffer's value now, as ``self.bias == 0`` of the unsliced eager
    buffer reads it); None for anything else: a graph input, a parameter (trained by the graph),
    a computed value."""
    if v.producer is None:
        t = tracer.sources.get(v)
        if t is None or hasattr(t, "_requires_grad"):     # a Parameter
            return None
        return t.numpy()
    node = v.producer
    if node.op.name not in _LAYOUT_OPS or len(node.outputs) != 1:
        return None
    ins = [_trace_time_value(tracer, i) for i in node.inputs]
    if any(a is None for a in ins):
        return None
    from .runtime.eager import run_op
    backend = get_backend()
    out, = run_op(node.op.name, [backend.from_numpy(a) for a in ins], dict(node.attrs))
    return backend.to_numpy(out)


def _kept_from_trace(t: Tensor) -> str:
    """The error for lazy tensor ``t`` used after its ``nn.Graph.build`` ended (kept in an
    attribute, ``self.attn = att`` in ``forward``, or a global): it never has a value."""
    return (f"lazy tensor %{t._value.name} ({t._value.type_str}) was kept from an "
            f"nn.Graph.build (an attribute set in forward, such as self.attn = ..., or a global) "
            f"and has no value outside it: return it from build and read the call's result")


def mask_array(fn: str, mask) -> np.ndarray:
    """``mask`` (a NumPy array or a nested sequence of bools) as an array, for ``fn``'s error.

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
    return np.asarray(mask)


def as_numpy(value) -> np.ndarray:
    """The values of ``value`` as a NumPy array of its shape and dtype: a miniflow Tensor's
    (:meth:`Tensor.numpy`), a torch tensor's, a Parameter or a tensor that requires grad read
    detached (as ``torch.Tensor.copy_`` reads its source), else ``np.asarray(value)`` (an array
    is not copied). A bfloat16 torch tensor, which torch cannot give NumPy, is read bit for bit
    as miniflow's bfloat16 array (``ml_dtypes.bfloat16``). What ``load_state_dict`` and
    ``Embedding.from_pretrained`` read.

    Raises:
        TypeError: what torch cannot give NumPy otherwise (torch's message).
    """
    if isinstance(value, Tensor):
        return value.numpy()
    if callable(getattr(value, "detach", None)):
        value = value.detach()
        torch = sys.modules.get("torch")     # imported already if value is a torch tensor
        if (torch is not None and isinstance(value, torch.Tensor)
                and value.dtype == torch.bfloat16):
            return np.asarray(value.view(torch.int16)).view(bfloat16.np)
    return np.asarray(value)


def tensor(data, dtype=None) -> Tensor:
    """Create an eager Tensor from array-like ``data``.

    dtype: None keeps a NumPy array's dtype (float64 included) and a torch tensor's floating
    dtype (``torch.tensor(t)`` keeps it; bfloat16 bit for bit, a tensor that requires grad read
    detached: :func:`as_numpy`), its integers and bools as int64; Python floats become float32
    and Python ints int64, as in PyTorch.

    Raises:
        TypeError: unsupported dtype (names the supported ones).
    """
    if isinstance(data, Tensor):
        data = data.numpy()
    elif _is_torch(data):
        data = as_numpy(data)
        data = data.astype(np.int64) if data.dtype.kind in "iub" else data
    if dtype is None:
        arr = np.asarray(data)
        if not isinstance(data, np.ndarray) and not isinstance(data, np.generic):
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float32)
            elif arr.dtype.kind in "iub":
                arr = arr.astype(np.int64)
        dt = as_dtype(arr.dtype)
    else:
        dt = as_dtype(dtype)
        arr = np.asarray(data).astype(dt.np)
    return Tensor(get_backend().from_numpy(arr))


def apply(op: str, inputs: list, **attrs):
    """Apply op type ``op`` (a registered name) to Tensors: record a node while tracing, else run
    the kernel now.

    Returns one Tensor, or a tuple for multi-output ops.

    Raises:
        TypeError: an input that is not a Tensor. KeyError: an unknown op type.
    """
    for i, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: input {i} is a {type(t).__name__}, not a miniflow Tensor; "
                            "wrap data with miniflow.tensor(...) (graph inputs are Tensors already)")
    tr = current_tracer()
    if tr is None:
        for t in inputs:
            if t._value is not None:
                raise RuntimeError(_kept_from_trace(t))
        from .runtime.eager import run_op
        outs = [Tensor(a) for a in run_op(op, [t._data for t in inputs], attrs)]
    else:
        vals = tr.operands([tr.value_of(t) for t in inputs])
        res = tr.graph.emit(get_op(op), *vals, **attrs)
        res = res if isinstance(res, tuple) else (res,)
        tr.record(res)
        outs = [Tensor(_value=v, _tracer=tr) for v in res]
    return outs[0] if len(outs) == 1 else tuple(outs)

