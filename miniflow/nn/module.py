"""``nn.Module`` and ``nn.Parameter``, following PyTorch's API (``torch.nn.Module``).

Attributes that are Parameters or Modules are registered in assignment order, which gives
PyTorch's parameter names (``0.weight``, ``encoder.bias``). Buffers (:meth:`Module.register_buffer`:
state that is not trained, such as batch norm's ``running_mean``) are registered the same way.
Parameters and buffers hold their data in backend arrays that nn.Graph binds as graph variables,
so a graph step updates them in place (the optimizer the parameters, a training-mode batch norm
its running statistics). ``state_dict()`` lists, as PyTorch does, each module's parameters, then
its persistent buffers, then its children's, depth first, under every name that reaches them
(a module or parameter assigned to two attributes is listed under both, as in PyTorch;
``parameters()`` yields it once).

``Module.training`` (set for a whole tree by :meth:`Module.train` / :meth:`Module.eval`) is the
mode layers read when traced; every change of any module's mode is counted
(:func:`mode_changes`), so an nn.Graph recompiles at its next call after one.

Under AMP with fused updates a parameter also owns half copies of its value (one per half dtype:
``Parameter.half_copy``), which the fused updates write and the next step's matmuls read; a
version counter says when something else wrote the parameter (:class:`HalfCopies` then refreshes
the copy before the next step).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..dtype import as_dtype, bfloat16, float32
from ..ir import Node, Value
from ..ops import get_op
from ..passes.fuse_model_update_cast import FusedUpdateState
from ..runtime.backend import get_backend
from ..tensor import Tensor

__all__ = ["Module", "Parameter", "HalfCopies", "replaced_count", "traced_graph_changed",
           "mode_changes"]


class Parameter(Tensor):
    """A trainable eager Tensor owned by a Module (float32 master weights by default).

    ``requires_grad`` (True by default; ``p.requires_grad = False`` or ``p.requires_grad_(False)``
    freezes it, as in PyTorch): a frozen parameter gets no gradient op and no update in a
    compiled graph, even when an optimizer lists it; a change recompiles the graphs at their
    next call (:func:`replaced_count`).

    ``version`` counts the writes of its value that its half copies did not follow (loading a
    state dict, an update that wrote no copy): :class:`HalfCopies` compares it with the version
    each copy was made from."""

    def __init__(self, data):
        arr = np.asarray(data)
        as_dtype(arr.dtype)
        super().__init__(get_backend().from_numpy(arr))
        self._requires_grad = True
        self.version = 0
        self._half_copies = {}

    @property
    def requires_grad(self) -> bool:
        """Whether a graph differentiates and updates this parameter (see the class docstring)."""
        d = self.__dict__
        return d.get("_requires_grad", d.get("requires_grad", True))  # (pickles before the property)

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"requires_grad must be True or False, got {value!r}")
        if value != self.requires_grad:
            traced_graph_changed()
        self._requires_grad = value

    def requires_grad_(self, requires_grad: bool = True) -> "Parameter":
        """Set :attr:`requires_grad` in place and return self (``torch.Tensor.requires_grad_``).

        Raises:
            TypeError: ``requires_grad`` is not a bool.
        """
        self.requires_grad = requires_grad
        return self

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
    """The half weight copies of one compiled graph (``FusedUpdateState.half_copies`` of the
    ``fuse_model_update_cast`` pass): binds each copy variable to its parameter's copy, makes a
    stale copy equal to the parameter rounded (:meth:`refresh`, before a step: one ``cast``
    kernel) and, after a step, records what the step wrote (:meth:`stepped`): the fused updates
    wrote parameters and copies together, the other updates only parameters.

    Args:
        graph: the compiled IR graph (its copy variables get their data here).
        ctx: its compile context (the ``FusedUpdateState``, and the settings' ``trainable`` and
            ``optimizers``: whether the graph updates parameters).
        params: variable name -> Parameter of the graph's modules.
        backend: the backend the plan runs on (the cast kernel).
    """

    def __init__(self, graph, ctx, params: dict, backend):
        self.fused, self.refreshes = [], []
        fused_names = set()
        cast = backend.builder_for(get_op("cast"))
        fused = ctx.state.get(FusedUpdateState)
        for name, copy_name in (fused.half_copies if fused is not None else ()):
            p, v = params[name], graph.variables[copy_name]
            entry = p.half_copy(v.dtype)
            graph.variable_data[copy_name] = entry.array
            node = Node(get_op("cast"), [Value(name, p.shape, float32, kind="variable")],
                        [Value(copy_name, p.shape, v.dtype, kind="variable")], {"dtype": v.dtype})
            self.refreshes.append((p, entry, cast(node, [p._data], [entry.array])))
            self.fused.append((p, entry))
            fused_names.add(name)
        settings = ctx.settings
        self.plain = ([params[n] for n in settings.trainable if n not in fused_names]
                      if settings.optimizers and graph.grads else [])

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
    """How many times a registered Parameter, buffer or sub-Module of any Module was replaced or
    removed, or a setting that changes what a module traces changed
    (:func:`traced_graph_changed`); nn.Graph compares it between calls and recompiles when it
    changed."""
    return _REPLACED[0]


def traced_graph_changed() -> None:
    """Record that compiled graphs may hold a trace that no longer holds (a replaced attribute,
    ``Parameter.requires_grad``, ``BatchNorm2d.track_running_stats``): they recompile at their
    next call."""
    _REPLACED[0] += 1


_MODES = [0]


def mode_changes() -> int:
    """How many times any Module's ``training`` flag changed (``train()`` / ``eval()`` or an
    assignment); nn.Graph compares it between calls and recompiles when it changed."""
    return _MODES[0]


def _as_buffer(name: str, value):
    """``value`` (None, a Tensor or array-like) as a buffer: None or an eager Tensor that owns
    its backend array."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        if value.is_lazy:
            raise TypeError(f"register_buffer: {name!r} is a lazy tensor of a trace; buffers "
                            f"hold data (create them in __init__)")
        return value
    arr = np.asarray(value)
    as_dtype(arr.dtype)
    return Tensor(get_backend().from_numpy(arr))


class Module:
    """Base class of layers and models: override ``forward``; call the module to run it.

    Attributes:
        training: True (the default) in training mode, False in eval mode (:meth:`train`,
            :meth:`eval`); batch norm reads it.
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError("call super().__init__() before assigning attributes of a Module")
        if name == "training":
            if not isinstance(value, bool):
                raise TypeError(f"{type(self).__name__}.training must be True or False, got "
                                f"{value!r}")
            if value != self.training:
                _MODES[0] += 1  # compiled graphs traced the other mode: they recompile
            object.__setattr__(self, name, value)
            return
        if name in self._buffers and not isinstance(value, (Parameter, Module)):
            self._buffers[name] = _as_buffer(name, value)   # assigning a buffer replaces it
            traced_graph_changed()
            object.__setattr__(self, name, self._buffers[name])
            return
        if name in self._parameters or name in self._modules or name in self._buffers:
            traced_graph_changed()  # compiled graphs may hold the old one: they recompile
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers.pop(name, None)
        self._non_persistent.discard(name)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        if name in self._parameters or name in self._modules or name in self._buffers:
            traced_graph_changed()
            self._parameters.pop(name, None)
            self._modules.pop(name, None)
            self._buffers.pop(name, None)
            self._non_persistent.discard(name)
        object.__delattr__(self, name)

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """Add a buffer: state of the module that is not a parameter (not trained), e.g. batch
        norm's ``running_mean``. It is reachable as ``self.<name>`` (an eager Tensor, or None),
        bound as a graph variable when traced (so graph steps may update it in place), listed by
        :meth:`named_buffers` and, when ``persistent``, in :meth:`state_dict`.

        Args:
            tensor: a Tensor, an array-like (copied into the backend's memory) or None.

        Raises:
            KeyError: ``name`` is already a parameter or sub-module, or is empty or dotted.
            TypeError: an unsupported dtype, or a lazy tensor.
        """
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"register_buffer: the name must be a non-empty string without '.', "
                           f"got {name!r}")
        if name in self._parameters or name in self._modules:
            raise KeyError(f"register_buffer: {name!r} is already a "
                           f"{'parameter' if name in self._parameters else 'sub-module'} of "
                           f"{type(self).__name__}")
        if name in self._buffers:
            traced_graph_changed()
        self._buffers[name] = _as_buffer(name, tensor)
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)
        object.__setattr__(self, name, self._buffers[name])

    # ------------------------------------------------------------------ modes
    def train(self, mode: bool = True) -> "Module":
        """Set training mode (``mode=True``) or eval mode on this module and every sub-module;
        returns self. A graph that traced the other mode recompiles at its next call.

        Raises:
            TypeError: ``mode`` is not a bool.
        """
        if not isinstance(mode, bool):
            raise TypeError(f"train: mode must be True or False, got {mode!r}")
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> "Module":
        """Eval mode: ``train(False)``; returns self."""
        return self.train(False)

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

    def named_modules(self, prefix: str = ""):
        """Yield ``(name, module)`` for this module (name ``prefix``) and every sub-module, depth
        first, each module once."""
        seen = set()

        def walk(m, name):
            if id(m) in seen:
                return
            seen.add(id(m))
            yield name, m
            for child_name, child in m._modules.items():
                yield from walk(child, f"{name}.{child_name}" if name else child_name)
        yield from walk(self, prefix)

    def modules(self):
        """Yield this module and every sub-module, depth first, each once."""
        for _, m in self.named_modules():
            yield m

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

    def named_buffers(self, prefix: str = ""):
        """Yield ``(name, buffer)`` for every buffer that is not None (persistent or not), depth
        first, each once."""
        seen = set()
        for name, m in self.named_modules(prefix.rstrip(".")):
            for key, b in m._buffers.items():
                if b is not None and id(b) not in seen:
                    seen.add(id(b))
                    yield (f"{name}.{key}" if name else key), b

    def buffers(self):
        """Yield every buffer (not None) once."""
        for _, b in self.named_buffers():
            yield b

    # ------------------------------------------------------------------ state
    def _state(self, prefix: str = ""):
        """``(name, tensor, module)`` of the state dict: per module its parameters, then its
        persistent buffers, then its children's (PyTorch's order, ``Module.state_dict``'s
        recursion); a module or tensor reachable under two names is listed under both, as
        PyTorch lists it."""
        own = list(self._parameters.items()) + [(k, b) for k, b in self._buffers.items()
                                                if k not in self._non_persistent]
        for key, t in own:
            if t is not None:
                yield prefix + key, t, self
        for name, m in self._modules.items():
            yield from m._state(f"{prefix}{name}.")

    def _optional_state(self) -> tuple:
        """Names of this module's persistent buffers that a loaded state dict may lack (they
        keep their value): buffers older checkpoints do not have, such as batch norm's
        ``num_batches_tracked`` (PyTorch's ``_BatchNorm._load_from_state_dict``); none by
        default."""
        return ()

    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Name -> NumPy copy of every parameter and persistent buffer, in PyTorch's order."""
        return OrderedDict((n, t.numpy()) for n, t, _ in self._state())

    def load_state_dict(self, state_dict, strict: bool = True) -> None:
        """Copy values into the parameters and persistent buffers in place (bound graphs see
        them).

        Values may be NumPy arrays or Tensors (a PyTorch state dict converted with
        ``{k: v.numpy() for k, v in sd.items()}`` loads: same names and shapes). As PyTorch's
        ``Tensor.copy_``, a value of another real dtype is cast to the model's (float64 into a
        float32 parameter rounds to nearest; beyond float16's range gives inf, as in torch);
        into an integer tensor (a counter) only whole numbers in its range. A module's buffer that older checkpoints lack (batch norm's
        ``num_batches_tracked``) keeps its value when missing, under ``strict=True`` too
        (PyTorch's ``_BatchNorm._load_from_state_dict``). Everything is checked before anything
        is copied.

        Raises:
            KeyError: missing or unexpected names (strict), listing them.
            ValueError: a shape differs from the model's, naming it.
            TypeError: a value that cannot be cast to the model's dtype (complex, strings,
                objects; a fraction or an out-of-range value into an integer tensor), naming it.
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
            raise TypeError(f"load_state_dict: expected a dict of name -> array (a "
                            f"state_dict()), got {type(state_dict).__name__}")
        own, optional = {}, set()
        for name, t, m in self._state():
            own[name] = t
            if name.rsplit(".", 1)[-1] in m._optional_state():
                optional.add(name)
        missing = sorted(set(own) - set(state_dict) - optional)
        unexpected = sorted(set(state_dict) - set(own))
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        checked = []  # check everything first: a failed load changes nothing
        for name, value in state_dict.items():
            if name not in own:
                continue
            p = own[name]
            arr = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
            if arr.shape != tuple(p.shape):
                raise ValueError(f"load_state_dict: {name!r} is {p.dtype.short}{list(p.shape)} in "
                                 f"the model but {arr.dtype}{list(arr.shape)} in the state dict")
            checked.append((p, _cast_for_load(name, arr, p.dtype)))

        def assign():
            backend = get_backend()
            for p, arr in checked:
                backend.copy_in(p._data, arr)
                if isinstance(p, Parameter):
                    p.written()
        return assign

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Set ``requires_grad`` of every parameter (``torch.nn.Module.requires_grad_``: freeze
        a backbone with ``backbone.requires_grad_(False)``); returns self.

        Raises:
            TypeError: ``requires_grad`` is not a bool (nothing is changed).
        """
        if not isinstance(requires_grad, bool):
            raise TypeError(f"requires_grad_: requires_grad must be True or False, got "
                            f"{requires_grad!r}")
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            lines.append(f"  ({name}): " + repr(m).replace("\n", "\n  "))
        return lines[0] + ("\n" + "\n".join(lines[1:]) + "\n)" if len(lines) > 1 else ")")

    def extra_repr(self) -> str:
        return ""


def _cast_for_load(name: str, arr: np.ndarray, dtype) -> np.ndarray:
    """``arr`` as miniflow ``dtype`` for :meth:`Module.load_state_dict` (``torch.Tensor.copy_``'s
    cast, refusing what would change the values: see its docstring).

    Raises:
        TypeError: a complex, object or string array; into an integer tensor, a value that is
            not a whole number in its range (naming the first one).
    """
    if arr.dtype == dtype.np:
        return arr
    real = arr.dtype.kind in "biuf" or arr.dtype == bfloat16.np
    if not real:
        raise TypeError(f"load_state_dict: {name!r} has dtype {arr.dtype} in the state dict, "
                        f"which does not cast to the model's {dtype.name} (real numbers only)")
    if dtype.is_float:
        with np.errstate(over="ignore"):  # float64 beyond float16's range: inf, as torch
            return arr.astype(dtype.np)
    info = np.iinfo(dtype.np)
    with np.errstate(invalid="ignore"):
        a = arr.astype(np.float64) if arr.dtype == bfloat16.np else arr
        bad = ~((a == np.trunc(a)) & (a >= info.min) & (a <= info.max)) \
            if a.dtype.kind == "f" else (a < info.min) | (a > info.max)
    if np.any(bad):
        first = arr[np.unravel_index(int(np.flatnonzero(bad)[0]), arr.shape)].item()
        raise TypeError(f"load_state_dict: {name!r} holds {first!r}, which the model's "
                        f"{dtype.name} cannot hold (an integer tensor takes whole numbers in "
                        f"[{info.min}, {info.max}])")
    return a.astype(dtype.np)
