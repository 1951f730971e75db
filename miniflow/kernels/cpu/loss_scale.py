"""CPU kernels of the loss-scale stage: multi_count_not_finite and dynamic_loss_scale_schedule
(semantics in ``miniflow.ops.loss_scale``; ``scalar_mul_by_tensor`` is an elementwise rule of
``kernels.common.elementwise``)."""
from __future__ import annotations

import math

from .common import flat, jit, jitable
from .fp16 import load
from ..common.loss_scale import schedule, schedule_builder

__all__ = ["count_not_finite_kernel", "schedule_kernel", "BUILDERS"]

_schedule = jitable(schedule)


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
    """``scale[0], tracker[0] = schedule(total[0], scale[0], tracker[0], ...)``."""
    scale[0], tracker[0] = _schedule(total[0], scale[0], tracker[0], growth_factor,
                                     backoff_factor, growth_interval, min_scale)


def build_multi_count_not_finite(node, ins, outs):
    """One call of :func:`count_not_finite_kernel` over all inputs."""
    return [(count_not_finite_kernel, (tuple(flat(g) for g in ins), outs[0], outs[1]))]


BUILDERS = {
    "multi_count_not_finite": build_multi_count_not_finite,
    "dynamic_loss_scale_schedule": schedule_builder(lambda *args: [(schedule_kernel, args)]),
}
"""Op type -> builder for the loss-scale stage."""
