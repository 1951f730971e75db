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
mode layers read when traced. Every change of any module that makes a compiled graph's trace
wrong (a replaced parameter, buffer or sub-module, a flipped ``training``, ``requires_grad`` or
``track_running_stats``) bumps :attr:`Module.version`, which the compile driver
(``miniflow.compiler.driver``: ``nn.Graph``) compares at every call. Any other attribute assigned
on a module a graph traced (``dropout.p``, ``layer_norm.eps``) makes that graph recompile
(:meth:`Module.compiled_into`).

Under AMP with fused updates a parameter also owns half copies of its value
(``Parameter.half_copies``, filled and kept fresh by ``miniflow.compiler.half_copies``);
``Parameter.version`` counts the writes of its value that those copies did not follow.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from ..checks import boolean
from ..dtype import as_dtype, is_bfloat16
from ..runtime.backend import get_backend
from ..tensor import Tensor, as_numpy, to_args
from ..trace import current_tracer

__all__ = ["IncompatibleKeys", "Module", "ModuleVersion", "Parameter", "StateDictKeysError",
           "StateDictShapeError"]


class IncompatibleKeys(NamedTuple):
    """What :meth:`Module.load_state_dict` returns (PyTorch's ``_IncompatibleKeys``):
    ``missing, unexpected = model.load_state_dict(sd, strict=False)``; both sorted lists of
    state-dict names."""

    missing_keys: list
    unexpected_keys: list


class StateDictShapeError(RuntimeError, ValueError):
    """:meth:`Module.load_state_dict` found a value of another shape than the model's: a
    RuntimeError as PyTorch raises ("size mismatch"), and a ValueError as miniflow raised
    before."""


class StateDictKeysError(RuntimeError, KeyError):
    """:meth:`Module.load_state_dict` with ``strict=True`` found missing or unexpected names:
    a RuntimeError as PyTorch raises, and a KeyError as miniflow raised before."""

    def __str__(self) -> str:   # the message as written, not KeyError's quoted repr
        return str(self.args[0]) if self.args else ""


class ModuleVersion(NamedTuple):
    """:attr:`Module.version`: how many changes of any module a compiled graph has to follow.

    Fields:
        traced: changes of what modules trace: a registered Parameter, buffer or sub-Module
            replaced or removed, ``Parameter.requires_grad`` or
            ``BatchNorm.track_running_stats`` flipped (:meth:`Module.trace_changed`). A graph
            drops every plan after one.
        modes: flips of a module's ``training`` flag (``train()`` / ``eval()`` or an
            assignment). A graph keys its plans by its modules' modes, so it compiles a plan per
            mode seen and keeps both.
    """

    traced: int = 0
    modes: int = 0


class Parameter(Tensor):
    """A trainable eager Tensor owned by a Module (float32 master weights by default).

    ``requires_grad`` (True by default; ``Parameter(data, requires_grad=False)``,
    ``p.requires_grad = False`` or ``p.requires_grad_(False)`` freezes it, as in PyTorch): a
    frozen parameter gets no gradient op and no update in a compiled graph, even when an
    optimizer lists it; a change recompiles the graphs at their next call (:attr:`Module.version`).

    ``version`` counts the writes of its value that its half copies did not follow (loading a
    state dict, an update that wrote no copy): ``miniflow.compiler.half_copies`` compares it with
    the version each copy was made from. ``half_copies``: dtype name -> the compile driver's
    copy of the value in that half dtype (empty until an AMP graph with fused updates
    compiles).

    Raises:
        RuntimeError: int64 data with ``requires_grad=True`` (PyTorch's message)."""

    def __init__(self, data, requires_grad: bool = True):
        boolean("Parameter", "requires_grad", requires_grad)
        arr = np.asarray(data)
        _check_grad_dtype(requires_grad, as_dtype(arr.dtype))
        super().__init__(get_backend().from_numpy(arr))
        self._requires_grad = requires_grad
        self.version = 0
        self.half_copies = {}

    @property
    def requires_grad(self) -> bool:
        """Whether a graph differentiates and updates this parameter (see the class docstring)."""
        d = self.__dict__
        return d.get("_requires_grad", d.get("requires_grad", True))  # (pickles before the property)

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        boolean("", "requires_grad", value)
        _check_grad_dtype(value, self.dtype)
        if value != self.requires_grad:
            Module.trace_changed()
        self._requires_grad = value

    def requires_grad_(self, requires_grad: bool = True) -> "Parameter":
        """Set :attr:`requires_grad` in place and return self (``torch.Tensor.requires_grad_``).

        Raises:
            TypeError: ``requires_grad`` is not a bool. RuntimeError: True for a parameter whose
            dtype is not floating (PyTorch's message).
        """
        self.requires_grad = requires_grad
        return self

    def written(self) -> None:
        """Record a write of the value that the half copies did not follow."""
        self.version = getattr(self, "version", 0) + 1


def _check_grad_dtype(requires_grad: bool, dtype) -> None:
    """Raises RuntimeError (PyTorch's message) where a parameter of a dtype that is not
    floating (int64) would require grad."""
    if requires_grad and not dtype.is_float:
        raise RuntimeError(f"Only Tensors of floating point and complex dtype can require "
                           f"gradients (a {dtype.name} parameter): pass requires_grad=False, "
                           f"or keep the values as a buffer (register_buffer)")


def _as_buffer(owner: str, name: str, value):
    """``value`` (None, a Tensor or array-like) as buffer ``name`` of module class ``owner``:
    None or an eager Tensor that owns its backend array.

    Raises:
        TypeError: a lazy tensor (``self.avg = self.avg * 0.9 + ...`` in a ``forward`` that a
            graph traces, which PyTorch runs as a buffer update): naming the buffer and how to
            update it instead."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        if value.is_lazy:
            raise TypeError(
                f"{owner}: buffer {name!r} cannot take a value computed inside nn.Graph.build "
                f"(lazy tensor %{value._value.name}): a graph writes no new value into a buffer "
                f"(PyTorch's self.{name} = ... in forward; only ops such as batch norm update "
                f"their statistics in place). Return the value from build and copy it in after "
                f"the call: module.load_state_dict({{{name!r}: value}}, strict=False) (in "
                f"place, no recompile)")
        return value
    arr = np.asarray(value)
    as_dtype(arr.dtype)
    return Tensor(get_backend().from_numpy(arr))


_DTYPE = ("a module's dtype is its parameters' at creation: make the layers with dtype= "
          "(miniflow.float16 ...), or train in float32 with AMP (graph.config.enable_amp)")
_DEVICE = ("there are no devices per module: the backend (cpu or cuda) is the process's, "
           "chosen before models are made (miniflow.set_backend, MINIFLOW_BACKEND)")
_NOT_IN_MODULE = {"zero_grad": "gradients live in the nn.Graph that trains the module: each call "
                               "computes them anew, so there is nothing to zero",
                  "cuda": _DEVICE, "cpu": _DEVICE,
                  "half": _DTYPE, "float": _DTYPE, "double": _DTYPE, "bfloat16": _DTYPE}
"""PyTorch's ``Module`` methods miniflow has not, and why (``Module.__getattr__``)."""


class Module:
    """Base class of layers and models: override ``forward``; call the module to run it.

    Attributes:
        training: True (the default) in training mode, False in eval mode (:meth:`train`,
            :meth:`eval`); batch norm reads it.
        version: class-wide (one for all modules, read as ``Module.version``): a
            :class:`ModuleVersion` bumped by every change of any module that a compiled graph
            has to follow; nn.Graph compares it between calls.
    """

    version = ModuleVersion()

    @staticmethod
    def trace_changed() -> None:
        """Record that compiled graphs may hold a trace that no longer holds (a replaced
        attribute, ``Parameter.requires_grad``, ``BatchNorm2d.track_running_stats``): bumps
        ``Module.version.traced``, so every graph recompiles at its next call."""
        Module.version = Module.version._replace(traced=Module.version.traced + 1)

    @staticmethod
    def compiled_into(modules, graph) -> None:
        """Record that ``graph`` traced ``modules``: a later assignment of any attribute of one
        of them (``dropout.p = 0.5``, ``ln.eps``, a plain attribute a custom ``forward`` reads)
        calls ``graph.module_changed()``, so the graph recompiles at its next call (as
        ``torch.compile`` recompiles; eager PyTorch reads the new value). ``training`` is
        excepted: graphs key their plans by the modes (:class:`ModuleVersion`). Assignments
        while a trace runs do not count (the trace itself reads them)."""
        for m in modules:
            _COMPILED_INTO.setdefault(m, weakref.WeakSet()).add(graph)

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __getattr__(self, name):
        """Only for an attribute there is not (the others are found first): PyTorch's methods
        miniflow has not say why and what instead, in the ``AttributeError``."""
        why = _NOT_IN_MODULE.get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}"
                             + (f": {why}" if why else ""))

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError("call super().__init__() before assigning attributes of a Module")
        if name == "training":
            boolean("", f"{type(self).__name__}.training", value)
            if value != self.training:  # compiled graphs traced the other mode: they recompile
                Module.version = Module.version._replace(modes=Module.version.modes + 1)
            object.__setattr__(self, name, value)
            return
        if name in self._parameters and not isinstance(value, (Parameter, type(None))):
            raise TypeError(f"cannot assign {_kind(value)} as parameter {name!r} of "
                            f"{type(self).__name__} (nn.Parameter or None expected; wrap a new "
                            f"value as nn.Parameter(...) or copy it in with load_state_dict)")
        if name in self._modules and not isinstance(value, (Module, type(None))):
            raise TypeError(f"cannot assign {_kind(value)} as child module {name!r} of "
                            f"{type(self).__name__} (nn.Module or None expected)")
        graphs = _COMPILED_INTO.get(self)
        if graphs and current_tracer() is None \
                and not same_value(self.__dict__.get(name, _NONE), value):
            for graph in list(graphs):   # graphs that traced this module recompile
                graph.module_changed()
        if name in self._buffers and not isinstance(value, (Parameter, Module)):
            self._buffers[name] = _as_buffer(type(self).__name__, name, value)  # replaces it
            Module.trace_changed()
            object.__setattr__(self, name, self._buffers[name])
            return
        if name in self._parameters and value is None:  # PyTorch's Module.__setattr__ too:
            Module.trace_changed()   # the name stays registered; the lists skip it
            self._parameters[name] = None
            object.__setattr__(self, name, None)
            return
        if name in self._parameters or name in self._modules or name in self._buffers:
            Module.trace_changed()  # compiled graphs may hold the old one: they recompile
        if isinstance(value, Parameter) and name in self._parameters:
            self._parameters[name] = value      # a replacement keeps its place (PyTorch's)
        elif isinstance(value, Module) and name in self._modules:
            self._modules[name] = value
        else:
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
            Module.trace_changed()
            self._parameters.pop(name, None)
            self._modules.pop(name, None)
            self._buffers.pop(name, None)
            self._non_persistent.discard(name)
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param) -> None:
        """Add ``param`` as the parameter ``name``, as ``self.<name> = param`` does, with PyTorch's
        checks (``torch.nn.Module.register_parameter``); ``None`` registers the name with no
        parameter (the lists and the state dict skip it).

        Raises:
            TypeError: ``param`` is neither a Parameter nor None, or ``name`` is not a str.
            KeyError: ``name`` is empty, contains ``"."`` or is already an attribute that is not
                a parameter (a method, a buffer, a child module).
        """
        self._check_new_name("register_parameter", "parameter", name, self._parameters)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"{type(self).__name__}.register_parameter: cannot assign "
                            f"{_kind(param)} as parameter {name!r} (nn.Parameter or None "
                            f"expected: wrap it as nn.Parameter(...))")
        self._parameters.setdefault(name, None)    # registered: assigning keeps it, None too
        setattr(self, name, param)

    def _check_new_name(self, method: str, noun: str, name, own: dict) -> None:
        """PyTorch's checks of a name ``method`` adds a ``noun`` (``"module"``, ``"parameter"``)
        under, ``own`` the dict it goes into: a str (TypeError), non-empty and without ``"."``
        (it becomes a state-dict key or prefix; KeyError), not already an attribute but one of
        ``own`` (KeyError; ``version`` is free: the class-wide ``Module.version`` is only read
        through the class)."""
        where = f"{type(self).__name__}.{method}"
        if not isinstance(name, str):
            raise TypeError(f"{where}: the {noun} name must be a str, got {type(name).__name__} "
                            f"{name!r}")
        if not name or "." in name:
            raise KeyError(f"{where}: the {noun} name must be non-empty and contain no '.' (it "
                           f"becomes a state-dict key{' prefix' if noun == 'module' else ''}), "
                           f"got {name!r}")
        if hasattr(self, name) and name not in own and name != "version":
            raise KeyError(f"{where}: attribute {name!r} already exists (choose another name "
                           f"for the {'child module' if noun == 'module' else noun})")

    def add_module(self, name: str, module) -> None:
        """Add ``module`` as the child ``name``, as ``self.<name> = module`` does, with PyTorch's
        checks (``torch.nn.Module.add_module``): the containers ``ModuleList`` and ``ModuleDict``
        add their children through it. ``None`` sets the attribute to None and registers no child
        (as assigning None does here; PyTorch keeps a None entry).

        Raises:
            TypeError: ``module`` is neither a Module nor None, or ``name`` is not a str.
            KeyError: ``name`` is empty, contains ``"."`` (it would make state-dict keys
                ambiguous) or is already an attribute that is not a child module (``training``,
                a method, a parameter or buffer). ``version`` is free, as in PyTorch: the
                class-wide ``Module.version`` is only read through the class.
        """
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__}.add_module: {_kind(module)} is not a Module "
                            f"(child {name!r})")
        self._check_new_name("add_module", "module", name, self._modules)
        setattr(self, name, module)

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
        if name not in self._buffers and name in self.__dict__:
            raise KeyError(f"register_buffer: attribute {name!r} already exists on "
                           f"{type(self).__name__} (PyTorch's \"attribute '{name}' already "
                           f"exists\"): delete it first, or pick another name")
        if name in self._buffers:
            Module.trace_changed()
        self._buffers[name] = _as_buffer(type(self).__name__, name, tensor)
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
        boolean("train", "mode", mode)
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

    def apply(self, fn) -> "Module":
        """Call ``fn(module)`` on every sub-module, then on this one, and return this module
        (``torch.nn.Module.apply``, as nanoGPT's ``self.apply(self._init_weights)``): depth
        first, children in assignment order before their parent; a child held under two names
        of one module is visited once, as PyTorch's ``children()`` yields it once. ``fn``'s
        result is ignored.
        """
        seen = set()
        for child in self.children():
            if id(child) not in seen:
                seen.add(id(child))
                child.apply(fn)
        fn(self)
        return self

    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True):
        """Yield ``(name, module)`` for this module (name ``prefix``) and every sub-module, depth
        first, each module once (``torch.nn.Module.named_modules``: ``memo``, a set of modules
        already yielded; ``remove_duplicate=False`` yields a module shared by two names under
        each)."""
        memo = set() if memo is None else memo

        def walk(m, name):
            if m in memo:
                return
            if remove_duplicate:
                memo.add(m)
            yield name, m
            for child_name, child in m._modules.items():
                yield from walk(child, f"{name}.{child_name}" if name else child_name)
        yield from walk(self, prefix)

    def modules(self):
        """Yield this module and every sub-module, depth first, each once."""
        for _, m in self.named_modules():
            yield m

    def get_submodule(self, target: str) -> "Module":
        """The sub-module at dotted path ``target`` (``"encoder.layers.0"``; ``""``: this module),
        as ``torch.nn.Module.get_submodule``.

        Raises:
            AttributeError: a name on the path that is not a sub-module (PyTorch's message)."""
        module = self
        for item in target.split(".") if target else ():
            child = module._modules.get(item)
            if child is None:
                raise AttributeError(f"{type(module).__name__} has no attribute `{item}`")
            module = child
        return module

    def _named_members(self, members, prefix: str, recurse: bool, remove_duplicate: bool):
        """``(name, member)`` of ``members(module)`` (a dict) over this module, or with
        ``recurse`` over :meth:`named_modules`, None skipped, each member once unless
        ``remove_duplicate`` is False (``torch.nn.Module._named_members``)."""
        prefix = prefix.rstrip(".")
        modules = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                   if recurse else [(prefix, self)])
        seen = set()
        for name, m in modules:
            for key, v in members(m).items():
                if v is None or (remove_duplicate and id(v) in seen):
                    continue
                seen.add(id(v))
                yield (f"{name}.{key}" if name else key), v

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True):
        """Yield ``(name, Parameter)`` pairs, depth first, each parameter once; a ``prefix`` is
        joined with a dot (``prefix="model"``: ``model.0.weight``); ``recurse=False``: this
        module's own (``torch.nn.Module.named_parameters``)."""
        return self._named_members(lambda m: m._parameters, prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True):
        """Yield every Parameter once (``recurse=False``: this module's own)."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True):
        """Yield ``(name, buffer)`` for every buffer that is not None (persistent or not), depth
        first, each once (``torch.nn.Module.named_buffers``)."""
        return self._named_members(lambda m: m._buffers, prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True):
        """Yield every buffer (not None) once (``recurse=False``: this module's own)."""
        for _, b in self.named_buffers(recurse=recurse):
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

    def state_dict(self, *, destination=None, prefix: str = "",
                   keep_vars: bool = False) -> "OrderedDict[str, np.ndarray]":
        """Name -> NumPy copy of every parameter and persistent buffer, in PyTorch's order.

        As PyTorch's ``Module.state_dict``: ``prefix`` starts every name, ``destination`` (a
        dict) is filled and returned instead of a new ``OrderedDict``, and ``keep_vars=True``
        gives the parameter and buffer tensors themselves (shared with the module and its graphs)
        instead of copies."""
        out = OrderedDict() if destination is None else destination
        for n, t, _ in self._state():
            out[prefix + n] = t if keep_vars else t.numpy()
        return out

    def load_state_dict(self, state_dict, strict: bool = True,
                        assign: bool = False) -> IncompatibleKeys:
        """Copy values into the parameters and persistent buffers in place (bound graphs see
        them). ``assign`` (PyTorch >= 2.1) is taken at its default, False: PyTorch's
        ``assign=True``, which makes the state dict's tensors the parameters, is refused.

        Values may be NumPy arrays or Tensors (a PyTorch state dict converted with
        ``{k: v.numpy() for k, v in sd.items()}`` loads: same names and shapes; torch tensors
        load as they are, parameters that require grad too: ``dict(model.named_parameters())``
        or ``state_dict(keep_vars=True)``, as PyTorch's ``copy_`` under ``no_grad``). As PyTorch's
        ``Tensor.copy_``, a value of another real dtype is cast to the model's (float64 into a
        float32 parameter rounds to nearest; beyond float16's range gives inf, as in torch);
        into an integer tensor (a counter) only whole numbers in its range. A module's buffer that older checkpoints lack (batch norm's
        ``num_batches_tracked``) keeps its value when missing, under ``strict=True`` too
        (PyTorch's ``_BatchNorm._load_from_state_dict``). Everything is checked before anything
        is copied, in the model's order (of two names of one tied parameter the later in the
        model wins, as in PyTorch, whatever the dict's order).

        Returns:
            :class:`IncompatibleKeys` ``(missing_keys, unexpected_keys)``, as PyTorch's
            ``_IncompatibleKeys`` (both empty after a strict load): the missing in the model's
            order, the unexpected in the dict's.

        Raises:
            StateDictKeysError: (a RuntimeError, as PyTorch raises, and a KeyError) missing or
                unexpected names (strict), listing them; where no name matches but the
                model's are under one entry (a training checkpoint's ``'model'``) or behind one
                prefix (``_orig_mod.``), saying what to load.
            StateDictShapeError: (a RuntimeError, as PyTorch raises, and a ValueError) a shape
                differs from the model's, naming it; with ``strict=False`` too, as PyTorch.
            TypeError: a value that cannot be cast to the model's dtype (complex, strings,
                objects; a fraction or an out-of-range value into an integer tensor), naming it.
            ValueError: ``assign`` not False.
        """
        if assign is not False:
            raise ValueError(f"load_state_dict: assign={assign!r} is not supported: miniflow "
                             "copies the values into the parameters in place, where compiled "
                             "graphs see them (PyTorch's assign=False); leave assign out")
        return self.prepare_load_state_dict(state_dict, strict)()

    def prepare_load_state_dict(self, state_dict, strict: bool = True):
        """Check ``state_dict`` as :meth:`load_state_dict` does and return a function of no
        arguments that copies it in and returns :class:`IncompatibleKeys` (a caller restoring
        several objects checks them all before it assigns any: ``miniflow.checkpoint.restore``).

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
        missing = [n for n in own if n not in state_dict and n not in optional]   # PyTorch's
        unexpected = [n for n in state_dict if n not in own]        # orders: model, dict
        if strict and (missing or unexpected):
            raise StateDictKeysError(f"load_state_dict: missing keys {missing}, unexpected keys "
                                     f"{unexpected}" + _keys_hint(state_dict, missing, unexpected,
                                                                  list(own)))
        checked = []  # check everything first: a failed load changes nothing
        for name, p in own.items():     # in the model's order: of tied names the last one wins
            if name not in state_dict:
                continue
            arr = as_numpy(state_dict[name])
            if arr.shape != tuple(p.shape):
                raise StateDictShapeError(
                    f"load_state_dict: {name!r} is {p.dtype.short}{list(p.shape)} in the model "
                    f"but {arr.dtype}{list(arr.shape)} in the state dict")
            checked.append((p, _cast_for_load(name, arr, p.dtype)))

        def assign():
            backend = get_backend()
            for p, arr in checked:
                backend.copy_in(p._data, arr)
                if isinstance(p, Parameter):
                    p.written()
            return IncompatibleKeys(missing, unexpected)
        return assign

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Set ``requires_grad`` of every parameter (``torch.nn.Module.requires_grad_``: freeze
        a backbone with ``backbone.requires_grad_(False)``); returns self.

        Raises:
            TypeError: ``requires_grad`` is not a bool (nothing is changed).
        """
        boolean("requires_grad_", "requires_grad", requires_grad)
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def to(self, *args, **kwargs) -> "Module":
        """``torch.nn.Module.to`` where it changes nothing: a device naming the process's
        backend (``model.to(device)``; miniflow has no per-tensor device) and a dtype that every
        floating parameter and buffer has already; returns this module. Arguments as
        ``Tensor.to`` (``miniflow.tensor.to_args``).

        Raises:
            ValueError: a device other than the process's backend (naming it).
            TypeError: a dtype that a floating parameter or buffer does not have (naming it): a
                module's dtype is set when it is made (the layers' ``dtype=``; mixed precision
                is the AMP pass, ``config.enable_amp``); arguments ``to`` does not take.
        """
        owner = f"{type(self).__name__}.to"
        dtype, _ = to_args(owner, args, kwargs)
        if dtype is not None:
            want = as_dtype(dtype)
            for name, t in (*self.named_parameters(), *self.named_buffers()):
                if t.dtype.is_float and t.dtype is not want:
                    raise TypeError(f"{owner}({want.name}): {name!r} is {t.dtype.name}, and "
                                    f"miniflow does not convert a module: make it in "
                                    f"{want.name} (the layers' dtype={want.name!r}), or use "
                                    f"mixed precision (config.enable_amp) for half types")
        return self

    def __repr__(self) -> str:
        """``Name(extra)`` for a one-line :meth:`extra_repr` and no children, else one line per
        line of it and per child, indented (``torch.nn.Module.__repr__``)."""
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + repr(m).replace("\n", "\n  ")
                       for name, m in self._modules.items()]
        if len(extra_lines) == 1 and not child_lines:
            return f"{type(self).__name__}({extra_lines[0]})"
        lines = extra_lines + child_lines
        body = "\n  " + "\n  ".join(lines) + "\n" if lines else ""
        return f"{type(self).__name__}({body})"

    def extra_repr(self) -> str:
        return ""


_COMPILED_INTO: "weakref.WeakKeyDictionary[Module, weakref.WeakSet]" = \
    weakref.WeakKeyDictionary()
"""Module -> the graphs that traced it (:meth:`Module.compiled_into`); both held weakly."""

_NONE = object()


def _keys_hint(state_dict: dict, missing: list, unexpected: list, own: list) -> str:
    """The end of a strict load's key error where no name matched but the model's state is in
    ``state_dict`` otherwise: under one entry (a training checkpoint: ``miniflow train
    --checkpoint``'s, nanoGPT's ``ckpt.pt``), with one prefix on every name (torch.compile's
    ``_orig_mod.``, DistributedDataParallel's ``module.``), or both (nanoGPT's ``ckpt.pt`` of a
    compiled model); or where every name of the model is a name of ``state_dict`` behind one
    prefix (a state dict of the original loaded into ``miniflow.compile``'s module, whose names
    start with ``_orig_mod.``); '' where none is so. ``missing`` are the model's names not in
    ``state_dict`` (optional buffers left out), ``own`` all its names."""
    if not missing or len(unexpected) != len(state_dict):
        return ""
    why = "(torch.compile's '_orig_mod.', DistributedDataParallel's 'module.')"
    for key, value in state_dict.items():
        if not isinstance(value, dict):
            continue
        entry = f"; this is a training checkpoint with the model's state dict under {key!r}"
        if set(missing) <= set(value):
            return f"{entry}: load_state_dict(checkpoint[{key!r}])"
        prefix = _common_prefix(value, missing)
        if prefix:
            return (f"{entry}, every name there starting with {prefix!r} {why}: load "
                    f"{{k.removeprefix({prefix!r}): v for k, v in checkpoint[{key!r}].items()}}")
    prefix = _common_prefix(state_dict, missing)
    if prefix:
        return (f"; every name starts with {prefix!r} {why}: load "
                f"{{k.removeprefix({prefix!r}): v for k, v in state_dict.items()}}")
    names = list(state_dict)
    prefix = all(isinstance(n, str) for n in names) and _common_prefix(own, names)
    if prefix:
        path = prefix[:-1]
        into = (f"model.{path}" if all(p.isidentifier() for p in path.split(".")) else
                f"model.get_submodule({path!r})")
        whose = (" (a miniflow.compile model: torch.compile's wrapper of the original)"
                 if prefix == "_orig_mod." else "")
        return (f"; every name of the model starts with {prefix!r}{whose} and the state "
                f"dict's do not: load it into that sub-module, {into}.load_state_dict(...)")
    return ""


def _common_prefix(names, missing: list) -> str | None:
    """The prefix every one of ``names`` starts with and ``missing`` (the model's names) are
    all found behind, or None."""
    first = missing[0]
    for name in names:
        prefix = name[:-len(first)] if isinstance(name, str) and name.endswith(first) else None
        if prefix and {prefix + n for n in missing} <= set(names) and \
                all(isinstance(n, str) and n.startswith(prefix) for n in names):
            return prefix
    return None


def same_value(old, new) -> bool:
    """Whether assigning ``new`` over ``old`` changes nothing a trace read: the same object, or
    an equal number or string of the same type (``d.p = 0.5`` twice recompiles once)."""
    return old is new or (type(old) is type(new) and isinstance(new, (bool, int, float, str))
                          and old == new)


def _kind(value) -> str:
    """How an error names an assigned value: its class, with dtype and shape for arrays."""
    if isinstance(value, (Tensor, np.ndarray)):
        dt = value.dtype.name if isinstance(value, Tensor) else value.dtype
        return f"a {type(value).__name__} of {dt}{list(value.shape)}"
    return f"a {type(value).__name__}"


def _cast_for_load(name: str, arr: np.ndarray, dtype) -> np.ndarray:
    """``arr`` as miniflow ``dtype`` for :meth:`Module.load_state_dict` (``torch.Tensor.copy_``'s
    cast, refusing what would change the values: see its docstring).

    Raises:
        TypeError: a complex, object or string array; into an integer tensor, a value that is
            not a whole number in its range (naming the first one).
    """
    if arr.dtype == dtype.np:
        return arr
    real = arr.dtype.kind in "biuf" or is_bfloat16(arr.dtype)
    if not real:
        raise TypeError(f"load_state_dict: {name!r} has dtype {arr.dtype} in the state dict, "
                        f"which does not cast to the model's {dtype.name} (real numbers only)")
    if dtype.is_float:
        with np.errstate(over="ignore"):  # float64 beyond float16's range: inf, as torch
            return arr.astype(dtype.np)
    info = np.iinfo(dtype.np)
    with np.errstate(invalid="ignore"):
        a = arr.astype(np.float64) if is_bfloat16(arr.dtype) else arr
        bad = ~((a == np.trunc(a)) & (a >= info.min) & (a <= info.max)) \
            if a.dtype.kind == "f" else (a < info.min) | (a > info.max)
    if np.any(bad):
        first = arr[np.unravel_index(int(np.flatnonzero(bad)[0]), arr.shape)].item()
        raise TypeError(f"load_state_dict: {name!r} holds {first!r}, which the model's "
                        f"{dtype.name} cannot hold (an integer tensor takes whole numbers in "
                        f"[{info.min}, {info.max}])")
    return a.astype(dtype.np)
