"""CUDA kernels of the loss-scale stage: multi_count_not_finite and dynamic_loss_scale_schedule
(semantics in ``miniflow.ops.loss_scale``; ``scalar_mul_by_tensor`` is an elementwise rule of
``kernels.common.elementwise``).

``multi_count_not_finite`` runs over the whole GPU: a grid-wide kernel (``launch.grid_steps``)
whose every block strides over every gradient (the inputs arrive as one tuple of flat arrays of
one dtype), counts the non-finite elements of its share of each and combines its threads' counts
in shared memory into one partial count per (block, gradient); a one-block kernel then sums the
partial counts into the per-gradient counts and the total. No atomics: the partial counts are
int64 in a scratch buffer allocated when the plan is built. (Before, one 128-thread block
scanned each gradient: a 1M-element weight gradient ran on one SM.) The schedule is a
one-thread kernel over the scalar body ``kernels.common.loss_scale.schedule`` (the CPU's math)
that updates the scale and the growth tracker in place.
"""
from __future__ import annotations

import functools

from numba import cuda, types

from .common import block_sum, compute_type, device, flat, jit, math, scratch, short
from .launch import current, flat_steps, grid_steps, reduce_grid, row_steps
from ..common.loss_scale import schedule, schedule_builder

__all__ = ["count_not_finite_kernel", "sum_counts_kernel", "schedule_kernel", "BUILDERS"]


@functools.cache
def count_not_finite_kernel(ct, block: int):
    """``kernel(grads, partial)``: ``partial[b * n + k]`` = the non-finite elements of
    ``grads[k]`` that block ``b`` of the grid visits (grid-stride), ``n = len(grads)``."""

    @jit
    def kernel(grads, partial):
        sm = cuda.shared.array(block, types.int64)
        n = len(grads)
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for k in range(n):
            g = grads[k]
            c = 0
            for i in range(start, g.size, stride):
                if not math.isfinite(ct(g[i])):
                    c += 1
            total = block_sum(sm, c)
            if cuda.threadIdx.x == 0:
                partial[cuda.blockIdx.x * n + k] = total

    return kernel


@functools.cache
def sum_counts_kernel(block: int):
    """``kernel(partial, counts, total, blocks)`` (one block): ``counts[k] = sum_b partial[b * n
    + k]``, ``total[0] = sum(counts)``."""

    @jit
    def kernel(partial, counts, total, blocks):
        sm = cuda.shared.array(block, types.int64)
        n = counts.size
        t = 0
        for k in range(n):
            c = 0
            for b in range(cuda.threadIdx.x, blocks, block):
                c += partial[b * n + k]
            s = block_sum(sm, c)
            t += s
            if cuda.threadIdx.x == 0:
                counts[k] = s
        if cuda.threadIdx.x == 0:
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
    """``counts, total = multi_count_not_finite(g0, g1, ...)``: the grid-wide counting kernel
    into a scratch of partial counts, then the one-block summing kernel."""
    counts, total = outs
    cfg = current()
    blocks = reduce_grid(max(g.size for g in ins))
    partial = scratch(counts, (blocks * len(ins),), "int64")
    kernel = count_not_finite_kernel(compute_type(ins[0].dtype), cfg.block)
    grads = tuple(flat(g) for g in ins)
    return (grid_steps(kernel, blocks, (grads, partial), f"count_not_finite {short(ins[0].dtype)}")
            + row_steps(sum_counts_kernel(cfg.row_block), 1, (partial, counts, total, blocks),
                        "sum_counts"))


BUILDERS = {
    "multi_count_not_finite": build_multi_count_not_finite,
    "dynamic_loss_scale_schedule": schedule_builder(schedule_steps),
}
"""Op type -> builder for the loss-scale stage."""
