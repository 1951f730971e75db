"""CUDA kernels of the loss-scale stage: multi_count_not_finite and dynamic_loss_scale_schedule
(semantics in ``miniflow.ops.loss_scale``; ``scalar_mul_by_tensor`` is an elementwise rule of
``kernels.common.elementwise``).

``multi_count_not_finite`` runs over the whole GPU: per dtype of the gradients, a grid-wide
kernel (``launch.grid_steps``) whose every block strides over every gradient of that dtype (one
tuple of flat arrays, loaded through ``ld``), counts the non-finite elements of its share of each
and combines its threads' counts in shared memory into one partial count per (block, gradient);
gradients whose producer counted already (``precounted``: a matmul with ``count_not_finite``)
have their counts copied into the partial counts by a one-thread kernel; a one-block kernel then
sums the partial counts into the per-gradient counts and the total. No atomics: the partial
counts are int64 in a scratch buffer allocated when the plan is built. (Before, one 128-thread
block scanned each gradient: a 1M-element weight gradient ran on one SM.) The schedule is a
one-thread kernel over the scalar body ``kernels.common.loss_scale.schedule`` (the CPU's math)
that updates the scale and the growth tracker in place.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, types

from .common import block_sum, device, flat, jit, load_type, math, scratch, short
from .launch import current, flat_steps, grid_steps, reduce_grid, row_steps
from ..common.loss_scale import schedule, schedule_builder

__all__ = ["count_not_finite_kernel", "copy_counts_kernel",
           "sum_counts_kernel", "schedule_kernel", "count_steps", "BUILDERS"]


@functools.cache
def count_not_finite_kernel(ld, block: int):
    """``kernel(grads, index, partial, n)``: ``partial[b * n + index[k]]`` = the non-finite
    elements of ``grads[k]`` that block ``b`` of the grid visits (grid-stride; ``grads`` of one
    dtype, loaded through ``ld``)."""

    @jit
    def kernel(grads, index, partial, n):
        sm = cuda.shared.array(block, types.int64)
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for k in range(len(grads)):     # n: the gradients of every dtype (the row length)
            g = grads[k]
            c = 0
            for i in range(start, g.size, stride):
                if not math.isfinite(ld(g[i])):
                    c += 1
            total = block_sum(sm, c)
            if cuda.threadIdx.x == 0:
                partial[cuda.blockIdx.x * n + index[k]] = total

    return kernel


@functools.cache
def copy_counts_kernel():
    """``kernel(taken, index, partial, n, blocks)`` (one thread): ``partial[index[k]] =
    taken[k][0]`` and 0 in the other blocks' rows: the counts the gradients' producers took."""

    @jit
    def kernel(taken, index, partial, n, blocks):
        if cuda.grid(1) == 0:
            for k in range(len(taken)):
                partial[index[k]] = taken[k][0]
                for b in range(1, blocks):
                    partial[b * n + index[k]] = 0

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


def count_steps(x, count):
    """Steps writing the number of non-finite elements of ``x`` into the i64[1] ``count`` (the
    second output of a matmul with ``count_not_finite``): the grid-wide counting kernel, then
    the summing kernel."""
    blocks = reduce_grid(x.size)
    partial = scratch(count, (blocks,), "int64")
    kernel = count_not_finite_kernel(load_type(x.dtype), current().block)
    return (grid_steps(kernel, blocks, ((flat(x),), _indices(count, [0]), partial, 1),
                       f"count_not_finite {short(x.dtype)}")
            + _sum_steps(partial, flat(count), scratch(count, (1,), "int64"), blocks))


def build_multi_count_not_finite(node, ins, outs):
    """``counts, total = multi_count_not_finite(g0, g1, ...)``: the grid-wide counting kernel
    per dtype of the inputs that are not ``precounted`` into a scratch of partial counts, a copy
    of the ``precounted`` counts, then the one-block summing kernel."""
    counts, total = outs
    pre = node.attrs.get("precounted", ())
    groups: dict = {}
    for k, g in enumerate(ins):
        if k not in pre:
            groups.setdefault(np.dtype(g.dtype), []).append(k)
    cfg = current()
    blocks = reduce_grid(max((ins[k].size for ks in groups.values() for k in ks), default=1))
    n = len(ins)
    partial = scratch(counts, (blocks * n,), "int64")
    steps = []
    for dtype, index in groups.items():
        kernel = count_not_finite_kernel(load_type(dtype), cfg.block)
        steps += grid_steps(kernel, blocks, (tuple(flat(ins[k]) for k in index),
                                             _indices(counts, index), partial, n),
                            f"count_not_finite {short(dtype)}")
    if pre:
        steps += flat_steps(copy_counts_kernel(), 1,
                            (tuple(flat(ins[k]) for k in pre), _indices(counts, pre), partial, n,
                             blocks), "copy_counts")
    return steps + _sum_steps(partial, counts, total, blocks)


def _sum_steps(partial, counts, total, blocks):
    """The one-block :func:`sum_counts_kernel` launch."""
    return row_steps(sum_counts_kernel(current().row_block), 1, (partial, counts, total, blocks),
                     "sum_counts")


def _indices(like, index):
    """The int64 array ``index`` in ``like``'s memory (device memory for device arrays)."""
    host = np.array(index, np.int64)
    return host if isinstance(like, np.ndarray) else cuda.to_device(host)


BUILDERS = {
    "multi_count_not_finite": build_multi_count_not_finite,
    "dynamic_loss_scale_schedule": schedule_builder(schedule_steps),
}
"""Op type -> builder for the loss-scale stage."""
