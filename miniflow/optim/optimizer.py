"""Optimizer base class: parameter groups (``param_groups``, each with its parameters and
hyper-parameters, ``add_param_group``), per-parameter state and its state_dict.

State arrays (momentum buffers, Adam moments, step counts) are created when the optimizer is made,
live in backend memory and are bound as graph variables named ``<param>.<state>``, so every plan of
the graph updates the same state.

As in PyTorch, an optimizer holds one or more parameter groups: ``SGD(model.parameters(), lr=...)``
makes one, ``SGD([{"params": a}, {"params": b, "lr": 0.01}], lr=0.1)`` two (a key a group does
not set takes the constructor's value, :attr:`Optimizer.defaults`), and
:meth:`Optimizer.add_param_group` adds one later (the graphs training the optimizer recompile).
A group may hold keys of its own (``{"params": b, "name": "head"}``, ``group["tag"] = 1``):
kept as PyTorch keeps them, never read by the update and in :meth:`Optimizer.state_dict`.

The learning rate of every group is state too: an f64[1] array (:attr:`Optimizer.learning_rates`,
group 0's also :attr:`Optimizer.learning_rate`), bound as the ``learning_rate`` input of the
group's update ops (OneFlow feeds its update ops the learning rate as a tensor).
``opt.param_groups[i]["lr"] = 0.01`` (what an LR scheduler does every step, for every group)
writes that array: compiled plans read the new value at their next call and nothing recompiles.
The other hyper-parameters (momentum, betas, eps, weight_decay, the clipping settings) become
attributes of the group's update ops in the compiled graph; changing one bumps
:attr:`Optimizer.version`, and an nn.Graph recompiles its plans at its next call.

Every group also has the gradient-clipping settings of OneFlow's param groups:
``clip_grad_max_norm`` (None: no clipping) and ``clip_grad_norm_type`` (default 2.0), applied to
the group's gradients together; see ``miniflow.passes.optimizer``.
"""
from __future__ import annotations

import copy
import weakref

import numpy as np

from ..checks import integer, real, real_number
from ..dtype import as_dtype, is_bfloat16
from ..nn.module import Parameter
from ..tensor import Tensor, as_numpy
from ..runtime.backend import get_backend
from ..runtime.readback import LEDGER, LedgerAttribute

__all__ = ["Optimizer", "ParamGroup", "RUNTIME_KEYS", "CLIP_KEYS"]

RUNTIME_KEYS = ("lr", "initial_lr")
"""Param-group keys that compiled graphs do not depend on: ``lr`` is read from the optimizer's
learning-rate array at every call; ``initial_lr`` is the schedulers' record (PyTorch's)."""

CLIP_KEYS = ("clip_grad_max_norm", "clip_grad_norm_type")
"""The gradient-clipping settings every optimizer has (OneFlow's param-group keys)."""


class GroupParams(list):
    """A param group's ``"params"``: a list of its parameters (PyTorch's), read-only. Changing
    it in place (``append``, ``extend``, ``remove``, ``group["params"][0] = p`` ...) raises: the
    optimizer keeps its parameters, their state and the compiled updates per parameter, and a
    list changed behind its back would leave them out of step (PyTorch's ``step()`` reads the
    list at each call; miniflow compiles it): add parameters with
    :meth:`Optimizer.add_param_group`. Copies (``list(...)``, ``copy.copy``, ``+``) are plain
    lists."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("an optimizer's param_groups[i]['params'] cannot be changed in place "
                        "(the optimizer's state and compiled updates are made per parameter): "
                        "add parameters with add_param_group({'params': [...]}), or make a "
                        "new optimizer")

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def __reduce__(self):
        return GroupParams, (list(self),)

    def __copy__(self) -> list:
        return list(self)


class ParamGroup(dict):
    """One parameter group of an optimizer (PyTorch's ``param_groups[i]``): its hyper-parameters,
    ``"params"``, the list of its parameters (a :class:`GroupParams`: read-only, grown with
    :meth:`Optimizer.add_param_group`), and any other keys the user gave it. Every change
    of a hyper-parameter is validated; a new ``lr`` is written to the group's learning-rate
    array (no recompilation), a change of any other hyper-parameter marks compiled graphs for
    recompilation.

    Keys the optimizer does not know (``{"params": ..., "name": "head", "lr_mult": 0.1}``, or a
    misspelt ``"weight_decy"``) are kept as ``torch.optim`` keeps them: unvalidated, never read
    by the update, written by :meth:`~Optimizer.state_dict` and restored by
    :meth:`~Optimizer.load_state_dict`. Setting one, new or not (``group["name"] = "x"``), or
    removing one changes nothing compiled (no recompilation). PyTorch's keys miniflow has not
    (:attr:`Optimizer.torch_keys`: ``maximize``, ``foreach`` ...) are kept too, but only at
    their no-op values (another value would make PyTorch's update differ from miniflow's).

    ``group[key] = v``, ``group.update(...)``, ``group |= {...}`` check all new values together with
    the optimizer's :meth:`~Optimizer.validated` and apply all or none of them; ``setdefault``
    returns an existing value and sets a new key as ``group[key] = default`` does.
    ``"initial_lr"`` (PyTorch's key: the lr when the first LR scheduler of the optimizer was
    made, which schedulers set with ``group.setdefault("initial_lr", group["lr"])``) is checked
    like ``lr``, or None (kept, as PyTorch keeps it; an LR scheduler made later refuses it).
    Removing a hyper-parameter (``del``, ``pop``, ``popitem``, ``clear``) and
    setting ``"params"`` are refused; the other keys may be removed. ``copy.copy(group)``,
    ``group.copy()``, ``dict(group)`` and ``group | {...}`` are plain dicts: snapshots that
    change no optimizer. ``copy.deepcopy`` and pickling of the optimizer give a group bound to
    the copy.

    The group holds its optimizer through a weak reference, so an optimizer is in no reference
    cycle and is freed on ``del`` with the cyclic collector off (PyTorch's
    ``test/optim/test_lrscheduler.py``, ``test_no_cyclic_references``).

    Raises:
        KeyError: setting ``"params"``; TypeError/ValueError: an invalid hyper-parameter value
        (as the constructor), or one of :attr:`Optimizer.torch_keys` at a value other than
        PyTorch's no-op one; TypeError: removing a hyper-parameter; ValueError: changing a key
        the group's state depends on (Adam's ``amsgrad``); ReferenceError: a change after the
        optimizer was deleted.
    """

    def __init__(self, owner, values: dict, params: list, hyper_keys=None):
        super().__init__(values, params=GroupParams(params))
        self._owner_ref = weakref.ref(owner)
        # the owner's hyper-parameter keys: copy and pickle pass them (the owner is not built
        # yet then); a pickle of a version without them holds hyper-parameters only
        if hyper_keys is None:
            hyper_keys = (owner._hyper_keys() if "defaults" in vars(owner)
                          else frozenset(values) | {"initial_lr"})
        self._hyper_keys = frozenset(hyper_keys)

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
            owner = self._owner
            v = real(type(owner).__name__, "lr", value, 0.0)
            dict.__setitem__(self, "lr", v)
            owner._write_lr(owner._index(self), v)
            return
        self.update({key: value})

    def update(self, *args, **kwargs):
        """Set several keys at once: all are checked first, then all are applied. The
        hyper-parameters are validated; other keys are kept as given (see the class)."""
        changes = dict(*args, **kwargs)
        if "params" in changes:
            raise KeyError(f"{self._name}: cannot set 'params' (make a new optimizer for other "
                           "parameters, or add a group with add_param_group)")
        if not changes:
            return
        owner = self._owner
        hyper, torch, extra = owner._split_keys(changes)
        for key, value in torch.items():
            owner._check_torch_key(f"{self._name}[{key!r}] = ", key, value)
        if hyper:
            owner._check_fixed(self._name, self, hyper)
            checked = owner.validated({**self.hyper(), **hyper})
            hyper = {key: checked[key] for key in hyper}
        dict.update(self, {**hyper, **torch, **extra})
        if hyper:
            owner._hyper_changed(owner._index(self), hyper)

    def __ior__(self, other):
        self.update(other)
        return self

    def setdefault(self, key, default=None):
        """``group[key]`` for an existing key; a new key is set as ``group[key] = default``
        (``initial_lr`` checked like lr, None taken)."""
        if key not in self:
            self.update({key: default})
        return self[key]

    def _no_change(self, method, *args):
        what = (f"del group[{args[0]!r}]" if method == "del" else
                f"{method}({args[0]!r})" if args else f"{method}()")
        raise TypeError(f"{self._name}: {what} is refused: hyper-parameters and 'params' cannot "
                        "be removed; assign a new value with group[key] = value")

    def _removable(self, key) -> bool:
        """Whether ``key`` may be removed: it is neither ``params`` nor a hyper-parameter."""
        return key != "params" and key not in self._hyper_keys

    def pop(self, key, *default):
        if key in self and not self._removable(key):
            self._no_change("pop", key)
        return dict.pop(self, key, *default)

    def popitem(self):
        if self and not self._removable(next(reversed(self))):
            self._no_change("popitem")
        return dict.popitem(self)

    def clear(self):
        self._no_change("clear")

    def __delitem__(self, key):
        if key in self and not self._removable(key):
            self._no_change("del", key)
        dict.__delitem__(self, key)

    @property
    def _name(self) -> str:
        owner = self._owner
        return f"{type(owner).__name__}.param_groups[{owner._index(self)}]"

    def hyper(self) -> dict:
        """The hyper-parameters: the optimizer's keys (and ``initial_lr`` when set), without
        ``params`` and the other keys (see the class)."""
        return {k: v for k, v in self.items() if k in self._hyper_keys}

    def others(self) -> dict:
        """The keys that are neither ``params`` nor hyper-parameters: the user's own, and
        PyTorch's :attr:`Optimizer.torch_keys` where given (see the class)."""
        return {k: v for k, v in self.items() if k != "params" and k not in self._hyper_keys}

    def values_without_params(self) -> dict:
        """Every key but ``params``: the hyper-parameters and the others."""
        return {k: v for k, v in self.items() if k != "params"}

    def __copy__(self) -> dict:
        return dict(self)

    def __deepcopy__(self, memo) -> dict:
        owner = memo.get(id(self._owner))
        if owner is None:  # the group alone: a snapshot, like copy.copy
            return copy.deepcopy(dict(self), memo)
        return ParamGroup(owner, copy.deepcopy(self.values_without_params(), memo),
                          copy.deepcopy(self["params"], memo), self._hyper_keys)

    def __reduce__(self):
        return ParamGroup, (self._owner, self.values_without_params(), self["params"],
                            self._hyper_keys)


class _ParamGroups(tuple):
    """``Optimizer.param_groups``: a tuple of the ParamGroups that refuses item assignment
    with a message saying what to do instead."""

    def _refuse(self, *args):
        raise TypeError("param_groups cannot be changed (add a group with "
                        "opt.add_param_group({'params': [...], ...})); change a value with "
                        "opt.param_groups[0][key] = value")

    def __setitem__(self, index, value):
        """Refused (TypeError), except putting back the group that is there: the second half of
        ``opt.param_groups[0] |= {...}``, whose first half (``ParamGroup.__ior__``, checked, all
        or nothing) already changed the group in place, as PyTorch's list of dicts does."""
        if not (isinstance(index, int) and -len(self) <= index < len(self)
                and value is tuple.__getitem__(self, index)):
            self._refuse()

    __delitem__ = _refuse


class Optimizer:
    """Base optimizer: subclasses set ``state_names`` (or override :meth:`group_state_names`),
    implement :meth:`check_hyper` and :meth:`emit_update`.

    Args:
        params: an iterable of ``nn.Parameter`` (one group; or ``model.named_parameters()``,
            whose names go to the group's ``"param_names"``), or of dicts, one per group: its
            ``"params"`` (a Parameter or an ordered iterable of them), the hyper-parameters
            it sets and any other keys (kept in the group unread, as PyTorch keeps them), as
            :meth:`add_param_group` takes them (PyTorch's per-group options).
        hyper: the defaults, validated by :meth:`validated`: every group's hyper-parameters that
            the group does not set (:attr:`defaults`).

    Attributes:
        defaults: the constructor's hyper-parameters (PyTorch's ``optimizer.defaults``).
        params: every parameter, group after group (the indices of :meth:`state_dict`).
        state: a dict keyed by the parameter, in :attr:`params` order, of its state arrays by
            name (PyTorch's ``optimizer.state[p]["exp_avg"]``; backend arrays, NumPy on the
            cpu backend, made with the optimizer: every parameter has its entry from the
            start, where PyTorch's appear at the first ``step()``).
        learning_rates: per group, the f64[1] backend array holding its ``"lr"``, the
            ``learning_rate`` input of its update ops; :attr:`learning_rate` is group 0's.
        num_steps, num_skipped_steps: how many calls of a graph ran this optimizer's updates,
            and how many of them the grad scaler skipped (non-finite gradients). With a grad
            scaler on cuda they are counted when the step's outcome is read back
            (``miniflow.runtime.readback``): reading them waits for it.
        version: bumped by every change a compiled graph depends on.

    ``copy.deepcopy`` and ``pickle`` copy everything: the parameters (as they copy any object:
    to keep an optimizer on its model, copy or pickle them together, ``(model, opt)``, as with
    PyTorch), the hyper-parameters (ParamGroups bound to, and validated by, the copy) and the
    state arrays (pickled as NumPy arrays, restored in the current backend's memory).
    ``copy.copy`` keeps the same Parameters and copies the rest.

    Raises:
        TypeError: ``params`` a single Parameter or a set, an element that is neither an
            nn.Parameter nor a dict, or a group as :meth:`add_param_group` refuses it.
        ValueError: an empty parameter list, a parameter listed twice (in one group or two).
    """

    state_names: tuple = ()
    fixed_keys: tuple = ()
    """Hyper-parameters a group's state depends on: set when the group is made, never changed."""
    num_steps = LedgerAttribute()
    num_skipped_steps = LedgerAttribute()

    def __getattr__(self, name):
        """Only for an attribute there is not: PyTorch's ``step()`` and ``zero_grad()`` say
        where the update runs instead, in the ``AttributeError``."""
        why = ""
        if name in ("step", "zero_grad"):
            why = (": the update runs inside an nn.Graph (OneFlow's): self.add_optimizer(opt) in "
                   "the graph's __init__ and loss.backward() in its build, then each call of the "
                   "graph computes the gradients and updates the parameters (nothing to zero)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}{why}")

    def __init__(self, params, hyper: dict):
        name = type(self).__name__
        if isinstance(params, (Tensor, set, frozenset)):
            raise TypeError(f"{name}: params must be an ordered iterable of nn.Parameters or of "
                            f"param-group dicts, got a {type(params).__name__}"
                            + (" (sets have no fixed order: use a list)"
                               if isinstance(params, (set, frozenset)) else ""))
        groups = list(params)
        if not groups:
            raise ValueError(f"{name}: got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.version = 0
        self.num_steps = 0
        self.num_skipped_steps = 0
        self.defaults = self.validated(hyper)
        self.params, self.state, self._groups = [], {}, []
        self.learning_rates, self._lr_host = [], []
        for group in groups:
            self.add_param_group(group)
        self.version = 0

    def add_param_group(self, param_group: dict) -> None:
        """Add a parameter group (``torch.optim.Optimizer.add_param_group``): ``param_group``
        holds ``"params"`` (an nn.Parameter, or a list or tuple of them, or of ``(name,
        parameter)`` pairs as ``model.named_parameters()`` gives them: the names go to the
        group's ``"param_names"``, as PyTorch's) and any of the
        optimizer's hyper-parameters; the others take :attr:`defaults`. Other keys
        (``"name": "head"``, a misspelt ``"weight_decy"``) are kept in the group as given,
        unvalidated and unread by the update, as PyTorch keeps them (see :class:`ParamGroup`).
        The new parameters get fresh state; graphs training this optimizer recompile at their
        next call.

        Raises:
            TypeError: not a dict; ``params`` missing, a set, or holding something other than
                nn.Parameters; a hyper-parameter of the wrong type (as the constructor).
            ValueError: a bad hyper-parameter value; one of PyTorch's :attr:`torch_keys` at
                another value than its no-op one; named and unnamed parameters mixed (in the
                group, or this group and the others); a parameter twice in the group, or
                already in another group (PyTorch's "some parameters appear in more than one
                parameter group").
        """
        name = type(self).__name__
        if not isinstance(param_group, dict):
            raise TypeError(f"{name}.add_param_group: param_group must be a dict, got "
                            f"{type(param_group).__name__} (param groups cannot be mixed with "
                            "plain parameters)")
        if "params" not in param_group:
            raise TypeError(f"{name}.add_param_group: the group has no 'params'")
        params = param_group["params"]
        if isinstance(params, (set, frozenset)):
            raise TypeError(f"{name}: optimizer parameters need to be organized in ordered "
                            "collections, but the ordering of tensors in sets will change "
                            "between runs. Please use a list instead.")
        params = [params] if isinstance(params, Tensor) else list(params)
        named = {}
        if any(isinstance(p, tuple) for p in params):   # model.named_parameters(), as PyTorch
            if not all(isinstance(p, tuple) and len(p) == 2 for p in params):
                raise ValueError(f"{name}: all optimizer params should be with/without names "
                                 f"(group {len(self._groups)} mixes (name, parameter) pairs "
                                 "with other entries)")
            named = {"param_names": [n for n, _ in params]}
            params = [p for _, p in params]
        if self._groups and ("param_names" in self._groups[0]) != (
                bool(named) or "param_names" in param_group):
            raise ValueError(f"{name}: all optimizer param groups should be with/without names "
                             "(give every group model.named_parameters(), or none)")
        for i, p in enumerate(params):
            if not isinstance(p, Parameter):
                raise TypeError(f"{name}: parameter {i} of group {len(self._groups)} is a "
                                f"{type(p).__name__}, not an nn.Parameter; pass "
                                "model.parameters()")
        if len({id(p) for p in params}) != len(params):
            raise ValueError(f"{name}: a parameter appears twice in group {len(self._groups)}")
        if {id(p) for p in self.params} & {id(p) for p in params}:
            raise ValueError(f"{name}: some parameters appear in more than one parameter group")
        hyper, torch, others = self._split_keys(
            {**{k: v for k, v in param_group.items() if k != "params"}, **named})
        for key, value in torch.items():
            self._check_torch_key(f"{name}.add_param_group: {key}=", key, value)
        checked = self.validated({**self.defaults, **hyper})
        backend = get_backend()
        self._lr_host.append(np.array([checked["lr"]], np.float64))  # staging for _write_lr
        self.learning_rates.append(backend.from_numpy(self._lr_host[-1]))
        self._groups.append(ParamGroup(self, {**checked, **torch, **others}, params))
        names = self.group_state_names(checked)
        self.state.update((p, {s: backend.from_numpy(self._initial_state(s, p)) for s in names})
                          for p in params)
        self.params += params
        self.version += 1

    def _hyper_keys(self) -> frozenset:
        """The keys a group's :meth:`validated` hyper-parameters may have: :attr:`defaults`'s
        and ``initial_lr``."""
        return frozenset(self.defaults) | {"initial_lr"}

    def _split_keys(self, values: dict) -> tuple:
        """``values`` (no ``params``) as three dicts: the hyper-parameters, PyTorch's keys of
        :attr:`torch_keys` (checked at their no-op values) and the others (kept unread)."""
        hyper_keys = self._hyper_keys()
        out = ({}, {}, {})
        for k, v in values.items():
            out[0 if k in hyper_keys else 1 if k in self.torch_keys else 2][k] = v
        return out

    @property
    def param_groups(self) -> "_ParamGroups":
        """PyTorch's list of parameter groups (:class:`ParamGroup`). Change their values
        (``opt.param_groups[0]["lr"] = 0.01``) or add one (:meth:`add_param_group`); the list
        itself cannot be changed."""
        return _ParamGroups(self._groups)

    @param_groups.setter
    def param_groups(self, value):
        raise AttributeError(f"{type(self).__name__}.param_groups cannot be replaced; change a "
                             "value with opt.param_groups[0][key] = value, or use load_state_dict")

    @property
    def hyper(self) -> dict:
        """The hyper-parameters of group 0 (``param_groups[0]`` without ``params``)."""
        return self._groups[0].hyper()

    @property
    def learning_rate(self):
        """Group 0's learning-rate array (f64[1])."""
        return self.learning_rates[0]

    def _index(self, group) -> int:
        """The position of ``group`` in :attr:`param_groups`."""
        return next(i for i, g in enumerate(self._groups) if g is group)

    def group_state_names(self, hyper: dict) -> tuple:
        """The state arrays of every parameter of a group with ``hyper``: :attr:`state_names`
        (Adam's depend on ``amsgrad``)."""
        return self.state_names

    def group_slices(self) -> list:
        """Per group, ``(group, first, stop)``: its parameters are ``params[first:stop]``."""
        out, first = [], 0
        for g in self._groups:
            out.append((g, first, first + len(g["params"])))
            first += len(g["params"])
        return out

    def check_hyper(self, hyper: dict) -> dict:
        """The subclass's own hyper-parameters of ``hyper`` (all but ``lr`` and the clipping
        settings, which :meth:`validated` checks), validated and normalised (raises KeyError
        for a missing one, TypeError/ValueError naming the bad one)."""
        raise NotImplementedError

    def validated(self, hyper: dict) -> dict:
        """All hyper-parameters of ``hyper`` validated: ``lr`` (finite >= 0; 0 is allowed, as in
        PyTorch), the subclass's (:meth:`check_hyper`), the clipping settings (missing ones: the
        defaults, no clipping) and ``initial_lr`` if present (as lr, or None: PyTorch's group
        keeps a None too).

        ``clip_grad_max_norm``: None, or a finite number > 0; ``clip_grad_norm_type``: a number
        > 0, ``inf`` included (1, 2 and inf are the usual ones).

        Raises:
            KeyError / TypeError / ValueError naming the bad key and value.
        """
        name = type(self).__name__
        if "lr" not in hyper:
            raise KeyError(f"{name}: missing hyper-parameters ['lr']")
        out = {"lr": real(name, "lr", hyper["lr"], 0.0), **self.check_hyper(hyper)}
        max_norm = hyper.get("clip_grad_max_norm")
        if max_norm is not None:
            max_norm = real(name, "clip_grad_max_norm", max_norm)
            if not max_norm > 0.0:          # one message for 0 and below
                raise ValueError(f"{name}: clip_grad_max_norm must be > 0 (None: no clipping), "
                                 f"got {hyper['clip_grad_max_norm']!r}")
        norm_type = hyper.get("clip_grad_norm_type", 2.0)
        if not float(real_number(name, "clip_grad_norm_type", norm_type)) > 0:  # NaN fails too
            raise ValueError(f"{name}: clip_grad_norm_type must be > 0 (1, 2, float('inf') or "
                             f"any p > 0), got {norm_type!r}")
        out.update(clip_grad_max_norm=max_norm, clip_grad_norm_type=float(norm_type))
        if "initial_lr" in hyper:
            initial = hyper["initial_lr"]
            out["initial_lr"] = None if initial is None else real(name, "initial_lr", initial, 0.0)
        return out

    def _check_fixed(self, where: str, group: dict, changes: dict) -> None:
        """Refuse a change of a :attr:`fixed_keys` hyper-parameter of ``group`` (ValueError)."""
        for key in self.fixed_keys:
            if key in changes and key in group and bool(changes[key]) != bool(group[key]):
                raise ValueError(f"{where}: {key} cannot be changed after the group was made (it "
                                 f"is {group[key]}; the group's state depends on it): make a new "
                                 "optimizer or add a new group")

    def _hyper_changed(self, index: int, keys) -> None:
        """After ``keys`` of group ``index`` changed: write a new lr into its learning-rate
        array; bump :attr:`version` when a compiled key changed."""
        if "lr" in keys:
            self._write_lr(index, self._groups[index]["lr"])
        if any(k not in RUNTIME_KEYS for k in keys):
            self.version += 1

    def _write_lr(self, index: int, lr: float) -> None:
        """Put a (checked) learning rate into group ``index``'s learning-rate array."""
        self._lr_host[index][0] = lr
        get_backend().copy_in(self.learning_rates[index], self._lr_host[index])

    @property
    def clip_grads(self) -> list:
        """Per group, ``(max_norm, norm_type)`` when it clips its gradients, else None."""
        return [None if g["clip_grad_max_norm"] is None else
                (g["clip_grad_max_norm"], g["clip_grad_norm_type"]) for g in self._groups]

    @property
    def clip_grad(self):
        """Group 0's entry of :attr:`clip_grads`."""
        return self.clip_grads[0]

    def _record_step(self, skipped: bool) -> None:
        """Count one call of a graph that ran this optimizer's updates (nn.Graph calls it):
        :attr:`num_steps`, and :attr:`num_skipped_steps` when the grad scaler skipped it."""
        d = self.__dict__                    # not the LedgerAttributes: this may run in a flush
        d["num_steps"] += 1
        d["num_skipped_steps"] += bool(skipped)

    def _initial_state(self, name: str, p) -> np.ndarray:
        return np.zeros(p.shape, p.dtype.np)

    def emit_update(self, graph, index: int, name: str, param, grad, lr, skip_if,
                    hyper: dict) -> None:
        """Emit the update op of parameter ``index`` (variable ``name``, Value ``param``, gradient
        Value ``grad``) of a group with hyper-parameters ``hyper``, taking the group's
        learning-rate variable ``lr`` and ``skip_if`` (called by the optimizer pass)."""
        raise NotImplementedError

    def _state_values(self, graph, name, index, names=None):
        """Declare the parameter's state arrays (``names``, default all) as graph variables."""
        vals = []
        state = self.state[self.params[index]]
        for s in (state if names is None else names):
            arr = state[s]
            vals.append(graph.add_variable(f"{name}.{s}", arr.shape, as_dtype(arr.dtype), data=arr))
        return vals

    def state_dict(self) -> dict:
        """PyTorch layout: ``{"state": {i: {name: ndarray}}, "param_groups": [{..., "params":
        [i, ...]}, ...]}`` (``i`` counts the parameters across the groups, in order; each group
        holds every key of the param group, the user's own included, as PyTorch's does, and
        PyTorch's keys miniflow has not, :attr:`torch_keys`, at their no-op values, so that
        ``torch.optim``'s ``load_state_dict``, which replaces whole groups, takes it),
        plus miniflow's ``num_steps`` and ``num_skipped_steps`` (the graph calls that ran the
        updates, and those skipped; LR schedulers read them, see
        ``miniflow.optim.lr_scheduler``; PyTorch's ``load_state_dict`` ignores them)."""
        to_numpy = get_backend().to_numpy
        return {"state": {i: {k: to_numpy(v) for k, v in s.items()}
                          for i, s in enumerate(self.state.values())},
                "param_groups": [{**self.torch_keys, **g.values_without_params(),
                                  "params": list(range(first, stop))}
                                 for g, first, stop in self.group_slices()],
                "num_steps": self.num_steps, "num_skipped_steps": self.num_skipped_steps}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore state arrays (in place: compiled graphs see them) and hyper-parameters from
        :meth:`state_dict`'s layout. Everything is checked before anything is assigned, so a
        failed load changes nothing.

        Checked: as many param groups as the optimizer has (PyTorch's "loaded state dict has a
        different number of parameter groups"), each with its ``params`` (the indices
        :meth:`state_dict` gives it: PyTorch's "doesn't match the size of optimizer's group"
        when the count differs) and hyper-parameters (as the constructor; the clipping
        settings, ``initial_lr``, ``num_steps`` and ``num_skipped_steps`` may be missing: they
        keep their current values; :attr:`fixed_keys` unchanged); for every
        parameter in ``state`` every state array of its group, with the current shape, a
        real-number dtype, finite values, whole numbers >= 0 for integer state (step counts;
        whole floats such as PyTorch's float step are accepted) and values >= 0 for
        :attr:`nonnegative_states`. A parameter left out of ``state`` gets its initial state
        (zeros), as PyTorch holds none for a parameter not stepped yet, nor for any parameter of
        an optimizer without state (SGD without momentum).

        A group's other keys (:meth:`ParamGroup.others`: ``"name"``, ``"lr_mult"`` ...) become
        the loaded group's, unchecked and copied, as PyTorch's ``load_state_dict`` replaces
        each group by the loaded one: a key the group has and the loaded one has not is removed
        (but ``"param_names"``, which PyTorch's load keeps too).

        A ``torch.optim`` state dict of the same algorithm loads, its groups' own keys
        included: PyTorch's keys of :attr:`torch_keys` are accepted at their no-op values
        (``maximize=False``, ``capturable=False`` ...); ``state`` values may be
        ``torch.Tensor``s (read with ``miniflow.tensor.as_numpy``: bfloat16 ones bit for bit,
        as PyTorch keeps AdamW's ``exp_avg`` of bfloat16 parameters; float16, bfloat16 and
        float32 state is cast to the optimizer's state dtype) and a step count 0-d (PyTorch's).

        Raises:
            KeyError: a missing entry (named);
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
        if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) for g in groups):
            raise ValueError(f"{where}: 'param_groups' must be a list of dicts, one per group, "
                             f"got {_short(groups)}")
        if len(groups) != len(self._groups):
            raise ValueError(f"{where}: loaded state dict has a different number of parameter "
                             f"groups ({len(groups)}; this optimizer has {len(self._groups)})")
        hypers = [self._checked_group(where, j, dict(loaded), *spans)
                  for j, (loaded, spans) in enumerate(zip(groups, self.group_slices()))]
        n = len(self.params)
        if not isinstance(st, dict) or not set(st) <= set(range(n)):
            raise ValueError(f"{where}: 'state' must map parameter indices (0 to {n - 1}) to "
                             f"their state, got {_short(st)}")
        arrays = [{k: self._checked_state(where, i, k, st, v) if i in st else
                   np.asarray(self._initial_state(k, p), np.dtype(v.dtype))
                   for k, v in s.items()}
                  for i, (p, s) in enumerate(self.state.items())]
        counts = {}
        for key in ("num_steps", "num_skipped_steps"):
            counts[key] = integer(where, key, state_dict.get(key, getattr(self, key)), 0)
        if counts["num_skipped_steps"] > counts["num_steps"]:
            raise ValueError(f"{where}: num_skipped_steps {counts['num_skipped_steps']} is more "
                             f"than num_steps {counts['num_steps']}")

        def assign():
            backend = get_backend()  # everything is valid: assign
            for s, new in zip(self.state.values(), arrays):
                for k, v in s.items():
                    backend.copy_in(v, new[k])
            for j, (group, (hyper, others)) in enumerate(zip(self._groups, hypers)):
                for key in group.others():  # PyTorch's load replaces the group: its other
                    if key not in others and key != "param_names":  # keys are the loaded ones
                        dict.__delitem__(group, key)
                dict.update(group, hyper)  # in place: references to param_groups[j] stay valid
                dict.update(group, others)
                self._write_lr(j, hyper["lr"])
            self.__dict__.update(counts)
            self.version += 1
        return assign

    nonnegative_states: tuple = ()
    """State arrays whose values must be >= 0 (checked by :meth:`load_state_dict`)."""

    torch_keys: dict = {"maximize": False, "foreach": None, "capturable": False,
                        "differentiable": False, "fused": None}
    """``torch.optim`` param-group keys miniflow has not, each with the value under which
    PyTorch's update is miniflow's (``torch.optim.SGD`` / ``Adam`` / ``AdamW``'s documented
    defaults). ``foreach`` and ``fused`` (default None) choose PyTorch's implementation, not
    the update ("numerically the same", its docs), so any bool is taken too: a checkpoint of
    nanoGPT's ``AdamW(..., fused=True)`` loads. The others are taken at that value and
    refused at any other: in the constructor's
    keywords (:meth:`check_torch_options`), in a group dict, ``group[key] = v`` (the group keeps
    them, as other keys) and :meth:`load_state_dict` (which keeps them in a group that has them
    and drops them elsewhere), so a ``torch.optim`` state dict of the same algorithm loads."""

    def _check_torch_key(self, what: str, key: str, value) -> None:
        """Raises ValueError (``what`` then ``value`` named) unless ``value`` is PyTorch's no-op
        value of :attr:`torch_keys` ``key`` (for a key whose default is None, ``foreach`` or
        ``fused``, a bool too: another implementation of the same update)."""
        neutral = self.torch_keys[key]
        if (not (value is None or isinstance(value, (bool, np.bool_))) if neutral is None
                else value is None or value != neutral):
            taken = f"{neutral!r}" + (", False or True" if neutral is None else "")
            raise ValueError(f"{what}{value!r}; miniflow's {type(self).__name__} runs only "
                             f"PyTorch's {key}={taken} (leave it out, or set it to {taken})")

    def check_torch_options(self, options: dict) -> None:
        """PyTorch's constructor keywords that miniflow has not (:attr:`torch_keys`:
        ``foreach=None``, ``fused=None``, ``maximize=False`` ...): accepted at their no-op values,
        so that code written for ``torch.optim`` runs.

        Raises:
            TypeError: a keyword that is not one of them (as Python's own message).
            ValueError: one of them at another value (PyTorch's update would differ).
        """
        name = type(self).__name__
        for key, value in options.items():
            if key not in self.torch_keys:
                raise TypeError(f"{name}.__init__() got an unexpected keyword argument {key!r}")
            self._check_torch_key(f"{name}: {key}=", key, value)

    def _checked_group(self, where: str, j: int, loaded: dict, current: dict, first: int,
                       stop: int) -> tuple:
        """The validated hyper-parameters of loaded param group ``j`` (``current``, holding
        ``params[first:stop]``) and its other keys (:meth:`ParamGroup.others`: the user's, and
        PyTorch's :attr:`torch_keys` that ``current`` has, at their no-op values)."""
        params = loaded.pop("params", None)
        expected = list(range(first, stop))
        if params is not None:
            if not isinstance(params, (list, tuple)) or len(params) != len(expected):
                raise ValueError(f"{where}: loaded state dict contains a parameter group that "
                                 f"doesn't match the size of optimizer's group: "
                                 f"param_groups[{j}]['params'] is {_short(params)}, expected "
                                 f"{len(expected)} indices")
            if list(params) != expected:
                raise ValueError(f"{where}: param_groups[{j}]['params'] is {_short(params)}, "
                                 f"expected {_short(expected)} (one index per parameter, "
                                 "counted across the groups)")
        known = current.hyper()
        loaded, torch, others = self._split_keys(loaded)
        for key, value in torch.items():
            self._check_torch_key(f"{where}: param_groups[{j}][{key!r}] is ", key, value)
            if key in current:               # kept where the group has it, else dropped
                others[key] = value
        others = copy.deepcopy(others)       # as PyTorch's load: not shared with state_dict
        optional = {k: v for k, v in known.items() if k in CLIP_KEYS or k == "initial_lr"}
        try:
            self._check_fixed(type(self).__name__, current, loaded)
            return self.validated({**optional, **loaded}), others
        except (KeyError, TypeError, ValueError) as e:
            raise type(e)(f"{where}: param_groups[{j}]: {e.args[0]}") from None

    def _checked_state(self, where: str, i: int, key: str, st: dict, current) -> np.ndarray:
        """Loaded state ``key`` of parameter ``i`` as an array of ``current``'s dtype and shape."""
        what = f"state[{i}][{key!r}]"
        try:
            value = st[i][key]
        except (KeyError, IndexError, TypeError):
            raise KeyError(f"{where}: missing {what}; parameter {i} needs "
                           f"{list(self.state[self.params[i]])}") from None
        a = as_numpy(value)                  # a torch bfloat16 tensor too, bit for bit
        dtype = np.dtype(current.dtype)
        if a.dtype.kind not in "iuf" and not is_bfloat16(a.dtype):
            raise TypeError(f"{where}: {what} has dtype {a.dtype} ({_short(value)}), expected "
                            f"real numbers for a {dtype} state")
        if a.shape == () and tuple(current.shape) == (1,):
            a = a.reshape(1)                 # PyTorch's 0-d step count; miniflow's is [1]
        if a.shape != tuple(current.shape):
            raise ValueError(f"{where}: {what} has shape {list(a.shape)}, expected "
                             f"{list(current.shape)}")
        floating = dtype.kind == "f" or is_bfloat16(dtype)
        with np.errstate(all="ignore"):
            out = a.astype(dtype)
            bad = ~np.isfinite(out) if floating else out != a
        if key in self.nonnegative_states or dtype.kind in "iu":
            bad |= a < 0
        if bad.any():
            k = np.unravel_index(int(np.flatnonzero(bad)[0]), a.shape)
            need = ("finite" + (" and >= 0" if key in self.nonnegative_states else "")
                    if floating else f"a count >= 0 that {dtype} holds")
            raise ValueError(f"{where}: {what} must be {need}; element {[int(j) for j in k]} is "
                             f"{a[k].item()!r}")
        return out

    # ------------------------------------------------------------------ copy and pickle
    def __getstate__(self) -> dict:
        """State arrays and the learning-rate arrays as NumPy copies (device arrays do not
        pickle); parameters as they are."""
        LEDGER.flush()                       # the step counts up to date
        state = dict(self.__dict__)
        to_numpy = get_backend().to_numpy
        state["state"] = {p: {k: to_numpy(v) for k, v in s.items()}
                          for p, s in self.state.items()}
        state["learning_rates"] = [to_numpy(a) for a in self.learning_rates]
        return state

    def __setstate__(self, state: dict) -> None:
        backend = get_backend()
        state["state"] = {p: {k: backend.from_numpy(v) for k, v in s.items()}
                          for p, s in state["state"].items()}
        state["learning_rates"] = [backend.from_numpy(a) for a in state["learning_rates"]]
        state["_lr_host"] = [np.array(a) for a in state["_lr_host"]]
        self.__dict__.update(state)

    def __copy__(self) -> "Optimizer":
        """``copy.copy``: an optimizer of the same Parameters with copies of the state arrays and
        its own ParamGroups (a shared group would change both optimizers' hyper-parameters while
        only one of them marks its graphs for recompilation)."""
        new = type(self).__new__(type(self))
        new.__setstate__(self.__getstate__())
        new.params = list(self.params)
        new._groups = [ParamGroup(new, g.values_without_params(), list(g["params"]),
                                  g._hyper_keys) for g in self._groups]
        new.defaults = dict(self.defaults)
        return new


def _short(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
