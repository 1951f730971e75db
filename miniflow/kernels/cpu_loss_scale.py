"""CPU kernels of the loss-scale stage: scalar_mul_by_tensor, multi_count_not_finite,
dynamic_loss_scale_schedule (semantics in ``miniflow.ops.loss_scale``)."""
from __future__ import annotations

import math

import numpy as np

from .cpu_common import flat, jit
from .cpu_elementwise import zip_steps
from .fp16 import load
from ..ops.elementwise import mul

__all__ = ["count_not_finite_kernel", "schedule_kernel", "BUILDERS"]


@jit(False)
def count_not_finite_kernel(grads, counts, total):
    """``counts[k] = #{i : not isfinite(grads[k][i])}``; ``total[0] = sum(counts)``.

    ``grads`` is a tuple of 1-D kernel views of one dtype: one call covers every parameter."""
    t = 0
    for k in range(len(grads)):
        g = grads[k]
        c = 0
        for i in range(g.size):
            if not math.isfinite(load(g, i)):
                c += 1
        counts[k] = c
        t += c
    total[0] = t


@jit(False)
def schedule_kernel(total, scale, tracker, growth_factor, backoff_factor, growth_interval,
                    min_scale):
    """One step of ``torch.amp.GradScaler``'s scale update with a floor (see ops.loss_scale)."""
    if total[0] != 0:
        scale[0] = np.float32(max(np.float64(scale[0]) * backoff_factor, min_scale))
        tracker[0] = 0
        return
    tracker[0] += 1
    if tracker[0] >= growth_interval:
        grown = np.float32(np.float64(scale[0]) * growth_factor)
        if math.isfinite(grown):
            scale[0] = grown
        tracker[0] = 0


def build_scalar_mul_by_tensor(node, ins, outs):
    """``out[i] = x[i] * scalar``: a broadcasting zip against the one-element scalar, whatever its
    shape (``[]``, ``[1]``, ``[1,1]`` ...): it is read flat and broadcast as ``(1,) * x.ndim``."""
    x, s = ins
    return zip_steps(mul, x, s, outs[0], y_shape=(1,) * x.ndim)


def build_multi_count_not_finite(node, ins, outs):
    """One call of :func:`count_not_finite_kernel` over all inputs."""
    return [(count_not_finite_kernel, (tuple(flat(g) for g in ins), outs[0], outs[1]))]


def build_dynamic_loss_scale_schedule(node, ins, outs):
    """One call of :func:`schedule_kernel`; writes loss_scale and growth_tracker in place."""
    a = node.attrs
    return [(schedule_kernel, (*ins, a["growth_factor"], a["backoff_factor"], a["growth_interval"],
                               a["min_scale"]))]


BUILDERS = {
    "scalar_mul_by_tensor": build_scalar_mul_by_tensor,
    "multi_count_not_finite": build_multi_count_not_finite,
    "dynamic_loss_scale_schedule": build_dynamic_loss_scale_schedule,
}
"""Op type -> builder for the loss-scale stage."""
