"""Comparisons (``==``, ``<``, ..., ``isnan``): the NumPy bool array of an eager tensor's values compared,
identity between two tensors under ``==`` / ``!=``, and a lazy tensor's value at trace time
where it only rearranges a buffer or a constant."""
from __future__ import annotations

import functools
import numbers

import numpy as np

from ..runtime.backend import get_backend
from .core import TensorCore


_COMPARE = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
            ">": np.greater, ">=": np.greater_equal}


class Comparisons:
    """The comparison operators of :class:`miniflow.tensor.Tensor`."""

    def _compare(self, other, symbol: str, elementwise: bool = False):
        """A comparison: refused on a lazy tensor (its value does not exist at trace time, as
        for ``float()``). miniflow has no comparison ops: an eager tensor against a number or a
        NumPy array gives the NumPy bool array of its values compared (a mask for
        :meth:`masked_fill`, as PyTorch's bool tensor), and so do two eager tensors under
        ``<``, ``<=``, ``>``, ``>=``; ``==`` and ``!=`` between two tensors are identity (so that
        tensors work in lists, dicts and sets; ``elementwise``: their values, as the methods
        :meth:`eq` ... compare them)."""
        known = {}
        for t in (self, other):
            if isinstance(t, TensorCore) and t._value is not None:
                known[id(t)] = _trace_time_value(t._tracer, t._value)
                if known[id(t)] is None:
                    raise RuntimeError(f"lazy tensor %{t._value.name} has no value at trace "
                                       f"time inside nn.Graph.build: '{symbol}' cannot be "
                                       "decided there (no data-dependent Python control flow); "
                                       "return it from build and compare the call's result")
        if isinstance(other, TensorCore) and (elementwise or symbol not in ("==", "!=")):
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

    def eq(self, other) -> np.ndarray:
        """``torch.Tensor.eq``: the NumPy bool array of this tensor's values equal to
        ``other``'s (a tensor, an array or a number; broadcast), between two tensors too, where
        ``==`` is identity. The MNIST example's ``pred.eq(target.view_as(pred)).sum().item()``
        counts the right answers. Eager tensors, and at trace time what ``==`` can read (a
        buffer's slice); miniflow has no bool tensors (a mask is this array).

        Raises:
            RuntimeError: a lazy tensor whose value is computed in the graph (as ``==``).
        """
        return self._compare(other, "==", elementwise=True)

    def ne(self, other) -> np.ndarray:
        """``torch.Tensor.ne``: values not equal, as :meth:`eq`."""
        return self._compare(other, "!=", elementwise=True)

    def lt(self, other) -> np.ndarray:
        """``torch.Tensor.lt``: ``<`` of the values, as :meth:`eq`."""
        return self._compare(other, "<", elementwise=True)

    def le(self, other) -> np.ndarray:
        """``torch.Tensor.le``: ``<=`` of the values, as :meth:`eq`."""
        return self._compare(other, "<=", elementwise=True)

    def gt(self, other) -> np.ndarray:
        """``torch.Tensor.gt``: ``>`` of the values, as :meth:`eq`."""
        return self._compare(other, ">", elementwise=True)

    def ge(self, other) -> np.ndarray:
        """``torch.Tensor.ge``: ``>=`` of the values, as :meth:`eq`."""
        return self._compare(other, ">=", elementwise=True)

    def isnan(self) -> np.ndarray:
        """``torch.isnan``: the NumPy bool array of where this tensor's values are NaN (``x !=
        x``, as :meth:`ne` reads them: eager tensors, and at trace time what ``==`` can read);
        miniflow has no bool tensors (a mask for :meth:`masked_fill` or :func:`where`).

        Raises:
            RuntimeError: a lazy tensor whose value is computed in the graph (as ``==``).
        """
        return self._compare(self, "!=", elementwise=True)


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
