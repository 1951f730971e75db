"""``miniflow.compile(model)``, PyTorch's ``torch.compile`` (``torch/__init__.py``) over
``nn.Graph``: a module comes back as an :class:`OptimizedModule` (PyTorch's
``torch._dynamo.eval_frame.OptimizedModule``, the original module as its child ``_orig_mod``), a
function as a :class:`CompiledFunction`. A call runs the forward as an ``nn.Graph`` (forward
only: training is a graph with ``add_optimizer``) and returns eager Tensors.

Per call, each argument is a graph input (a NumPy array or an eager Tensor) or a constant (None,
a bool, int, float or str, a dtype) compiled into the graph. One ``nn.Graph`` is kept per pattern
of constants (up to :data:`MAX_GRAPHS`, least recently used evicted, as ``torch.compile``'s
recompile limit), and each graph keeps a plan per input shapes, dtypes and train/eval modes: a
new shape, dtype, mode or constant traces the forward again, as ``torch.compile`` recompiles on a
guard that fails. The graphs bind the module's parameters and buffers as variables: a later
``load_state_dict``, or an optimizer's update in another graph, is seen at the next call.
"""
from __future__ import annotations

import functools
import inspect
from collections import OrderedDict

import numpy as np

from ..dtype import DType, as_dtype
from ..nn.module import Module
from ..tensor import Tensor
from ..tensor.core import LazyValueError
from ..trace import current_tracer
from .driver import Graph

__all__ = ["CompiledFunction", "OptimizedModule", "compile"]

MAX_GRAPHS = 8
"""Graphs kept per compiled module or function (one per pattern of constant arguments)."""

MODES = ("default", "lite", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
"""``torch.compile``'s modes; miniflow takes each and compiles the same way (its kernels are
tuned per machine anyway)."""

BACKENDS = ("inductor", "miniflow")
"""The backends ``compile`` takes: PyTorch's default name, and miniflow's own; both mean
miniflow's compiler (``nn.Graph``)."""

_CONSTANTS = (type(None), bool, int, float, str, DType)
"""Argument types compiled into the graph as constants (a new value traces again)."""


def _is_torch_dtype(value) -> bool:
    """Whether ``value`` is a ``torch.dtype`` (without importing torch)."""
    return type(value).__module__ == "torch" and type(value).__name__ == "dtype"


def compile(model=None, *, fullgraph: bool = False, dynamic=None, backend="inductor",
            mode=None, options=None, disable: bool = False):
    """Compile ``model`` (an ``nn.Module`` or a function of tensors) for fast forward calls, as
    ``torch.compile`` (https://pytorch.org/docs/stable/generated/torch.compile.html): the
    forward runs as one ``nn.Graph`` per input signature (shapes, dtypes, the modules'
    train/eval modes, the constant arguments), traced at the first call with it.

    ``model = miniflow.compile(model)``; ``@miniflow.compile`` on a function;
    ``miniflow.compile(mode="max-autotune")(fn)`` (``model=None`` gives the decorator).

    Args:
        model: an ``nn.Module`` (returned as an :class:`OptimizedModule`: ``state_dict`` names
            behind ``_orig_mod.``, parameters, ``train()`` / ``eval()`` and attributes are the
            module's) or a function (a :class:`CompiledFunction`). Its arguments per call:
            NumPy arrays or eager Tensors (inputs of any shape and miniflow dtype) and None,
            bool, int, float, str or dtype constants; it returns Tensors, or tuples, lists and
            dicts of them (eager Tensors, as the module returns them; a None as None).
        fullgraph: taken either way: miniflow always traces the whole forward as one graph.
            With False, where ``torch.compile`` would break the graph (Python code that reads a
            tensor's value: ``float(x)``, ``if x.sum() > 0``) miniflow raises instead.
        dynamic: None, False or True; every new shape traces again (True is taken, but shapes
            are never symbolic).
        backend: ``"inductor"`` (PyTorch's default) or ``"miniflow"``: miniflow's compiler.
        mode: None or one of :data:`MODES`; they all compile alike.
        options: None or ``{}`` (miniflow has no inductor options).
        disable: True returns ``model`` itself, uncompiled (as PyTorch).

    Returns:
        The compiled module or function; with ``model=None`` a decorator taking it.

    Raises:
        TypeError: ``model`` is neither a Module nor callable; ``fullgraph`` or ``disable`` not
            a bool, ``dynamic`` neither None nor a bool; at a call, an argument that is neither
            an array, a Tensor nor a constant (naming it).
        RuntimeError: (PyTorch's type) an unknown ``mode`` or ``backend``, a backend
            callable, both ``mode`` and ``options``, or options miniflow does not have; at a
            call, a forward that reads a tensor's value (torch.compile's graph break).
    """
    _check_settings(fullgraph, dynamic, backend, mode, options, disable)
    if model is None:
        return functools.partial(_compile_or_none, fullgraph=fullgraph, dynamic=dynamic,
                                 backend=backend, mode=mode, options=options, disable=disable)
    if disable:
        return model
    if isinstance(model, Module):
        return OptimizedModule(model)
    if isinstance(model, Graph) or not callable(model):
        what = "is an nn.Graph, compiled already" if callable(model) else "is not callable"
        raise TypeError(f"miniflow.compile: the model {what} (a {type(model).__name__}); pass "
                        f"an nn.Module or a function of tensors")
    return CompiledFunction(model)


def _compile_or_none(model, **settings):
    """The decorator of ``compile(model=None, ...)``: ``compile(model, ...)``.

    Raises:
        RuntimeError: ``model`` is None (PyTorch's "Model can't be None")."""
    if model is None:
        raise RuntimeError("miniflow.compile: Model can't be None (the decorator takes the "
                           "module or function to compile)")
    return compile(model, **settings)


def _check_settings(fullgraph, dynamic, backend, mode, options, disable) -> None:
    """:func:`compile`'s keyword checks (its Raises)."""
    for name, value in (("fullgraph", fullgraph), ("disable", disable)):
        if not isinstance(value, bool):
            raise TypeError(f"miniflow.compile: {name} must be a bool, got {value!r}")
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"miniflow.compile: dynamic must be None, False or True, got {dynamic!r}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        what = repr(backend) if isinstance(backend, str) else f"a {type(backend).__name__}"
        raise RuntimeError(f"miniflow.compile: Invalid backend: {what}; miniflow compiles with "
                           f"its own compiler (nn.Graph) only: leave backend out, or pass one of "
                           f"{', '.join(map(repr, BACKENDS))} (for eager runs, call the model "
                           f"uncompiled)")
    if mode is not None and options is not None:
        raise RuntimeError("miniflow.compile: Either mode or options can be specified, but both "
                           "can't be specified at the same time.")
    if mode is not None and mode not in MODES:
        raise RuntimeError(f"miniflow.compile: Unrecognized mode={mode}, should be one of: "
                           f"{', '.join(MODES)}")
    if options:
        raise RuntimeError(f"miniflow.compile: options {sorted(options)} are TorchInductor's; "
                           f"miniflow's compiler has none: leave options out")


class _Forward(Graph):
    """The graph of one pattern of constant arguments: ``build`` puts the inputs and the
    constants back in their places and calls the function; the modules it reads are attributes
    (their parameters and buffers are graph variables)."""

    def __init__(self, fn, modules: dict, slots: tuple, where: str):
        super().__init__()
        self._fn, self._slots, self._where = fn, slots, where
        for name, module in modules.items():   # (a name of nn.Graph's own: "training")
            setattr(self, f"module_{name}" if hasattr(Graph, name) else name, module)

    def build(self, *inputs):
        args, kwargs, it = [], {}, iter(inputs)
        for place, constant in self._slots:
            value = next(it) if constant is None else constant[1]
            if isinstance(place, int):
                args.append(value)
            else:
                kwargs[place] = value
        try:
            return self._fn(*args, **kwargs)
        except LazyValueError as e:
            raise LazyValueError(
                f"{self._where}: the forward reads the value of a tensor it computes ({e}). "
                f"miniflow traces the whole forward into one graph and has no graph breaks "
                f"(torch.compile's fullgraph=False would run that part in Python): compute the "
                f"value outside and pass it in as an argument, or call the model uncompiled"
            ) from e


class _Graphs:
    """The graphs of a compiled module or function: per pattern of constant arguments one
    :class:`_Forward`, least recently used evicted beyond :data:`MAX_GRAPHS`."""

    def __init__(self, fn, modules: dict, where: str):
        self.fn, self.modules, self.where = fn, modules, where
        self.graphs: OrderedDict = OrderedDict()

    def __call__(self, args: tuple, kwargs: dict):
        """``fn(*args, **kwargs)`` run as a graph (inside another graph's build: ``fn`` itself,
        traced into that graph)."""
        if current_tracer() is not None:
            return self.fn(*args, **kwargs)
        slots, inputs = [], []
        for place, value in [*enumerate(args), *sorted(kwargs.items())]:
            if isinstance(value, (np.ndarray, Tensor)):
                slots.append((place, None))
                inputs.append(value)
            elif isinstance(value, _CONSTANTS):
                slots.append((place, (type(value), value)))
            elif _is_torch_dtype(value):       # torch.bfloat16 names miniflow's, as in .to()
                slots.append((place, (DType, as_dtype(value))))
            else:
                at = f"argument {place}" if isinstance(place, int) else f"argument {place!r}"
                raise TypeError(f"{self.where}: {at} is a {type(value).__name__}: a compiled "
                                f"call takes NumPy arrays and Tensors (the graph's inputs) and "
                                f"None, bool, int, float, str or dtype constants")
        key = tuple(slots)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = _Forward(self.fn, self.modules, key, self.where)
            if len(self.graphs) > MAX_GRAPHS:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        return graph(*inputs)


class OptimizedModule(Module):
    """What :func:`compile` returns for a module (PyTorch's ``OptimizedModule``): a Module whose
    only child is the original, ``_orig_mod``, so ``state_dict()`` names are the original's
    behind ``_orig_mod.`` and ``load_state_dict`` takes them (the original's own names load
    into ``compiled._orig_mod``); ``parameters()``, ``train()`` / ``eval()`` reach the original,
    and any attribute it lacks is read from the original (``compiled.config``). A call runs
    the original's forward as a graph (see :mod:`miniflow.compiler.optimized`)."""

    def __init__(self, mod: Module):
        super().__init__()
        self._orig_mod = mod
        self._graphs = self._graphs_of(mod)

    @staticmethod
    def _graphs_of(mod: Module) -> _Graphs:
        """The graphs of a new wrapper of ``mod``, none compiled yet."""
        return _Graphs(mod, {"_orig_mod": mod}, f"miniflow.compile({type(mod).__name__})")

    def forward(self, *args, **kwargs):
        """The original's forward on ``args`` (arrays, Tensors, constants), as a graph."""
        return self._graphs(args, kwargs)

    def __getattr__(self, name):
        """An attribute this wrapper lacks: the original module's (PyTorch's)."""
        mod = self.__dict__.get("_orig_mod")
        if mod is None or name.startswith("__"):
            return super().__getattr__(name)
        return getattr(mod, name)

    def __getstate__(self) -> dict:
        """``copy.deepcopy`` and ``pickle`` copy the module, not the compiled graphs (a copy
        compiles its own at its first call)."""
        return {k: v for k, v in self.__dict__.items() if k != "_graphs"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        object.__setattr__(self, "_graphs", self._graphs_of(state["_orig_mod"]))


class CompiledFunction:
    """What :func:`compile` returns for a function: called as the function, it runs as a graph
    (see :mod:`miniflow.compiler.optimized`). The modules the function names (globals and
    closure variables) are bound as the graph's variables, so their parameters are read live;
    any other eager Tensor it reads from outside is a constant of the graph."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self._orig_fn = fn
        self._graphs = _Graphs(fn, _modules_named_by(fn), f"miniflow.compile({_name(fn)})")

    def __call__(self, *args, **kwargs):
        return self._graphs(args, kwargs)


def _name(fn) -> str:
    """``fn``'s name for messages."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _modules_named_by(fn) -> dict:
    """``name -> Module`` for the modules ``fn`` reads by name: its globals and closure
    variables (``inspect.getclosurevars``), and ``self`` of a module's method
    (``compile(model.forward)``); none for a callable that is no Python function."""
    owner = getattr(fn, "__self__", None)
    named = {"self": owner} if isinstance(owner, Module) else {}
    try:
        found = inspect.getclosurevars(inspect.unwrap(fn))
    except TypeError:
        return named
    return {**named, **{name: value for name, value in {**found.globals,
                                                         **found.nonlocals}.items()
                        if isinstance(value, Module)}}
