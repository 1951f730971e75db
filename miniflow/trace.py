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

__all__ = ["Tracer", "current_tracer", "no_grad"]

_LOCAL = threading.local()
"""Per thread: ``stack``, the Tracers of the builds running in this thread (two threads may trace
two different graphs at once without seeing each other's trace)."""


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
        self.no_grad_depth = 0
        """How many :class:`no_grad` blocks are open in this build."""
        self._no_grad_values: set = set()
        self._detached: dict = {}

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

    def operands(self, values: list) -> list:
        """The Values an op reads: ``values``, but inside a :class:`no_grad` block a value that
        may carry a gradient (a floating trainable parameter or node output) made outside the
        block is read through a ``detach`` node (one per value), so that nothing the block
        computes carries a gradient out of it. Inputs, constants, frozen parameters and buffers
        carry none, and a buffer an op writes in place (batch norm's running statistics, updated
        under ``no_grad`` as in PyTorch) must stay itself."""
        if not self.no_grad_depth:
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
        if self.no_grad_depth:
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


class no_grad(contextlib.ContextDecorator):
    """``torch.no_grad()``: a block (or, as a decorator, a function) whose results carry no
    gradient. Inside ``nn.Graph.build`` its ops read every floating value made outside the block
    through op ``detach`` (:meth:`Tracer.operands`), so the autograd pass gives nothing inside it
    a gradient (a target computed by a second model, an EMA). Outside a build it changes nothing:
    eager ops are forward-only already, and a graph's own build (a training step called in an
    evaluation loop's ``with no_grad():``) takes its gradients as written, where PyTorch would
    compute none. ``@no_grad`` without parentheses decorates a function as ``@no_grad()``
    (PyTorch's ``_NoParamDecoratorContextManager``).

    Raises:
        TypeError: an argument that is not a function (``no_grad(False)``).
    """

    def __new__(cls, func=None):
        if func is None:
            return super().__new__(cls)
        if not callable(func):
            raise TypeError(f"no_grad: expects a function to decorate, got "
                            f"{type(func).__name__} (use no_grad() as a context: "
                            f"with no_grad(): ...)")
        return cls()(func)

    def __init__(self):
        self._tracers: list = []

    def __enter__(self):
        tracer = current_tracer()
        if tracer is not None:
            tracer.no_grad_depth += 1
        self._tracers.append(tracer)

    def __exit__(self, *exc):
        tracer = self._tracers.pop()
        if tracer is not None:
            tracer.no_grad_depth -= 1
        return False
