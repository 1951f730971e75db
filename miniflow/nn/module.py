"""``nn.Module`` and ``nn.Parameter``, following PyTorch's API (``torch.nn.Module``).

Attributes that are Parameters or Modules are registered in assignment order, which gives
PyTorch's parameter names (``0.weight``, ``encoder.bias``). Parameters hold their data in backend
arrays that nn.Graph binds as graph variables, so a graph step updates them in place.

Under AMP with fused updates a parameter also owns half copies of its value (one per half dtype:
``Parameter.half_copy``), which the fused updates write and the next step's matmuls read; a
version counter says when something else wrote the parameter (:class:`HalfCopies` then refreshes
the copy before the next step).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..dtype import as_dtype, float32
from ..ir import Node, Value
from ..ops import get_op
from ..runtime.backend import get_backend
from ..tensor import Tensor

__all__ = ["Module", "Parameter", "HalfCopies", "replaced_count"]


class Parameter(Tensor):
    """A trainable eager Tensor owned by a Module (float32 master weights by default).

    ``version`` counts the writes of its value that its half copies did not follow (loading a
    state dict, an update that wrote no copy): :class:`HalfCopies` compares it with the version
    each copy was made from."""

    def __init__(self, data):
        arr = np.asarray(data)
        as_dtype(arr.dtype)
        super().__init__(get_backend().from_numpy(arr))
        self.requires_grad = True
        self.version = 0
        self._half_copies = {}

    def half_copy(self, dtype) -> "_HalfCopy":
        """The parameter's copy in half ``dtype`` (made on first use, stale until refreshed)."""
        copies = self.__dict__.setdefault("_half_copies", {})
        if dtype.name not in copies:
            copies[dtype.name] = _HalfCopy(get_backend().empty(self.shape, dtype.np))
        return copies[dtype.name]

    def written(self) -> None:
        """Record a write of the value that the half copies did not follow."""
        self.version = getattr(self, "version", 0) + 1


class _HalfCopy:
    """A half copy's array and the parameter ``version`` it equals (-1: never made)."""

    __slots__ = ("array", "version")

    def __init__(self, array):
        self.array, self.version = array, -1


class HalfCopies:
    """The half weight copies of one compiled graph (``ctx.half_copies`` of the
    ``fuse_model_update_cast`` pass): binds each copy variable to its parameter's copy, makes a
    stale copy equal to the parameter rounded (:meth:`refresh`, before a step: one ``cast``
    kernel) and, after a step, records what the step wrote (:meth:`stepped`): the fused updates
    wrote parameters and copies together, the other updates only parameters.

    Args:
        graph: the compiled IR graph (its copy variables get their data here).
        ctx: its compile context (``half_copies``, ``trainable``, and ``optimizers``: whether the
            graph updates parameters).
        params: variable name -> Parameter of the graph's modules.
        backend: the backend the plan runs on (the cast kernel).
    """

    def __init__(self, graph, ctx, params: dict, backend):
        self.fused, self.refreshes = [], []
        fused_names = set()
        cast = backend.builder_for(get_op("cast"))
        for name, copy_name in ctx.half_copies:
            p, v = params[name], graph.variables[copy_name]
            entry = p.half_copy(v.dtype)
            graph.variable_data[copy_name] = entry.array
            node = Node(get_op("cast"), [Value(name, p.shape, float32, kind="variable")],
                        [Value(copy_name, p.shape, v.dtype, kind="variable")], {"dtype": v.dtype})
            self.refreshes.append((p, entry, cast(node, [p._data], [entry.array])))
            self.fused.append((p, entry))
            fused_names.add(name)
        self.plain = ([params[n] for n in ctx.trainable if n not in fused_names]
                      if ctx.optimizers and graph.grads else [])

    def stale(self) -> None:
        """Mark every copy stale (the parameters were written behind the copies' backs)."""
        for _, entry, _ in self.refreshes:
            entry.version = -1

    def refresh(self) -> None:
        """Make every stale copy equal to its parameter rounded to the copy's dtype."""
        for p, entry, steps in self.refreshes:
            if entry.version != p.version:
                for fn, args in steps:
                    fn(*args)
                entry.version = p.version

    def stepped(self) -> None:
        """After a step: parameters written by plain updates are ahead of their copies; the
        fused ones wrote their copy of this dtype too (copies of other dtypes fall behind)."""
        for p in self.plain:
            p.written()
        for p, entry in self.fused:
            p.written()
            entry.version = p.version


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
                if isinstance(p, Parameter):
                    p.written()
        return assign

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            lines.append(f"  ({name}): " + repr(m).replace("\n", "\n  "))
        return lines[0] + ("\n" + "\n".join(lines[1:]) + "\n)" if len(lines) > 1 else ")")

    def extra_repr(self) -> str:
        return ""
