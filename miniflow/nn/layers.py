"""Layers: Linear, Sequential, Flatten, Identity (PyTorch's ``torch.nn`` names, shapes and
initialisation); the activation modules are in ``miniflow.nn.activations``, convolution, batch
norm and pooling in ``conv``, ``normalization`` and ``pooling``."""
from __future__ import annotations

import math
from ..checks import positive_integer
from ..random import generator
from . import functional as F
from .containers import checked_module, position, renumber
from .factory import param_dtype
from .module import Module, Parameter

__all__ = ["Linear", "Sequential", "Flatten", "Identity"]


class Linear(Module):
    """``y = x @ weight.T + bias``; x [..., in_features] -> y [..., out_features].

    weight: [out_features, in_features], bias: [out_features], float32 unless ``dtype``; both
    initialised U(-1/sqrt(in_features), 1/sqrt(in_features)) like PyTorch (kaiming_uniform with
    a=sqrt(5)). ``device`` / ``dtype``: PyTorch's factory keywords (``nn.factory.param_dtype``).

    Raises:
        ValueError: a size that is not a positive integer, a device other than the process's.
        TypeError: a dtype that is not a floating dtype of miniflow.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None):
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            positive_integer("Linear", name, v)
        dt = param_dtype("Linear", device, dtype)
        self.in_features, self.out_features = int(in_features), int(out_features)
        bound = 1.0 / math.sqrt(in_features)
        g = generator()
        self.weight = Parameter(g.uniform(-bound, bound, (out_features, in_features))
                                .astype(dt))
        self.bias = (Parameter(g.uniform(-bound, bound, out_features).astype(dt))
                     if bias else None)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Sequential(Module):
    """Modules applied in order (``torch.nn.Sequential``): ``Sequential(m0, m1, ...)`` names them
    by position (``0.weight``), ``Sequential(OrderedDict(fc=m0, act=m1))`` by the dict's keys
    (``fc.weight``). ``seq[i]`` is a module, ``seq[i:j]`` a Sequential of those modules under
    their names; ``seq[i] = m`` replaces one under its name; ``del seq[i]``, ``append``,
    ``extend``, ``insert`` and ``pop`` as in PyTorch (deleting or inserting renumbers the modules
    ``0 ..``).

    Raises:
        TypeError: an argument (or dict value) that is not a Module, or a name that is not a str.
        ValueError: a name that is empty or contains ``"."`` (PyTorch's ``add_module`` rule: a
            dot would make the state-dict keys ambiguous).
    """

    def __init__(self, *modules):
        super().__init__()
        named = len(modules) == 1 and isinstance(modules[0], dict)
        items = list(modules[0].items()) if named else [(str(i), m) for i, m in enumerate(modules)]
        for name, m in items:
            if not isinstance(m, Module):
                where = f"module {name!r}" if named else f"argument {name}"
                raise TypeError(f"Sequential: {where} is {type(m).__name__}, not a Module")
            if not isinstance(name, str):
                raise TypeError(f"Sequential: module name {name!r} is {type(name).__name__}, "
                                "not a str")
            if not name or "." in name:
                raise ValueError(f"Sequential: module name {name!r} must be non-empty and "
                                 "contain no '.' (it becomes a state-dict key prefix)")
            setattr(self, name, m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(dict(list(self._modules.items())[i]))
        return list(self._modules.values())[position("Sequential", i, len(self))]

    def __setitem__(self, i, module) -> None:
        """Replace the module at position ``i`` under its name (PyTorch's)."""
        setattr(self, list(self._modules)[position("Sequential", i, len(self))],
                checked_module("Sequential", module))

    def __delitem__(self, i) -> None:
        """Remove the module at ``i`` (or a slice); the rest are renumbered ``0 ..`` (PyTorch's,
        dict names included)."""
        modules = list(self._modules.values())
        if isinstance(i, slice):
            del modules[i]
        else:
            del modules[position("Sequential", i, len(self))]
        renumber(self, modules)

    def append(self, module) -> "Sequential":
        """Add ``module`` at the end, named by its position; returns self."""
        self.add_module(str(len(self)), checked_module("Sequential", module))
        return self

    def extend(self, modules) -> "Sequential":
        """Append every module of ``modules``; returns self."""
        for m in list(modules):
            self.append(m)
        return self

    def insert(self, index: int, module) -> "Sequential":
        """Insert ``module`` before position ``index`` (``-len <= index <= len``); the modules are
        renumbered ``0 ..``; returns self.

        Raises:
            IndexError: ``index`` out of range.
            KeyError: the children are named (``Sequential(OrderedDict(...))``), not numbered
                ``0 ..``: inserting would rename them and their state-dict keys (PyTorch's insert
                raises a KeyError there too)."""
        n, module = len(self), checked_module("Sequential", module)
        if not -n <= index <= n:
            raise IndexError(f"Sequential.insert: index {index} is out of range for {n} modules")
        if list(self._modules) != [str(i) for i in range(n)]:
            raise KeyError(f"Sequential.insert: the children are named {list(self._modules)}, "
                           f"not numbered 0 .. {n - 1}; inserting would rename them (and their "
                           f"state-dict keys): build a new Sequential(OrderedDict(...)) instead")
        modules = list(self._modules.values())
        modules.insert(index + n if index < 0 else index, module)
        renumber(self, modules)
        return self

    def pop(self, i=-1):
        """Remove the module at ``i`` (or the Sequential of a slice) and return it."""
        module = self[i]
        del self[i]
        return module

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules.values()))


class Flatten(Module):
    """``x`` with dims ``start_dim .. end_dim`` merged (``torch.nn.Flatten``: start_dim 1, so
    ``[N, C, H, W]`` -> ``[N, C*H*W]``). Op ``flatten``."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return F.flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Identity(Module):
    """Returns its input (``torch.nn.Identity``): a placeholder layer, no op."""

    def forward(self, x):
        return x


class Softmax(Module):
    """``F.softmax(x, dim)`` as a module (``torch.nn.Softmax(dim=None)``; without ``dim``,
    PyTorch's implicit one: :func:`miniflow.nn.functional.softmax`). Op ``softmax``."""

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """``F.log_softmax(x, dim)`` as a module (``torch.nn.LogSoftmax(dim=None)``). Op
    ``log_softmax``."""

    def forward(self, x):
        return F.log_softmax(x, self.dim)
