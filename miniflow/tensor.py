"""Tensor: an eager data holder, or a lazy proxy for an IR Value while an nn.Graph traces.

Every op goes through :func:`apply`: inside ``nn.Graph.build`` it records a Node (lazy); outside, it
runs the op's kernel at once (eager, forward only), on the same kernels a compiled plan uses.
"""
from __future__ import annotations

import functools
import numbers

import numpy as np

from .dtype import DType, as_dtype
from .ops import get_op
from .runtime.backend import get_backend
from .trace import current_tracer

__all__ = ["Tensor", "tensor", "apply"]


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
    def is_lazy(self) -> bool:
        """True while this tensor is a proxy in a trace."""
        return self._value is not None

    def numpy(self) -> np.ndarray:
        """A host copy of the data.

        Raises:
            RuntimeError: on a lazy tensor inside ``build`` (its value does not exist yet).
        """
        if self._value is not None:
            raise RuntimeError(f"cannot read the value of lazy tensor %{self._value.name} inside "
                               "nn.Graph.build: return it from build and read the call's result")
        return get_backend().to_numpy(self._data)

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

    def __float__(self) -> float:
        return float(self.item())

    def __bool__(self) -> bool:
        if self._value is not None:
            raise RuntimeError(f"the truth value of lazy tensor %{self._value.name} is unknown "
                               "inside nn.Graph.build (no data-dependent Python control flow)")
        return bool(self.item())

    def _compare(self, other, symbol: str):
        """A comparison: refused on a lazy tensor (its value does not exist at trace time, as
        for ``float()``); miniflow has no comparison ops, so eager tensors compare as Python
        objects do (``==`` is identity, ``<`` a TypeError; compare ``t.numpy()``)."""
        for t in (self, other):
            if isinstance(t, Tensor) and t._value is not None:
                raise RuntimeError(f"lazy tensor %{t._value.name} has no value at trace time "
                                   f"inside nn.Graph.build: '{symbol}' cannot be decided there "
                                   "(no data-dependent Python control flow); return it from "
                                   "build and compare the call's result")
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
        return f"tensor({np.array2string(self.numpy(), precision=4)}, dtype={self.dtype!r})"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # ------------------------------------------------------------------ conversions
    def to(self, dtype) -> "Tensor":
        """A copy converted to ``dtype`` (op ``cast``)."""
        return apply("cast", [self], dtype=as_dtype(dtype))

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
                            lambda t, s: apply("scalar_mul", [t], scalar=_reciprocal(s)))

    def __rtruediv__(self, o):
        return self._binary(o, "broadcast_div",
                            lambda t, s: tensor(np.full(t.shape, s), dtype=t.dtype) / t,
                            reverse=True)

    def __matmul__(self, o):
        return apply("matmul", [self, o if isinstance(o, Tensor) else tensor(o, dtype=self.dtype)])

    def __rmatmul__(self, o):
        return apply("matmul", [tensor(o, dtype=self.dtype), self])

    def __neg__(self):
        return apply("negative", [self])

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

    def sum(self, axis=None, keepdims: bool = False):
        """Sum over ``axis`` (None = all) (op ``reduce_sum``)."""
        return apply("reduce_sum", [self], axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims: bool = False):
        """Mean over ``axis``: traced as ``reduce_sum`` then ``scalar_mul(1/n)`` (no mean op type)."""
        s = self.sum(axis, keepdims)
        n = int(np.prod(self.shape, dtype=np.int64) // max(1, int(np.prod(s.shape, dtype=np.int64))))
        if n == 0:
            raise ValueError(f"mean: reducing an empty axis of shape {list(self.shape)}")
        return apply("scalar_mul", [s], scalar=1.0 / n)

    def reshape(self, *shape):
        """A tensor with the same elements in ``shape`` (one entry may be -1)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return apply("reshape", [self], shape=shape)

    def transpose(self, *perm):
        """Axes permuted by ``perm`` (reversed when omitted)."""
        if len(perm) == 1 and isinstance(perm[0], (tuple, list)):
            perm = tuple(perm[0])
        return apply("transpose", [self], perm=perm or None)

    @property
    def T(self):
        """The tensor with its axes reversed (op ``transpose``)."""
        return self.transpose()


def _reciprocal(s: float) -> float:
    """1 / s with IEEE semantics (1/0 = inf, 1/-0 = -inf) instead of ZeroDivisionError."""
    with np.errstate(divide="ignore"):
        return float(np.float64(1.0) / np.float64(s))


def tensor(data, dtype=None) -> Tensor:
    """Create an eager Tensor from array-like ``data``.

    dtype: None keeps a NumPy array's dtype (float64 included); Python floats become float32 and
    Python ints int64, as in PyTorch.

    Raises:
        TypeError: unsupported dtype (names the supported ones).
    """
    if isinstance(data, Tensor):
        data = data.numpy()
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
                raise RuntimeError(f"lazy tensor %{t._value.name} used outside nn.Graph.build")
        from .runtime.eager import run_op
        outs = [Tensor(a) for a in run_op(op, [t._data for t in inputs], attrs)]
    else:
        vals = [tr.value_of(t) for t in inputs]
        res = tr.graph.emit(get_op(op), *vals, **attrs)
        res = res if isinstance(res, tuple) else (res,)
        outs = [Tensor(_value=v, _tracer=tr) for v in res]
    return outs[0] if len(outs) == 1 else tuple(outs)

