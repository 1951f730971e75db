"""Reduction and row CUDA kernels: reduce_sum, softmax / log_softmax (+ grads), sparse softmax cross
entropy (+ grad).

Row kernels (``launch.row_steps``): one block of ``row_block`` threads per row (blocks loop
over rows when there are more rows than blocks). The block's threads stride over the row's columns,
and partial results are combined in shared memory (``common.block_sum`` / ``block_max``): no
atomics. Softmax-like kernels subtract the row max before ``exp`` (a NaN anywhere in a row makes
the max, hence the whole row, NaN, as on the CPU). Sums accumulate in the compute type (float32 for
f16/f32, float64 for f64).

``reduce_sum`` views its input as ``(outer, red, inner)`` (``kernels.common.reduce`` plans the
layout and the gather for both backends) and runs one row per output element.

Labels out of range. The CPU kernels raise ValueError; a CUDA kernel cannot raise, so a row whose
label is outside ``[0, C)`` gets a NaN loss (and a NaN gradient row), which the loss-scale pass's
non-finite count and any printed loss show.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from .common import (block_max, block_sum, device, flat, jit, math, nan_max, scratch, short,
                     types_of)
from .launch import current, flat_steps, row_steps
from .movement import fill_steps, transpose_steps
from ..common import reduce
from ..common.precision import compute_scalars
from ..common.reduce import gathered, with_log

__all__ = ["column_total", "reduce_sum_kernel", "reduce_sum_map_kernel", "reduce_sum_then",
           "row_max_sumexp", "softmax_kernel", "softmax_grad_kernel", "sparse_xent_kernel",
           "sparse_xent_grad_kernel", "sum_steps", "softmax_steps", "softmax_grad_steps",
           "xent_steps", "xent_grad_steps", "BUILDERS"]


# ----------------------------------------------------------------------------- kernels
@functools.cache
def column_total(ld, ct, block: int):
    """Device function ``total = f(sm, x, ok, red, inner)``: the sum over ``r`` of
    ``x[o, r, k]`` for the output element ``ok = o * inner + k``, in the compute type, the
    block's threads striding over ``r`` and combining in shared memory ``sm``."""

    @cuda.jit(device=True)
    def column_total(sm, x, ok, red, inner):
        o = ok // inner
        base = o * red * inner + (ok - o * inner)
        acc = ct(0)
        for r in range(cuda.threadIdx.x, red, block):
            acc += ld(x[base + r * inner])
        return block_sum(sm, acc)

    return column_total


@functools.cache
def reduce_sum_kernel(ld, ct, st, block: int):
    """``kernel(x, out, outer, red, inner)``: ``out[o, k] = sum_r x[o, r, k]``, block per (o, k)."""
    total = column_total(ld, ct, block)

    @jit
    def kernel(x, out, outer, red, inner):
        sm = cuda.shared.array(block, ct)
        for ok in range(cuda.blockIdx.x, outer * inner, cuda.gridDim.x):
            t = total(sm, x, ok, red, inner)
            if cuda.threadIdx.x == 0:
                out[ok] = st(t)

    return kernel


@functools.cache
def reduce_sum_map_kernel(fn, scalar: bool, ld, ct, st, block: int):
    """``kernel(x, out, outer, red, inner, s)``: ``out[o, k] = fn(sum_r x[o, r, k][, *s])``
    (``s``: a tuple of compute-type scalars, ignored without ``scalar``), the
    sum rounded to out's dtype first (as ``reduce_sum`` stores it), ``fn``'s result rounded to
    the compute type, then stored (as the map kernel of ``fn``): the mean loss
    (``reduce_sum`` then ``scalar_mul``) in one launch, bit for bit the two kernels' result."""
    f, total = device(fn), column_total(ld, ct, block)

    @jit
    def kernel(x, out, outer, red, inner, s):
        sm = cuda.shared.array(block, ct)
        for ok in range(cuda.blockIdx.x, outer * inner, cuda.gridDim.x):
            t = total(sm, x, ok, red, inner)
            if cuda.threadIdx.x == 0:
                v = ld(st(t))
                out[ok] = st(ct(f(v, *s)) if scalar else ct(f(v)))

    return kernel


@functools.cache
def row_max_sumexp(ld, ct):
    """Device function ``(m, s) = f(sm, x, base, cols)`` for the block's row
    ``x[base:base+cols]``: ``m = max(x)`` (NaN if any is NaN) and ``s = sum exp(x - m)``, both in
    the compute type."""

    @cuda.jit(device=True)
    def row_max_sumexp(sm, x, base, cols):
        m = ct(-math.inf)
        for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
            m = nan_max(m, ld(x[base + c]))
        m = block_max(sm, m)
        s = ct(0)
        for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
            s += math.exp(ld(x[base + c]) - m)
        return m, block_sum(sm, s)

    return row_max_sumexp


@functools.cache
def softmax_kernel(log: bool, ld, ct, st, block: int):
    """``kernel(x, out, rows, cols)``, per row: ``out = exp(x - m) / s`` or, for ``log``,
    ``out = x - m - log(s)`` (``m``, ``s`` from :func:`row_max_sumexp`)."""
    stats = row_max_sumexp(ld, ct)

    @jit
    def kernel(x, out, rows, cols):
        sm = cuda.shared.array(block, ct)
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            base = r * cols
            m, s = stats(sm, x, base, cols)
            log_s = math.log(s)
            for c in range(cuda.threadIdx.x, cols, block):
                v = ld(x[base + c]) - m
                out[base + c] = st(ct(v - log_s) if log else ct(math.exp(v) / s))

    return kernel


@functools.cache
def softmax_grad_kernel(log: bool, ld, ct, st, block: int):
    """``kernel(y, dy, dx, rows, cols)``, per row: ``dx = y * (dy - sum(dy * y))``, or for ``log``
    (y = log_softmax) ``dx = dy - exp(y) * sum(dy)``."""

    @jit
    def kernel(y, dy, dx, rows, cols):
        sm = cuda.shared.array(block, ct)
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            base = r * cols
            part = ct(0)
            for c in range(cuda.threadIdx.x, cols, block):
                part += ld(dy[base + c]) if log else ld(dy[base + c]) * ld(y[base + c])
            s = block_sum(sm, part)
            for c in range(cuda.threadIdx.x, cols, block):
                yc, dyc = ld(y[base + c]), ld(dy[base + c])
                dx[base + c] = st(ct(dyc - math.exp(yc) * s) if log else ct(yc * (dyc - s)))

    return kernel


@functools.cache
def sparse_xent_kernel(ld, ct, st, block: int):
    """``kernel(x, label, prob, out, rows, cols)``, per row: ``prob = softmax(x)``,
    ``out[r] = m + log(s) - x[r, label[r]]`` (logsumexp minus the picked logit); NaN for a label
    outside ``[0, cols)``."""
    stats = row_max_sumexp(ld, ct)

    @jit
    def kernel(x, label, prob, out, rows, cols):
        sm = cuda.shared.array(block, ct)
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            base = r * cols
            m, s = stats(sm, x, base, cols)
            for c in range(cuda.threadIdx.x, cols, block):
                prob[base + c] = st(ct(math.exp(ld(x[base + c]) - m) / s))
            if cuda.threadIdx.x == 0:
                lab = label[r]
                if 0 <= lab < cols:
                    out[r] = st(ct(m + math.log(s) - ld(x[base + lab])))
                else:
                    out[r] = st(math.nan)

    return kernel


@functools.cache
def sparse_xent_grad_kernel(ld, ct, st):
    """``kernel(dy, label, prob, dx, cols)``: ``dx[r, c] = dy[r] * (prob[r, c] - (c == label[r]))``
    (flat over r, c); a NaN row for a label outside ``[0, cols)``."""

    @jit
    def kernel(dy, label, prob, dx, cols):
        for i in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
            r = i // cols
            lab = label[r]
            p = ld(prob[i])
            if lab < 0 or lab >= cols:
                dx[i] = st(math.nan)
            elif i - r * cols == lab:
                dx[i] = st(ct(ld(dy[r]) * (p - ct(1))))
            else:
                dx[i] = st(ct(ld(dy[r]) * p))

    return kernel


# ----------------------------------------------------------------------------- step makers
def sum_steps(x, out, outer: int, red: int, inner: int):
    """Steps for ``out[o, k] = sum_r x[o, r, k]``: one row block per output element."""
    kernel = reduce_sum_kernel(*types_of(out), current().row_block)
    return row_steps(kernel, outer * inner, (flat(x), flat(out), outer, red, inner),
                     f"reduce_sum {short(out.dtype)}")


def sum_map_steps(fn, scalar, s, x, out, outer: int, red: int, inner: int):
    """Steps for ``out[o, k] = fn(sum_r x[o, r, k][, *s])`` (:func:`reduce_sum_map_kernel`; ``s``
    a non-empty tuple of Python floats)."""
    kernel = reduce_sum_map_kernel(fn, scalar, *types_of(out), current().row_block)
    args = (flat(x), flat(out), outer, red, inner, compute_scalars(out.dtype, s))
    return row_steps(kernel, outer * inner, args,
                     f"reduce_sum+map[{fn.__name__}] {short(out.dtype)}")


def reduce_sum_then(op):
    """The fused builder of ``reduce_sum`` then the elementwise map ``op`` (an OpDef with a
    scalar function of one tensor operand, e.g. ``scalar_mul``): ``(producer, consumer, ins,
    outs)``, as ``runtime.plan.build_steps`` calls it."""
    fn, scalar = op.scalar, bool(op.scalar_attrs)

    def build(producer, consumer, ins, outs):
        s = op.scalar_args(consumer.attrs) or (0.0,)      # (0.0,): a placeholder, never read
        plan = reduce.plan_of(producer, ins, outs)
        if plan is None:
            return []
        steps = gathered(transpose_steps, scratch,
                         functools.partial(sum_map_steps, fn, scalar, s))
        return steps(ins, outs, plan, producer.attrs)
    return build


def softmax_steps(log: bool, ins, outs, plan, attrs):
    """Row launches of :func:`softmax_kernel` (none for an empty output; with ``log`` bound: a
    step maker)."""
    (x,), (out,), (rows, cols) = ins, outs, plan
    if out.size == 0:
        return []
    kernel = softmax_kernel(log, *types_of(out), current().row_block)
    return row_steps(kernel, rows, (flat(x), flat(out), rows, cols),
                     f"{'log_' if log else ''}softmax {short(out.dtype)}")


def softmax_grad_steps(log: bool, ins, outs, plan, attrs):
    """Row launches of :func:`softmax_grad_kernel` (none for an empty output; with ``log`` bound:
    a step maker)."""
    (y, dy), (dx,), (rows, cols) = ins, outs, plan
    if dx.size == 0:
        return []
    kernel = softmax_grad_kernel(log, *types_of(dx), current().row_block)
    return row_steps(kernel, rows, (flat(y), flat(dy), flat(dx), rows, cols),
                     f"{'log_' if log else ''}softmax_grad {short(dx.dtype)}")


def xent_steps(ins, outs, plan, attrs):
    """Row launches of :func:`sparse_xent_kernel`; with no rows or no classes (then every label is
    out of range) a NaN fill of the loss."""
    (x, label), (prob, out), (rows, cols) = ins, outs, plan
    if prob.size == 0:
        return fill_steps(out, np.nan)
    kernel = sparse_xent_kernel(*types_of(prob), current().row_block)
    return row_steps(kernel, rows, (flat(x), flat(label), flat(prob), flat(out), rows, cols),
                     f"sparse_xent {short(prob.dtype)}")


def xent_grad_steps(ins, outs, plan, attrs):
    """A grid-stride launch of :func:`sparse_xent_grad_kernel` over dx."""
    (dy, label, prob), (dx,), (rows, cols) = ins, outs, plan
    kernel = sparse_xent_grad_kernel(*types_of(dx))
    return flat_steps(kernel, dx.size, (flat(dy), flat(label), flat(prob), flat(dx), cols),
                      f"sparse_xent_grad {short(dx.dtype)}")


BUILDERS = reduce.builders(reduce_sum=gathered(transpose_steps, scratch, sum_steps),
                           **with_log(softmax=softmax_steps, softmax_grad=softmax_grad_steps),
                           sparse_softmax_cross_entropy=xent_steps,
                           sparse_softmax_cross_entropy_grad=xent_grad_steps)
"""Op type -> builder for the reductions and row ops."""
