"""CUDA kernels of the loss-scale stage: multi_count_not_finite and dynamic_loss_scale_schedule
(semantics in ``miniflow.ops.loss_scale``; ``scalar_mul_by_tensor`` is an elementwise rule of
``kernels.common.elementwise``).

``multi_count_not_finite`` is one row kernel over the gradients of one dtype at once: block ``k``
counts the non-finite elements of the group's input ``k`` (one tuple of flat arrays) into
``counts[index[k]]``, combining the per-thread counts in shared memory; gradients whose producer
counted already (``precounted``) are copied by a one-thread kernel; a one-thread kernel then sums
the counts into the total. The schedule is a one-thread kernel over the scalar body
``kernels.common.loss_scale.schedule`` (the CPU's math) that updates the scale and the growth
tracker in place.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, types

from .common import block_sum, device, flat, jit, load_type, math, short
from .launch import current, flat_steps, row_steps
from ..common.loss_scale import schedule, schedule_builder

__all__ = ["count_not_finite_kernel", "copy_counts_kernel",
           "sum_counts_kernel", "schedule_kernel", "count_steps", "BUILDERS"]


@functools.cache
def count_not_finite_kernel(ld, block: int):
    """``kernel(grads, index, counts)``: ``counts[index[k]] = #{i : not isfinite(grads[k][i])}``,
    block k (``grads`` of one dtype)."""

    @jit
    def kernel(grads, index, counts):
        sm = cuda.shared.array(block, types.int64)
        for k in range(cuda.blockIdx.x, len(grads), cuda.gridDim.x):
            g = grads[k]
            c = 0
            for i in range(cuda.threadIdx.x, g.size, block):
                if not math.isfinite(ld(g[i])):
                    c += 1
            total = block_sum(sm, c)
            if cuda.threadIdx.x == 0:
                counts[index[k]] = total

    return kernel


@functools.cache
def copy_counts_kernel():
    """``kernel(taken, index, counts)``: ``counts[index[k]] = taken[k][0]`` (one thread): the
    counts the gradients' producers took."""

    @jit
    def kernel(taken, index, counts):
        if cuda.grid(1) == 0:
            for k in range(len(taken)):
                counts[index[k]] = taken[k][0]

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


def count_steps(x, count):
    """Steps writing the number of non-finite elements of ``x`` into the i64[1] ``count`` (the
    second output of a matmul with ``count_not_finite``): one block of the row kernel."""
    kernel = count_not_finite_kernel(load_type(x.dtype), current().row_block)
    return row_steps(kernel, 1, ((flat(x),), _indices(count, [0]), flat(count)),
                     f"count_not_finite {short(x.dtype)}")


def build_multi_count_not_finite(node, ins, outs):
    """``counts, total = multi_count_not_finite(g0, g1, ...)``: a row kernel per dtype of the
    inputs that are not ``precounted``, a copy of the ``precounted`` counts, a summing kernel."""
    counts, total = outs
    pre = node.attrs.get("precounted", ())
    groups: dict = {}
    for k, g in enumerate(ins):
        if k not in pre:
            groups.setdefault(np.dtype(g.dtype), []).append(k)
    steps = []
    for dtype, index in groups.items():
        kernel = count_not_finite_kernel(load_type(dtype), current().row_block)
        steps += row_steps(kernel, len(index), (tuple(flat(ins[k]) for k in index),
                                                _indices(counts, index), counts),
                           f"count_not_finite {short(dtype)}")
    if pre:
        steps += flat_steps(copy_counts_kernel(), 1,
                            (tuple(flat(ins[k]) for k in pre), _indices(counts, pre), counts),
                            "copy_counts")
    return steps + flat_steps(sum_counts_kernel(), 1, (counts, total), "sum_counts")


def _indices(like, index):
    """The int64 array ``index`` in ``like``'s memory (device memory for device arrays)."""
    host = np.array(index, np.int64)
    return host if isinstance(like, np.ndarray) else cuda.to_device(host)


BUILDERS = {
    "multi_count_not_finite": build_multi_count_not_finite,
    "dynamic_loss_scale_schedule": schedule_builder(schedule_steps),
}
"""Op type -> builder for the loss-scale stage."""
