"""Optimizer base class: parameters, hyper-parameters, per-parameter state and its state_dict.

State arrays (momentum buffers, Adam moments, step counts) are created when the optimizer is made,
live in backend memory and are bound as graph variables named ``<param>.<state>``, so every plan of
the graph updates the same state. Hyper-parameters are read when a graph is compiled.
"""
from __future__ import annotations

import numpy as np

from ..dtype import as_dtype
from ..runtime.backend import get_backend

__all__ = ["Optimizer"]


class Optimizer:
    """Base optimizer: subclasses set ``state_names`` and implement :meth:`emit_update`.

    Raises:
        ValueError: empty parameter list, or a parameter listed twice.
    """

    state_names: tuple = ()

    def __init__(self, params, defaults: dict):
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError(f"{type(self).__name__}: a parameter appears twice")
        self.defaults = dict(defaults)
        backend = get_backend()
        self.state = [{name: backend.from_numpy(self._initial_state(name, p))
                       for name in self.state_names} for p in self.params]

    def _initial_state(self, name: str, p) -> np.ndarray:
        return np.zeros(p.shape, p.dtype.np)

    def emit_update(self, graph, index: int, name: str, param, grad, skip_if) -> None:
        """Emit the update op of parameter ``index`` (variable ``name``, Value ``param``, gradient
        Value ``grad``) taking ``skip_if`` (called by the optimizer pass)."""
        raise NotImplementedError

    def _state_values(self, graph, name, index):
        """Declare the parameter's state arrays as graph variables; returns their Values."""
        vals = []
        for s in self.state_names:
            arr = self.state[index][s]
            vals.append(graph.add_variable(f"{name}.{s}", arr.shape, as_dtype(arr.dtype), data=arr))
        return vals

    def state_dict(self) -> dict:
        """PyTorch layout: ``{"state": {i: {name: ndarray}}, "param_groups": [{..., "params": [i]}]}``."""
        to_numpy = get_backend().to_numpy
        return {"state": {i: {k: to_numpy(v) for k, v in s.items()} for i, s in enumerate(self.state)},
                "param_groups": [dict(self.defaults, params=list(range(len(self.params))))]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Copy state arrays in place and restore hyper-parameters.

        Raises:
            ValueError: a different number of parameters, or a state array of another shape.
        """
        st = state_dict["state"]
        if len(st) != len(self.params):
            raise ValueError(f"{type(self).__name__}.load_state_dict: {len(st)} parameter states "
                             f"for {len(self.params)} parameters")
        backend = get_backend()
        for i, s in enumerate(self.state):
            for k, v in s.items():
                new = np.asarray(st[i][k])
                if new.shape != v.shape:
                    raise ValueError(f"state {k!r} of parameter {i}: shape {new.shape} != {v.shape}")
                backend.copy_in(v, new.astype(v.dtype))
        group = dict(state_dict["param_groups"][0])
        group.pop("params", None)
        self.defaults.update(group)
