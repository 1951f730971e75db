"""The dynamic loss-scale schedule of every backend (semantics in ``miniflow.ops.loss_scale``):
its per-step math as one scalar body, compiled into each backend's one-thread kernel
(``numba.njit`` / ``cuda.jit(device=True)``), and its builder."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["schedule", "schedule_builder"]


def schedule(total, scale, tracker, growth_factor, backoff_factor, growth_interval, min_scale):
    """One step of ``torch.amp.GradScaler``'s scale update with a floor: ``(scale, tracker)``.

    ``total != 0`` (a non-finite gradient): ``scale = max(scale * backoff_factor, min_scale)``,
    tracker 0. Else tracker + 1, and when it reaches ``growth_interval``
    ``scale *= growth_factor`` unless that is not finite in float32, tracker 0. The products are
    float64, the scale (float32) is rounded once.
    """
    if total != 0:
        return np.float32(max(np.float64(scale) * backoff_factor, min_scale)), 0
    tracker += 1
    if tracker >= growth_interval:
        grown = np.float32(np.float64(scale) * growth_factor)
        return (grown if math.isfinite(grown) else scale), 0
    return scale, tracker


def schedule_builder(schedule_steps):
    """The ``dynamic_loss_scale_schedule`` builder over a backend's ``schedule_steps(total,
    scale, tracker, growth_factor, backoff_factor, growth_interval, min_scale)`` (writes scale
    and tracker in place)."""
    def build_dynamic_loss_scale_schedule(node, ins, outs):
        """One call of the backend's schedule kernel on ``(total, loss_scale, growth_tracker)``."""
        a = node.attrs
        return schedule_steps(*ins, float(a["growth_factor"]), float(a["backoff_factor"]),
                              int(a["growth_interval"]), float(a["min_scale"]))
    return build_dynamic_loss_scale_schedule
