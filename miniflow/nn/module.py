"""``nn.Module`` and ``nn.Parameter``, following PyTorch's API (``torch.nn.Module``).

Attributes that are Parameters or Modules are registered in assignment order, which gives
PyTorch's parameter names (``0.weight``, ``encoder.bias``). Parameters hold their data in backend
arrays that nn.Graph binds as graph variables, so a graph step updates them in place.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..dtype import as_dtype
from ..runtime.backend import get_backend
from ..tensor import Tensor

__all__ = ["Module", "Parameter", "replaced_count"]


class Parameter(Tensor):
    """A trainable eager Tensor owned by a Module (float32 master weights by default)."""

    def __init__(self, data):
        arr = np.asarray(data)
        as_dtype(arr.dtype)
        super().__init__(get_backend().from_numpy(arr))
        self.requires_grad = True


_REPLACED = [0]


def replaced_count() -> int:
    """How many times a registered Parameter or sub-Module of any Module was replaced or removed
    (nn.Graph compares it between calls and recompiles when it changed)."""
    return _REPLACED[0]


class Module:
    """Base class of layers and models: override ``forward``; call the module to run it."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError("call super().__init__() before assigning attributes of a Module")
        if name in self._parameters or name in self._modules:
            _REPLACED[0] += 1  # compiled graphs may hold the old one: they recompile
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        if name in self._parameters or name in self._modules:
            _REPLACED[0] += 1
            self._parameters.pop(name, None)
            self._modules.pop(name, None)
        object.__delattr__(self, name)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ------------------------------------------------------------------ traversal
    def named_children(self):
        """Yield ``(attribute name, sub-Module)`` for the direct sub-modules, in assignment order."""
        return iter(self._modules.items())

    def children(self):
        """Yield the direct sub-modules, in assignment order."""
        return iter(self._modules.values())

    def named_parameters(self, prefix: str = ""):
        """Yield ``(name, Parameter)`` pairs, depth first, each parameter once."""
        seen = set()
        for name, p in self._named_parameters(prefix):
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def _named_parameters(self, prefix):
        for name, p in self._parameters.items():
            yield prefix + name, p
        for name, m in self._modules.items():
            yield from m._named_parameters(prefix + name + ".")

    def parameters(self):
        """Yield every Parameter once."""
        for _, p in self.named_parameters():
            yield p

    # ------------------------------------------------------------------ state
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Parameter name -> NumPy copy of its value."""
        return OrderedDict((n, p.numpy()) for n, p in self.named_parameters())

    def load_state_dict(self, state_dict, strict: bool = True) -> None:
        """Copy values into the parameters in place (bound graphs see them).

        Values may be NumPy arrays or Tensors. Everything is checked before anything is copied.

        Raises:
            KeyError: missing or unexpected names (strict), listing them.
            ValueError: a shape or dtype differs from the parameter's, naming it.
        """
        self.prepare_load_state_dict(state_dict, strict)()

    def prepare_load_state_dict(self, state_dict, strict: bool = True):
        """Check ``state_dict`` as :meth:`load_state_dict` does and return a function of no
        arguments that copies it in (a caller restoring several objects checks them all before
        it assigns any: ``miniflow.checkpoint.restore``).

        Raises:
            TypeError: not a dict; otherwise as :meth:`load_state_dict`.
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f"load_state_dict: expected a dict of parameter name -> array (a "
                            f"state_dict()), got {type(state_dict).__name__}")
        own = dict(self.named_parameters())
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        checked = []  # check everything first: a failed load changes nothing
        for name, value in state_dict.items():
            if name not in own:
                continue
            p = own[name]
            arr = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
            if arr.shape != p.shape or arr.dtype != p.dtype.np:
                raise ValueError(f"load_state_dict: {name!r} is {p.dtype.short}{list(p.shape)} in "
                                 f"the model but {arr.dtype}{list(arr.shape)} in the state dict")
            checked.append((p, arr))

        def assign():
            backend = get_backend()
            for p, arr in checked:
                backend.copy_in(p._data, arr)
        return assign

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            lines.append(f"  ({name}): " + repr(m).replace("\n", "\n  "))
        return lines[0] + ("\n" + "\n".join(lines[1:]) + "\n)" if len(lines) > 1 else ")")

    def extra_repr(self) -> str:
        return ""
