"""CUDA kernels of the loss-scale stage: multi_count_not_finite and dynamic_loss_scale_schedule
(semantics in ``miniflow.ops.loss_scale``; ``scalar_mul_by_tensor`` is an elementwise rule of
``kernels.common.elementwise``).

``multi_count_not_finite`` is one row kernel over all gradients at once: block ``k`` counts the
non-finite elements of input ``k`` (the inputs arrive as one tuple of flat arrays of one dtype) and
combines the per-thread counts in shared memory; a one-thread kernel then sums the counts into the
total. The schedule is a one-thread kernel over the scalar body
``kernels.common.loss_scale.schedule`` (the CPU's math) that updates the scale and the growth
tracker in place.
"""
from __future__ import annotations

import functools

from numba import cuda, types

from .common import block_sum, compute_type, device, flat, jit, math, short
from .launch import current, flat_steps, row_steps
from ..common.loss_scale import schedule, schedule_builder

__all__ = ["count_not_finite_kernel", "sum_counts_kernel", "schedule_kernel", "BUILDERS"]


@functools.cache
def count_not_finite_kernel(ct, block: int):
    """``kernel(grads, counts)``: ``counts[k] = #{i : not isfinite(grads[k][i])}``, block k."""

    @jit
    def kernel(grads, counts):
        sm = cuda.shared.array(block, types.int64)
        for k in range(cuda.blockIdx.x, len(grads), cuda.gridDim.x):
            g = grads[k]
            c = 0
            for i in range(cuda.threadIdx.x, g.size, block):
                if not math.isfinite(ct(g[i])):
                    c += 1
            total = block_sum(sm, c)
            if cuda.threadIdx.x == 0:
                counts[k] = total

    return kernel


@functools.cache
def sum_counts_kernel():
    """``kernel(counts, total)``: ``total[0] = sum(counts)`` (one thread)."""

    @jit
    def kernel(counts, total):
        if cuda.grid(1) == 0:
            t = 0
            for k in range(counts.size):
                t += counts[k]
            total[0] = t

    return kernel


@functools.cache
def schedule_kernel():
    """``kernel(total, scale, tracker, growth_factor, backoff_factor, growth_interval, min_scale)``
    (one thread): ``scale[0], tracker[0] = schedule(total[0], scale[0], tracker[0], ...)``."""
    step = device(schedule)

    @jit
    def kernel(total, scale, tracker, growth_factor, backoff_factor, growth_interval, min_scale):
        if cuda.grid(1) == 0:
            scale[0], tracker[0] = step(total[0], scale[0], tracker[0], growth_factor,
                                        backoff_factor, growth_interval, min_scale)

    return kernel


def schedule_steps(*args):
    """One one-thread launch of :func:`schedule_kernel`; writes loss_scale and growth_tracker."""
    return flat_steps(schedule_kernel(), 1, args, "loss_scale_schedule")


def build_multi_count_not_finite(node, ins, outs):
    """``counts, total = multi_count_not_finite(g0, g1, ...)``: a row kernel, a summing kernel."""
    counts, total = outs
    kernel = count_not_finite_kernel(compute_type(ins[0].dtype), current().row_block)
    grads = tuple(flat(g) for g in ins)
    return (row_steps(kernel, len(ins), (grads, counts), f"count_not_finite {short(ins[0].dtype)}")
            + flat_steps(sum_counts_kernel(), 1, (counts, total), "sum_counts"))


BUILDERS = {
    "multi_count_not_finite": build_multi_count_not_finite,
    "dynamic_loss_scale_schedule": schedule_builder(schedule_steps),
}
"""Op type -> builder for the loss-scale stage."""
