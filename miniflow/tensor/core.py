"""The tensor's state: its data or lazy Value, its properties, and what reads it as Python or
NumPy values (``numpy``, ``item``, ``float``, ``repr``, ...); the base class of
:class:`miniflow.tensor.Tensor`, which mixes in the method groups of the sibling modules."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..dtype import DType, as_dtype
from ..runtime.backend import device, get_backend
from ..trace import current_tracer

if TYPE_CHECKING:        # the composed class, for the annotations only
    from . import Tensor


_NO_DATA = ("miniflow tensors have no .data (PyTorch's tensor without autograd history): read "
            "the values with .numpy(); to replace a parameter's values, use "
            "module.load_state_dict({name: array}, strict=False), which copies them in place "
            "(compiled graphs see them at their next call)")

_TRAIN_IN_A_GRAPH = """backward() works only inside nn.Graph.build: miniflow's autograd is a graph \
pass, and eager tensors (a module called outside a graph, miniflow.compile(model)'s result) are \
forward-only. Train in an nn.Graph that owns the optimizer:

class TrainStep(nn.Graph):
    def __init__(self, model, optimizer):
        super().__init__(); self.model = model; self.add_optimizer(optimizer)
    def build(self, x, y):
        loss = loss_fn(self.model(x), y); loss.backward(); return loss

step = TrainStep(model, optimizer); loss = step(x, y)  # one step: gradients and update"""
"""Tensor.backward's error outside ``build``: the five lines of a training graph."""


NOT_THERE: dict = {
    "backends": "torch.backends switches (cuda.matmul.allow_tf32, cudnn.benchmark) have no "
                "miniflow counterpart: drop the line (float32 products are float32; kernel "
                "choices are measured on this machine, docs/usage.md)",
}
"""PyTorch's tensor names miniflow has not yet, and what to write instead: the hint of the
``AttributeError`` of ``Tensor.<name>`` and ``miniflow.<name>``."""


LISTED = "docs/differences.md lists the PyTorch names miniflow has and lacks"
"""The hint of a missing public name of ``miniflow`` and ``miniflow.nn.functional``."""


def not_there(owner: str, name: str, otherwise: str = "") -> AttributeError:
    """The ``AttributeError`` of ``owner``'s missing attribute ``name``, with what to write
    instead when :data:`NOT_THERE` lists it, else ``otherwise`` (a hint, or nothing)."""
    hint = NOT_THERE.get(name, otherwise)
    return AttributeError(f"{owner} has no attribute {name!r}" + (f": {hint}" if hint else ""))


class LazyValueError(RuntimeError):
    """The value of a lazy tensor was read inside ``nn.Graph.build`` (``numpy()``, ``item()``,
    ``bool(t)``, ``if t:``): it does not exist until the graph runs, and miniflow traces the whole
    function into one graph, where ``torch.compile`` would break the graph there. A
    ``RuntimeError``, as before it had a class."""


class TensorCore:
    """What every tensor holds: ``_data`` (a backend array, eager) or ``_value`` (the IR Value it
    stands for in ``_tracer``'s trace, lazy), and the reading of it. Every tensor is a
    :class:`miniflow.tensor.Tensor`, this class with the method groups mixed in."""

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
    def device(self) -> device:
        """The process's device (``torch.Tensor.device``: nanoGPT's ``device = idx.device``,
        passed on to ``torch.arange(..., device=device)``): ``device(type='cpu')`` or
        ``device(type='cuda', index=0)``, the same for every tensor (miniflow has one backend
        per process), a lazy one too."""
        name = get_backend().name
        return device(name, 0 if name == "cuda" else None)

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

    def __getattr__(self, name):
        """Only for an attribute there is not (the others are found first): PyTorch's names
        miniflow has not yet say what to write instead (:data:`NOT_THERE`); a property whose
        getter raised ``AttributeError`` (``data``) raises its own message again."""
        attr = getattr(type(self), name, None)
        if isinstance(attr, property):
            return attr.__get__(self, type(self))
        raise not_there("'Tensor' object", name)

    @property
    def is_lazy(self) -> bool:
        """True while this tensor is a proxy in a trace."""
        return self._value is not None

    def numpy(self) -> np.ndarray:
        """A host copy of the data.

        Raises:
            LazyValueError: on a lazy tensor inside ``build`` (its value does not exist yet).
            RuntimeError: on a lazy tensor kept from a finished trace.
        """
        if self._value is not None:
            if current_tracer() is None:
                raise RuntimeError(_kept_from_trace(self))
            raise LazyValueError(f"cannot read the value of lazy tensor %{self._value.name} "
                                 "inside nn.Graph.build: return it from build and read the "
                                 "call's result")
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
        """``bool(t)``, ``if t:``: the truth of a one-element tensor (``if (x == y).all():``).

        Raises:
            LazyValueError: a lazy tensor inside ``build``.
            RuntimeError: not one element (PyTorch's "Boolean value of Tensor with more than
                one value is ambiguous": ``t == u`` compares values, as in PyTorch; ``t is u``
                is identity)."""
        if self._value is not None:
            raise LazyValueError(f"the truth value of lazy tensor %{self._value.name} is "
                                 "unknown inside nn.Graph.build (no data-dependent Python "
                                 "control flow)")
        if self.numel() != 1:
            many = "more than one value" if self.numel() else "no values"
            raise RuntimeError(f"Boolean value of Tensor with {many} is ambiguous (shape "
                               f"{list(self.shape)}): reduce it with .any() or .all(); "
                               f"t == u compares values, as in PyTorch (t is u is identity)")
        return bool(self.item())

    def __repr__(self) -> str:
        if self._value is not None:
            return f"tensor(lazy %{self._value.name}: {self._value.type_str})"
        values = np.array2string(self.numpy(), precision=4, separator=", ", prefix="tensor(")
        return f"tensor({values}, dtype={self.dtype!r})"      # PyTorch's layout: rows aligned

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def backward(self) -> None:
        """Mark this scalar as the loss of the enclosing ``nn.Graph.build``.

        The backward nodes are emitted later by the autograd pass, not now.

        Raises:
            RuntimeError: outside build (eager mode is forward-only), twice, or on a non-scalar.
        """
        tr = current_tracer()
        if tr is None:
            raise RuntimeError(_TRAIN_IN_A_GRAPH)
        tr.set_loss(self)


def _kept_from_trace(t: TensorCore) -> str:
    """The error for lazy tensor ``t`` used after its ``nn.Graph.build`` ended (kept in an
    attribute, ``self.attn = att`` in ``forward``, or a global): it never has a value."""
    return (f"lazy tensor %{t._value.name} ({t._value.type_str}) was kept from an "
            f"nn.Graph.build (an attribute set in forward, such as self.attn = ..., or a global) "
            f"and has no value outside it: return it from build and read the call's result")
