"""Tracing: while an ``nn.Graph`` builds, ops on Tensors record Nodes instead of running.

The :class:`Tracer` is the one piece of "current graph" state (a stack per thread, like PyTorch FX's tracer).
It lifts eager Tensors that a traced op touches into the IR: a module parameter or buffer becomes
a graph variable named after its module path (``model.0.weight``, ``model.1.running_mean``) that
shares its storage, and so does state an op bound with :meth:`Tracer.bind_state` (the dropout
stream); any other eager Tensor becomes a constant.
"""
from __future__ import annotations

import contextlib
import threading

from .ir import Graph, Value
from .ops import get_op

__all__ = ["Tracer", "current_tracer", "no_grad", "enable_grad", "set_grad_enabled",
           "is_grad_enabled"]

_LOCAL = threading.local()
"""Per thread: ``stack``, the Tracers of the builds running in this thread (two threads may trace
two different graphs at once without seeing each other's trace), and ``grad_enabled``, the grad
mode outside a build (PyTorch's grad mode is per thread too)."""


def _stack() -> list:
    if not hasattr(_LOCAL, "stack"):
        _LOCAL.stack = []
    return _LOCAL.stack


def current_tracer():
    """The active Tracer of this thread, or None outside ``nn.Graph.build``."""
    stack = _stack()
    return stack[-1] if stack else None


class Tracer:
    """Records ops into ``graph``.

    Args:
        graph: the IR being built.
        variable_names: ``id(tensor) -> name`` for every parameter and buffer the nn.Graph
            owns (they become variables).
    """

    def __init__(self, graph: Graph, variable_names: dict):
        self.graph = graph
        self.variable_names = variable_names
        self._lifted: dict = {}
        self._keepalive: list = []
        self.sources: dict = {}
        """lifted Value -> the eager Tensor it was lifted from (a buffer, a constant ...)."""
        self.grad_enabled = True
        """This build's grad mode: False inside a :class:`no_grad` block (or after
        ``set_grad_enabled(False)``) until it is turned on again. A build starts with it on,
        whatever the mode outside (the graph's gradients are what ``build`` writes)."""
        self._no_grad_values: set = set()
        self._detached: dict = {}
        self.made: set = set()
        """The ids of the eager Tensors made while this build runs (``miniflow.ones(T, T)`` in
        it): assignments may write them; one made before would be written once, at trace time,
        where PyTorch writes it at every call."""

    def __enter__(self):
        _stack().append(self)
        return self

    def __exit__(self, *exc):
        _stack().pop()

    def value_of(self, t) -> Value:
        """The IR Value for Tensor ``t``: its own if lazy, else the lifted variable/constant.

        Raises:
            RuntimeError: a lazy Tensor from another (finished) trace, e.g. one kept in a global.
        """
        if t._value is not None:
            if t._tracer is not self:
                raise RuntimeError(f"tensor %{t._value.name} belongs to another graph's trace; "
                                   "lazy tensors cannot be kept between nn.Graph builds")
            return t._value
        key = id(t)
        if key in self._lifted:
            return self._lifted[key]
        name = self.variable_names.get(key)
        if name is not None:
            v = self.graph.add_variable(name, t.shape, t.dtype, data=t._data)
        else:
            v = self.graph.add_constant(t.numpy())
        self._lifted[key] = v
        self._keepalive.append(t)
        self.sources[v] = t
        return v

    def forget(self, t) -> None:
        """Lift eager Tensor ``t`` anew at its next use: it was written in place inside the
        build (``t[key] = value`` of a value that is not lazy), so the constant lifted before
        holds the values the ops recorded before the write read."""
        self._lifted.pop(id(t), None)

    def operands(self, values: list) -> list:
        """The Values an op reads: ``values``, but inside a :class:`no_grad` block a value that
        may carry a gradient (a floating trainable parameter or node output) made outside the
        block is read through a ``detach`` node (one per value), so that nothing the block
        computes carries a gradient out of it. Inputs, constants, frozen parameters and buffers
        carry none, and a buffer an op writes in place (batch norm's running statistics, updated
        under ``no_grad`` as in PyTorch) must stay itself."""
        if self.grad_enabled:
            return values
        return [self._detach(v) if self._may_carry_gradient(v) else v for v in values]

    def _may_carry_gradient(self, v: Value) -> bool:
        if not v.dtype.is_float or v in self._no_grad_values:
            return False
        return v.kind == "node" or (v.kind == "variable"
                                    and getattr(self.sources.get(v), "requires_grad", False))

    def record(self, values) -> None:
        """Note the outputs of an op just emitted (inside a :class:`no_grad` block, they need no
        ``detach``)."""
        if not self.grad_enabled:
            self._no_grad_values.update(values)

    def _detach(self, v: Value) -> Value:
        if v not in self._detached:
            self._detached[v] = self.graph.emit(get_op("detach"), v)
        return self._detached[v]

    def bind_state(self, t, name: str) -> None:
        """Make eager Tensor ``t`` a graph variable named ``name`` when no module of the graph
        holds it already (state an op writes in place: the dropout stream of ``F.dropout``
        called in a model without an ``nn.Dropout``); a held ``t`` keeps its module's name.

        Raises:
            ValueError: ``name`` is the name of another tensor of the graph.
        """
        if id(t) in self.variable_names:
            return
        if name in self.variable_names.values():
            raise ValueError(f"graph variable {name!r} names another tensor of the graph's "
                             f"modules; rename that attribute")
        self.variable_names[id(t)] = name

    def set_loss(self, t) -> None:
        """Mark ``t`` as the loss (``Tensor.backward()`` inside build).

        Raises:
            RuntimeError: backward() called twice, or on a tensor of more than one element.
        """
        if self.graph.loss is not None:
            raise RuntimeError("backward() was already called in this build; call it once, on the "
                               "total loss (add the losses first)")
        v = self.value_of(t)
        if v.size != 1:
            raise RuntimeError(f"backward() needs a scalar loss, got %{v.name} with shape "
                               f"{list(v.shape)}; reduce it first, e.g. loss.mean()")
        if not v.dtype.is_float:
            raise RuntimeError(f"backward() needs a floating-point loss, got {v.type_str}")
        self.graph.results["loss"] = v


def is_grad_enabled() -> bool:
    """``torch.is_grad_enabled()``: the grad mode, True unless a :class:`no_grad` block (or
    ``set_grad_enabled(False)``) turned it off. Inside ``nn.Graph.build`` it is the build's own
    mode (which starts on); outside, this thread's (on in a new thread, as PyTorch's)."""
    tracer = current_tracer()
    return tracer.grad_enabled if tracer is not None else getattr(_LOCAL, "grad_enabled", True)


def _set_mode(mode: bool):
    """Set the grad mode where :func:`is_grad_enabled` reads it; returns ``(where, previous)``
    for :func:`_restore` (a build's Tracer, or None for this thread's mode)."""
    tracer = current_tracer()
    previous = is_grad_enabled()
    if tracer is not None:
        tracer.grad_enabled = mode
    else:
        _LOCAL.grad_enabled = mode
    return tracer, previous


def _restore(saved) -> None:
    tracer, previous = saved
    if tracer is not None:
        tracer.grad_enabled = previous
    else:
        _LOCAL.grad_enabled = previous


class _GradMode(contextlib.ContextDecorator):
    """A block (or a decorated function) run in grad mode ``_mode``, the previous mode restored
    after it (PyTorch's ``no_grad`` / ``enable_grad``). ``@cls`` without parentheses decorates
    a function as ``@cls()`` (PyTorch's ``_NoParamDecoratorContextManager``). Re-entrant: a
    decorated function may call itself."""

    _mode = False

    def __new__(cls, func=None):
        if func is None:
            return super().__new__(cls)
        if not callable(func):
            raise TypeError(f"{cls.__name__}: expects a function to decorate, got "
                            f"{type(func).__name__} (use {cls.__name__}() as a context: "
                            f"with {cls.__name__}(): ...)")
        return cls()(func)

    def __init__(self):
        self._saved: list = []

    def __enter__(self):
        self._saved.append(_set_mode(self._mode))

    def __exit__(self, *exc):
        _restore(self._saved.pop())
        return False


class no_grad(_GradMode):
    """``torch.no_grad()``: a block (or, as a decorator, a function) whose results carry no
    gradient. Inside ``nn.Graph.build`` its ops read every floating value made outside the block
    through op ``detach`` (:meth:`Tracer.operands`), so the autograd pass gives nothing inside it
    a gradient (a target computed by a second model, an EMA). Outside a build it changes nothing
    but :func:`is_grad_enabled`: eager ops are forward-only already, and a graph's own build (a
    training step called in an evaluation loop's ``with no_grad():``) takes its gradients as
    written, where PyTorch would compute none. ``@no_grad`` without parentheses decorates a
    function as ``@no_grad()`` (PyTorch's ``_NoParamDecoratorContextManager``).

    Raises:
        TypeError: an argument that is not a function (``no_grad(False)``).
    """

    _mode = False


class enable_grad(_GradMode):
    """``torch.enable_grad()``: a block (or, as a decorator, a function) whose ops take
    gradients again inside a :class:`no_grad` block (or after ``set_grad_enabled(False)``), the
    mode before it restored after it. Inside ``nn.Graph.build`` its ops read their operands as
    they are (a value made under ``no_grad`` still carries no gradient, as in PyTorch); outside
    a build it changes only :func:`is_grad_enabled`. ``@enable_grad`` works without parentheses.

    Raises:
        TypeError: an argument that is not a function (``enable_grad(False)``).
    """

    _mode = True


class set_grad_enabled(contextlib.ContextDecorator):
    """``torch.set_grad_enabled(mode)``: as a function it sets the grad mode at once
    (``set_grad_enabled(False)`` in ``build``: the ops after it take no gradient until it is set
    on again or the build ends; outside a build: this thread's mode, which only
    :func:`is_grad_enabled` reads); as a context manager (``with set_grad_enabled(is_train):``)
    or a decorator the mode holds inside the block and the one before is restored after it.
    Where it acts, as :class:`no_grad` and :class:`enable_grad`.

    Raises:
        TypeError: ``mode`` that is not a bool (PyTorch's check: an int, a NumPy bool or None
            is refused).
    """

    def __init__(self, mode: bool):
        if not isinstance(mode, bool):
            raise TypeError(f"set_grad_enabled(): argument 'mode' (position 1) must be bool, "
                            f"not {type(mode).__name__}")
        self.mode = mode
        self._saved: list = []
        self._initial = _set_mode(mode)       # the function form acts at once

    def __call__(self, func):
        """Decorate ``func`` (the mode the constructor set is undone, as PyTorch's)."""
        self._undo_initial()
        return super().__call__(func)

    def _undo_initial(self) -> None:
        if self._initial is not None:
            _restore(self._initial)
            self._initial = None

    def __enter__(self):
        self._saved.append(_set_mode(self.mode))

    def __exit__(self, *exc):
        _restore(self._saved.pop())
        if not self._saved:      # ``with set_grad_enabled(m):``: the mode before the call
            self._undo_initial()
        return False

    def __repr__(self) -> str:
        return f"miniflow.set_grad_enabled(mode={self.mode})"
