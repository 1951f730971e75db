"""Comparisons and logic (``==``, ``<``, ..., ``isnan``, ``&``, ``|``, ``^``, ``~``,
``logical_and`` ..., ``any``, ``all``): eager bool tensors (``miniflow.bool``) of the values, read
with NumPy, from eager tensors and, inside ``nn.Graph.build``, from a lazy tensor whose value is
known at trace time (it only rearranges a buffer or a constant)."""
from __future__ import annotations

import functools
import numbers
from typing import TYPE_CHECKING

import numpy as np

from ..runtime.backend import get_backend
from .core import TensorCore
from .create import _from_host, _is_torch, as_numpy
from .dims import _dim

if TYPE_CHECKING:        # the composed class, for the annotations only
    from . import Tensor


_COMPARE = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
            ">": np.greater, ">=": np.greater_equal, "&": np.bitwise_and, "|": np.bitwise_or,
            "^": np.bitwise_xor, "logical_and": np.logical_and, "logical_or": np.logical_or,
            "logical_xor": np.logical_xor}
"""The NumPy function of each comparison and logical operator (by its symbol or name)."""


def _read(t: TensorCore, fn: str) -> np.ndarray:
    """The values of tensor ``t`` for ``fn``: an eager tensor's, or at trace time those of a lazy
    one that only rearranges a buffer or a constant (:func:`_trace_time_value`).

    Raises:
        RuntimeError: a lazy tensor whose value is computed in the graph: it does not exist at
            trace time, as for ``float()``.
    """
    if t._value is None:
        return t.numpy()
    known = _trace_time_value(t._tracer, t._value)
    if known is None:
        raise RuntimeError(f"lazy tensor %{t._value.name} has no value at trace time inside "
                           f"nn.Graph.build: '{fn}' cannot be decided there (no data-dependent "
                           f"Python control flow); return it from build and compare the call's "
                           f"result")
    return known


def _operand(other, fn: str):
    """``other`` of a comparison as NumPy values (a tensor's by :func:`_read`, a torch
    tensor's, a number or an array as they are), or None for anything else (a string, None)."""
    if isinstance(other, TensorCore):
        return _read(other, fn)
    if _is_torch(other):
        return as_numpy(other)
    if isinstance(other, (numbers.Number, np.generic, np.ndarray)):
        return other
    return None


def _broadcast_check(fn: str, a: np.ndarray, b) -> None:
    """PyTorch's error for operands of shapes that do not broadcast.

    Raises:
        RuntimeError: naming the first dimension (from the right) whose sizes differ."""
    sa, sb = np.shape(a), np.shape(b)
    for k in range(1, min(len(sa), len(sb)) + 1):
        if sa[-k] != sb[-k] and 1 not in (sa[-k], sb[-k]):
            raise RuntimeError(f"{fn}: The size of tensor a ({sa[-k]}) must match the size of "
                               f"tensor b ({sb[-k]}) at non-singleton dimension "
                               f"{max(len(sa), len(sb)) - k}")


def _integral(fn: str, t: TensorCore) -> None:
    """Bitwise operators take bool and int64 tensors, as PyTorch's.

    Raises:
        TypeError: a floating tensor (PyTorch: not implemented for 'Float')."""
    if t.dtype.is_float:
        raise TypeError(f"'{fn}': bitwise operators take bool and int64 tensors, not "
                        f"{t.dtype.name} (of shape {list(t.shape)}); compare first (x > 0) or "
                        f"cast with .bool()")


class Comparisons:
    """The comparison and logical operators of :class:`miniflow.tensor.Tensor`."""

    def _compare(self, other, symbol: str):
        """``self (symbol) other`` elementwise (broadcast), as an eager tensor: bool for a
        comparison or a logical function, bool or int64 (NumPy's promotion: PyTorch's for
        these) for a bitwise operator; ``NotImplemented`` for an operand that is not a
        tensor, a number or an array (so ``t == None`` is False, as PyTorch's).

        Raises:
            RuntimeError: a lazy tensor whose value is computed in the graph (:func:`_read`);
                shapes that do not broadcast (PyTorch's message).
            TypeError: a floating operand of a bitwise operator.
        """
        if symbol in ("&", "|", "^"):
            for t in (self, other):
                if isinstance(t, TensorCore):
                    _integral(symbol, t)
        b = _operand(other, symbol)
        if b is None:
            return NotImplemented
        a = _read(self, symbol)
        _broadcast_check(symbol, a, b)
        return _from_host(np.asarray(_COMPARE[symbol](a, b)))

    __eq__ = functools.partialmethod(_compare, symbol="==")
    __ne__ = functools.partialmethod(_compare, symbol="!=")
    __lt__ = functools.partialmethod(_compare, symbol="<")
    __le__ = functools.partialmethod(_compare, symbol="<=")
    __gt__ = functools.partialmethod(_compare, symbol=">")
    __ge__ = functools.partialmethod(_compare, symbol=">=")
    __and__ = __rand__ = functools.partialmethod(_compare, symbol="&")
    __or__ = __ror__ = functools.partialmethod(_compare, symbol="|")
    __xor__ = __rxor__ = functools.partialmethod(_compare, symbol="^")

    __hash__ = object.__hash__   # hashed by identity, as torch.Tensor: keys of dicts and sets

    def eq(self, other) -> "Tensor":
        """``torch.Tensor.eq`` (``==``): an eager bool tensor of where this tensor's values
        equal ``other``'s (a tensor, an array or a number; broadcast). The MNIST example's
        ``pred.eq(target.view_as(pred)).sum().item()`` counts the right answers. Eager
        tensors, and at trace time what can be read there (a buffer's slice, as nanoGPT's
        ``self.bias[:, :, :T, :T] == 0``).

        Raises:
            RuntimeError: a lazy tensor whose value is computed in the graph; shapes that do
                not broadcast.
            TypeError: ``other`` not a tensor, an array or a number.
        """
        return self._method(other, "==")

    def _method(self, other, symbol: str):
        """The method form of ``symbol``: as the operator, but another operand is an error."""
        out = self._compare(other, symbol)
        if out is NotImplemented:
            raise TypeError(f"{symbol}: other must be a tensor, an array or a number, got "
                            f"{type(other).__name__}")
        return out

    def ne(self, other) -> "Tensor":
        """``torch.Tensor.ne``: values not equal (``!=``), as :meth:`eq`."""
        return self._method(other, "!=")

    def lt(self, other) -> "Tensor":
        """``torch.Tensor.lt``: ``<`` of the values, as :meth:`eq`."""
        return self._method(other, "<")

    def le(self, other) -> "Tensor":
        """``torch.Tensor.le``: ``<=`` of the values, as :meth:`eq`."""
        return self._method(other, "<=")

    def gt(self, other) -> "Tensor":
        """``torch.Tensor.gt``: ``>`` of the values, as :meth:`eq`."""
        return self._method(other, ">")

    def ge(self, other) -> "Tensor":
        """``torch.Tensor.ge``: ``>=`` of the values, as :meth:`eq`."""
        return self._method(other, ">=")

    def isnan(self) -> "Tensor":
        """``torch.isnan``: an eager bool tensor of where this tensor's values are NaN (``x !=
        x``; a mask for :meth:`masked_fill` or :func:`where`); as :meth:`eq`, what can be read.

        Raises:
            RuntimeError: a lazy tensor whose value is computed in the graph (as ``==``).
        """
        return self._method(self, "!=")

    def logical_and(self, other) -> "Tensor":
        """``torch.logical_and``: an eager bool tensor, True where both values are nonzero
        (any dtypes; NaN is nonzero); arguments and errors as :meth:`eq`."""
        return self._method(other, "logical_and")

    def logical_or(self, other) -> "Tensor":
        """``torch.logical_or``: True where either value is nonzero, as :meth:`logical_and`."""
        return self._method(other, "logical_or")

    def logical_xor(self, other) -> "Tensor":
        """``torch.logical_xor``: True where one value is nonzero, as :meth:`logical_and`."""
        return self._method(other, "logical_xor")

    def logical_not(self) -> "Tensor":
        """``torch.logical_not``: an eager bool tensor, True where the value is 0; as
        :meth:`eq`, what can be read."""
        return _from_host(np.asarray(np.logical_not(_read(self, "logical_not"))))

    def __invert__(self) -> "Tensor":
        """``~t``: of a bool tensor its logical not (a mask inverted), of an int64 one its
        bitwise not, as PyTorch's.

        Raises:
            TypeError: a floating tensor. RuntimeError: as :meth:`eq`."""
        _integral("~", self)
        return _from_host(np.asarray(np.invert(_read(self, "~"))))

    def any(self, dim=None, keepdim: bool = False) -> "Tensor":
        """``torch.Tensor.any``: an eager bool tensor, whether any value is nonzero, over
        ``dim`` (an int, a tuple of ints or None: every dim) keeping it as size 1 with
        ``keepdim``; as :meth:`eq`, what can be read.

        Raises:
            IndexError: a dim out of range. RuntimeError: as :meth:`eq`."""
        return self._reduce("any", np.any, dim, keepdim)

    def all(self, dim=None, keepdim: bool = False) -> "Tensor":
        """``torch.Tensor.all``: whether every value is nonzero, as :meth:`any`."""
        return self._reduce("all", np.all, dim, keepdim)

    def _reduce(self, fn: str, reduce, dim, keepdim: bool) -> "Tensor":
        """:meth:`any` / :meth:`all` with NumPy's ``reduce``."""
        dims = () if dim is None else dim if isinstance(dim, (tuple, list)) else (dim,)
        axes = tuple(_dim(fn, d, self.ndim) for d in dims)    # a 0-d tensor's 0 or -1: None
        values = _read(self, fn)
        out = reduce(values, axis=axes if axes and self.ndim else None, keepdims=bool(keepdim))
        return _from_host(np.asarray(out))


_LAYOUT_OPS = ("slice", "reshape", "transpose", "flatten")


def _trace_time_value(tracer, v):
    """The NumPy value of lazy Value ``v`` at trace time where it only rearranges a buffer or a
    constant lifted into the trace (ops ``slice``, ``reshape``, ``transpose``, ``flatten``:
    indexing, ``view``, ``unsqueeze`` ...), as nanoGPT's ``self.bias[:, :, :T, :T] == 0`` of a
    ``tril`` buffer reads it (the buffer's value now, as ``self.bias == 0`` of the unsliced eager
    buffer reads it); None for anything else: a graph input, a parameter (trained by the graph),
    a computed value."""
    if v.kind == "constant":      # as lifted (its tensor may have been written since)
        return tracer.graph.constant_data[v.name]
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
    from ..runtime.eager import run_op
    backend = get_backend()
    out, = run_op(node.op.name, [backend.from_numpy(a) for a in ins], dict(node.attrs))
    return backend.to_numpy(out)
