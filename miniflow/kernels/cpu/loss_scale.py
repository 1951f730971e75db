"""CPU kernels of the loss-scale stage: multi_count_not_finite and dynamic_loss_scale_schedule
(semantics in ``miniflow.ops.loss_scale``; ``scalar_mul_by_tensor`` is an elementwise rule of
``kernels.common.elementwise``), and the counting cast that a matmul with ``count_not_finite``
rounds its product with (:func:`cast_count_steps`).

``multi_count_not_finite`` counts the inputs of each dtype one pack of up to ``TENSOR_PACK`` at
a time (``common.pack``: at most four compilations per dtype whatever the number of inputs),
copies the producers' counts (``precounted``), and sums the counts.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .common import flat, jit, jitable, kview, loop_for, pack, tensor_packs, use_parallel
from .fp16 import load, store
from ..common.loss_scale import schedule, schedule_builder

__all__ = ["count_into_kernel", "copy_counts_kernel",
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
def count_into_kernel(count, grads, index, counts):
    """``counts[index[k]] = #{i : not isfinite(grads[k][i])}`` for ``k < count`` (``grads``: a
    ``common.pack`` of 1-D kernel views of one dtype)."""
    for k in range(count):
        counts[index[k]] = _not_finite(grads[k])


@jit(False)
def copy_counts_kernel(count, taken, index, counts):
    """``counts[index[k]] = taken[k][0]`` for ``k < count``: the counts the gradients' producers
    took (``taken``: a ``common.pack``)."""
    for k in range(count):
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
    """A call of :func:`count_into_kernel` per dtype and pack of inputs (``common.tensor_packs``),
    of :func:`copy_counts_kernel` per pack of ``precounted`` inputs, then
    :func:`sum_counts_kernel`."""
    counts, total = outs
    pre = list(node.attrs.get("precounted", ()))
    groups: dict = {}
    for k, g in enumerate(ins):
        if k not in pre:
            groups.setdefault(kview(g).dtype, []).append(k)
    steps = []
    for index in groups.values():
        for part in tensor_packs(len(index)):
            chosen = [index[j] for j in part]
            steps.append((count_into_kernel, (len(chosen), pack([flat(ins[k]) for k in chosen]),
                                              np.array(chosen, np.int64), counts)))
    for part in tensor_packs(len(pre)):
        chosen = [pre[j] for j in part]
        taken = pack([ins[k].reshape(-1) for k in chosen])
        steps.append((copy_counts_kernel, (len(chosen), taken, np.array(chosen, np.int64),
                                           counts)))
    return steps + [(sum_counts_kernel, (counts, total))]


BUILDERS = {
    "multi_count_not_finite": build_multi_count_not_finite,
    "dynamic_loss_scale_schedule": schedule_builder(lambda *args: [(schedule_kernel, args)]),
}
"""Op type -> builder for the loss-scale stage."""
