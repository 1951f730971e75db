"""CPU kernels of the loss-scale stage: multi_count_not_finite and dynamic_loss_scale_schedule
(semantics in ``miniflow.ops.loss_scale``; ``scalar_mul_by_tensor`` is an elementwise rule of
``kernels.common.elementwise``), and the counting cast that a matmul with ``count_not_finite``
rounds its product with (:func:`cast_count_steps`).

``multi_count_not_finite`` is one kernel call over all its inputs when they share one dtype;
inputs of several dtypes are counted one call per dtype, the producers' counts (``precounted``)
copied, and the counts summed.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .common import flat, jit, jitable, kview, loop_for, use_parallel
from .fp16 import load, store
from ..common.loss_scale import schedule, schedule_builder

__all__ = ["count_not_finite_kernel", "count_into_kernel", "copy_counts_kernel",
           "sum_counts_kernel", "cast_count_kernel", "cast_count_steps", "schedule_kernel",
           "BUILDERS"]

_schedule = jitable(schedule)


@jitable
def _not_finite(g):
    """``#{i : not isfinite(g[i])}`` for a 1-D kernel view ``g``."""
    c = 0
    for i in range(g.size):
        if not math.isfinite(load(g, i)):
            c += 1
    return c


@jit(False)
def count_not_finite_kernel(grads, counts, total):
    """``counts[k] = #{i : not isfinite(grads[k][i])}``; ``total[0] = sum(counts)``.

    ``grads`` is a tuple of 1-D kernel views of one dtype: one call covers every parameter."""
    t = 0
    for k in range(len(grads)):
        counts[k] = _not_finite(grads[k])
        t += counts[k]
    total[0] = t


@jit(False)
def count_into_kernel(grads, index, counts):
    """``counts[index[k]] = #{i : not isfinite(grads[k][i])}`` (``grads``: one dtype)."""
    for k in range(len(grads)):
        counts[index[k]] = _not_finite(grads[k])


@jit(False)
def copy_counts_kernel(taken, index, counts):
    """``counts[index[k]] = taken[k][0]``: the counts the gradients' producers took."""
    for k in range(len(taken)):
        counts[index[k]] = taken[k][0]


@jit(False)
def sum_counts_kernel(counts, total):
    """``total[0] = sum(counts)``."""
    t = 0
    for k in range(counts.size):
        t += counts[k]
    total[0] = t


@functools.cache
def cast_count_kernel(parallel: bool):
    """``kernel(x, out, count)``: ``out[i] = x[i]`` rounded to out's dtype (a ``cast``) and
    ``count[0]`` = the number of non-finite elements of out, in the same pass."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, count):
        c = 0
        for i in loop(out.size):
            store(out, i, load(x, i))
            if not math.isfinite(load(out, i)):
                c += 1
        count[0] = c

    return kernel


def cast_count_steps(x, out, count):
    """Steps for ``out = x.astype(out.dtype)`` counting the non-finite elements of out into the
    i64[1] ``count`` (x may have out's dtype: then it only counts, through a copy)."""
    return [(cast_count_kernel(use_parallel(out.size)), (flat(x), flat(out), count.reshape(-1)))]


@jit(False)
def schedule_kernel(total, scale, tracker, growth_factor, backoff_factor, growth_interval,
                    min_scale):
    """``scale[0], tracker[0] = schedule(total[0], scale[0], tracker[0], ...)``."""
    scale[0], tracker[0] = _schedule(total[0], scale[0], tracker[0], growth_factor,
                                     backoff_factor, growth_interval, min_scale)


def build_multi_count_not_finite(node, ins, outs):
    """One call of :func:`count_not_finite_kernel` over all inputs when they share a dtype;
    else a call of :func:`count_into_kernel` per dtype, :func:`copy_counts_kernel` for the
    ``precounted`` inputs and :func:`sum_counts_kernel`."""
    counts, total = outs
    pre = node.attrs.get("precounted", ())
    groups: dict = {}
    for k, g in enumerate(ins):
        if k not in pre:
            groups.setdefault(kview(g).dtype, []).append(k)
    if not pre and len(groups) == 1:
        return [(count_not_finite_kernel, (tuple(flat(g) for g in ins), counts, total))]
    steps = [(count_into_kernel, (tuple(flat(ins[k]) for k in index),
                                  np.array(index, np.int64), counts))
             for index in groups.values()]
    if pre:
        steps.append((copy_counts_kernel, (tuple(ins[k].reshape(-1) for k in pre),
                                           np.array(pre, np.int64), counts)))
    return steps + [(sum_counts_kernel, (counts, total))]


BUILDERS = {
    "multi_count_not_finite": build_multi_count_not_finite,
    "dynamic_loss_scale_schedule": schedule_builder(lambda *args: [(schedule_kernel, args)]),
}
"""Op type -> builder for the loss-scale stage."""
