"""Loss scalers for ``nn.Graph.set_grad_scaler``: dynamic (:class:`GradScaler`) and static.

The scale and the growth tracker are graph variables (float32 ``[1]`` and int64 ``[1]``) whose
storage the scaler owns; the loss-scale pass (``miniflow.passes.loss_scale``) multiplies the initial
gradient by the scale, unscales the parameter gradients, counts non-finite values, makes every update
op skip a non-finite step and, for a dynamic scaler, updates scale and tracker in the graph. The
step's outcome (the non-finite counts and the scale the step started from) is read back lazily
(``miniflow.runtime.readback``): ``found_inf``, ``num_skipped_steps`` and
``consecutive_floor_skips`` are up to date whenever they are read, and a loop that reads none of
them never waits for the device. On the cpu backend they are updated, and
:class:`NonFiniteGradientsError` is raised, by the graph call that made the step; on cuda by the
first later call that finds the step finished on the GPU (at most
``CudaBackend.readback_depth`` calls later), or by the first read.

Semantics follow ``torch.amp.GradScaler`` (init 2^16, growth 2, backoff 0.5, interval 2000; never
grows to a non-finite float32 scale) with two additions of miniflow's, for gradients that stay
non-finite whatever the scale: a floor ``min_scale`` and :class:`NonFiniteGradientsError` after
``max_consecutive_skips`` skipped steps at the floor (NaN from data or a diverging model is not
fixed by a smaller scale).
"""
from __future__ import annotations

import math

import numpy as np

from ..checks import boolean, integer, is_real, real_number
from ..runtime.backend import check_device, get_backend
from ..runtime.readback import LEDGER, LedgerAttribute

__all__ = ["GradScaler", "StaticGradScaler", "NonFiniteGradientsError"]


class NonFiniteGradientsError(FloatingPointError):
    """Raised when gradients stay non-finite at the lowest scale for too many steps in a row."""


def _check_scale(name: str, value) -> float:
    """A scale as the float32 value it will be stored as; must be finite and > 0 in float32."""
    real_number("", name, value)
    with np.errstate(over="ignore", under="ignore"):
        stored = float(np.float32(value))
    if not (math.isfinite(stored) and stored > 0):
        raise ValueError(f"{name} must be a finite number > 0 that float32 can hold "
                         f"(about 1.2e-38 to 3.4e38), got {value!r}")
    return stored


def _check_factor(name: str, value, low: float, high: float) -> float:
    """A finite real number strictly between ``low`` and ``high``."""
    if not is_real(value) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not low < value < high:
        bounds = f"> {low:g}" if high == math.inf else f"in ({low:g}, {high:g})"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return float(value)


_FIELDS = {
    "growth_factor": lambda n, v: _check_factor(n, v, 1.0, math.inf),
    "backoff_factor": lambda n, v: _check_factor(n, v, 0.0, 1.0),
    "growth_interval": lambda n, v: integer("", n, v, 1),
    "min_scale": _check_scale,
    "max_consecutive_skips": lambda n, v: integer("", n, v, 1),
    "skip_nonfinite": lambda n, v: boolean("", n, v, numpy=True),
    "found_inf": lambda n, v: boolean("", n, v, numpy=True),   # a NumPy bool when loaded
    "num_skipped_steps": lambda n, v: integer("", n, v, 0),
    "consecutive_floor_skips": lambda n, v: integer("", n, v, 0),
}
"""Setting name -> ``check(name, value)`` returning the normalised value: used by the
constructors, by attribute assignment after construction and by ``load_state_dict``."""

_STATE_FIELDS = {"scale": _check_scale, "_growth_tracker": lambda n, v: integer("", n, v, 0)}
"""The state_dict keys held in the graph variables (not attributes), with their checks."""

_COMPILED_SETTINGS = frozenset({"growth_factor", "backoff_factor", "growth_interval", "min_scale",
                                "skip_nonfinite"})
"""Attributes that become part of a compiled graph: setting one bumps ``version``."""


class _Scaler:
    """State and bookkeeping shared by the static and the dynamic scaler.

    ``version`` counts changes that compiled graphs depend on (schedule settings, ``skip_nonfinite``,
    a loaded state: a static scale is a constant in the graph); nn.Graph recompiles when it moves.

    Every setting in ``_settings`` is checked when it is assigned, at construction or later
    (``scaler.growth_interval = 0`` raises like ``GradScaler(growth_interval=0)``); assigning any
    other public attribute (a misspelt setting) is an AttributeError.
    """

    dynamic = False
    version = 0
    _enabled = True
    found_inf = LedgerAttribute()
    num_skipped_steps = LedgerAttribute()
    consecutive_floor_skips = LedgerAttribute()
    _settings = ("max_consecutive_skips", "skip_nonfinite", "found_inf", "num_skipped_steps",
                 "consecutive_floor_skips")
    _required_keys = ("scale",)
    """Keys ``load_state_dict`` needs; the other keys of :meth:`state_dict` are optional."""

    def __setattr__(self, name, value):
        if name in self._settings:
            LEDGER.flush()                   # pending steps were made with the old settings
            value = self._checked(name, value, f"{type(self).__name__}: ")
            if name == "min_scale" and "_scale" in self.__dict__ and value > self.scale:
                raise ValueError(f"{type(self).__name__}: min_scale {value:g} is above the scale "
                                 f"{self.scale:g}: the floor must not be higher than the scale")
            if name in _COMPILED_SETTINGS:
                object.__setattr__(self, "version", self.version + 1)
        elif not name.startswith("_") and name != "version":
            raise AttributeError(f"{type(self).__name__} has no setting {name!r}; its settings are "
                                 f"{', '.join(self._settings)}")
        object.__setattr__(self, name, value)

    @staticmethod
    def _checked(name: str, value, prefix: str, check=None):
        """``value`` checked as setting or state key ``name`` (or by ``check``); errors start
        with ``prefix``."""
        check = check or _FIELDS.get(name) or _STATE_FIELDS[name]
        try:
            return check(name, value)
        except (TypeError, ValueError) as e:
            raise type(e)(prefix + str(e)) from None

    def __init__(self, scale: float, max_consecutive_skips: int, skip_nonfinite: bool = True):
        backend = get_backend()
        self._scale = backend.from_numpy(np.array([scale], np.float32))
        self._growth_tracker = backend.from_numpy(np.zeros(1, np.int64))
        self.max_consecutive_skips = max_consecutive_skips
        self.skip_nonfinite = skip_nonfinite
        self.found_inf = False
        self.num_skipped_steps = 0
        self.consecutive_floor_skips = 0

    # ------------------------------------------------------------------ state readers
    @property
    def scale(self) -> float:
        """The current loss scale (float32 value as a Python float)."""
        return float(get_backend().to_numpy(self._scale)[0])

    def get_scale(self) -> float:
        """The current loss scale (``torch.amp.GradScaler.get_scale``): :attr:`scale`; 1.0 for a
        disabled scaler, as PyTorch's."""
        return self.scale if self._enabled else 1.0

    def is_enabled(self) -> bool:
        """``torch.amp.GradScaler.is_enabled``: False for ``GradScaler(enabled=False)``, which a
        graph takes as no scaler (:meth:`nn.Graph.set_grad_scaler`)."""
        return self._enabled

    @property
    def growth_tracker(self) -> int:
        """Finite steps since the scale last changed (PyTorch's ``_growth_tracker``)."""
        return int(get_backend().to_numpy(self._growth_tracker)[0])

    def _record_step(self, counts: np.ndarray, scale_before: float, param_names: list,
                     found: bool) -> None:
        """Update the host-side counters with one step's outcome (applied from the read-back
        ledger, in step order, so it writes ``__dict__`` directly); ``found``: whether any of
        ``counts`` is not 0.

        Raises:
            NonFiniteGradientsError: this step completed ``max_consecutive_skips`` consecutive
                skips at the floor; names the first parameter whose gradient was non-finite.
        """
        d = self.__dict__
        d["found_inf"] = found
        if not found:
            d["consecutive_floor_skips"] = 0
            return
        if self.skip_nonfinite:
            d["num_skipped_steps"] += 1
        if not self._at_floor(scale_before):
            d["consecutive_floor_skips"] = 0
            return
        d["consecutive_floor_skips"] += 1
        if d["consecutive_floor_skips"] >= self.max_consecutive_skips:
            k = int(np.flatnonzero(counts)[0])
            raise NonFiniteGradientsError(
                f"{d['consecutive_floor_skips']} consecutive steps skipped with non-finite "
                f"gradients at the lowest loss scale ({scale_before:g}); first non-finite gradient: "
                f"{param_names[k]!r} ({int(counts[k])} elements). {self._floor_advice}")

    # ------------------------------------------------------------------ state dict
    def state_dict(self) -> dict:
        """PyTorch's keys (``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``,
        ``_growth_tracker``) plus miniflow's (``min_scale``, ``max_consecutive_skips``,
        ``found_inf``, ``num_skipped_steps``, ``consecutive_floor_skips``, ``skip_nonfinite``);
        ``{}`` for a disabled scaler, as PyTorch's."""
        if not self._enabled:
            return {}
        return {"scale": self.scale, "_growth_tracker": self.growth_tracker,
                **{k: getattr(self, k) for k in self._settings}}

    def load_state_dict(self, state: dict) -> None:
        """Restore the fields of :meth:`state_dict` (in place: compiled graphs see them).

        The keys of ``_required_keys`` must be there: for :class:`GradScaler` PyTorch's keys, so a
        ``torch.amp.GradScaler`` state dict loads; a missing miniflow-only key keeps its current
        value (its default on a new scaler). Every value gets the constructor's check, and all are
        checked before anything changes, so a failed load leaves the scaler as it was.

        Raises:
            KeyError: missing or unknown keys (listed); ValueError/TypeError: an invalid value
                (naming the key and the value).
        """
        self.prepare_load_state_dict(state)()

    def prepare_load_state_dict(self, state: dict):
        """Check ``state`` as :meth:`load_state_dict` does and return a function of no
        arguments that assigns it (``miniflow.checkpoint.restore`` checks several objects
        before it assigns any).

        A disabled scaler ignores ``state``, as PyTorch's.

        Raises:
            as :meth:`load_state_dict`.
        """
        if not self._enabled:
            return lambda: None
        where = f"{type(self).__name__}.load_state_dict: "
        if not isinstance(state, dict):
            raise TypeError(f"{where}expected a dict (a state_dict()), got {type(state).__name__}")
        current = self.state_dict()
        missing = sorted(set(self._required_keys) - set(state))
        if missing:
            raise KeyError(f"{where}missing keys {missing}")
        extra = sorted(set(state) - set(current), key=str)
        if extra:
            raise KeyError(f"{where}unexpected keys {extra}{self._extra_keys_hint}")
        merged = {**current, **{k: self._checked(k, v, where) for k, v in state.items()}}
        if merged.get("min_scale", 0.0) > merged["scale"]:
            raise ValueError(f"{where}min_scale {merged['min_scale']:g} is above the scale "
                             f"{merged['scale']:g}; load a lower min_scale with it, or set "
                             "scaler.min_scale lower before loading")

        def assign():
            backend = get_backend()  # everything is valid: assign
            backend.copy_in(self._scale, np.array([merged["scale"]], np.float32))
            backend.copy_in(self._growth_tracker, np.array([merged["_growth_tracker"]], np.int64))
            for k in self._settings:
                object.__setattr__(self, k, merged[k])
            object.__setattr__(self, "version", self.version + 1)  # a static scale: a constant
        return assign

    _extra_keys_hint = ""


class GradScaler(_Scaler):
    """Dynamic loss scaling (``torch.amp.GradScaler`` semantics, in the graph).

    Every step: non-finite gradients -> the step is skipped (no parameter or optimizer state
    changes), ``scale = max(scale * backoff_factor, min_scale)``, tracker = 0; finite -> tracker += 1
    and after ``growth_interval`` finite steps ``scale *= growth_factor`` (unless that is not finite
    in float32), tracker = 0.

    Args:
        device: ``torch.amp.GradScaler``'s first argument: None or the process's device
            (``"cuda"`` on the CUDA backend, ``"cpu"`` on the CPU one; the scale lives there).
        init_scale: first scale (float32; PyTorch and OneFlow default 2^16).
        growth_factor: > 1. backoff_factor: in (0, 1). growth_interval: >= 1 steps.
        min_scale: > 0, the floor, not above the scale (default 1, or ``init_scale`` when that
            is below 1: PyTorch has no floor). max_consecutive_skips: >= 1 (see
            :class:`NonFiniteGradientsError`).
        enabled: PyTorch's switch (a bool): ``GradScaler(enabled=False)`` is a scaler that
            scales nothing, as PyTorch's (nanoGPT's ``enabled=(dtype == 'float16')``): a
            graph given it has no scaler, ``get_scale()`` is 1.0, ``state_dict()`` is ``{}``.

    The positional order is ``torch.amp.GradScaler``'s (device, init_scale, growth_factor,
    backoff_factor, growth_interval, enabled); miniflow's ``min_scale`` and
    ``max_consecutive_skips`` are keyword-only.

    The settings can be changed later (``scaler.growth_interval = 100``), with the same checks;
    a compiled graph then recompiles at its next call.

    Raises:
        ValueError/TypeError: any argument outside its range or of the wrong type, quoting it;
            ``enabled`` not a bool (TypeError); a device other than the
            process's for an enabled scaler (ValueError; a disabled one takes any, as nanoGPT's
            ``GradScaler("cuda", enabled=False)`` on a CPU), a number as the device (TypeError:
            the scale is the second argument, as PyTorch's).
    """

    dynamic = True
    _settings = ("growth_factor", "backoff_factor", "growth_interval", "min_scale",
                 *_Scaler._settings)
    _required_keys = ("scale", "growth_factor", "backoff_factor", "growth_interval",
                      "_growth_tracker")

    def __init__(self, device=None, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True, *, min_scale: float | None = None,
                 max_consecutive_skips: int = 64):
        if is_real(device):
            raise TypeError(f"GradScaler: the first argument is the device, as "
                            f"torch.amp.GradScaler's, got {device!r}; give the scale by "
                            f"keyword: GradScaler(init_scale={device!r})")
        self._enabled = boolean("GradScaler", "enabled", enabled, numpy=True)
        if self._enabled:    # a disabled scaler keeps nothing anywhere: any device, as torch's
            check_device("GradScaler", device)
        super().__init__(self._checked("init_scale", init_scale, "GradScaler: ", _check_scale),
                         max_consecutive_skips)
        min_scale = min(1.0, self.scale) if min_scale is None else min_scale
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.min_scale = min_scale

    def get_growth_factor(self) -> float:
        """``torch.amp.GradScaler.get_growth_factor``: :attr:`growth_factor`."""
        return self.growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """``torch.amp.GradScaler.set_growth_factor``: ``scaler.growth_factor = new_factor``,
        checked as the constructor's (a ValueError/TypeError naming it)."""
        self.growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        """``torch.amp.GradScaler.get_backoff_factor``: :attr:`backoff_factor`."""
        return self.backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """``torch.amp.GradScaler.set_backoff_factor``: ``scaler.backoff_factor = new_factor``,
        checked as the constructor's."""
        self.backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        """``torch.amp.GradScaler.get_growth_interval``: :attr:`growth_interval`."""
        return self.growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """``torch.amp.GradScaler.set_growth_interval``: ``scaler.growth_interval =
        new_interval``, checked as the constructor's."""
        self.growth_interval = new_interval

    _floor_advice = ("The scale cannot go lower, so this is NaN/inf from the data or a diverging "
                     "model, not float16 overflow: check the inputs and the learning rate")

    def _at_floor(self, scale_before: float) -> bool:
        return scale_before <= self.min_scale

    def schedule_attrs(self) -> dict:
        """Attributes of the ``dynamic_loss_scale_schedule`` op."""
        return {"growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "min_scale": self.min_scale}

    def __repr__(self) -> str:
        return (f"GradScaler(scale={self.scale:g}, growth_factor={self.growth_factor}, "
                f"backoff_factor={self.backoff_factor}, growth_interval={self.growth_interval}, "
                f"min_scale={self.min_scale}{'' if self._enabled else ', enabled=False'})")


class StaticGradScaler(_Scaler):
    """A constant loss scale. Non-finite steps are skipped (``skip_nonfinite=True``, default) or
    applied anyway (``False``: what OneFlow does under a static loss scale, where only a dynamic
    policy adds the non-finite check and ``skip_if``; a model can be watched turning to NaN). Every skipped step counts as a skip at the floor.

    Raises:
        ValueError: scale <= 0, NaN or inf; max_consecutive_skips < 1.
        TypeError: skip_nonfinite not a bool.
    """

    _extra_keys_hint = " (a GradScaler's state? load it into a GradScaler)"

    def __init__(self, scale: float, skip_nonfinite: bool = True, max_consecutive_skips: int = 64):
        super().__init__(self._checked("scale", scale, "StaticGradScaler: ", _check_scale),
                         max_consecutive_skips, skip_nonfinite)

    _floor_advice = ("A static scale never changes: lower it, use loss_scale_policy='fp32' if "
                     "the scaled initial gradient overflows float16, or check the inputs and the "
                     "learning rate")

    def _at_floor(self, scale_before: float) -> bool:
        return self.skip_nonfinite

    def __repr__(self) -> str:
        return f"StaticGradScaler(scale={self.scale:g}, skip_nonfinite={self.skip_nonfinite})"
