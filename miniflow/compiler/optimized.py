"""``miniflow.compile(model)``, PyTorch's ``torch.compile`` (``torch/__init__.py``) over
``nn.Graph``: a module comes back as an :class:`OptimizedModule` (PyTorch's
``torch._dynamo.eval_frame.OptimizedModule``, the original module as its child ``_orig_mod``), a
function as a :class:`CompiledFunction`. A call runs the forward as an ``nn.Graph`` (forward
only: training is a graph with ``add_optimizer``) and returns eager Tensors.

Per call, each argument is a graph input (a NumPy array or an eager Tensor), a constant (None,
a bool, int, float or str, a dtype) compiled into the graph, or a tuple, list or dict of them
(PyTorch's pytrees: flattened, the structure and the constants part of the signature). The
globals and closure variables the function (or the module's ``forward``) reads are guarded as
``torch.compile`` guards them: a new value of a number or string, or another object bound to
the name, traces again. One ``nn.Graph`` is kept per pattern of constants and outside values
(up to :data:`MAX_GRAPHS`, least recently used evicted, as ``torch.compile``'s recompile limit,
with its warning), and each graph keeps a plan per input shapes, dtypes and train/eval modes: a
new shape, dtype, mode or constant traces the forward again, as ``torch.compile`` recompiles on a
guard that fails. The graphs bind the module's parameters and buffers, and the eager Tensors
the function names, as variables: a later ``load_state_dict``, an optimizer's update in another
graph, or a write into such a tensor, is seen at the next call.
"""
from __future__ import annotations

import functools
import inspect
import types
import warnings
from collections import OrderedDict

import numpy as np

from ..dtype import DType, as_dtype
from ..nn.module import Module
from ..tensor import Tensor
from ..tensor.core import LazyValueError
from ..trace import current_tracer
from .driver import Graph
from .outputs import flatten, rebuild

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

_VALUES = (type(None), bool, int, float, str)
"""Types of the outside values a graph guards by value (others by identity)."""


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
    """The graph of one pattern of constant arguments and outside values: ``build`` puts the
    inputs and the constants back in their places and calls the function; the modules it reads
    are attributes (their parameters and buffers are graph variables), and so are, as
    variables named ``G.<name>``, the eager Tensors it reads by name (read live, as
    ``torch.compile`` reads a global tensor at every call)."""

    def __init__(self, fn, slots: tuple, leaves: tuple, reads: dict, where: str):
        super().__init__()
        self._fn, self._slots, self._leaves, self._where = fn, slots, leaves, where
        self._reads = reads         # held: the ids its guards compare are not reused meanwhile
        self._tensors = {name: value for name, value in reads.items()
                         if isinstance(value, Tensor) and not value.is_lazy}
        for name, module in _modules_in(fn, reads).items():   # (a name of nn.Graph's own)
            setattr(self, f"module_{name}" if hasattr(Graph, name) else name, module)

    def build(self, *inputs):
        tracer, it = current_tracer(), iter(inputs)
        for name, t in self._tensors.items():
            tracer.bind_state(t, f"G.{name}")
        values = iter([next(it) if leaf is None else leaf[1] for leaf in self._leaves])
        args, kwargs = [], {}
        for place, structure in self._slots:     # each takes its leaves from values
            if isinstance(place, int):
                args.append(rebuild(structure, values))
            else:
                kwargs[place] = rebuild(structure, values)
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
    """The graphs of a compiled module or function: per pattern of constant arguments and of
    the outside values it reads (:func:`_outside_reads`) one :class:`_Forward`, least recently
    used evicted beyond :data:`MAX_GRAPHS` (with ``torch.compile``'s warning, once)."""

    def __init__(self, fn, where: str):
        self.fn, self.where = fn, where
        self.graphs: OrderedDict = OrderedDict()
        self.warned = False

    def __call__(self, args: tuple, kwargs: dict):
        """``fn(*args, **kwargs)`` run as a graph (inside another graph's build: ``fn`` itself,
        traced into that graph).

        Raises:
            TypeError: an argument, or a leaf of a tuple, list or dict argument, that is
                neither an array, a Tensor nor a constant (naming where it is).
        """
        if current_tracer() is not None:
            return self.fn(*args, **kwargs)
        slots, inputs, leaves = [], [], []
        for place, value in [*enumerate(args), *sorted(kwargs.items())]:
            at = f"argument {place}" if isinstance(place, int) else f"argument {place!r}"
            found, structure = flatten(value, _is_leaf, f"{self.where}: {at} holds something "
                                       f"a compiled call does not take: NumPy arrays and Tensors "
                                       f"(the graph's inputs), None, bool, int, float, str or "
                                       f"dtype constants, and tuples, lists and dicts of them")
            slots.append((place, structure))
            for leaf in found:
                if isinstance(leaf, (np.ndarray, Tensor)):
                    leaves.append(None)
                    inputs.append(leaf)
                else:           # a torch.bfloat16 names miniflow's, as in .to()
                    leaf = as_dtype(leaf) if _is_torch_dtype(leaf) else leaf
                    leaves.append((type(leaf), leaf))
        reads = _outside_reads(self.fn)
        guards = tuple((name, _guard(value)) for name, value in reads.items())
        key = (tuple(slots), tuple(leaves), guards)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = _Forward(self.fn, *key[:2], reads, self.where)
            if len(self.graphs) > MAX_GRAPHS:
                self._evict(guards)
        else:
            self.graphs.move_to_end(key)
        return graph(*inputs)

    def _evict(self, guards: tuple) -> None:
        """Drop the least recently used graph; the first time, warn as ``torch.compile`` does
        when it hits its recompile limit, naming the function and why it compiled again."""
        self.graphs.popitem(last=False)
        if self.warned:
            return
        self.warned = True
        before = dict(list(self.graphs)[-2][2])   # the graph used last before
        changed = [name for name, guard in guards if before.get(name, guard) != guard]
        reason = (f"{', '.join(map(repr, changed))} changed" if changed else
                  "new constant arguments, or a new structure of tuple, list or dict arguments")
        code = getattr(_function_of(self.fn), "__code__", None)
        function = (f"{code.co_name!r} ({code.co_filename}:{code.co_firstlineno})"
                    if code is not None else repr(_name(self.fn)))
        warnings.warn(f"{self.where} hit its recompile limit ({MAX_GRAPHS}), as "
                      f"torch._dynamo hit config.recompile_limit ({MAX_GRAPHS})\n"
                      f"   function: {function}\n"
                      f"   last reason: {reason}\n"
                      f"miniflow keeps compiling, evicting the least recently used graph (PyTorch "
                      f"runs the function eagerly from here on): pass a value that changes at "
                      f"every call as a tensor argument", RuntimeWarning,
                      stacklevel=5 if isinstance(self.fn, Module) else 4)   # the caller's line


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
        return _Graphs(mod, f"miniflow.compile({type(mod).__name__})")

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
    (see :mod:`miniflow.compiler.optimized`). The modules and eager Tensors the function names
    (globals and closure variables) are bound as the graph's variables, so their parameters and
    values are read live; re-binding one of the names it reads traces again
    (:func:`_outside_reads`)."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self._orig_fn = fn
        self._graphs = _Graphs(fn, f"miniflow.compile({_name(fn)})")

    def __call__(self, *args, **kwargs):
        return self._graphs(args, kwargs)


def _name(fn) -> str:
    """``fn``'s name for messages."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _is_leaf(value) -> bool:
    """Whether ``value`` is an argument's leaf: a graph input or a constant (else a container,
    or refused)."""
    return (isinstance(value, (np.ndarray, Tensor, *_CONSTANTS)) and value is not None
            or _is_torch_dtype(value))


def _guard(value):
    """What a value read from outside must stay for a graph to be used again: the value itself
    for None, a bool, int, float or str (a new value traces again, as ``torch.compile``'s
    guards compare them), else the object's identity (a re-bound name traces again; the graph
    holds the object, so its id is not reused)."""
    return (type(value), value) if type(value) in _VALUES else id(value)


def _function_of(fn):
    """The Python function behind ``fn``: itself, a method's function, or a module's
    ``forward``'s; None for a callable that is no Python function."""
    fn = inspect.unwrap(fn)
    if isinstance(fn, Module):
        fn = type(fn).forward
    fn = getattr(fn, "__func__", fn)
    return fn if isinstance(fn, types.FunctionType) else None


def _outside_reads(fn) -> dict:
    """``name -> value`` of what ``fn`` reads from outside by name, as ``torch.compile``
    guards on them: the globals its code names (nested functions' and lambdas' code too), its
    closure variables, and so on through the functions among them defined in the same module
    (its helpers). A global is ``name``, a closure variable ``name`` too unless a global has
    it (then ``<function>.name``). Attributes are not followed: ``config.scale`` is read as
    ``config``, by identity."""
    first = _function_of(fn)
    reads: dict = {}
    todo, seen = [first] if first is not None else [], set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        found = [(name, f.__globals__[name]) for name in _names_of(f.__code__)
                 if name in f.__globals__]
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
            try:
                found.append((name if name not in reads else f"{f.__qualname__}.{name}",
                              cell.cell_contents))
            except ValueError:                  # a cell not filled yet
                continue
        for name, value in found:
            reads.setdefault(name, value)
            if isinstance(value, types.FunctionType) and value.__globals__ is first.__globals__:
                todo.append(value)
    return reads


@functools.lru_cache(maxsize=None)
def _names_of(code: types.CodeType) -> tuple:
    """The global (and attribute) names ``code`` and the code objects in it read, in order."""
    names = dict.fromkeys(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(dict.fromkeys(_names_of(const)))
    return tuple(names)


def _modules_in(fn, reads: dict) -> dict:
    """``name -> Module`` for the modules bound as a graph's attributes: ``fn`` itself (a
    compiled module, as ``_orig_mod``), ``self`` of a module's method (``compile(model.forward)``)
    and the modules among ``reads`` (a global module a compiled module's ``forward`` names
    too)."""
    owner = fn if isinstance(fn, Module) else getattr(fn, "__self__", None)
    named = ({} if not isinstance(owner, Module) else {"_orig_mod": fn} if owner is fn
             else {"self": owner})
    return {**named, **{name: value for name, value in reads.items()
                        if isinstance(value, Module)}}
