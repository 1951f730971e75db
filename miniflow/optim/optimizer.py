"""Optimizer base class: parameters, hyper-parameters (``param_groups``), per-parameter state and
its state_dict.

State arrays (momentum buffers, Adam moments, step counts) are created when the optimizer is made,
live in backend memory and are bound as graph variables named ``<param>.<state>``, so every plan of
the graph updates the same state. Hyper-parameters become attributes of the update ops when a graph
is compiled; changing one (``opt.param_groups[0]["lr"] = 0.01``, as a PyTorch LR schedule does)
bumps :attr:`Optimizer.version`, and an nn.Graph recompiles its plans at its next call.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..dtype import as_dtype
from ..nn.module import Parameter
from ..runtime.backend import get_backend

__all__ = ["Optimizer", "ParamGroup", "check_real"]


def check_real(owner: str, name: str, value, low: float = 0.0, low_inclusive: bool = True,
               high: float = math.inf, high_inclusive: bool = False) -> float:
    """``value`` as a float, checked to be a finite real number in the given range.

    Raises:
        TypeError: not a real number (a string, a bool, None ...).
        ValueError: NaN, inf or outside the range, quoting the value.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be a real number, got {value!r}")
    v = float(value)
    ok = math.isfinite(v) and (v >= low if low_inclusive else v > low) and \
        (v <= high if high_inclusive else v < high)
    if not ok:
        lo = "[" if low_inclusive else "("
        hi = "]" if high_inclusive else ")"
        raise ValueError(f"{owner}: {name} must be finite and in {lo}{low:g}, {high:g}{hi}, "
                         f"got {value!r}")
    return v


class ParamGroup(dict):
    """The hyper-parameters of an optimizer (PyTorch's ``param_groups[0]``; ``"params"`` lists the
    parameters). Setting a key validates the value and marks compiled graphs for recompilation.

    Raises:
        KeyError: an unknown key; TypeError/ValueError: an invalid value (as the constructor).
    """

    def __init__(self, owner, values: dict, params: list):
        super().__init__(values, params=params)
        self._owner = owner

    def __setitem__(self, key, value):
        if key not in self or key == "params":
            raise KeyError(f"{type(self._owner).__name__}.param_groups: cannot set {key!r}; "
                           f"hyper-parameters are {sorted(k for k in self if k != 'params')}")
        checked = self._owner.check_hyper({**self.hyper(), key: value})
        super().__setitem__(key, checked[key])
        self._owner.version += 1

    def update(self, *args, **kwargs):
        """Set several hyper-parameters, each checked like ``group[key] = value``."""
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def _no_removal(self, *args, **kwargs):
        raise TypeError(f"{type(self._owner).__name__}.param_groups: hyper-parameters cannot be "
                        "removed or added; assign a new value with group[key] = value")

    pop = popitem = clear = setdefault = __delitem__ = _no_removal

    def hyper(self) -> dict:
        """The hyper-parameters without ``params``."""
        return {k: v for k, v in self.items() if k != "params"}


class Optimizer:
    """Base optimizer: subclasses set ``state_names``, implement :meth:`check_hyper` and
    :meth:`emit_update`.

    Args:
        params: an iterable of ``nn.Parameter`` (one group; PyTorch's per-group dicts are not
            supported).
        hyper: the hyper-parameters, validated by :meth:`check_hyper`.

    Raises:
        TypeError: an element that is not an nn.Parameter (e.g. a param-group dict or an array).
        ValueError: an empty parameter list, or a parameter listed twice.
    """

    state_names: tuple = ()

    def __init__(self, params, hyper: dict):
        name = type(self).__name__
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{name}: got an empty parameter list")
        for i, p in enumerate(self.params):
            if not isinstance(p, Parameter):
                hint = (" (param-group dicts are not supported: use one optimizer per group)"
                        if isinstance(p, dict) else "")
                raise TypeError(f"{name}: parameter {i} is a {type(p).__name__}, not an "
                                f"nn.Parameter; pass model.parameters(){hint}")
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError(f"{name}: a parameter appears twice")
        self.version = 0
        self.param_groups = [ParamGroup(self, self.check_hyper(hyper), self.params)]
        backend = get_backend()
        self.state = [{s: backend.from_numpy(self._initial_state(s, p)) for s in self.state_names}
                      for p in self.params]

    @property
    def hyper(self) -> dict:
        """The current hyper-parameters (``param_groups[0]`` without ``params``)."""
        return self.param_groups[0].hyper()

    def check_hyper(self, hyper: dict) -> dict:
        """Validated, normalised hyper-parameters (raises TypeError/ValueError naming the bad one)."""
        raise NotImplementedError

    def _initial_state(self, name: str, p) -> np.ndarray:
        return np.zeros(p.shape, p.dtype.np)

    def emit_update(self, graph, index: int, name: str, param, grad, skip_if) -> None:
        """Emit the update op of parameter ``index`` (variable ``name``, Value ``param``, gradient
        Value ``grad``) taking ``skip_if`` (called by the optimizer pass)."""
        raise NotImplementedError

    def _state_values(self, graph, name, index, names=None):
        """Declare the parameter's state arrays (``names``, default all) as graph variables."""
        vals = []
        for s in (self.state_names if names is None else names):
            arr = self.state[index][s]
            vals.append(graph.add_variable(f"{name}.{s}", arr.shape, as_dtype(arr.dtype), data=arr))
        return vals

    def state_dict(self) -> dict:
        """PyTorch layout: ``{"state": {i: {name: ndarray}}, "param_groups": [{..., "params": [i]}]}``."""
        to_numpy = get_backend().to_numpy
        return {"state": {i: {k: to_numpy(v) for k, v in s.items()} for i, s in enumerate(self.state)},
                "param_groups": [dict(self.hyper, params=list(range(len(self.params))))]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore state arrays (in place) and hyper-parameters; everything is checked first, so a
        failed load changes nothing.

        Raises:
            KeyError: a missing entry; ValueError/TypeError: a wrong count, shape or value.
        """
        name = type(self).__name__
        try:
            st, group = state_dict["state"], dict(state_dict["param_groups"][0])
            arrays = [{k: np.asarray(st[i][k]) for k in s} for i, s in enumerate(self.state)]
        except (KeyError, IndexError, TypeError) as e:
            raise KeyError(f"{name}.load_state_dict: missing or malformed entry {e}; expected "
                           f"'state' with {self.state_names} per parameter and 'param_groups'") from None
        if len(st) != len(self.params):
            raise ValueError(f"{name}.load_state_dict: {len(st)} parameter states for "
                             f"{len(self.params)} parameters")
        for i, (s, new) in enumerate(zip(self.state, arrays)):
            for k, v in s.items():
                if new[k].shape != v.shape:
                    raise ValueError(f"{name}.load_state_dict: state {k!r} of parameter {i} has "
                                     f"shape {new[k].shape}, expected {v.shape}")
        group.pop("params", None)
        hyper = self.check_hyper(group)
        backend = get_backend()
        for s, new in zip(self.state, arrays):
            for k, v in s.items():
                backend.copy_in(v, new[k].astype(v.dtype))
        self.param_groups[0] = ParamGroup(self, hyper, self.params)
        self.version += 1
