"""Making tensors: :func:`apply` (every op's one door: record a node while tracing, else run the
kernel now), :func:`tensor` (from array-like data), :func:`as_numpy` (a tensor's, a torch
tensor's or an array's values as NumPy) and PyTorch's factories (:func:`zeros`, :func:`ones`,
:func:`full`, :func:`arange`, :func:`zeros_like`, :func:`ones_like`, :func:`rand`, :func:`randn`,
:func:`randint`, :func:`from_numpy`: eager tensors)."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np

from ..checks import is_integer, is_real
from ..dtype import as_dtype, bfloat16, bool_
from ..ops import get_op
from ..random import generator as global_generator
from ..runtime.backend import check_device, get_backend
from ..trace import current_tracer
from .core import TensorCore, _kept_from_trace

if TYPE_CHECKING:        # the composed class, for the annotations only
    from . import Tensor


_tensor_class = TensorCore
"""The class of the tensors made here: :class:`miniflow.tensor.Tensor`, which :func:`tensor_class`
registers (it is composed of method groups that import this module, so this module cannot
import it)."""


def tensor_class(cls: type) -> type:
    """Class decorator: ``cls`` is the class of every tensor :func:`new_tensor`, :func:`tensor`
    and :func:`apply` make."""
    global _tensor_class
    _tensor_class = cls
    return cls


def new_tensor(data=None, *, _value=None, _tracer=None):
    """``Tensor(data)`` (eager) or ``Tensor(_value=, _tracer=)`` (lazy) of the registered
    class."""
    return _tensor_class(data, _value=_value, _tracer=_tracer)


def _from_host(arr: np.ndarray):
    """An eager tensor of the NumPy array ``arr`` in the backend's memory (:func:`tensor` and
    the factories); one made while a build runs is noted in its tracer's ``made``, so that
    assignments may write it (an eager op's result or a ``detach`` sharing a tensor's data is
    not: inside a build only these make new eager data)."""
    t = new_tensor(get_backend().from_numpy(arr))
    tr = current_tracer()
    if tr is not None:
        tr.made.add(id(t))
    return t


def _is_torch(value) -> bool:
    """Whether ``value`` is a torch tensor (an index, read as an array; :func:`as_numpy`)."""
    return not isinstance(value, TensorCore) and callable(getattr(value, "detach", None))


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
    if isinstance(value, TensorCore):
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

    dtype: None keeps a NumPy array's dtype (float64 and bool included) and a torch tensor's
    floating or bool dtype (``torch.tensor(t)`` keeps it; bfloat16 bit for bit, a tensor that
    requires grad read detached: :func:`as_numpy`), its integers as int64; Python floats become
    float32, Python ints int64 and Python bools bool (``miniflow.bool``), as in PyTorch.

    Raises:
        TypeError: unsupported dtype (names the supported ones).
    """
    if isinstance(data, TensorCore):
        data = data.numpy()
    elif _is_torch(data):
        data = as_numpy(data)
        data = data.astype(np.int64) if data.dtype.kind in "iu" else data
    if dtype is None:
        arr = np.asarray(data)
        if not isinstance(data, np.ndarray) and not isinstance(data, np.generic):
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float32)
            elif arr.dtype.kind in "iu":
                arr = arr.astype(np.int64)
        dt = as_dtype(arr.dtype)
    else:
        dt = as_dtype(dtype)
        arr = np.asarray(data).astype(dt.np)
    return _from_host(arr)


def from_numpy(ndarray: np.ndarray) -> Tensor:
    """An eager tensor of a NumPy array's values and dtype (``torch.from_numpy``; nanoGPT's
    ``torch.from_numpy((data[i:i+block_size]).astype(np.int64))``). PyTorch's shares the
    array's memory; miniflow copies it (a later write to the array does not change the tensor).

    Raises:
        TypeError: not a NumPy array (PyTorch's message); a dtype miniflow has not.
    """
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"from_numpy(): expected np.ndarray (got {type(ndarray).__name__})")
    return tensor(ndarray)


def apply(op: str, inputs: list, **attrs):
    """Apply op type ``op`` (a registered name) to Tensors: record a node while tracing, else run
    the kernel now.

    Returns one Tensor, or a tuple for multi-output ops. Bool tensors are eager, inside
    ``build`` too (:func:`_bool_apply`).

    Raises:
        TypeError: an input that is not a Tensor; an op that does not move data of a bool
            tensor (:func:`_bool_apply`). KeyError: an unknown op type.
    """
    for i, t in enumerate(inputs):
        if not isinstance(t, TensorCore):
            raise TypeError(f"{op}: input {i} is a {type(t).__name__}, not a miniflow Tensor; "
                            "wrap data with miniflow.tensor(...) (graph inputs are Tensors "
                            "already)")
    if any(t.dtype is bool_ for t in inputs) or op == "cast" and as_dtype(attrs["dtype"]) is bool_:
        return _bool_apply(op, inputs, attrs)
    tr = current_tracer()
    if tr is None:
        for t in inputs:
            if t._value is not None:
                raise RuntimeError(_kept_from_trace(t))
        from ..runtime.eager import run_op
        outs = [new_tensor(a) for a in run_op(op, [t._data for t in inputs], attrs)]
    else:
        vals = tr.operands([tr.value_of(t) for t in inputs])
        res = tr.graph.emit(get_op(op), *vals, **attrs)
        res = res if isinstance(res, tuple) else (res,)
        tr.record(res)
        outs = [new_tensor(_value=v, _tracer=tr) for v in res]
    return outs[0] if len(outs) == 1 else tuple(outs)


_BOOL_OPS = frozenset({"slice", "reshape", "transpose", "flatten", "expand", "broadcast_like",
                       "cat", "gather", "dim_gather", "detach", "identity"})
"""The ops that only move data, which :func:`_bool_apply` runs on bool tensors."""


def _bool_apply(op: str, inputs: list, attrs: dict):
    """Op ``op`` of eager tensors of which some are bool, or a ``cast`` to bool: run now, inside
    ``build`` too, so that no graph value is bool (a bool tensor is data there, as a NumPy
    bool array). ``cast`` converts with NumPy (to bool: nonzero is True, NaN too, as PyTorch);
    an op of :data:`_BOOL_OPS` runs its kernel on the bools as int64 and gives bool back.

    Raises:
        TypeError: a lazy operand (a bool tensor has no graph value); any other op (``exp``,
            ``matmul``, a sum of two bool tensors): naming it and saying to cast first; data
            of bool and another dtype (``cat``; an index as the data).
    """
    lazy = [t for t in inputs if t._value is not None]
    if lazy:
        raise TypeError(f"{op}: lazy tensor %{lazy[0]._value.name} ({lazy[0]._value.type_str}) "
                        f"inside nn.Graph.build with a bool operand or result: bool tensors are "
                        f"eager in miniflow and no graph value is bool; cast an eager bool "
                        f"tensor with .float() (or .long(), a mask) before it meets a computed "
                        f"one (a computed tensor cannot become bool there)")
    backend = get_backend()
    if op == "cast":
        arr = inputs[0].numpy().astype(as_dtype(attrs["dtype"]).np)
        return new_tensor(backend.from_numpy(arr))
    dtypes = ", ".join(t.dtype.name for t in inputs)
    if op not in _BOOL_OPS:
        raise TypeError(f"{op}: miniflow computes nothing on bool tensors (inputs {dtypes}): "
                        f"cast first, with .float() (True is 1.0) or .long()")
    if any(t.dtype is not bool_ for t in (inputs if op == "cat" else inputs[:1])):
        raise TypeError(f"{op}: its data is bool and not bool (inputs {dtypes}): cast to one "
                        f"dtype first (.float(), .long() or .bool())")
    from ..runtime.eager import run_op
    arrays = [backend.from_numpy(t.numpy().astype(np.int64)) if t.dtype is bool_ else t._data
              for t in inputs]
    outs = [new_tensor(backend.from_numpy(backend.to_numpy(a).astype(np.bool_)))
            for a in run_op(op, arrays, attrs)]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _size(fn: str, size: tuple) -> tuple:
    """PyTorch's ``*size``: ints, or one tuple or list of them."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    if not all(is_integer(n) and n >= 0 for n in size):
        raise TypeError(f"{fn}(): size must be integers >= 0 (as {fn}(2, 3) or {fn}((2, 3))), "
                        f"got {size!r}")
    return tuple(int(n) for n in size)


def _made(fn: str, arr: np.ndarray, dtype, device, requires_grad) -> Tensor:
    """``arr`` as an eager tensor of ``dtype`` (None: its own) on the process's device."""
    check_device(fn, device)
    if requires_grad is not False:
        raise ValueError(f"{fn}(): requires_grad={requires_grad!r} is not supported: only "
                         f"parameters train in miniflow; wrap the tensor as "
                         f"nn.Parameter({fn}(...)) in a Module")
    if dtype is not None:
        arr = arr.astype(as_dtype(dtype).np)
    as_dtype(arr.dtype)
    return _from_host(np.asarray(arr, order="C"))    # 0-d stays 0-d


def zeros(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An eager tensor of zeros (``torch.zeros``): ``size`` as ints or one tuple or list;
    ``dtype`` float32 by default (PyTorch's default dtype), any miniflow dtype (a
    ``torch.dtype`` too); ``device`` the process's (``runtime.backend.check_device``). Inside
    ``nn.Graph.build`` the result is a constant of the graph.

    Raises:
        TypeError: a size that is not integers >= 0; an unsupported dtype.
        ValueError: another device; ``requires_grad=True`` (only parameters train: wrap it as
            ``nn.Parameter``).
    """
    return _made("zeros", np.zeros(_size("zeros", size), np.float32), dtype, device,
                 requires_grad)


def ones(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An eager tensor of ones (``torch.ones``; nanoGPT's ``torch.tril(torch.ones(T, T))``
    mask); arguments and errors as :func:`zeros`."""
    return _made("ones", np.ones(_size("ones", size), np.float32), dtype, device, requires_grad)


def full(size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An eager tensor of ``size`` (a tuple or list of ints) filled with ``fill_value``
    (``torch.full``): without a dtype, bool for a bool, int64 for an int, float32 for a float,
    as PyTorch infers it. Errors as :func:`zeros`."""
    if not isinstance(size, (tuple, list)):
        raise TypeError(f"full(): size must be a tuple or list of ints, got "
                        f"{type(size).__name__} (write full((2, 3), value))")
    kind = (np.bool_ if isinstance(fill_value, (bool, np.bool_)) else np.int64
            if is_integer(fill_value) else np.float32)
    return _made("full", np.full(_size("full", (size,)), fill_value, kind), dtype, device,
                 requires_grad)


def arange(start, end=None, step=1, *, dtype=None, device=None,
           requires_grad: bool = False) -> Tensor:
    """``[start, end)`` by ``step`` as an eager 1-D tensor (``torch.arange``; ``arange(n)`` is
    ``[0, n)``): int64 when every argument is an integer (nanoGPT's positions,
    ``torch.arange(0, t, dtype=torch.long, device=device)``), else float32, as PyTorch's
    default; ``device`` the process's.

    Raises:
        TypeError: a bound or step that is not a real number; an unsupported dtype.
        ValueError: ``step`` 0, or ``step`` of the wrong sign for the bounds (PyTorch's
            "upper bound and lower bound inconsistent with step sign"); another device;
            ``requires_grad=True``.
    """
    start, end = (0, start) if end is None else (start, end)
    for name, v in (("start", start), ("end", end), ("step", step)):
        if not is_real(v):
            raise TypeError(f"arange(): {name} must be a real number, got {v!r}")
    if step == 0:
        raise ValueError("arange(): step must be nonzero")
    if (end - start) * step < 0:
        raise ValueError("arange(): upper bound and lower bound inconsistent with step sign")
    whole = all(is_integer(v) for v in (start, end, step))
    return _made("arange", np.arange(start, end, step, np.int64 if whole else np.float32),
                 dtype, device, requires_grad)


def zeros_like(input: Tensor, *, dtype=None, device=None,
               requires_grad: bool = False) -> Tensor:
    """Zeros of ``input``'s shape and (without ``dtype``) dtype (``torch.zeros_like``); errors
    as :func:`zeros`."""
    dtype = input.dtype if dtype is None else dtype
    return _made("zeros_like", np.zeros(input.shape, np.float32), dtype, device, requires_grad)


def ones_like(input: Tensor, *, dtype=None, device=None,
              requires_grad: bool = False) -> Tensor:
    """Ones of ``input``'s shape and (without ``dtype``) dtype (``torch.ones_like``); errors as
    :func:`zeros`."""
    dtype = input.dtype if dtype is None else dtype
    return _made("ones_like", np.ones(input.shape, np.float32), dtype, device, requires_grad)


def _random(fn: str, size: tuple, generator, draw) -> np.ndarray:
    """``draw(miniflow's generator, size)`` for the random factories."""
    if generator is not None:
        raise TypeError(f"{fn}(): generator={generator!r} is not supported: miniflow draws from "
                        f"its one generator; seed it with miniflow.manual_seed")
    return draw(global_generator(), _size(fn, size))


def rand(*size, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An eager tensor of values drawn from U(0, 1) (``torch.rand``), float32 by default, from
    miniflow's generator (``miniflow.manual_seed``: PyTorch's distribution, not its numbers).

    Raises:
        TypeError: a ``generator``; otherwise as :func:`zeros`."""
    arr = _random("rand", size, generator, lambda g, s: g.random(s))
    return _made("rand", arr.astype(np.float32), dtype, device, requires_grad)


def randn(*size, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """An eager tensor of values drawn from N(0, 1) (``torch.randn``: a tutorial's test input or
    ``nn.Parameter(torch.randn(1, 1, d))``); arguments and errors as :func:`rand`."""
    arr = _random("randn", size, generator, lambda g, s: g.standard_normal(s))
    return _made("randn", arr.astype(np.float32), dtype, device, requires_grad)


def randint(low, high=None, size=None, *, generator=None, dtype=None, device=None,
            requires_grad: bool = False) -> Tensor:
    """An eager int64 tensor of integers drawn uniformly from ``[low, high)``
    (``torch.randint(high, size)`` or ``torch.randint(low, high, size)``; nanoGPT's
    ``torch.randint(len(data) - block_size, (batch_size,))``), from miniflow's generator.

    Raises:
        TypeError: no ``size``, bounds that are not integers, a ``generator``.
        ValueError: ``low >= high`` (PyTorch: "random_ expects 'from' to be less than 'to'").
    """
    if size is None:
        low, high, size = 0, low, high
    if size is None or not isinstance(size, (tuple, list)):
        raise TypeError(f"randint(): size must be a tuple or list of ints (randint(high, size) or "
                        f"randint(low, high, size)), got {size!r}")
    if not (is_integer(low) and is_integer(high)):
        raise TypeError(f"randint(): low and high must be integers, got {low!r} and {high!r}")
    if low >= high:
        raise ValueError(f"randint(): random_ expects 'from' to be less than 'to', but got "
                         f"from={low} >= to={high}")
    arr = _random("randint", (size,), generator, lambda g, s: g.integers(low, high, s))
    return _made("randint", arr.astype(np.int64), dtype, device, requires_grad)
