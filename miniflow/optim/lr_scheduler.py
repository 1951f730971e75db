"""Learning-rate schedulers with ``torch.optim.lr_scheduler``'s names, arguments, formulas and
``state_dict`` keys: :class:`StepLR`, :class:`MultiStepLR`, :class:`ExponentialLR`,
:class:`CosineAnnealingLR`, :class:`CosineAnnealingWarmRestarts`, :class:`LinearLR` and
:class:`ConstantLR` (warm-ups), :class:`PolynomialLR`, :class:`LambdaLR`,
:class:`MultiplicativeLR`, :class:`SequentialLR`, :class:`ChainedScheduler` and
:class:`ReduceLROnPlateau` (driven by a metric: ``step(val_loss)``; see its docstring).

Use them as in PyTorch: make the scheduler after the optimizer (this sets the first lr), call
``scheduler.step()`` once after every optimizer step (every call of a training nn.Graph), or
give it to the graph as in OneFlow (``add_optimizer(opt, lr_sch=scheduler)``: the graph steps it
after each call, and its ``step()`` by hand raises, as it would advance twice per update), read
the lr with ``get_last_lr()``. A scheduler sets ``group["lr"]`` of every param group of its
optimizer: any object with ``param_groups``, a sequence of dicts with a real ``"lr"`` (miniflow
optimizers have one group). On a miniflow optimizer that writes the
optimizer's learning-rate variable, which the compiled graph reads at its next call: a schedule
that changes the lr every step never recompiles (``miniflow.optim.optimizer``).

Skipped steps do not count. When the grad scaler of an nn.Graph skips a step (non-finite
gradients: no parameter changed), the optimizer counts it (``num_steps`` and
``num_skipped_steps``, which nn.Graph updates after every call), and the next ``step()`` of its
schedulers does nothing: ``last_epoch`` and the lr stay, so the lr of the k-th *applied* update
is the schedule's k-th lr, whatever the scaler skipped. Precisely: ``step()`` advances unless the
optimizer ran at least one graph step since the previous ``step()`` and all of them were
skipped; so a per-epoch schedule (one ``step()`` per epoch) advances unless the whole epoch was
skipped, and ``step()`` without any graph call in between (or on an optimizer that counts no
steps, such as a plain object with ``param_groups``) always advances. PyTorch advances anyway
(and warns that ``optimizer.step()`` was not called). The counts the scheduler last saw are in
its ``state_dict()`` (``_optimizer_steps_seen``), so a resumed run skips the same steps.

The lr sequences are PyTorch's to rounding: each ``get_lr`` is PyTorch's recursive ("chainable")
form, which computes the next lr from the current one (so changes made to ``group["lr"]`` by
other code carry on, as in PyTorch), and :class:`SequentialLR` restarts a scheduler at its
milestone with that scheduler's closed form, as PyTorch does. :class:`CosineAnnealingLR` follows
PyTorch's recursion, not the textbook closed form (they differ by rounding), and keeps going
past ``T_max`` as PyTorch does (the lr rises again towards the base lr).

Differences from PyTorch:

- The initial lr is PyTorch's: every param group gets ``group["initial_lr"]``, set by the first
  scheduler made for the optimizer (``group.setdefault("initial_lr", group["lr"])``) and used as
  ``base_lrs`` by every later one (that is why a cosine schedule made after a warm-up still
  starts from the full lr). A miniflow ``ParamGroup`` accepts that one new key, checks it like
  ``lr`` (or takes None, as PyTorch's group does), and keeps it out of the compiled graph; it is
  in the optimizer's ``state_dict()``, as in PyTorch. A scheduler made for a group whose
  ``initial_lr`` is None raises at once (PyTorch's takes ``base_lrs=[None]`` and fails at the
  first lr computed from it, or never).
- ``last_epoch`` must be -1 (its default): resume by making the scheduler afresh and calling
  ``load_state_dict`` (PyTorch's ``last_epoch=n`` resume path is deprecated there).
- Skipped steps do not count (above).
- ``step()`` takes no ``epoch`` (deprecated in PyTorch); there are no call-order warnings
  (miniflow optimizers have no ``step()`` to watch).
- Arguments are validated (PyTorch accepts e.g. ``gamma=0``, ``T_max=0`` or decreasing
  milestones and fails later or never); a SequentialLR cannot contain a SequentialLR (PyTorch's
  fails at the first milestone) or a ChainedScheduler; every new lr must be a finite real
  number (a ``LambdaLR`` returning NaN raises) and a step that raises changes nothing.
- ``load_state_dict`` checks the keys and values (PyTorch's ``state_dict`` of the same class
  loads: its transient flags ``_get_lr_called_within_step`` and ``_is_initial`` are accepted and
  ignored) and applies all or nothing. It does not touch the optimizer: load the optimizer's
  state too, it holds the current lr (as in PyTorch).
"""
from __future__ import annotations

import math
import types
import weakref
from bisect import bisect_right
from collections import Counter

from ..checks import integer, is_real, real

__all__ = ["ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts",
           "ExponentialLR", "LRScheduler", "LambdaLR", "LinearLR", "MultiStepLR",
           "MultiplicativeLR", "PolynomialLR", "ReduceLROnPlateau", "SequentialLR", "StepLR"]

_TORCH_FLAGS = ("_get_lr_called_within_step", "_is_initial")
"""Keys of PyTorch's scheduler state dicts that are always False between calls."""

_STEPPED_BY: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""Scheduler -> the nn.Graphs that step it (``add_optimizer(lr_sch=)``), both weakly held (a
copy of a scheduler is stepped by no graph)."""

_SEEN = "_optimizer_steps_seen"
"""miniflow's state-dict key: the optimizer's step counts at the scheduler's last step."""


# ------------------------------------------------------------------------------------ checks
def _reals(owner: str, name: str, values, count: int, fewer: bool = False) -> list:
    """A list of ``count`` finite floats (``base_lrs``, ``_last_lr``); with ``fewer``, of 1 to
    ``count`` (``base_lrs`` of a scheduler made before ``add_param_group`` added groups: it
    has none for them, as PyTorch's)."""
    if not isinstance(values, (list, tuple)) or not (
            len(values) == count or fewer and 1 <= len(values) < count):
        least = "1 to " if fewer and count > 1 else ""
        raise ValueError(f"{owner}: {name} must be a list of {least}{count} numbers (one per "
                         f"param group), got {values!r}")
    return [real(owner, f"{name}[{i}]", v) for i, v in enumerate(values)]


def _param_groups(owner: str, optimizer) -> list:
    """``optimizer.param_groups``, checked: a non-empty sequence of dicts with a real lr."""
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, (list, tuple)) or not groups or \
            not all(isinstance(g, dict) and "lr" in g for g in groups):
        raise TypeError(f"{owner}: expected an optimizer (an object whose param_groups is a "
                        f"non-empty list of dicts with 'lr'), got {type(optimizer).__name__} "
                        f"with param_groups={groups!r:.80}")
    for i, g in enumerate(groups):
        real(owner, f"param_groups[{i}]['lr']", g["lr"])
    return list(groups)


def _initial_lrs(owner: str, optimizer) -> list:
    """The optimizer's initial lrs: ``group.setdefault("initial_lr", group["lr"])`` for every
    param group (PyTorch's rule: the first scheduler made for the optimizer records them).

    Raises:
        TypeError: a group's ``initial_lr`` is None (PyTorch's setdefault keeps the None, and its
            schedulers fail at the first lr computed from it, or never) or not a real number.
        ValueError: one that is NaN or infinite.
    """
    groups = _param_groups(owner, optimizer)
    out = []
    for i, g in enumerate(groups):
        initial = g.setdefault("initial_lr", g["lr"])
        if initial is None:
            raise TypeError(f"{owner}: param_groups[{i}]['initial_lr'] is None, and a scheduler "
                            f"computes the lrs from it: set it to a number (param_groups[{i}]"
                            f"['initial_lr'] = param_groups[{i}]['lr'] takes the current lr)")
        out.append(real(owner, f"param_groups[{i}]['initial_lr']", initial))
    return out


def _step_counts(optimizer):
    """``(num_steps, num_skipped_steps)`` of a miniflow optimizer (see the module docstring), or
    None for an optimizer that does not count its steps."""
    counts = (getattr(optimizer, "num_steps", None), getattr(optimizer, "num_skipped_steps", None))
    return None if None in counts else counts


def _seen_list(counts):
    """Step counts as the state dict holds them: a list, or None."""
    return None if counts is None else list(counts)


def _seen_counts(owner: str, name: str, value):
    """A saved ``_optimizer_steps_seen``: None or ``[num_steps, num_skipped_steps]``."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"{owner}: {name} must be None or [num_steps, num_skipped_steps], got "
                         f"{value!r}")
    steps, skipped = (integer(owner, f"{name}[{i}]", v, 0) for i, v in enumerate(value))
    if skipped > steps:
        raise ValueError(f"{owner}: {name} has more skipped steps than steps: {value!r}")
    return steps, skipped


def _milestone_list(owner: str, milestones, strict: bool, low: int) -> list:
    """Milestones as a list of ints >= ``low``, increasing (non-decreasing unless ``strict``)."""
    try:
        values = list(milestones)
    except TypeError:
        raise TypeError(f"{owner}: milestones must be a list of integers, got "
                        f"{milestones!r}") from None
    values = [integer(owner, f"milestones[{i}]", m, low) for i, m in enumerate(values)]
    for a, b in zip(values, values[1:]):
        if b < a or (strict and b == a):
            order = "strictly increasing" if strict else "non-decreasing"
            raise ValueError(f"{owner}: milestones must be {order}, got {values}")
    return values


def _check_last_epoch(owner: str, last_epoch) -> None:
    if isinstance(last_epoch, bool) or last_epoch != -1:
        raise ValueError(f"{owner}: last_epoch={last_epoch!r} is not supported: to resume, make "
                         "the scheduler with last_epoch=-1 and call load_state_dict(saved state)")


def _checked_schedulers(where: str, schedulers: list, states) -> list:
    """Each of ``schedulers`` checks its saved state of ``states`` (a SequentialLR's or a
    ChainedScheduler's ``_schedulers``); an error names the index."""
    checked = []
    for i, (s, sub) in enumerate(zip(schedulers, states)):
        try:
            checked.append(s._checked(sub))
        except (KeyError, TypeError, ValueError) as e:
            raise type(e)(f"{where}: _schedulers[{i}]: {e.args[0]}") from None
    return checked


# ------------------------------------------------------------------------------------- base
class LRScheduler:
    """Base class: subclasses implement :meth:`get_lr` (the lrs at ``last_epoch`` from the
    current ones) and, where one exists, :meth:`_get_closed_form_lr` (from ``base_lrs``).

    Attributes:
        optimizer: the optimizer whose ``param_groups[i]["lr"]`` this sets.
        base_lrs: the initial lr of each group (see the module docstring).
        last_epoch: how many times :meth:`step` advanced (0 after construction; a step after
            skipped optimizer steps does not advance, see the module docstring).

    Args:
        optimizer: see the module docstring.
        last_epoch: must be -1 (resume with :meth:`load_state_dict`).

    Raises:
        TypeError: an optimizer without valid ``param_groups``.
        ValueError: ``last_epoch`` other than -1.
    """

    _hyper: dict = {}
    """Constructor argument -> ``check(owner, name, value)``: the hyper-parameters, kept in the
    state dict under their names (PyTorch's keys)."""

    def __init__(self, optimizer, last_epoch: int = -1):
        name = type(self).__name__
        _check_last_epoch(name, last_epoch)
        self.optimizer = optimizer
        self.base_lrs = _initial_lrs(name, optimizer)
        self.last_epoch = -1
        self._seen_steps = _step_counts(optimizer)
        self._initial_step()

    def _set_hyper(self, **values) -> None:
        """Check and set hyper-parameters with :attr:`_hyper` (constructor errors)."""
        for k, v in values.items():
            setattr(self, k, self._hyper[k](type(self).__name__, k, v))

    def _initial_step(self) -> None:
        """Step to epoch 0: the first lr. (``_step_count`` counts the steps, as PyTorch's; it is
        kept for the state dict only.)"""
        self._step_count = 0
        self._advance()

    def get_lr(self) -> list:
        """The lr of each param group at :attr:`last_epoch`, computed from the current lrs
        (PyTorch's recursive form). Called by :meth:`step`; read the current lrs with
        :meth:`get_last_lr`."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr()")

    def _get_closed_form_lr(self) -> list:
        """The lrs at :attr:`last_epoch` from :attr:`base_lrs` (SequentialLR restarts a
        scheduler with it); :meth:`get_lr` where there is no closed form (as PyTorch)."""
        return self.get_lr()

    def _group_base_lrs(self) -> list:
        """:attr:`base_lrs`, checked to have one per param group (the lrs computed from them).

        Raises:
            ValueError: the optimizer has more param groups than the scheduler has base lrs:
                groups added with ``add_param_group`` after the scheduler was made (PyTorch's
                fails there too, with zip's "argument 2 is longer than argument 1")."""
        n = len(self.optimizer.param_groups)
        if len(self.base_lrs) != n:
            raise ValueError(f"{type(self).__name__}: the optimizer has {n} param groups but "
                             f"this scheduler has base_lrs for {len(self.base_lrs)} "
                             f"({self.base_lrs}): groups were added with add_param_group after "
                             "the scheduler was made, and this schedule computes every lr from "
                             "its group's base lr; make the scheduler after adding the groups")
        return self.base_lrs

    def get_last_lr(self) -> list:
        """The lr of each param group set by the last :meth:`step` (a new list)."""
        return list(self._last_lr)

    def step(self) -> None:
        """Advance one epoch/iteration and set the optimizer's lrs, unless every optimizer step
        since the last call was skipped by the grad scaler (then nothing changes; see the module
        docstring). Call it after each optimizer step (each call of the training graph).

        Raises:
            ValueError/TypeError: a new lr is not a finite real number (e.g. a LambdaLR's
                function returned NaN), or the optimizer refused it (a miniflow ParamGroup
                refuses lr < 0); nothing changes.
            RuntimeError: the scheduler was given to an nn.Graph (``add_optimizer(opt,
                lr_sch=scheduler)``, or it is part of a SequentialLR given so), which steps it
                after every call: a step by hand too would advance it twice per update.
        """
        graphs = sorted(g.name for g in _STEPPED_BY.get(self, ()))
        if graphs:
            raise RuntimeError(
                f"{type(self).__name__}.step(): this scheduler was given to nn.Graph "
                f"{', '.join(graphs)} (add_optimizer(opt, lr_sch=...)), which steps it after "
                "every call that ran the update; stepping it by hand too would advance the "
                "schedule twice per update. Remove the step() call, or leave lr_sch out")
        self._scheduled_step()

    def _scheduled_step(self) -> None:
        """The body of :meth:`step` (an nn.Graph given this scheduler as ``lr_sch`` calls it)."""
        if not self._skipped():
            self._advance()

    def _stepped_by(self, graph) -> None:
        """Note that ``graph`` steps this scheduler (``add_optimizer(lr_sch=)``): :meth:`step`
        by hand is refused while the graph exists (a weak reference)."""
        _STEPPED_BY.setdefault(self, weakref.WeakSet()).add(graph)

    def _skipped(self) -> bool:
        """Whether the optimizer ran graph steps since the last call and the grad scaler skipped
        all of them; records the optimizer's step counts."""
        now = _step_counts(self.optimizer)
        seen, self._seen_steps = self._seen_steps, now
        if now is None or seen is None:
            return False
        steps, skipped = now[0] - seen[0], now[1] - seen[1]
        return steps > 0 and skipped == steps

    def _advance(self) -> None:
        """One step of the schedule (:meth:`step` without the skipped-step rule)."""
        self._update_lr()
        self._step_count += 1

    def _update_lr(self, epoch: int | None = None) -> None:
        """Move to ``last_epoch + 1`` with :meth:`get_lr`, or to ``epoch`` with the closed form,
        and set the lrs; on any error restore ``last_epoch`` and the lrs."""
        before = self.last_epoch
        groups = self.optimizer.param_groups
        old = self._current()
        try:
            self.last_epoch = before + 1 if epoch is None else epoch
            values = self.get_lr() if epoch is None else self._get_closed_form_lr()
            values = [real(type(self).__name__,
                           f"the lr of param group {i} at epoch {self.last_epoch}", v)
                      for i, v in enumerate(values)]
            for g, v in zip(groups, values, strict=True):
                if g["lr"] != v:  # an unchanged lr is not set (nothing to write)
                    g["lr"] = v
        except BaseException:
            self.last_epoch = before
            for g, v in zip(groups, old):
                if g["lr"] != v:
                    g["lr"] = v
            raise
        self._last_lr = self._current()

    def _current(self) -> list:
        """The current lr of each param group."""
        return [g["lr"] for g in self.optimizer.param_groups]

    # ------------------------------------------------------------------------ state dict
    def state_dict(self) -> dict:
        """PyTorch's keys: the hyper-parameters (the constructor's argument names), ``base_lrs``,
        ``last_epoch``, ``_step_count`` and ``_last_lr``, plus miniflow's
        ``_optimizer_steps_seen`` (the optimizer's step counts at the last :meth:`step`, or
        None); plain values (lists, numbers), as :func:`miniflow.save` stores them."""
        state = {k: getattr(self, k) for k in self._hyper}
        state.update(base_lrs=list(self.base_lrs), last_epoch=self.last_epoch,
                     _step_count=self._step_count, _last_lr=list(self._last_lr),
                     _optimizer_steps_seen=_seen_list(self._seen_steps))
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict`'s values (PyTorch's scheduler state dict of the same class
        loads too). Everything is checked before anything is assigned. The optimizer is not
        touched: restore its state as well (it holds the current lr).

        ``_optimizer_steps_seen`` may be missing (a PyTorch state dict): the optimizer's current
        step counts are taken. ``base_lrs`` may have fewer entries than the optimizer has param
        groups: the state of a scheduler made before ``add_param_group`` added some (it has
        no base lr for them, as PyTorch's).

        Raises:
            KeyError: missing or unknown keys (listed); ValueError/TypeError: a value that the
                constructor would refuse, or lists of the wrong length (naming the key).
        """
        self.prepare_load_state_dict(state_dict)()

    def prepare_load_state_dict(self, state_dict: dict):
        """Check ``state_dict`` as :meth:`load_state_dict` does and return a function of no
        arguments that assigns it (a caller restoring several objects checks them all first).

        Raises:
            as :meth:`load_state_dict`.
        """
        checked = self._checked(state_dict)
        return lambda: self._apply(dict(checked))

    def _state_keys(self) -> tuple:
        return (*self._hyper, "base_lrs", "last_epoch", "_step_count", "_last_lr")

    def _checked(self, state: dict) -> dict:
        """The validated values of a state dict (raises as :meth:`load_state_dict`)."""
        where = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: expected a dict (a state_dict()), got "
                            f"{type(state).__name__}")
        keys = self._state_keys()
        missing = [k for k in keys if k not in state]
        unknown = sorted(set(state) - set(keys) - set(_TORCH_FLAGS) - {_SEEN}, key=str)
        if missing or unknown:
            raise KeyError(f"{where}: missing keys {missing}, unknown keys {unknown} (a state "
                           f"dict of another scheduler class?); {type(self).__name__} has "
                           f"{list(keys)}")
        for flag in _TORCH_FLAGS:
            if state.get(flag, False) is not False:
                raise ValueError(f"{where}: {flag} must be False (saved between steps), got "
                                 f"{state[flag]!r}")
        n = len(self.optimizer.param_groups)
        return {**{k: check(where, k, state[k]) for k, check in self._hyper.items()},
                **self._checked_extra(where, state),
                "base_lrs": _reals(where, "base_lrs", state["base_lrs"], n, fewer=True),
                "_last_lr": _reals(where, "_last_lr", state["_last_lr"], n),
                "last_epoch": integer(where, "last_epoch", state["last_epoch"], -1),
                "_step_count": integer(where, "_step_count", state["_step_count"], 0),
                "_seen_steps": self._checked_seen(where, state)}

    def _checked_seen(self, where: str, state: dict):
        """The loaded ``_optimizer_steps_seen``, or the optimizer's counts when it is missing."""
        if _SEEN not in state:
            return _step_counts(self.optimizer)
        return _seen_counts(where, _SEEN, state[_SEEN])

    def _checked_extra(self, where: str, state: dict) -> dict:
        """Subclass state beyond the hyper-parameters and the common keys."""
        return {}

    def _apply(self, checked: dict) -> None:
        for k, v in checked.items():
            setattr(self, k, v)


# ------------------------------------------------------------------------------ schedulers
class StepLR(LRScheduler):
    """Multiply the lr by ``gamma`` every ``step_size`` epochs: ``lr_e = base_lr *
    gamma ** (e // step_size)`` (PyTorch's ``StepLR``).

    Raises:
        ValueError: step_size not an integer >= 1; gamma not finite > 0 (TypeError: not a
            number).
    """

    _hyper = {"step_size": lambda o, n, v: integer(o, n, v, 1),
              "gamma": lambda o, n, v: real(o, n, v, 0.0, low_open=True)}

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        self._set_hyper(step_size=step_size, gamma=gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._current()
        return [lr * self.gamma for lr in self._current()]

    def _get_closed_form_lr(self) -> list:
        return [b * self.gamma ** (self.last_epoch // self.step_size)
                for b in self._group_base_lrs()]


def _milestone_counts(owner: str, name: str, value) -> Counter:
    """MultiStepLR's state: ``{milestone: times listed}`` (PyTorch's Counter)."""
    if not isinstance(value, dict):
        raise TypeError(f"{owner}: {name} must be a dict milestone -> count (a Counter), got "
                        f"{value!r}")
    return Counter({integer(owner, f"{name} key", m, 0): integer(owner, f"{name}[{m!r}]", c, 1)
                    for m, c in value.items()})


class MultiStepLR(LRScheduler):
    """Multiply the lr by ``gamma`` at each milestone: ``lr_e = base_lr * gamma ** (number of
    milestones <= e)``; a milestone listed k times multiplies by ``gamma ** k`` (PyTorch's
    ``MultiStepLR``). ``milestones`` is stored as a Counter, as in PyTorch.

    Raises:
        ValueError: a milestone not an integer >= 0, milestones decreasing, gamma not finite
            > 0 (TypeError: gamma not a number, milestones not iterable).
    """

    _hyper = {"milestones": _milestone_counts,
              "gamma": lambda o, n, v: real(o, n, v, 0.0, low_open=True)}

    def __init__(self, optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1):
        self.milestones = Counter(_milestone_list("MultiStepLR", milestones, strict=False,
                                                  low=0))
        self._set_hyper(gamma=gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self.last_epoch not in self.milestones:
            return self._current()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._current()]

    def _get_closed_form_lr(self) -> list:
        passed = bisect_right(sorted(self.milestones.elements()), self.last_epoch)
        return [b * self.gamma ** passed for b in self._group_base_lrs()]

    def state_dict(self) -> dict:
        return {**super().state_dict(), "milestones": Counter(self.milestones)}


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the base lr to ``eta_min`` over ``T_max`` epochs (Loshchilov &
    Hutter, SGDR, arXiv:1608.03983, without restarts), PyTorch's ``CosineAnnealingLR``:
    ``lr_e ~ eta_min + (base_lr - eta_min) (1 + cos(pi e / T_max)) / 2``, computed by PyTorch's
    recursion ``lr_e = eta_min + (lr_{e-1} - eta_min) (1 + cos(pi e / T_max)) /
    (1 + cos(pi (e - 1) / T_max))``, with PyTorch's special step where the denominator is 0
    (e = T_max + 1 mod 2 T_max): past ``T_max`` the lr rises again, as PyTorch's does.

    Raises:
        ValueError: T_max not an integer >= 1; eta_min not finite >= 0.
    """

    _hyper = {"T_max": lambda o, n, v: integer(o, n, v, 1),
              "eta_min": lambda o, n, v: real(o, n, v, 0.0)}

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        self._set_hyper(T_max=T_max, eta_min=eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        e, t, lo = self.last_epoch, self.T_max, self.eta_min
        if e == 0:
            return self._current()
        if (e - 1 - t) % (2 * t) == 0:
            return [lr + (b - lo) * (1 - math.cos(math.pi / t)) / 2
                    for b, lr in zip(self._group_base_lrs(), self._current(), strict=True)]
        return [(1 + math.cos(math.pi * e / t)) / (1 + math.cos(math.pi * (e - 1) / t))
                * (lr - lo) + lo for lr in self._current()]

    def _get_closed_form_lr(self) -> list:
        return [self.eta_min + (b - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch
                                                                  / self.T_max)) / 2
                for b in self._group_base_lrs()]


def _restart_position(epoch: int, t_0: int, t_mult: int) -> tuple:
    """``(T_cur, T_i)`` at ``epoch``: the epochs since the last restart and the current cycle's
    length, cycles of ``t_0``, ``t_0 * t_mult``, ... epochs (PyTorch's recursion, in integers)."""
    t_cur, t_i = epoch, t_0
    while t_cur >= t_i:
        t_cur, t_i = t_cur - t_i, t_i * t_mult
    return t_cur, t_i


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing restarted every cycle (SGDR, arXiv:1608.03983), PyTorch's
    ``CosineAnnealingWarmRestarts``: ``lr_e = eta_min + (base_lr - eta_min) (1 + cos(pi T_cur /
    T_i)) / 2``, where ``T_cur`` counts the epochs since the last restart and ``T_i``, the
    cycle's length, starts at ``T_0`` and is multiplied by ``T_mult`` at every restart.

    ``step()`` takes no epoch: PyTorch's ``step(epoch)`` with a fractional epoch (``step(epoch
    + i / iters)``, restarts within an epoch) is not there; call ``step()`` once per batch with
    ``T_0`` counted in batches instead. ``T_cur`` and ``T_i`` are in the state dict (PyTorch's
    keys); a state whose ``T_cur`` or ``T_i`` does not follow from its ``last_epoch`` (saved
    after a ``step(epoch)``) is refused by ``load_state_dict``.

    Raises:
        ValueError: T_0 not an integer >= 1, T_mult not an integer >= 1, eta_min not finite
            >= 0.
    """

    _hyper = {"T_0": lambda o, n, v: integer(o, n, v, 1),
              "T_mult": lambda o, n, v: integer(o, n, v, 1),
              "eta_min": lambda o, n, v: real(o, n, v, 0.0)}

    def __init__(self, optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0,
                 last_epoch: int = -1):
        self._set_hyper(T_0=T_0, T_mult=T_mult, eta_min=eta_min)
        self.T_cur, self.T_i = -1, self.T_0
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        self.T_cur, self.T_i = _restart_position(self.last_epoch, self.T_0, self.T_mult)
        lo = self.eta_min
        return [lo + (b - lo) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for b in self._group_base_lrs()]

    def state_dict(self) -> dict:
        return {**super().state_dict(), "T_i": self.T_i, "T_cur": self.T_cur}

    def _state_keys(self) -> tuple:
        return (*super()._state_keys(), "T_i", "T_cur")

    def _checked_extra(self, where: str, state: dict) -> dict:
        epoch = integer(where, "last_epoch", state["last_epoch"], 0)
        t_0 = integer(where, "T_0", state["T_0"], 1)
        expected = _restart_position(epoch, t_0, integer(where, "T_mult", state["T_mult"], 1))
        if (state["T_cur"], state["T_i"]) != expected:
            raise ValueError(f"{where}: T_cur {state['T_cur']!r} and T_i {state['T_i']!r} do "
                             f"not follow from last_epoch {epoch} (expected {expected[0]} and "
                             f"{expected[1]}): a state saved after step(epoch) with an epoch of "
                             "its own, which this scheduler has not")
        return {"T_cur": expected[0], "T_i": expected[1]}


class LinearLR(LRScheduler):
    """Scale the lr by a factor going linearly from ``start_factor`` to ``end_factor`` over
    ``total_iters`` epochs, then keep it (a warm-up when end_factor is 1): ``lr_e = base_lr *
    (start + (end - start) * min(e, total_iters) / total_iters)``, computed by PyTorch's
    recursion (PyTorch's ``LinearLR``).

    Raises:
        ValueError: start_factor outside (0, 1], end_factor outside [0, 1], total_iters not an
            integer >= 1 (TypeError: a factor that is not a number).
    """

    _hyper = {"start_factor": lambda o, n, v: real(o, n, v, 0.0, 1.0, low_open=True),
              "end_factor": lambda o, n, v: real(o, n, v, 0.0, 1.0),
              "total_iters": lambda o, n, v: integer(o, n, v, 1)}

    def __init__(self, optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1):
        self._set_hyper(start_factor=start_factor, end_factor=end_factor,
                        total_iters=total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        e, s, d = self.last_epoch, self.start_factor, self.end_factor - self.start_factor
        if e == 0:
            return [lr * s for lr in self._current()]
        if e > self.total_iters:
            return self._current()
        return [lr * (1.0 + d / (self.total_iters * s + (e - 1) * d)) for lr in self._current()]

    def _get_closed_form_lr(self) -> list:
        d = self.end_factor - self.start_factor
        return [b * (self.start_factor + d * min(self.total_iters, self.last_epoch)
                     / self.total_iters) for b in self._group_base_lrs()]


class ExponentialLR(LRScheduler):
    """Multiply the lr by ``gamma`` every epoch: ``lr_e = base_lr * gamma ** e`` (PyTorch's
    ``ExponentialLR``, by its recursion ``lr_e = lr_{e-1} * gamma``).

    Raises:
        ValueError: gamma not finite > 0 (TypeError: not a number).
    """

    _hyper = {"gamma": lambda o, n, v: real(o, n, v, 0.0, low_open=True)}

    def __init__(self, optimizer, gamma: float, last_epoch: int = -1):
        self._set_hyper(gamma=gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self.last_epoch == 0:
            return self._current()
        return [lr * self.gamma for lr in self._current()]

    def _get_closed_form_lr(self) -> list:
        return [b * self.gamma ** self.last_epoch for b in self._group_base_lrs()]


class ConstantLR(LRScheduler):
    """Scale the lr by ``factor`` for the first ``total_iters`` epochs, then give back the base
    lr: ``lr_e = base_lr * (factor if e < total_iters else 1)`` (a constant warm-up; PyTorch's
    ``ConstantLR``, by its recursion: times ``factor`` at epoch 0, times ``1 / factor`` at
    ``total_iters``).

    Raises:
        ValueError: factor outside (0, 1] (PyTorch accepts 0 and then divides by it at
            ``total_iters``), total_iters not an integer >= 1 (PyTorch's recursion keeps the
            factor for ever at 0, its closed form none) (TypeError: a factor that is not a
            number).
    """

    _hyper = {"factor": lambda o, n, v: real(o, n, v, 0.0, 1.0, low_open=True),
              "total_iters": lambda o, n, v: integer(o, n, v, 1)}

    def __init__(self, optimizer, factor: float = 1.0 / 3, total_iters: int = 5,
                 last_epoch: int = -1):
        self._set_hyper(factor=factor, total_iters=total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self.last_epoch == 0:
            return [lr * self.factor for lr in self._current()]
        if self.last_epoch != self.total_iters:
            return self._current()
        return [lr * (1.0 / self.factor) for lr in self._current()]

    def _get_closed_form_lr(self) -> list:
        f = self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor)
        return [b * f for b in self._group_base_lrs()]


class PolynomialLR(LRScheduler):
    """Decay the lr to 0 over ``total_iters`` epochs as a polynomial of degree ``power``, then
    keep it: ``lr_e = base_lr * (1 - min(e, total_iters) / total_iters) ** power``, computed by
    PyTorch's recursion (PyTorch's ``PolynomialLR``).

    Raises:
        ValueError: total_iters not an integer >= 1, power not finite >= 0 (TypeError: a power
            that is not a number).
    """

    _hyper = {"total_iters": lambda o, n, v: integer(o, n, v, 1),
              "power": lambda o, n, v: real(o, n, v, 0.0)}

    def __init__(self, optimizer, total_iters: int = 5, power: float = 1.0,
                 last_epoch: int = -1):
        self._set_hyper(total_iters=total_iters, power=power)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        e, t = self.last_epoch, self.total_iters
        if e == 0 or e > t:
            return self._current()
        decay = ((1.0 - e / t) / (1.0 - (e - 1) / t)) ** self.power
        return [lr * decay for lr in self._current()]

    def _get_closed_form_lr(self) -> list:
        return [b * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters)
                ** self.power for b in self._group_base_lrs()]


class LambdaLR(LRScheduler):
    """``lr_e = base_lr * lr_lambda(e)`` (PyTorch's ``LambdaLR``).

    Args:
        lr_lambda: a function of the epoch (int) returning a factor, or a list of them, one per
            param group.

    ``state_dict()["lr_lambdas"]`` holds, per function, None for a plain function or lambda
    (code is not saved: make the scheduler with the same functions before loading) and a copy
    of ``__dict__`` for a callable object, restored by ``load_state_dict``, as in PyTorch.

    Raises:
        TypeError: a lr_lambda that is not callable; ValueError: a list of the wrong length.
    """

    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1):
        name = type(self).__name__
        n = len(_param_groups(name, optimizer))
        fns = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(fns) != n:
            raise ValueError(f"{name}: expected {n} lr_lambdas (one per param group), got "
                             f"{len(fns)}")
        for i, fn in enumerate(fns):
            if not callable(fn):
                raise TypeError(f"{name}: lr_lambda {i} must be callable (a function of the "
                                f"epoch returning a factor), got {fn!r}")
        self.lr_lambdas = fns
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        return [b * fn(self.last_epoch)
                for fn, b in zip(self.lr_lambdas, self._group_base_lrs(), strict=True)]

    def state_dict(self) -> dict:
        saved = [None if isinstance(fn, types.FunctionType) or not hasattr(fn, "__dict__")
                 else dict(fn.__dict__) for fn in self.lr_lambdas]
        return {**super().state_dict(), "lr_lambdas": saved}

    def _state_keys(self) -> tuple:
        return (*super()._state_keys(), "lr_lambdas")

    def _checked_extra(self, where: str, state: dict) -> dict:
        saved = state["lr_lambdas"]
        if not isinstance(saved, (list, tuple)) or len(saved) != len(self.lr_lambdas) or \
                not all(s is None or isinstance(s, dict) for s in saved):
            raise ValueError(f"{where}: lr_lambdas must be a list of {len(self.lr_lambdas)} "
                             f"entries, each None or a dict, got {saved!r:.80}")
        for i, s in enumerate(saved):
            if s is not None and not hasattr(self.lr_lambdas[i], "__dict__"):
                raise ValueError(f"{where}: lr_lambdas[{i}] has saved attributes but this "
                                 f"scheduler's function {self.lr_lambdas[i]!r} has none")
        return {"lr_lambdas": list(saved)}

    def _apply(self, checked: dict) -> None:
        for fn, saved in zip(self.lr_lambdas, checked.pop("lr_lambdas")):
            if saved is not None:
                fn.__dict__.update(saved)
        super()._apply(checked)


class MultiplicativeLR(LambdaLR):
    """``lr_e = lr_(e-1) * lr_lambda(e)`` (PyTorch's ``MultiplicativeLR``): the factor
    multiplies the current lr, so changes made to ``group["lr"]`` by other code carry on; the
    step the constructor makes keeps the lr, and a :class:`SequentialLR` restarting it at its
    milestone multiplies by ``lr_lambda(0)``, as PyTorch's. Arguments, state dict and errors
    are :class:`LambdaLR`'s.
    """

    def get_lr(self) -> list:
        if self._step_count == 0:  # the initial step (PyTorch's _is_initial)
            return self._current()
        return [lr * fn(self.last_epoch)
                for fn, lr in zip(self.lr_lambdas, self._current(), strict=True)]


class SequentialLR(LRScheduler):
    """Run ``schedulers[0]`` until ``milestones[0]``, then ``schedulers[1]`` (restarted from
    its epoch 0 with its closed form) until ``milestones[1]``, ... (PyTorch's ``SequentialLR``;
    e.g. ``SequentialLR(opt, [LinearLR(opt, 0.1, total_iters=5), CosineAnnealingLR(opt, 95)],
    milestones=[5])``: 5 warm-up epochs, then cosine from the full lr).

    Making it resets the lrs to the initial lrs and starts ``schedulers[0]`` afresh; the
    others wait for their milestone (their ``last_epoch`` is -1 until then).

    Raises:
        TypeError: an element that is not an LRScheduler, or a SequentialLR (not supported).
        ValueError: a ReduceLROnPlateau (as PyTorch: it needs a metric), no schedulers, a
            scheduler of another optimizer or listed twice, not ``len(schedulers) - 1``
            milestones, milestones not strictly increasing integers >= 1.
    """

    def __init__(self, optimizer, schedulers, milestones, last_epoch: int = -1):
        _check_last_epoch("SequentialLR", last_epoch)
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("SequentialLR: expects at least one scheduler, got none")
        for i, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler) or isinstance(s, (SequentialLR, ChainedScheduler)):
                raise TypeError(f"SequentialLR: schedulers[{i}] must be an LRScheduler other "
                                f"than SequentialLR and ChainedScheduler, got "
                                f"{type(s).__name__}")
            if isinstance(s, ReduceLROnPlateau):   # PyTorch's check and message
                raise ValueError(f"SequentialLR: schedulers[{i}] is a ReduceLROnPlateau, which "
                                 "needs the metric at every step(metric); SequentialLR steps "
                                 "its schedulers without one")
            if s.optimizer is not optimizer:
                raise ValueError(f"SequentialLR: schedulers[{i}] ({type(s).__name__}) belongs "
                                 "to another optimizer; all must use the SequentialLR's")
            if any(s is t for t in schedulers[:i]):
                raise ValueError(f"SequentialLR: schedulers[{i}] is listed twice; make one "
                                 "scheduler per phase")
        milestones = _milestone_list("SequentialLR", milestones, strict=True, low=1)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: expects one milestone fewer than schedulers, got "
                             f"{len(schedulers)} schedulers and milestones {milestones}")
        self.optimizer = optimizer
        self._schedulers = schedulers
        self._milestones = milestones
        for g, lr in zip(optimizer.param_groups, _initial_lrs("SequentialLR", optimizer)):
            g["lr"] = lr
        for s in schedulers:  # undo the initial step each made
            s.last_epoch -= 1
        self.last_epoch = 0
        self._seen_steps = _step_counts(optimizer)
        schedulers[0]._initial_step()
        self._last_lr = schedulers[0].get_last_lr()

    def _stepped_by(self, graph) -> None:
        super()._stepped_by(graph)
        for s in self._schedulers:
            s._stepped_by(graph)

    def _scheduled_step(self) -> None:
        """Advance one epoch: step the current scheduler, or restart the next one at its
        milestone; nothing when every optimizer step since the last call was skipped (the
        module docstring)."""
        if self._skipped():
            return
        epoch = self.last_epoch + 1
        idx = bisect_right(self._milestones, epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == epoch:
            scheduler._update_lr(0)
        else:
            scheduler._advance()
        self.last_epoch = epoch
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict:
        """PyTorch's keys: ``_milestones``, ``last_epoch``, ``_last_lr`` and ``_schedulers`` (the
        state dict of each scheduler), plus miniflow's ``_optimizer_steps_seen``."""
        return {"_milestones": list(self._milestones), "last_epoch": self.last_epoch,
                "_last_lr": list(self._last_lr),
                "_schedulers": [s.state_dict() for s in self._schedulers],
                _SEEN: _seen_list(self._seen_steps)}

    def _state_keys(self) -> tuple:
        return ("_milestones", "last_epoch", "_last_lr", "_schedulers")

    def _checked(self, state: dict) -> dict:
        where = "SequentialLR.load_state_dict"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: expected a dict (a state_dict()), got "
                            f"{type(state).__name__}")
        keys = self._state_keys()
        missing = [k for k in keys if k not in state]
        unknown = sorted(set(state) - set(keys) - {_SEEN}, key=str)
        if missing or unknown:
            raise KeyError(f"{where}: missing keys {missing}, unknown keys {unknown}; "
                           f"SequentialLR has {list(keys)}")
        milestones = _milestone_list(where, state["_milestones"], strict=True, low=1)
        subs = state["_schedulers"]
        if len(milestones) != len(self._milestones) or not isinstance(subs, (list, tuple)) \
                or len(subs) != len(self._schedulers):
            raise ValueError(f"{where}: the state has milestones {milestones} and "
                             f"{len(subs) if isinstance(subs, (list, tuple)) else subs!r} "
                             f"schedulers; this SequentialLR has {len(self._schedulers)} "
                             "schedulers")
        checked = _checked_schedulers(where, self._schedulers, subs)
        return {"_milestones": milestones,
                "last_epoch": integer(where, "last_epoch", state["last_epoch"], 0),
                "_last_lr": _reals(where, "_last_lr", state["_last_lr"],
                                   len(self.optimizer.param_groups)),
                "_schedulers": checked, "_seen_steps": self._checked_seen(where, state)}

    def _apply(self, checked: dict) -> None:
        for s, sub in zip(self._schedulers, checked.pop("_schedulers")):
            s._apply(sub)
        super()._apply(checked)


class ChainedScheduler(LRScheduler):
    """Step every scheduler of ``schedulers`` in turn at each :meth:`step` (PyTorch's
    ``ChainedScheduler``: recursive schedules compose, e.g. ``ChainedScheduler([ConstantLR(opt,
    0.1, total_iters=2), ExponentialLR(opt, 0.9)])``); :meth:`get_last_lr` is the lrs after
    the last one. Each scheduler keeps its own ``last_epoch`` and skipped-step rule (the
    module docstring); the chain has no ``last_epoch`` of its own, as PyTorch's has none.
    Given to an nn.Graph as ``lr_sch``, the graph steps the chain and none of its schedulers
    may be stepped by hand.

    Args:
        schedulers: LRSchedulers of one optimizer (not ReduceLROnPlateau; a SequentialLR or
            another chain may be one).
        optimizer: that optimizer (default: the first scheduler's).

    ``state_dict()``: PyTorch's keys, ``_last_lr`` and ``_schedulers`` (each one's state dict).

    Raises:
        TypeError: an element that is not an LRScheduler.
        ValueError: no schedulers, a ReduceLROnPlateau (as PyTorch: it needs a metric), a
            scheduler of another optimizer.
    """

    def __init__(self, schedulers, optimizer=None):
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("ChainedScheduler: expects at least one scheduler to be chained, "
                             "got none")
        optimizer = schedulers[0].optimizer if optimizer is None else optimizer
        for i, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler):
                raise TypeError(f"ChainedScheduler: schedulers[{i}] must be an LRScheduler, got "
                                f"{type(s).__name__}")
            if isinstance(s, ReduceLROnPlateau):   # PyTorch's check
                raise ValueError(f"ChainedScheduler: schedulers[{i}] is a ReduceLROnPlateau, "
                                 "which needs the metric at every step(metric); "
                                 "ChainedScheduler steps its schedulers without one")
            if s.optimizer is not optimizer:
                raise ValueError(f"ChainedScheduler: schedulers[{i}] ({type(s).__name__}) "
                                 "belongs to another optimizer; all must use one optimizer")
        self.optimizer = optimizer
        self._schedulers = schedulers
        self._last_lr = self._current()

    def _stepped_by(self, graph) -> None:
        super()._stepped_by(graph)
        for s in self._schedulers:
            s._stepped_by(graph)

    def _scheduled_step(self) -> None:
        """Step each scheduler (each applies the skipped-step rule itself)."""
        for s in self._schedulers:
            s._scheduled_step()
        self._last_lr = self._current()

    def state_dict(self) -> dict:
        return {"_last_lr": list(self._last_lr),
                "_schedulers": [s.state_dict() for s in self._schedulers]}

    def _checked(self, state: dict) -> dict:
        where = "ChainedScheduler.load_state_dict"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: expected a dict (a state_dict()), got "
                            f"{type(state).__name__}")
        keys = ("_last_lr", "_schedulers")
        if set(state) != set(keys):
            raise KeyError(f"{where}: missing keys {[k for k in keys if k not in state]}, "
                           f"unknown keys {sorted(set(state) - set(keys), key=str)}; "
                           f"ChainedScheduler has {list(keys)}")
        subs = state["_schedulers"]
        if not isinstance(subs, (list, tuple)) or len(subs) != len(self._schedulers):
            raise ValueError(f"{where}: _schedulers must be a list of {len(self._schedulers)} "
                             f"state dicts, got {subs!r:.80}")
        return {"_last_lr": _reals(where, "_last_lr", state["_last_lr"],
                                   len(self.optimizer.param_groups)),
                "_schedulers": _checked_schedulers(where, self._schedulers, subs)}

    def _apply(self, checked: dict) -> None:
        for s, sub in zip(self._schedulers, checked["_schedulers"]):
            s._apply(sub)
        self._last_lr = checked["_last_lr"]


class ReduceLROnPlateau(LRScheduler):
    """Multiply the lr by ``factor`` when a metric stopped improving for more than ``patience``
    epochs (PyTorch's ``ReduceLROnPlateau``: its arguments, defaults, rule and state-dict keys).

    Call ``step(metrics)`` once per epoch with the monitored value (a float, or a one-element
    Tensor/array: the validation loss, an accuracy). A value is better than ``best`` when, with
    ``mode="min"``, it is below ``best * (1 - threshold)`` (``threshold_mode="rel"``) or
    ``best - threshold`` (``"abs"``), and above ``best * (1 + threshold)`` / ``best +
    threshold`` with ``mode="max"``. A value that is not better counts a bad epoch; during the
    ``cooldown`` epochs after a reduction bad epochs are not counted; when more than
    ``patience`` are counted, every group's lr becomes ``max(lr * factor, min_lr)`` (a change of
    at most ``eps`` is not made) and the count restarts.

    Unlike the other schedulers it ignores skipped optimizer steps (it follows the metric, as
    in PyTorch) and it does not record ``initial_lr``, as PyTorch's does not.

    Args:
        optimizer: see the module docstring.
        mode: ``"min"`` or ``"max"``; factor: in [0, 1) (default 0.1); patience: int >= 0
            (10); threshold: finite >= 0 (1e-4); threshold_mode: ``"rel"`` or ``"abs"``;
            cooldown: int >= 0 (0); min_lr: a number >= 0 or one per param group (0); eps:
            finite >= 0 (1e-8).

    Raises:
        TypeError: an optimizer without valid ``param_groups``, a non-real number.
        ValueError: ``factor >= 1`` (PyTorch's "Factor should be < 1.0."), an unknown mode or
            threshold_mode, a negative patience/cooldown/threshold/eps/min_lr, a min_lr list of
            the wrong length; in :meth:`step`, a metric that is not a finite number (NaN
            included: PyTorch would count it bad silently) and nothing changes.
    """

    def __init__(self, optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr=0.0, eps: float = 1e-8):
        name = type(self).__name__
        groups = _param_groups(name, optimizer)
        self.optimizer = optimizer
        hyper = self._checked_hyper(name, dict(
            mode=mode, factor=factor, patience=patience, threshold=threshold,
            threshold_mode=threshold_mode, cooldown=cooldown, eps=eps,
            default_min_lr=None if isinstance(min_lr, (list, tuple)) else min_lr,
            min_lrs=list(min_lr) if isinstance(min_lr, (list, tuple)) else [min_lr] * len(groups)))
        self.__dict__.update(hyper)
        self.last_epoch = 0
        self._last_lr = self._current()
        self.best, self.cooldown_counter, self.num_bad_epochs = self.mode_worse, 0, 0

    @staticmethod
    def _worse(mode: str) -> float:
        """The worst value in ``mode``: the initial ``best``."""
        return math.inf if mode == "min" else -math.inf

    def _checked_hyper(self, owner: str, h: dict) -> dict:
        """The validated hyper-parameters (and ``mode_worse``) of ``h``."""
        for key, allowed in (("mode", ("min", "max")), ("threshold_mode", ("rel", "abs"))):
            if h[key] not in allowed:
                raise ValueError(f"{owner}: {key} must be one of {list(allowed)}, got "
                                 f"{h[key]!r}")
        factor = real(owner, "factor", h["factor"], 0.0)
        if factor >= 1.0:
            raise ValueError(f"{owner}: Factor should be < 1.0 (new_lr = lr * factor), got "
                             f"{h['factor']!r}")
        n = len(self.optimizer.param_groups)
        if len(h["min_lrs"]) != n:
            raise ValueError(f"{owner}: expected {n} min_lrs (one per param group), got "
                             f"{len(h['min_lrs'])}: {h['min_lrs']!r}")
        return dict(
            mode=h["mode"], threshold_mode=h["threshold_mode"], factor=factor,
            patience=integer(owner, "patience", h["patience"], 0),
            cooldown=integer(owner, "cooldown", h["cooldown"], 0),
            threshold=real(owner, "threshold", h["threshold"], 0.0),
            eps=real(owner, "eps", h["eps"], 0.0),
            default_min_lr=(None if h["default_min_lr"] is None
                            else real(owner, "min_lr", h["default_min_lr"], 0.0)),
            min_lrs=[real(owner, f"min_lr[{i}]", v, 0.0) for i, v in enumerate(h["min_lrs"])],
            mode_worse=self._worse(h["mode"]))

    @property
    def in_cooldown(self) -> bool:
        """Whether the epochs after a reduction are still being waited out."""
        return self.cooldown_counter > 0

    def _is_better(self, a: float, best: float) -> bool:
        sign = 1.0 if self.mode == "max" else -1.0
        if self.threshold_mode == "rel":
            return sign * a > sign * best * (1.0 + sign * self.threshold)
        return sign * a > sign * best + self.threshold

    def get_lr(self) -> list:
        """The current lrs (the lr changes only in :meth:`step`, from the metric)."""
        return self._current()

    def step(self, metrics) -> None:
        """One epoch with the monitored value ``metrics`` (see the class docstring).

        ``metrics``: a number, or an array or tensor of one element of any shape (its
        ``item()``, as PyTorch's ``float(metrics)`` takes a ``[1]`` tensor).

        Raises:
            TypeError: ``metrics`` not convertible to float (a Tensor of several values);
            ValueError: not finite. Nothing changes then.
        """
        try:
            current = float(metrics.item() if hasattr(metrics, "item") else metrics)
        except (TypeError, ValueError) as e:
            raise TypeError(f"ReduceLROnPlateau.step: metrics must be a number or a "
                            f"one-element tensor, got {metrics!r:.80} ({e})") from None
        if not math.isfinite(current):
            raise ValueError(f"ReduceLROnPlateau.step: metrics must be finite, got {current!r}")
        self.last_epoch += 1
        if self._is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0           # bad epochs in the cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = self._current()

    def _reduce_lr(self) -> None:
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(f"ReduceLROnPlateau: the optimizer has {len(groups)} param "
                                   f"groups, min_lr lists {len(self.min_lrs)} (a group was "
                                   "added): set scheduler.min_lrs to one value per group")
            self.min_lrs = [self.default_min_lr] * len(groups)
        for g, low in zip(groups, self.min_lrs):
            old = float(g["lr"])
            new = max(old * self.factor, low)
            if old - new > self.eps:
                g["lr"] = new

    _KEYS = ("factor", "default_min_lr", "min_lrs", "patience", "cooldown", "eps", "last_epoch",
             "_last_lr", "mode_worse", "mode", "threshold", "threshold_mode", "best",
             "cooldown_counter", "num_bad_epochs")
    """PyTorch's state-dict keys (its ``__dict__`` without the optimizer)."""

    def state_dict(self) -> dict:
        """PyTorch's keys and values (:attr:`_KEYS`); a PyTorch state dict loads and back."""
        return {k: (list(getattr(self, k)) if isinstance(getattr(self, k), list)
                    else getattr(self, k)) for k in self._KEYS}

    def prepare_load_state_dict(self, state_dict: dict):
        """Check ``state_dict`` (as the constructor checks its arguments; ``best`` a number or
        ``mode_worse``, the counters ints >= 0) and return the function that assigns it.

        Raises:
            KeyError: missing or unknown keys; TypeError/ValueError: a bad value (named).
        """
        where = "ReduceLROnPlateau.load_state_dict"
        if not isinstance(state_dict, dict):
            raise TypeError(f"{where}: expected a dict (a state_dict()), got "
                            f"{type(state_dict).__name__}")
        missing = [k for k in self._KEYS if k not in state_dict]
        unknown = sorted(set(state_dict) - set(self._KEYS), key=str)
        if missing or unknown:
            raise KeyError(f"{where}: missing keys {missing}, unknown keys {unknown}; "
                           f"ReduceLROnPlateau has {list(self._KEYS)}")
        s = state_dict
        checked = self._checked_hyper(where, {**s, "min_lrs": list(s["min_lrs"])})
        if s["mode_worse"] != checked["mode_worse"]:
            raise ValueError(f"{where}: mode_worse {s['mode_worse']!r} does not fit mode "
                             f"{s['mode']!r}")
        best = s["best"]
        if not (is_real(best) and (math.isfinite(best) or best == checked["mode_worse"])):
            raise ValueError(f"{where}: best must be a finite number or {checked['mode_worse']}"
                             f", got {best!r}")
        checked.update(
            best=float(best), last_epoch=integer(where, "last_epoch", s["last_epoch"], 0),
            cooldown_counter=integer(where, "cooldown_counter", s["cooldown_counter"], 0),
            num_bad_epochs=integer(where, "num_bad_epochs", s["num_bad_epochs"], 0),
            _last_lr=_reals(where, "_last_lr", s["_last_lr"], len(self.optimizer.param_groups)))
        return lambda: self.__dict__.update(checked)


_NOT_THERE = {
    "OneCycleLR": "it cycles the momentum (Adam's beta1) with the lr, and miniflow compiles the "
                  "momentum into the graph (a new value every step would recompile every step); "
                  "write the lr part as a LambdaLR of the step, or a SequentialLR of LinearLR "
                  "and CosineAnnealingLR",
    "CyclicLR": "it cycles the momentum with the lr by default, and miniflow compiles the "
                "momentum into the graph; write the lr cycle as a LambdaLR of the step",
    "_LRScheduler": "PyTorch's old name of LRScheduler: subclass LRScheduler",
}
"""``torch.optim.lr_scheduler`` names miniflow has not: why, and what to write instead."""


def __getattr__(name):
    """Raises:
        AttributeError: a name the module has not; one of :data:`_NOT_THERE` says why and what
            to write instead."""
    hint = f": {_NOT_THERE[name]}" if name in _NOT_THERE else ""
    raise AttributeError(f"module 'miniflow.optim.lr_scheduler' has no attribute {name!r}{hint}")
