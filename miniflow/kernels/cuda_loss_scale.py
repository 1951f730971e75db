"""CUDA kernels of the loss-scale stage: scalar_mul_by_tensor, multi_count_not_finite,
dynamic_loss_scale_schedule (semantics in ``miniflow.ops.loss_scale``, CPU twins in
``cpu_loss_scale``).

``multi_count_not_finite`` is one row kernel over all gradients at once: block ``k`` counts the
non-finite elements of input ``k`` (the inputs arrive as one tuple of flat arrays of one dtype) and
combines the per-thread counts in shared memory; a one-thread kernel then sums the counts into the
total. The schedule is a one-thread kernel that updates the scale and the growth tracker in place.
"""
from __future__ import annotations

import functools

from numba import cuda, types

from .cuda_common import block_sum, compute_type, flat, jit, math
from .cuda_elementwise import short, zip_steps
from .cuda_launch import current, flat_steps, row_steps
from ..ops.elementwise import mul

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
    (one thread): ``total[0] != 0`` -> ``scale = max(scale * backoff, min_scale)``, tracker = 0;
    else tracker += 1 and at ``growth_interval`` ``scale *= growth`` unless that is not finite in
    float32, tracker = 0."""

    @jit
    def kernel(total, scale, tracker, growth_factor, backoff_factor, growth_interval, min_scale):
        if cuda.grid(1) != 0:
            return
        if total[0] != 0:
            scale[0] = types.float32(max(types.float64(scale[0]) * backoff_factor, min_scale))
            tracker[0] = 0
            return
        tracker[0] += 1
        if tracker[0] >= growth_interval:
            grown = types.float32(types.float64(scale[0]) * growth_factor)
            if math.isfinite(grown):
                scale[0] = grown
            tracker[0] = 0

    return kernel


def build_scalar_mul_by_tensor(node, ins, outs):
    """``out[i] = x[i] * scalar``: a broadcasting zip against the one-element scalar, whatever its
    shape (``[]``, ``[1]``, ``[1,1]`` ...): it is read flat and broadcast as ``(1,) * x.ndim``."""
    x, s = ins
    return zip_steps(mul, x, s, outs[0], y_shape=(1,) * len(x.shape))


def build_multi_count_not_finite(node, ins, outs):
    """``counts, total = multi_count_not_finite(g0, g1, ...)``: a row kernel, a summing kernel."""
    counts, total = outs
    kernel = count_not_finite_kernel(compute_type(ins[0].dtype), current().row_block)
    grads = tuple(flat(g) for g in ins)
    return (row_steps(kernel, len(ins), (grads, counts), f"count_not_finite {short(ins[0].dtype)}")
            + flat_steps(sum_counts_kernel(), 1, (counts, total), "sum_counts"))


def build_dynamic_loss_scale_schedule(node, ins, outs):
    """One launch of :func:`schedule_kernel`; writes loss_scale and growth_tracker in place."""
    a = node.attrs
    return flat_steps(schedule_kernel(), 1,
                      (*ins, float(a["growth_factor"]), float(a["backoff_factor"]),
                       int(a["growth_interval"]), float(a["min_scale"])), "loss_scale_schedule")


BUILDERS = {
    "scalar_mul_by_tensor": build_scalar_mul_by_tensor,
    "multi_count_not_finite": build_multi_count_not_finite,
    "dynamic_loss_scale_schedule": build_dynamic_loss_scale_schedule,
}
"""Op type -> builder for the loss-scale stage."""
