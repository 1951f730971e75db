"""dtype and device conversions: ``to`` (with ``torch.Tensor.to``'s argument forms,
:func:`to_args`), ``float`` / ``half`` / ``long`` ..., ``detach`` and ``clone``; ``new_zeros``,
``new_ones``, ``new_full`` and ``new_tensor`` (eager tensors of this tensor's dtype)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..dtype import as_dtype, bool_
from ..runtime.backend import check_device
from .core import TensorCore
from .create import _made, apply, as_numpy, full, new_tensor, ones, zeros

if TYPE_CHECKING:        # the composed class, for the annotations only
    from . import Tensor


class Casts:
    """The dtype conversions, ``detach`` and ``clone`` of :class:`miniflow.tensor.Tensor`."""

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

    def detach(self) -> "Tensor":
        """The same values with no gradient flowing back through them (op ``detach``); eager: a
        tensor sharing this one's data, as in PyTorch."""
        if self._value is None:
            return new_tensor(self._data)
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

    def bool(self) -> "Tensor":
        """``to(miniflow.bool)`` (``torch.Tensor.bool``): True where the value is nonzero (NaN
        too); an eager tensor, inside ``build`` too (of what can be read there: a lazy tensor
        computed in the graph is refused, bool tensors being eager; see :meth:`to`)."""
        return self.to(bool_)

    def int(self) -> "Tensor":
        """``torch.Tensor.int`` (int32, which miniflow has not): ``to(int64)``, as
        :meth:`long`, the integer dtype miniflow has."""
        return self.to("int64")

    def type(self, dtype=None):
        """``torch.Tensor.type``: without ``dtype`` PyTorch's type string of this tensor's dtype
        (``'torch.FloatTensor'``); with one (a dtype, a torch.dtype, a name), ``to(dtype)`` (the
        tutorial's ``(pred.argmax(1) == y).type(torch.float).sum().item()``).

        Raises:
            TypeError: a dtype miniflow has not."""
        if dtype is None:
            return f"torch.{_TYPE_NAMES[self.dtype.name]}Tensor"
        return self.to(dtype)

    def type_as(self, other: "Tensor") -> "Tensor":
        """This tensor in ``other``'s dtype (``torch.Tensor.type_as``:
        ``norm(x.float()).type_as(x)``): ``to(other.dtype)``, but inside ``build``, of two
        floating tensors, ``other`` computed in the graph, op ``cast_like`` (OneFlow's), which
        takes ``other``'s dtype after the AMP pass: float16 where a white op computes ``other``,
        as ``type_as`` gives under PyTorch's autocast (``to(other.dtype)`` would keep the traced
        float32). Its gradient is cast back to this tensor's dtype.

        Raises:
            TypeError: ``other`` is not a Tensor (PyTorch's type).
        """
        if not isinstance(other, TensorCore):
            raise TypeError(f"type_as(): argument 'other' (position 1) must be Tensor, not "
                            f"{type(other).__name__}")
        if other._value is not None and self.dtype.is_float and other.dtype.is_float:
            return apply("cast_like", [self, other])
        return self.to(other.dtype)

    def is_floating_point(self) -> bool:
        """Whether the dtype is a floating-point one (``torch.Tensor.is_floating_point``)."""
        return self.dtype.is_float

    def new_zeros(self, *size, dtype=None, device=None, requires_grad: bool = False):
        """``torch.Tensor.new_zeros``: :func:`miniflow.zeros` of ``size`` (ints, or one tuple
        or list) in this tensor's dtype unless ``dtype`` is given; an eager tensor (a constant
        inside ``build``). Errors as :func:`miniflow.zeros`."""
        return zeros(*size, dtype=self.dtype if dtype is None else dtype, device=device,
                     requires_grad=requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad: bool = False):
        """``torch.Tensor.new_ones``: ones, as :meth:`new_zeros`."""
        return ones(*size, dtype=self.dtype if dtype is None else dtype, device=device,
                    requires_grad=requires_grad)

    def new_full(self, size, fill_value, *, dtype=None, device=None,
                 requires_grad: bool = False):
        """``torch.Tensor.new_full``: :func:`miniflow.full` of ``size`` (a tuple or list),
        ``fill_value`` in this tensor's dtype unless ``dtype`` is given; errors as
        :func:`miniflow.full`."""
        return full(size, fill_value, dtype=self.dtype if dtype is None else dtype,
                    device=device, requires_grad=requires_grad)

    def new_tensor(self, data, *, dtype=None, device=None, requires_grad: bool = False):
        """``torch.Tensor.new_tensor``: ``data`` (an array, a sequence, a number, a tensor: its
        values copied) as an eager tensor of this tensor's dtype unless ``dtype`` is given.

        Raises:
            TypeError: an unsupported dtype. ValueError: another device;
                ``requires_grad=True`` (as :func:`miniflow.zeros`)."""
        return _made("new_tensor", np.array(as_numpy(data)), self.dtype if dtype is None
                     else dtype, device, requires_grad)

    def clone(self) -> "Tensor":
        """A copy (op ``identity``, floating or int64; ``torch.Tensor.clone``: its gradient
        flows to this tensor)."""
        return apply("identity", [self])


_TYPE_NAMES = {"float64": "Double", "float32": "Float", "float16": "Half", "bfloat16": "BFloat16",
               "int64": "Long", "bool": "Bool"}
"""PyTorch's tensor type name of each dtype (``Tensor.type()``: ``torch.LongTensor``)."""


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
    if rest and isinstance(rest[0], TensorCore):
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
