"""Loss scalers for ``nn.Graph.set_grad_scaler``: dynamic (:class:`GradScaler`) and static.

The scale and the growth tracker are graph variables (float32 ``[1]`` and int64 ``[1]``) whose
storage the scaler owns; the loss-scale pass (``miniflow.passes.loss_scale``) multiplies the initial
gradient by the scale, unscales the parameter gradients, counts non-finite values, makes every update
op skip a non-finite step and, for a dynamic scaler, updates scale and tracker in the graph. After each
call of the graph the scaler reads the step's outcome (``found_inf``, ``num_skipped_steps``).

Semantics follow ``torch.amp.GradScaler`` (init 2^16, growth 2, backoff 0.5, interval 2000; never
grows to a non-finite float32 scale) with two additions from REFERENCE.md's list of failure classes:
a floor ``min_scale`` and :class:`NonFiniteGradientsError` after ``max_consecutive_skips`` skipped
steps at the floor (NaN from data or a diverging model is not fixed by a smaller scale).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..runtime.backend import get_backend

__all__ = ["GradScaler", "StaticGradScaler", "NonFiniteGradientsError"]


class NonFiniteGradientsError(FloatingPointError):
    """Raised when gradients stay non-finite at the lowest scale for too many steps in a row."""


def _check_scale(name: str, value) -> float:
    """A scale as the float32 value it will be stored as; must be finite and > 0 in float32."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    with np.errstate(over="ignore", under="ignore"):
        stored = float(np.float32(value))
    if not (math.isfinite(stored) and stored > 0):
        raise ValueError(f"{name} must be a finite number > 0 that float32 can hold "
                         f"(about 1.2e-38 to 3.4e38), got {value!r}")
    return stored


def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


_COMPILED_SETTINGS = frozenset({"growth_factor", "backoff_factor", "growth_interval", "min_scale",
                                "skip_nonfinite"})
"""Attributes that become part of a compiled graph: setting one bumps ``version``."""


class _Scaler:
    """State and bookkeeping shared by the static and the dynamic scaler.

    ``version`` counts changes that compiled graphs depend on (schedule settings, ``skip_nonfinite``,
    a loaded state: a static scale is a constant in the graph); nn.Graph recompiles when it moves.
    """

    dynamic = False
    version = 0

    def __setattr__(self, name, value):
        if name in _COMPILED_SETTINGS:
            object.__setattr__(self, "version", self.version + 1)
        object.__setattr__(self, name, value)

    def __init__(self, scale: float, max_consecutive_skips: int, skip_nonfinite: bool = True):
        backend = get_backend()
        self._scale = backend.from_numpy(np.array([scale], np.float32))
        self._growth_tracker = backend.from_numpy(np.zeros(1, np.int64))
        self.max_consecutive_skips = _check_count("max_consecutive_skips", max_consecutive_skips)
        self.skip_nonfinite = bool(skip_nonfinite)
        self.found_inf = False
        self.num_skipped_steps = 0
        self.consecutive_floor_skips = 0

    # ------------------------------------------------------------------ state readers
    @property
    def scale(self) -> float:
        """The current loss scale (float32 value as a Python float)."""
        return float(get_backend().to_numpy(self._scale)[0])

    @property
    def growth_tracker(self) -> int:
        """Finite steps since the scale last changed (PyTorch's ``_growth_tracker``)."""
        return int(get_backend().to_numpy(self._growth_tracker)[0])

    def _record_step(self, counts: np.ndarray, scale_before: float, param_names: list) -> None:
        """Update the host-side counters after one graph call (the graph state is committed).

        Raises:
            NonFiniteGradientsError: this call completed ``max_consecutive_skips`` consecutive skips
                at the floor; names the first parameter whose gradient was non-finite.
        """
        self.found_inf = bool(counts.any())
        if not self.found_inf:
            self.consecutive_floor_skips = 0
            return
        if self.skip_nonfinite:
            self.num_skipped_steps += 1
        if not self._at_floor(scale_before):
            self.consecutive_floor_skips = 0
            return
        self.consecutive_floor_skips += 1
        if self.consecutive_floor_skips >= self.max_consecutive_skips:
            k = int(np.flatnonzero(counts)[0])
            raise NonFiniteGradientsError(
                f"{self.consecutive_floor_skips} consecutive steps skipped with non-finite "
                f"gradients at the lowest loss scale ({scale_before:g}); first non-finite gradient: "
                f"{param_names[k]!r} ({int(counts[k])} elements). {self._floor_advice}")

    # ------------------------------------------------------------------ state dict
    def state_dict(self) -> dict:
        """PyTorch's keys (``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``,
        ``_growth_tracker``) plus miniflow's (``min_scale``, ``max_consecutive_skips``,
        ``found_inf``, ``num_skipped_steps``, ``consecutive_floor_skips``, ``skip_nonfinite``)."""
        return {"scale": self.scale, "_growth_tracker": self.growth_tracker,
                "max_consecutive_skips": self.max_consecutive_skips,
                "skip_nonfinite": self.skip_nonfinite, "found_inf": self.found_inf,
                "num_skipped_steps": self.num_skipped_steps,
                "consecutive_floor_skips": self.consecutive_floor_skips}

    def load_state_dict(self, state: dict) -> None:
        """Restore every field of :meth:`state_dict` (in place: compiled graphs see it).

        Everything is checked before anything changes, so a failed load leaves the scaler as it was.

        Raises:
            KeyError: missing keys (listed); ValueError/TypeError: an invalid value (same checks as
                the constructor).
        """
        missing = sorted(set(self.state_dict()) - set(state))
        if missing:
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing keys {missing}")
        self._check_state(state)
        self._apply_state(state)

    def _check_state(self, state: dict) -> None:
        _check_scale("scale", state["scale"])
        _check_count("max_consecutive_skips", state["max_consecutive_skips"])

    def _apply_state(self, state: dict) -> None:
        self.version += 1  # a static scale is compiled into the graph as a constant
        backend = get_backend()
        backend.copy_in(self._scale, np.array([state["scale"]], np.float32))
        backend.copy_in(self._growth_tracker, np.array([int(state["_growth_tracker"])], np.int64))
        self.max_consecutive_skips = int(state["max_consecutive_skips"])
        self.skip_nonfinite = bool(state["skip_nonfinite"])
        self.found_inf = bool(state["found_inf"])
        self.num_skipped_steps = int(state["num_skipped_steps"])
        self.consecutive_floor_skips = int(state["consecutive_floor_skips"])


class GradScaler(_Scaler):
    """Dynamic loss scaling (``torch.amp.GradScaler`` semantics, in the graph).

    Every step: non-finite gradients -> the step is skipped (no parameter or optimizer state
    changes), ``scale = max(scale * backoff_factor, min_scale)``, tracker = 0; finite -> tracker += 1
    and after ``growth_interval`` finite steps ``scale *= growth_factor`` (unless that is not finite
    in float32), tracker = 0.

    Args:
        init_scale: first scale (float32; PyTorch and OneFlow default 2^16).
        growth_factor: > 1. backoff_factor: in (0, 1). growth_interval: >= 1 steps.
        min_scale: > 0, the floor. max_consecutive_skips: >= 1 (see :class:`NonFiniteGradientsError`).

    Raises:
        ValueError: any argument outside its range, quoting the value.
    """

    dynamic = True

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, min_scale: float = 1.0,
                 max_consecutive_skips: int = 64):
        init_scale = _check_scale("init_scale", init_scale)
        self._set_schedule(*self._check_schedule(growth_factor, backoff_factor, growth_interval,
                                                 min_scale, init_scale))
        super().__init__(init_scale, max_consecutive_skips)

    @staticmethod
    def _check_schedule(growth_factor, backoff_factor, growth_interval, min_scale, scale):
        """Validated ``(growth_factor, backoff_factor, growth_interval, min_scale)``."""
        for name, v in (("growth_factor", growth_factor), ("backoff_factor", backoff_factor)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if not growth_factor > 1:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        growth_interval = _check_count("growth_interval", growth_interval)
        min_scale = _check_scale("min_scale", min_scale)
        if min_scale > scale:
            raise ValueError(f"min_scale {min_scale:g} is above the scale {scale:g}: the floor "
                             "must not be higher than the starting scale")
        return float(growth_factor), float(backoff_factor), growth_interval, min_scale

    def _set_schedule(self, growth_factor, backoff_factor, growth_interval, min_scale):
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.min_scale = min_scale

    _floor_advice = ("The scale cannot go lower, so this is NaN/inf from the data or a diverging "
                     "model, not float16 overflow: check the inputs and the learning rate")

    def _at_floor(self, scale_before: float) -> bool:
        return scale_before <= self.min_scale

    def schedule_attrs(self) -> dict:
        """Attributes of the ``dynamic_loss_scale_schedule`` op."""
        return {"growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "min_scale": self.min_scale}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "min_scale": self.min_scale}

    def _check_state(self, state: dict) -> None:
        super()._check_state(state)
        self._check_schedule(state["growth_factor"], state["backoff_factor"],
                             state["growth_interval"], state["min_scale"], state["scale"])

    def _apply_state(self, state: dict) -> None:
        self._set_schedule(*self._check_schedule(state["growth_factor"], state["backoff_factor"],
                                                 state["growth_interval"], state["min_scale"],
                                                 state["scale"]))
        super()._apply_state(state)

    def __repr__(self) -> str:
        return (f"GradScaler(scale={self.scale:g}, growth_factor={self.growth_factor}, "
                f"backoff_factor={self.backoff_factor}, growth_interval={self.growth_interval}, "
                f"min_scale={self.min_scale})")


class StaticGradScaler(_Scaler):
    """A constant loss scale. Non-finite steps are skipped (``skip_nonfinite=True``, default) or
    applied anyway (``False``: what frameworks without a check do, so a model can be watched turning
    to NaN). Every skipped step counts as a skip at the floor.

    Raises:
        ValueError: scale <= 0, NaN or inf; max_consecutive_skips < 1.
    """

    def __init__(self, scale: float, skip_nonfinite: bool = True, max_consecutive_skips: int = 64):
        super().__init__(_check_scale("scale", scale), max_consecutive_skips, skip_nonfinite)

    _floor_advice = ("A static scale never changes: lower it, use loss_scale_policy='fp32' if "
                     "the scaled initial gradient overflows float16, or check the inputs and the "
                     "learning rate")

    def _at_floor(self, scale_before: float) -> bool:
        return self.skip_nonfinite

    def _check_state(self, state: dict) -> None:
        extra = sorted(set(state) - set(self.state_dict()))
        if extra:
            raise KeyError(f"StaticGradScaler.load_state_dict: unexpected keys {extra} (a "
                           "GradScaler's state? load it into a GradScaler)")
        super()._check_state(state)

    def __repr__(self) -> str:
        return f"StaticGradScaler(scale={self.scale:g}, skip_nonfinite={self.skip_nonfinite})"
