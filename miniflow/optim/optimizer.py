"""Optimizer base class: parameters, hyper-parameters (``param_groups``), per-parameter state and
its state_dict.

State arrays (momentum buffers, Adam moments, step counts) are created when the optimizer is made,
live in backend memory and are bound as graph variables named ``<param>.<state>``, so every plan of
the graph updates the same state.

The learning rate is state too: an f64[1] array (:attr:`Optimizer.learning_rate`), bound as the
``learning_rate`` input of every update op (OneFlow feeds its update ops the learning rate as a
tensor). ``opt.param_groups[0]["lr"] = 0.01`` (what an LR scheduler does every step) writes that
array: compiled plans read the new value at their next call and nothing recompiles. The other
hyper-parameters (momentum, betas, eps, weight_decay, the clipping settings) become attributes of
the compiled graph; changing one bumps :attr:`Optimizer.version`, and an nn.Graph recompiles its
plans at its next call.

Every optimizer also has the gradient-clipping settings of OneFlow's param groups:
``clip_grad_max_norm`` (None: no clipping) and ``clip_grad_norm_type`` (default 2.0); see
``miniflow.passes.optimizer``.
"""
from __future__ import annotations

import copy
import math
import numbers
import weakref

import numpy as np

from ..dtype import as_dtype
from ..nn.module import Parameter
from ..tensor import Tensor
from ..runtime.backend import get_backend
from ..runtime.readback import LEDGER, LedgerAttribute

__all__ = ["Optimizer", "ParamGroup", "check_real", "RUNTIME_KEYS", "CLIP_KEYS"]

RUNTIME_KEYS = ("lr", "initial_lr")
"""Param-group keys that compiled graphs do not depend on: ``lr`` is read from the optimizer's
learning-rate array at every call; ``initial_lr`` is the schedulers' record (PyTorch's)."""

CLIP_KEYS = ("clip_grad_max_norm", "clip_grad_norm_type")
"""The gradient-clipping settings every optimizer has (OneFlow's param-group keys)."""


def check_real(owner: str, name: str, value, low: float = 0.0, high: float = math.inf) -> float:
    """``value`` as a float, checked to be a finite real number in ``[low, high)``.

    Raises:
        TypeError: not a real number (a string, a bool, None ...).
        ValueError: NaN, inf or outside the range, quoting the value.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be a real number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and low <= v < high):
        raise ValueError(f"{owner}: {name} must be finite and in [{low:g}, {high:g}), "
                         f"got {value!r}")
    return v


class ParamGroup(dict):
    """The hyper-parameters of an optimizer (PyTorch's ``param_groups[0]``; ``"params"`` lists the
    parameters). Every change is validated; a new ``lr`` is written to the optimizer's
    learning-rate array (no recompilation), a change of any other hyper-parameter marks compiled
    graphs for recompilation.

    ``group[key] = v``, ``group.update(...)``, ``group |= {...}`` check all new values together with
    the optimizer's :meth:`~Optimizer.validated` and apply all or none of them; ``setdefault``
    returns an existing value. ``"initial_lr"`` (PyTorch's key: the lr when the first LR scheduler
    of the optimizer was made, which schedulers set with ``group.setdefault("initial_lr",
    group["lr"])``) is the one key that may be added, checked like ``lr``. Adding other keys or
    removing keys (``del``, ``pop``, ``popitem``, ``clear``, ``setdefault`` of a new key) and
    setting ``"params"`` are refused. ``copy.copy(group)``, ``group.copy()``, ``dict(group)`` and
    ``group | {...}`` are plain dicts: snapshots that change no optimizer. ``copy.deepcopy`` and
    pickling of the optimizer give a group bound to the copy.

    The group holds its optimizer through a weak reference, so an optimizer is in no reference
    cycle and is freed on ``del`` with the cyclic collector off (PyTorch's
    ``test/optim/test_lrscheduler.py``, ``test_no_cyclic_references``).

    Raises:
        KeyError: an unknown key; TypeError/ValueError: an invalid value (as the constructor);
        TypeError: adding or removing a key; ReferenceError: a change after the optimizer was
        deleted.
    """

    def __init__(self, owner, values: dict, params: list):
        super().__init__(values, params=params)
        self._owner_ref = weakref.ref(owner)

    @property
    def _owner(self):
        """The optimizer this group belongs to.

        Raises:
            ReferenceError: it was deleted (a group kept alone only reads).
        """
        owner = self._owner_ref()
        if owner is None:
            raise ReferenceError("this param group's optimizer was deleted; its values cannot "
                                 "be changed (keep the optimizer, or copy the group: dict(group))")
        return owner

    def __setitem__(self, key, value):
        if key == "lr":  # what a schedule does every step: check it, write the lr array
            v = check_real(type(self._owner).__name__, "lr", value)
            dict.__setitem__(self, "lr", v)
            self._owner._write_lr(v)
            return
        self.update({key: value})

    def update(self, *args, **kwargs):
        """Set several hyper-parameters at once: all are checked first, then all are applied."""
        changes = dict(*args, **kwargs)
        for key in changes:
            if (key not in self and key != "initial_lr") or key == "params":
                raise KeyError(f"{self._name}: cannot set {key!r}; hyper-parameters are "
                               f"{sorted(self.hyper())}"
                               + (" (make a new optimizer for other parameters)"
                                  if key == "params" else ""))
        if not changes:
            return
        checked = self._owner.validated({**self.hyper(), **changes})
        for key in changes:
            dict.__setitem__(self, key, checked[key])
        self._owner._hyper_changed(changes)

    def __ior__(self, other):
        self.update(other)
        return self

    def setdefault(self, key, default=None):
        """``group[key]`` for an existing key; ``initial_lr`` may be added (checked like lr);
        adding another key is refused (TypeError)."""
        if key not in self and key == "initial_lr":
            self.update(initial_lr=default)
        if key in self:
            return self[key]
        self._no_change("setdefault", key)

    def _no_change(self, method, *args):
        what = (f"del group[{args[0]!r}]" if method == "del" else
                f"{method}({args[0]!r})" if args else f"{method}()")
        raise TypeError(f"{self._name}: {what} is refused: hyper-parameters cannot be removed or "
                        "added; assign a new value with group[key] = value")

    def pop(self, key, *default):
        self._no_change("pop", key)

    def popitem(self):
        self._no_change("popitem")

    def clear(self):
        self._no_change("clear")

    def __delitem__(self, key):
        self._no_change("del", key)

    @property
    def _name(self) -> str:
        return f"{type(self._owner).__name__}.param_groups[0]"

    def hyper(self) -> dict:
        """The hyper-parameters without ``params``."""
        return {k: v for k, v in self.items() if k != "params"}

    def __copy__(self) -> dict:
        return dict(self)

    def __deepcopy__(self, memo) -> dict:
        owner = memo.get(id(self._owner))
        if owner is None:  # the group alone: a snapshot, like copy.copy
            return copy.deepcopy(dict(self), memo)
        return ParamGroup(owner, copy.deepcopy(self.hyper(), memo),
                          copy.deepcopy(self["params"], memo))

    def __reduce__(self):
        return ParamGroup, (self._owner, self.hyper(), self["params"])


class _ParamGroups(tuple):
    """``Optimizer.param_groups``: a tuple of the one ParamGroup that refuses item assignment
    with a message saying what to do instead."""

    def _refuse(self, *args):
        raise TypeError("param_groups cannot be changed (miniflow optimizers have one group); "
                        "change a value with opt.param_groups[0][key] = value")

    def __setitem__(self, index, value):
        """Refused (TypeError), except putting back the group that is there: the second half of
        ``opt.param_groups[0] |= {...}``, whose first half (``ParamGroup.__ior__``, checked, all
        or nothing) already changed the group in place, as PyTorch's list of dicts does."""
        if not (isinstance(index, int) and -len(self) <= index < len(self)
                and value is tuple.__getitem__(self, index)):
            self._refuse()

    __delitem__ = _refuse


class Optimizer:
    """Base optimizer: subclasses set ``state_names``, implement :meth:`check_hyper` and
    :meth:`emit_update`.

    Args:
        params: an iterable of ``nn.Parameter`` (one group; PyTorch's per-group dicts are not
            supported).
        hyper: the hyper-parameters, validated by :meth:`validated`.

    Attributes:
        learning_rate: the f64[1] backend array holding ``param_groups[0]["lr"]``, the
            ``learning_rate`` input of the update ops.
        num_steps, num_skipped_steps: how many calls of a graph ran this optimizer's updates,
            and how many of them the grad scaler skipped (non-finite gradients). With a grad
            scaler on cuda they are counted when the step's outcome is read back
            (``miniflow.runtime.readback``): reading them waits for it.
        version: bumped by every change a compiled graph depends on.

    ``copy.deepcopy`` and ``pickle`` copy everything: the parameters (as they copy any object:
    to keep an optimizer on its model, copy or pickle them together, ``(model, opt)``, as with
    PyTorch), the hyper-parameters (a ParamGroup bound to, and validated by, the copy) and the
    state arrays (pickled as NumPy arrays, restored in the current backend's memory).
    ``copy.copy`` keeps the same Parameters and copies the rest.

    Raises:
        TypeError: an element that is not an nn.Parameter (e.g. a param-group dict or an array).
        ValueError: an empty parameter list, or a parameter listed twice.
    """

    state_names: tuple = ()
    num_steps = LedgerAttribute()
    num_skipped_steps = LedgerAttribute()

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
        self.num_steps = 0
        self.num_skipped_steps = 0
        checked = self.validated(hyper)
        backend = get_backend()
        self._lr_host = np.array([checked["lr"]], np.float64)  # staging for _write_lr
        self.learning_rate = backend.from_numpy(self._lr_host)
        self._group = ParamGroup(self, checked, self.params)
        self.state = [{s: backend.from_numpy(self._initial_state(s, p)) for s in self.state_names}
                      for p in self.params]

    @property
    def param_groups(self) -> "_ParamGroups":
        """PyTorch's list of parameter groups: here always one :class:`ParamGroup`. Change its
        values (``opt.param_groups[0]["lr"] = 0.01``); the list itself cannot be changed."""
        return _ParamGroups((self._group,))

    @param_groups.setter
    def param_groups(self, value):
        raise AttributeError(f"{type(self).__name__}.param_groups cannot be replaced; change a "
                             "value with opt.param_groups[0][key] = value, or use load_state_dict")

    @property
    def hyper(self) -> dict:
        """The current hyper-parameters (``param_groups[0]`` without ``params``)."""
        return self._group.hyper()

    def check_hyper(self, hyper: dict) -> dict:
        """The subclass's own hyper-parameters of ``hyper`` (all but ``lr`` and the clipping
        settings, which :meth:`validated` checks), validated and normalised (raises KeyError
        for a missing one, TypeError/ValueError naming the bad one)."""
        raise NotImplementedError

    def validated(self, hyper: dict) -> dict:
        """All hyper-parameters of ``hyper`` validated: ``lr`` (finite >= 0; 0 is allowed, as in
        PyTorch), the subclass's (:meth:`check_hyper`), the clipping settings (missing ones: the
        defaults, no clipping) and ``initial_lr`` if present (as lr).

        ``clip_grad_max_norm``: None, or a finite number > 0; ``clip_grad_norm_type``: a number
        > 0, ``inf`` included (1, 2 and inf are the usual ones).

        Raises:
            KeyError / TypeError / ValueError naming the bad key and value.
        """
        name = type(self).__name__
        if "lr" not in hyper:
            raise KeyError(f"{name}: missing hyper-parameters ['lr']")
        out = {"lr": check_real(name, "lr", hyper["lr"]), **self.check_hyper(hyper)}
        max_norm = hyper.get("clip_grad_max_norm")
        if max_norm is not None:
            max_norm = check_real(name, "clip_grad_max_norm", max_norm)
            if max_norm == 0.0:
                raise ValueError(f"{name}: clip_grad_max_norm must be > 0 (None: no clipping), "
                                 "got 0")
        norm_type = hyper.get("clip_grad_norm_type", 2.0)
        if isinstance(norm_type, bool) or not isinstance(norm_type, numbers.Real):
            raise TypeError(f"{name}: clip_grad_norm_type must be a real number, got "
                            f"{norm_type!r}")
        if not float(norm_type) > 0:  # NaN fails too
            raise ValueError(f"{name}: clip_grad_norm_type must be > 0 (1, 2, float('inf') or "
                             f"any p > 0), got {norm_type!r}")
        out.update(clip_grad_max_norm=max_norm, clip_grad_norm_type=float(norm_type))
        if "initial_lr" in hyper:
            out["initial_lr"] = check_real(name, "initial_lr", hyper["initial_lr"])
        return out

    def _hyper_changed(self, keys) -> None:
        """After ``keys`` of the param group changed: write a new lr into
        :attr:`learning_rate`; bump :attr:`version` when a compiled key changed."""
        if "lr" in keys:
            self._write_lr(self._group["lr"])
        if any(k not in RUNTIME_KEYS for k in keys):
            self.version += 1

    def _write_lr(self, lr: float) -> None:
        """Put a (checked) learning rate into :attr:`learning_rate`."""
        self._lr_host[0] = lr
        get_backend().copy_in(self.learning_rate, self._lr_host)

    @property
    def clip_grad(self):
        """``(max_norm, norm_type)`` when gradient clipping is on, else None."""
        h = self._group
        return None if h["clip_grad_max_norm"] is None else (h["clip_grad_max_norm"],
                                                             h["clip_grad_norm_type"])

    def _record_step(self, skipped: bool) -> None:
        """Count one call of a graph that ran this optimizer's updates (nn.Graph calls it):
        :attr:`num_steps`, and :attr:`num_skipped_steps` when the grad scaler skipped it."""
        d = self.__dict__                    # not the LedgerAttributes: this may run in a flush
        d["num_steps"] += 1
        d["num_skipped_steps"] += bool(skipped)

    def _initial_state(self, name: str, p) -> np.ndarray:
        return np.zeros(p.shape, p.dtype.np)

    def emit_update(self, graph, index: int, name: str, param, grad, lr, skip_if) -> None:
        """Emit the update op of parameter ``index`` (variable ``name``, Value ``param``, gradient
        Value ``grad``) taking the learning-rate variable ``lr`` and ``skip_if`` (called by the
        optimizer pass)."""
        raise NotImplementedError

    def _state_values(self, graph, name, index, names=None):
        """Declare the parameter's state arrays (``names``, default all) as graph variables."""
        vals = []
        for s in (self.state_names if names is None else names):
            arr = self.state[index][s]
            vals.append(graph.add_variable(f"{name}.{s}", arr.shape, as_dtype(arr.dtype), data=arr))
        return vals

    def state_dict(self) -> dict:
        """PyTorch layout: ``{"state": {i: {name: ndarray}}, "param_groups": [{..., "params":
        [i]}]}``, plus miniflow's ``num_steps`` and ``num_skipped_steps`` (the graph calls that
        ran the updates, and those skipped; LR schedulers read them, see
        ``miniflow.optim.lr_scheduler``; PyTorch's ``load_state_dict`` ignores them)."""
        to_numpy = get_backend().to_numpy
        return {"state": {i: {k: to_numpy(v) for k, v in s.items()} for i, s in enumerate(self.state)},
                "param_groups": [dict(self.hyper, params=list(range(len(self.params))))],
                "num_steps": self.num_steps, "num_skipped_steps": self.num_skipped_steps}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore state arrays (in place: compiled graphs see them) and hyper-parameters from
        :meth:`state_dict`'s layout. Everything is checked before anything is assigned, so a
        failed load changes nothing.

        Checked: one param group, its ``params`` (``[0, 1, ...]``) and hyper-parameters (as the
        constructor; no unknown keys; the clipping settings, ``initial_lr``, ``num_steps`` and
        ``num_skipped_steps`` may be missing: they keep their current values); for every
        parameter every state array of :attr:`state_names`, with the current shape, a
        real-number dtype, finite values, whole numbers >= 0 for integer state (step counts;
        whole floats such as PyTorch's float step are accepted) and values >= 0 for
        :attr:`nonnegative_states`.

        A ``torch.optim`` state dict of the same algorithm loads: PyTorch's keys of
        :attr:`torch_keys` are accepted at their no-op values (``dampening=0``, ``maximize=False``
        ...); ``state`` values may be ``torch.Tensor``s (read with ``np.asarray``) and a step
        count 0-d (PyTorch's).

        Raises:
            KeyError: a missing entry or an unknown hyper-parameter (named);
            ValueError/TypeError: a wrong count, shape, dtype or value (naming the key and value).
        """
        self.prepare_load_state_dict(state_dict)()

    def prepare_load_state_dict(self, state_dict: dict):
        """Check ``state_dict`` as :meth:`load_state_dict` does and return a function of no
        arguments that assigns it (and cannot fail): a caller restoring several objects checks
        them all before it assigns any (``miniflow.experiments.checkpoint``).

        Raises:
            as :meth:`load_state_dict`.
        """
        where = f"{type(self).__name__}.load_state_dict"
        try:
            st, groups = state_dict["state"], state_dict["param_groups"]
        except (KeyError, TypeError):
            raise KeyError(f"{where}: expected a dict with 'state' and 'param_groups' "
                           "(Optimizer.state_dict()'s layout), got "
                           f"{_short(state_dict)}") from None
        if not isinstance(groups, (list, tuple)) or len(groups) != 1 \
                or not isinstance(groups[0], dict):
            raise ValueError(f"{where}: 'param_groups' must be a list of one dict (miniflow "
                             f"optimizers have one group), got {_short(groups)}")
        hyper = self._checked_group(where, dict(groups[0]))
        if not isinstance(st, dict) or len(st) != len(self.params):
            raise ValueError(f"{where}: 'state' must map each of the {len(self.params)} "
                             f"parameter indices to its state, got {_short(st)}")
        arrays = [{k: self._checked_state(where, i, k, st, v) for k, v in s.items()}
                  for i, s in enumerate(self.state)]
        counts = {}
        for key in ("num_steps", "num_skipped_steps"):
            value = state_dict.get(key, getattr(self, key))
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"{where}: {key} must be an integer >= 0, got {value!r}")
            counts[key] = int(value)
        if counts["num_skipped_steps"] > counts["num_steps"]:
            raise ValueError(f"{where}: num_skipped_steps {counts['num_skipped_steps']} is more "
                             f"than num_steps {counts['num_steps']}")

        def assign():
            backend = get_backend()  # everything is valid: assign
            for s, new in zip(self.state, arrays):
                for k, v in s.items():
                    backend.copy_in(v, new[k])
            dict.update(self._group, hyper)  # in place: references to param_groups[0] stay valid
            self._write_lr(hyper["lr"])
            self.__dict__.update(counts)
            self.version += 1
        return assign

    nonnegative_states: tuple = ()
    """State arrays whose values must be >= 0 (checked by :meth:`load_state_dict`)."""

    torch_keys: dict = {"maximize": False, "foreach": None, "capturable": False,
                        "differentiable": False, "fused": None}
    """``torch.optim`` param-group keys miniflow has not, each with the value under which
    PyTorch's update is miniflow's (``torch.optim.SGD`` / ``Adam`` / ``AdamW``'s documented
    defaults): :meth:`load_state_dict` drops them at that value and refuses any other, so a
    ``torch.optim`` state dict of the same algorithm loads."""

    def _checked_group(self, where: str, group: dict) -> dict:
        """The validated hyper-parameters of a loaded param group."""
        params = group.pop("params", None)
        expected = list(range(len(self.params)))
        if params is not None and list(params) != expected:
            raise ValueError(f"{where}: param_groups[0]['params'] is {_short(params)}, expected "
                             f"{expected} (one index per parameter)")
        for key, neutral in self.torch_keys.items():
            if key in group and key not in self.hyper:
                value = group.pop(key)
                if (value is not None if neutral is None else value is None or value != neutral):
                    raise ValueError(f"{where}: param_groups[0][{key!r}] is {value!r}; miniflow's "
                                     f"{type(self).__name__} runs only PyTorch's {key}="
                                     f"{neutral!r} (leave the key out, or set it to {neutral!r})")
        unknown = sorted(set(group) - set(self.hyper) - {"initial_lr"}, key=str)
        if unknown:
            raise KeyError(f"{where}: unknown hyper-parameters {unknown} in param_groups[0]; "
                           f"{type(self).__name__} has {sorted(self.hyper)}")
        optional = {k: v for k, v in self.hyper.items() if k in CLIP_KEYS or k == "initial_lr"}
        try:
            return self.validated({**optional, **group})
        except (KeyError, TypeError, ValueError) as e:
            raise type(e)(f"{where}: param_groups[0]: {e.args[0]}") from None

    def _checked_state(self, where: str, i: int, key: str, st: dict, current) -> np.ndarray:
        """Loaded state ``key`` of parameter ``i`` as an array of ``current``'s dtype and shape."""
        what = f"state[{i}][{key!r}]"
        try:
            value = st[i][key]
        except (KeyError, IndexError, TypeError):
            raise KeyError(f"{where}: missing {what}; every parameter needs "
                           f"{list(self.state_names)}") from None
        if isinstance(value, Tensor):
            value = value.numpy()
        a = np.asarray(value)
        dtype = np.dtype(current.dtype)
        if a.dtype.kind not in "iuf":
            raise TypeError(f"{where}: {what} has dtype {a.dtype} ({_short(value)}), expected "
                            f"real numbers for a {dtype} state")
        if a.shape == () and tuple(current.shape) == (1,):
            a = a.reshape(1)                 # PyTorch's 0-d step count; miniflow's is [1]
        if a.shape != tuple(current.shape):
            raise ValueError(f"{where}: {what} has shape {list(a.shape)}, expected "
                             f"{list(current.shape)}")
        with np.errstate(all="ignore"):
            out = a.astype(dtype)
            bad = ~np.isfinite(out) if dtype.kind == "f" else out != a
        if key in self.nonnegative_states or dtype.kind in "iu":
            bad |= a < 0
        if bad.any():
            k = np.unravel_index(int(np.flatnonzero(bad)[0]), a.shape)
            need = ("finite" + (" and >= 0" if key in self.nonnegative_states else "")
                    if dtype.kind == "f" else f"a count >= 0 that {dtype} holds")
            raise ValueError(f"{where}: {what} must be {need}; element {[int(j) for j in k]} is "
                             f"{a[k].item()!r}")
        return out

    # ------------------------------------------------------------------ copy and pickle
    def __getstate__(self) -> dict:
        """State arrays and the learning-rate array as NumPy copies (device arrays do not
        pickle); parameters as they are."""
        LEDGER.flush()                       # the step counts up to date
        state = dict(self.__dict__)
        to_numpy = get_backend().to_numpy
        state["state"] = [{k: to_numpy(v) for k, v in s.items()} for s in self.state]
        state["learning_rate"] = to_numpy(self.learning_rate)
        return state

    def __setstate__(self, state: dict) -> None:
        backend = get_backend()
        state["state"] = [{k: backend.from_numpy(v) for k, v in s.items()} for s in state["state"]]
        state["learning_rate"] = backend.from_numpy(state["learning_rate"])
        state["_lr_host"] = np.array(state["_lr_host"])
        self.__dict__.update(state)

    def __copy__(self) -> "Optimizer":
        """``copy.copy``: an optimizer of the same Parameters with copies of the state arrays and
        its own ParamGroup (a shared group would change both optimizers' hyper-parameters while
        only one of them marks its graphs for recompilation)."""
        new = type(self).__new__(type(self))
        new.__setstate__(self.__getstate__())
        new.params = list(self.params)
        new._group = ParamGroup(new, self.hyper, new.params)
        return new


def _short(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
