"""CUDA kernels of gradient clipping by the global norm, ``clip_grad_norm`` (semantics in
``miniflow.ops.clip``).

A row kernel over all gradients at once (as ``multi_count_not_finite``): block ``k`` accumulates
gradient ``k`` in float64 (the scalar bodies of ``kernels.common.clip``, as on the CPU) and
combines its threads' partial results in shared memory into ``partial[k]``; a one-thread kernel
combines the partial results, finishes the norm and computes the clip factor.
"""
from __future__ import annotations

import functools
import math as _math

from numba import cuda, types

from .common import block_max, block_sum, device, flat, jit, load_type, scratch, short
from .launch import current, flat_steps, row_steps
from ..common.clip import (clip_builder, clip_coefficient, norm_accumulate, norm_combine,
                           norm_finish)

__all__ = ["partial_norm_kernel", "finish_kernel", "BUILDERS"]


@functools.cache
def partial_norm_kernel(ld, block: int):
    """``kernel(grads, partial, p)``: ``partial[k]`` = the accumulated ``|grads[k]|`` (block k)."""
    accumulate = device(norm_accumulate)
    f64 = types.float64

    @jit
    def kernel(grads, partial, p):
        sm = cuda.shared.array(block, types.float64)
        for k in range(cuda.blockIdx.x, len(grads), cuda.gridDim.x):
            g = grads[k]
            acc = f64(0.0)
            for i in range(cuda.threadIdx.x, g.size, block):
                acc = accumulate(acc, f64(ld(g[i])), p)
            total = block_max(sm, acc) if p == _math.inf else block_sum(sm, acc)
            if cuda.threadIdx.x == 0:
                partial[k] = total

    return kernel


@functools.cache
def finish_kernel():
    """``kernel(skip_if, partial, total, coef, max_norm, p)`` (one thread): the norm from the
    partial results and the clip factor."""
    combine, finish = device(norm_combine), device(norm_finish)
    coefficient = device(clip_coefficient)

    @jit
    def kernel(skip_if, partial, total, coef, max_norm, p):
        if cuda.grid(1) == 0:
            acc = 0.0
            for k in range(partial.size):
                acc = combine(acc, partial[k], p)
            norm = finish(acc, p)
            total[0] = norm
            coef[0] = coefficient(norm, max_norm, skip_if[0])

    return kernel


def clip_steps(skip_if, grads, total, coef, max_norm, p):
    """A row kernel over the gradients into a float64 scratch of partial results, then the
    one-thread finishing kernel."""
    partial = scratch(total, (len(grads),), "float64")
    kernel = partial_norm_kernel(load_type(grads[0].dtype), current().row_block)
    return (row_steps(kernel, len(grads), (tuple(flat(g) for g in grads), partial, p),
                      f"clip_partial_norm {short(grads[0].dtype)}")
            + flat_steps(finish_kernel(), 1, (flat(skip_if), partial, total, coef, max_norm, p),
                         "clip_finish"))


BUILDERS = {"clip_grad_norm": clip_builder(clip_steps)}
"""Op type -> builder for gradient clipping."""
