"""Containers of sub-modules: ``ModuleList`` and ``ModuleDict`` (PyTorch's ``torch.nn`` names,
methods and state-dict keys), and of parameters: ``ParameterList`` and ``ParameterDict``. The
module containers hold modules only, so that ``parameters()``, ``state_dict()``, ``train()`` /
``eval()`` and ``nn.Graph`` see them; they have no ``forward``: the owning module's
``forward`` (or ``build``) iterates or indexes them, and the trace records the ops of the modules
it calls. Changing a container after a graph traced it (``append``, ``layers[0] = ...``,
``del blocks["head"]``) makes that graph recompile at its next call, like any assignment."""
from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from ..tensor import as_numpy
from .module import Module, Parameter

__all__ = ["ModuleList", "ModuleDict", "ParameterList", "ParameterDict", "position", "renumber",
           "checked_module"]


class ModuleList(Module):
    """Sub-modules in a list (``torch.nn.ModuleList``): ``ModuleList([m0, m1])`` names them by
    position, so their state-dict keys are ``0.weight``, ``1.weight``; ``ml[i]`` is a module,
    ``ml[i:j]`` a new ModuleList of those modules (numbered from 0), ``append``, ``extend``,
    ``insert``, ``pop``, ``del ml[i]``, ``+`` and ``+=`` as in PyTorch (deleting or inserting
    renumbers the names after it, as PyTorch does).

    Raises:
        TypeError: an element that is not a Module (``None`` included: PyTorch's list keeps a
            None entry); an index that is not an integer or slice; assigning to a slice.
        IndexError: an index out of range.
    """

    def __init__(self, modules: Iterable | None = None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, idx) -> int:
        """``idx`` as an index in ``range(len(self))``."""
        return position("ModuleList", idx, len(self))

    def _renumber(self, modules: list) -> None:
        renumber(self, modules)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ModuleList(list(self._modules.values())[idx])
        return self._modules[str(self._index(idx))]

    def __setitem__(self, idx, module) -> None:
        if isinstance(idx, slice):
            raise TypeError("ModuleList: a slice cannot be assigned (nor in PyTorch); assign one "
                            "index at a time, or make a new ModuleList")
        self.add_module(str(self._index(idx)), checked_module("ModuleList", module))

    def __delitem__(self, idx) -> None:
        modules = list(self._modules.values())
        if isinstance(idx, slice):
            del modules[idx]
        else:
            del modules[self._index(idx)]
        self._renumber(modules)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules.values()))

    def __iadd__(self, modules: Iterable) -> "ModuleList":
        return self.extend(modules)

    def __add__(self, other: Iterable) -> "ModuleList":
        return ModuleList([*self, *other])

    def append(self, module: Module) -> "ModuleList":
        """Add ``module`` at the end; returns self."""
        self.add_module(str(len(self)), checked_module("ModuleList", module))
        return self

    def extend(self, modules: Iterable) -> "ModuleList":
        """Append every module of ``modules`` (an iterable, not a single module); returns self."""
        if not isinstance(modules, Iterable):
            raise TypeError(f"ModuleList.extend takes an iterable of modules, got a "
                            f"{type(modules).__name__} (append adds one module)")
        for m in list(modules):
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before position ``index`` (``list.insert``'s rule: clipped to the
        ends); the modules after it are renumbered."""
        modules = list(self._modules.values())
        modules.insert(operator.index(index), checked_module("ModuleList", module))
        self._renumber(modules)

    def pop(self, idx: int = -1) -> Module:
        """Remove the module at ``idx`` and return it."""
        module = self[idx]
        del self[idx]
        return module


class ModuleDict(Module):
    """Sub-modules by name (``torch.nn.ModuleDict``): ``ModuleDict({"enc": m0, "dec": m1})``,
    state-dict keys ``enc.weight``; the dict methods ``[]``, ``in``, ``len``, iteration over the
    keys in insertion order, ``keys()``, ``values()``, ``items()``, ``update()``, ``pop()``,
    ``clear()``, as in PyTorch.

    Raises:
        TypeError: a value that is not a Module, a key that is not a str, ``update`` of
            something that is neither a mapping nor an iterable of (key, module) pairs.
        KeyError: a missing key; a key that is empty, dotted or an existing attribute
            (``ModuleDict({"keys": m})``: ``Module.add_module``'s checks).
    """

    def __init__(self, modules: Mapping | Iterable | None = None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, checked_module("ModuleDict", module, key))

    def __delitem__(self, key: str) -> None:
        if key not in self._modules:
            raise KeyError(key)
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(list(self._modules))

    def __contains__(self, key) -> bool:
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def pop(self, key: str) -> Module:
        """Remove the module ``key`` and return it."""
        module = self[key]
        del self[key]
        return module

    def clear(self) -> None:
        """Remove every module."""
        for key in list(self._modules):
            del self[key]

    def update(self, modules: Mapping | Iterable) -> None:
        """Add or replace the modules of ``modules``: a mapping (a dict, a ModuleDict) or an
        iterable of ``(key, module)`` pairs, in its order."""
        if isinstance(modules, (Mapping, ModuleDict)):
            pairs = list(modules.items())
        else:
            try:
                pairs = [tuple(p) for p in modules]
            except TypeError:
                raise TypeError(f"ModuleDict.update takes a mapping or an iterable of (key, "
                                f"module) pairs, got {type(modules).__name__}") from None
            for i, p in enumerate(pairs):
                if len(p) != 2:
                    raise TypeError(f"ModuleDict.update: element {i} has {len(p)} items, "
                                    f"expected a (key, module) pair")
        for key, module in pairs:
            self[key] = module


class ParameterList(Module):
    """Parameters in a list (``torch.nn.ParameterList``): ``ParameterList([p0, p1])`` names them by
    position, so their state-dict keys are ``0``, ``1``; a value that is not a Parameter (an
    array, a tensor) is made one, as PyTorch does. ``pl[i]`` is a Parameter, ``pl[i:j]`` a new
    ParameterList of those parameters, ``pl[i] = p``, ``append``, ``extend``, ``+=``, ``len``
    and iteration as in PyTorch.

    Raises:
        TypeError: an index that is not an integer or slice; assigning to a slice.
        IndexError: an index out of range.
    """

    def __init__(self, values: Iterable | None = None):
        super().__init__()
        if values is not None:
            self.extend(values)

    @staticmethod
    def _parameter(value) -> Parameter:
        return value if isinstance(value, Parameter) else Parameter(as_numpy(value))

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ParameterList(list(self._parameters.values())[idx])
        return self._parameters[str(position("ParameterList", idx, len(self), "parameters"))]

    def __setitem__(self, idx, value) -> None:
        if isinstance(idx, slice):
            raise TypeError("ParameterList: a slice cannot be assigned; assign one index at a "
                            "time, or make a new ParameterList")
        i = position("ParameterList", idx, len(self), "parameters")
        setattr(self, str(i), self._parameter(value))

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self):
        return iter(list(self._parameters.values()))

    def __iadd__(self, values: Iterable) -> "ParameterList":
        return self.extend(values)

    def append(self, value) -> "ParameterList":
        """Add ``value`` (made a Parameter if it is not one) at the end; returns self."""
        self.register_parameter(str(len(self)), self._parameter(value))
        return self

    def extend(self, values: Iterable) -> "ParameterList":
        """Append every value of ``values``; returns self.

        Raises:
            TypeError: ``values`` is not an iterable."""
        if not isinstance(values, Iterable):
            raise TypeError(f"ParameterList.extend should be called with an iterable, but got "
                            f"{type(values).__name__}")
        for v in values:
            self.append(v)
        return self

    def extra_repr(self) -> str:
        return "\n".join(f"({i}): Parameter containing: [{p.dtype.name} of size "
                         f"{'x'.join(str(d) for d in p.shape)}]" for i, p in enumerate(self))


class ParameterDict(Module):
    """Parameters by name (``torch.nn.ParameterDict``): ``ParameterDict({"left": p0, "right":
    p1})``, state-dict keys ``left``, ``right`` (``params.left`` under an attribute ``params``);
    a value that is not a Parameter (an array, a tensor) is made one, as PyTorch makes a tensor
    one, and None registers the key with no parameter (the lists and the state dict skip it).
    An ordered dict: ``[]``, ``in``, ``len``, iteration over the keys in insertion order,
    ``reversed``, ``keys()``, ``values()``, ``items()``, ``get``, ``setdefault``, ``pop``,
    ``popitem``, ``clear``, ``copy``, ``fromkeys``, ``update`` and ``|``, ``|=`` as PyTorch's;
    ``update`` (and the constructor) of a plain dict adds its keys in sorted order, as
    PyTorch's does (an ``OrderedDict``, a ParameterDict or a list of pairs keeps its order).

    Raises:
        TypeError: a key that is not a str (PyTorch's message); a value that is neither an array
            nor a tensor nor None (PyTorch keeps any object as a plain attribute); ``update`` of
            something that is not iterable, or of a pair that is not iterable.
        ValueError: ``update`` of a sequence element that is not a pair.
        KeyError: a missing key; a key that is empty, dotted or an existing attribute
            (``ParameterDict({"keys": p})``: ``Module.register_parameter``'s checks).
        RuntimeError: calling it (PyTorch's "ParameterDict should not be called.").
    """

    def __init__(self, parameters=None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    @staticmethod
    def _key(key) -> str:
        if not isinstance(key, str):
            raise TypeError(f"Index given to ParameterDict cannot be used as a key as it is not "
                            f"a string (type is '{type(key).__name__}')")
        return key

    def __getitem__(self, key: str):
        if self._key(key) not in self._parameters:
            raise KeyError(key)
        return self._parameters[key]

    def __setitem__(self, key: str, value) -> None:
        value = None if value is None else ParameterList._parameter(value)
        self.register_parameter(self._key(key), value)

    def __delitem__(self, key: str) -> None:
        self[key]       # KeyError for a missing key
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self):
        return iter(list(self._parameters))

    def __reversed__(self):
        return reversed(list(self._parameters))

    def __contains__(self, key) -> bool:
        return key in self._parameters

    def __call__(self, *args, **kwargs):
        raise RuntimeError("ParameterDict should not be called.")

    def keys(self):
        return self._parameters.keys()

    def values(self):
        return (self[k] for k in self)

    def items(self):
        return ((k, self[k]) for k in self)

    def get(self, key: str, default=None):
        """``self[key]`` if ``key`` is in it, else ``default``."""
        return self[key] if key in self else default

    def setdefault(self, key: str, default=None):
        """``self[key]``, set to ``default`` (made a Parameter) first if missing."""
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, key: str):
        """Remove ``key`` and return its parameter."""
        value = self[key]
        del self[key]
        return value

    def popitem(self) -> tuple:
        """Remove and return the last inserted ``(key, parameter)`` pair.

        Raises:
            KeyError: the dict is empty (``dict.popitem``'s)."""
        if not len(self):
            raise KeyError("popitem(): ParameterDict is empty")
        key = list(self._parameters)[-1]
        return key, self.pop(key)

    def clear(self) -> None:
        """Remove every parameter."""
        for key in list(self._parameters):
            del self[key]

    def copy(self) -> "ParameterDict":
        """A new ParameterDict of the same parameters (not copied), in the same order."""
        return ParameterDict(OrderedDict(self.items()))

    def fromkeys(self, keys: Iterable, default=None) -> "ParameterDict":
        """A new ParameterDict with ``keys``, each set to ``default``."""
        return ParameterDict([(k, default) for k in keys])

    def update(self, parameters) -> None:
        """Add or replace the parameters of ``parameters``: an ``OrderedDict`` or ParameterDict
        (in its order), another mapping (in sorted key order, as PyTorch) or an iterable of
        ``(key, value)`` pairs (in its order)."""
        if not isinstance(parameters, Iterable):
            raise TypeError(f"ParametersDict.update should be called with an iterable of "
                            f"key/value pairs, but got {type(parameters).__name__}")
        if isinstance(parameters, (OrderedDict, ParameterDict)):
            pairs = list(parameters.items())
        elif isinstance(parameters, Mapping):
            pairs = sorted(parameters.items())
        else:
            pairs = list(parameters)
            for j, p in enumerate(pairs):
                if not isinstance(p, Iterable):
                    raise TypeError(f"ParameterDict update sequence element #{j} should be "
                                    f"Iterable; is {type(p).__name__}")
                if len(p) != 2:
                    raise ValueError(f"ParameterDict update sequence element #{j} has length "
                                     f"{len(p)}; 2 is required")
        for key, value in pairs:
            self[key] = value

    def __or__(self, other: "ParameterDict") -> "ParameterDict":
        merged = self.copy()
        merged.update(other)
        return merged

    def __ror__(self, other: "ParameterDict") -> "ParameterDict":
        merged = other.copy()
        merged.update(self)
        return merged

    def __ior__(self, other: "ParameterDict") -> "ParameterDict":
        self.update(other)
        return self

    def extra_repr(self) -> str:
        return "\n".join(f"({k}): Parameter containing: [{p.dtype.name} of size "
                         f"{'x'.join(str(d) for d in p.shape)}]" if p is not None else
                         f"({k}): Object of type: NoneType" for k, p in self.items())


def position(owner: str, idx, n: int, noun: str = "modules") -> int:
    """``idx`` (an int, negative from the end) as an index in ``range(n)`` of container
    ``owner`` (of ``n`` ``noun``).

    Raises:
        TypeError: not an integer. IndexError: out of range."""
    try:
        i = operator.index(idx)
    except TypeError:
        raise TypeError(f"{owner} indices must be integers or slices, got "
                        f"{type(idx).__name__}") from None
    if not -n <= i < n:
        raise IndexError(f"{owner} index {i} is out of range for {n} {noun}")
    return i % n


def renumber(container: Module, modules: list) -> None:
    """Make ``modules`` the children of ``container``, named ``0 .. len - 1`` (PyTorch's
    ``ModuleList`` and ``Sequential`` after a deletion or insertion)."""
    for name in list(container._modules):
        delattr(container, name)
    for i, m in enumerate(modules):
        container.add_module(str(i), m)


def checked_module(owner: str, value, key=None) -> Module:
    """``value`` if it is a Module (PyTorch's containers hold modules only).

    Raises:
        TypeError: anything else, naming the container ``owner`` (and ``key``)."""
    if not isinstance(value, Module):
        where = "" if key is None else f" for key {key!r}"
        raise TypeError(f"{owner} holds modules: got a {type(value).__name__}{where}")
    return value
