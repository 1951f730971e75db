"""Tracing: while an ``nn.Graph`` builds, ops on Tensors record Nodes instead of running.

The :class:`Tracer` is the one piece of "current graph" state (a stack per thread, like PyTorch FX's tracer).
It lifts eager Tensors that a traced op touches into the IR: a module parameter or buffer becomes
a graph variable named after its module path (``model.0.weight``, ``model.1.running_mean``) that
shares its storage; any other eager Tensor becomes a constant.
"""
from __future__ import annotations

import threading

from .ir import Graph, Value

__all__ = ["Tracer", "current_tracer"]

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
