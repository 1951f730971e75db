"""Reduction and row CUDA kernels: reduce_sum, softmax / log_softmax (+ grads), sparse softmax cross
entropy (+ grad).

Row kernels (``cuda_launch.row_steps``): one block of ``row_block`` threads per row (blocks loop
over rows when there are more rows than blocks). The block's threads stride over the row's columns,
and partial results are combined in shared memory (``cuda_common.block_sum`` / ``block_max``): no
atomics. Softmax-like kernels subtract the row max before ``exp`` (a NaN anywhere in a row makes
the max, hence the whole row, NaN, as on the CPU). Sums accumulate in the compute type (float32 for
f16/f32, float64 for f64).

``reduce_sum`` views its input as ``(outer, red, inner)`` with ``layout.reduce_layout`` and runs
one row per output element; when the reduced dims are not one block, the builder first gathers the
input, kept dims first, into a scratch buffer (as the CPU builder does).

Labels out of range. The CPU kernels raise ValueError; a CUDA kernel cannot raise, so a row whose
label is outside ``[0, C)`` gets a NaN loss (and a NaN gradient row), which the loss-scale pass's
non-finite count and any printed loss show.
"""
from __future__ import annotations

import functools
import math as _math

import numpy as np
from numba import cuda

from .cuda_common import (block_max, block_sum, compute_type, flat, jit, math, nan_max, scratch,
                          storage_type)
from .cuda_elementwise import c_strides, fill_steps, gather_steps, short
from .cuda_launch import current, flat_steps, row_steps
from .layout import reduce_layout

__all__ = ["reduce_sum_kernel", "row_max_sumexp", "softmax_kernel", "softmax_grad_kernel",
           "sparse_xent_kernel", "sparse_xent_grad_kernel", "BUILDERS"]


# ----------------------------------------------------------------------------- kernels
@functools.cache
def reduce_sum_kernel(ct, st, block: int):
    """``kernel(x, out, outer, red, inner)``: ``out[o, k] = sum_r x[o, r, k]``, block per (o, k)."""

    @jit
    def kernel(x, out, outer, red, inner):
        sm = cuda.shared.array(block, ct)
        for ok in range(cuda.blockIdx.x, outer * inner, cuda.gridDim.x):
            o = ok // inner
            base = o * red * inner + (ok - o * inner)
            acc = ct(0)
            for r in range(cuda.threadIdx.x, red, block):
                acc += ct(x[base + r * inner])
            total = block_sum(sm, acc)
            if cuda.threadIdx.x == 0:
                out[ok] = st(total)

    return kernel


@functools.cache
def row_max_sumexp(ct):
    """Device function ``(m, s) = f(sm, x, base, cols)`` for the block's row
    ``x[base:base+cols]``: ``m = max(x)`` (NaN if any is NaN) and ``s = sum exp(x - m)``, both in
    the compute type."""

    @cuda.jit(device=True)
    def row_max_sumexp(sm, x, base, cols):
        m = ct(-math.inf)
        for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
            m = nan_max(m, ct(x[base + c]))
        m = block_max(sm, m)
        s = ct(0)
        for c in range(cuda.threadIdx.x, cols, cuda.blockDim.x):
            s += math.exp(ct(x[base + c]) - m)
        return m, block_sum(sm, s)

    return row_max_sumexp


@functools.cache
def softmax_kernel(log: bool, ct, st, block: int):
    """``kernel(x, out, rows, cols)``, per row: ``out = exp(x - m) / s`` or, for ``log``,
    ``out = x - m - log(s)`` (``m``, ``s`` from :func:`row_max_sumexp`)."""
    stats = row_max_sumexp(ct)

    @jit
    def kernel(x, out, rows, cols):
        sm = cuda.shared.array(block, ct)
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            base = r * cols
            m, s = stats(sm, x, base, cols)
            log_s = math.log(s)
            for c in range(cuda.threadIdx.x, cols, block):
                v = ct(x[base + c]) - m
                out[base + c] = st(ct(v - log_s) if log else ct(math.exp(v) / s))

    return kernel


@functools.cache
def softmax_grad_kernel(log: bool, ct, st, block: int):
    """``kernel(y, dy, dx, rows, cols)``, per row: ``dx = y * (dy - sum(dy * y))``, or for ``log``
    (y = log_softmax) ``dx = dy - exp(y) * sum(dy)``."""

    @jit
    def kernel(y, dy, dx, rows, cols):
        sm = cuda.shared.array(block, ct)
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            base = r * cols
            part = ct(0)
            for c in range(cuda.threadIdx.x, cols, block):
                part += ct(dy[base + c]) if log else ct(dy[base + c]) * ct(y[base + c])
            s = block_sum(sm, part)
            for c in range(cuda.threadIdx.x, cols, block):
                yc, dyc = ct(y[base + c]), ct(dy[base + c])
                dx[base + c] = st(ct(dyc - math.exp(yc) * s) if log else ct(yc * (dyc - s)))

    return kernel


@functools.cache
def sparse_xent_kernel(ct, st, block: int):
    """``kernel(x, label, prob, out, rows, cols)``, per row: ``prob = softmax(x)``,
    ``out[r] = m + log(s) - x[r, label[r]]`` (logsumexp minus the picked logit); NaN for a label
    outside ``[0, cols)``."""
    stats = row_max_sumexp(ct)

    @jit
    def kernel(x, label, prob, out, rows, cols):
        sm = cuda.shared.array(block, ct)
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            base = r * cols
            m, s = stats(sm, x, base, cols)
            for c in range(cuda.threadIdx.x, cols, block):
                prob[base + c] = st(ct(math.exp(ct(x[base + c]) - m) / s))
            if cuda.threadIdx.x == 0:
                lab = label[r]
                if 0 <= lab < cols:
                    out[r] = st(ct(m + math.log(s) - ct(x[base + lab])))
                else:
                    out[r] = st(math.nan)

    return kernel


@functools.cache
def sparse_xent_grad_kernel(ct, st):
    """``kernel(dy, label, prob, dx, cols)``: ``dx[r, c] = dy[r] * (prob[r, c] - (c == label[r]))``
    (flat over r, c); a NaN row for a label outside ``[0, cols)``."""

    @jit
    def kernel(dy, label, prob, dx, cols):
        for i in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
            r = i // cols
            lab = label[r]
            p = ct(prob[i])
            if lab < 0 or lab >= cols:
                dx[i] = st(math.nan)
            elif i - r * cols == lab:
                dx[i] = st(ct(ct(dy[r]) * (p - ct(1))))
            else:
                dx[i] = st(ct(ct(dy[r]) * p))

    return kernel


# ----------------------------------------------------------------------------- builders
def _types(a):
    return compute_type(a.dtype), storage_type(a.dtype)


def build_reduce_sum(node, ins, outs):
    """``out = x.sum(axis=attrs["axis"], keepdims=attrs["keepdims"])``, summed in compute type."""
    x, out = ins[0], outs[0]
    if out.size == 0:
        return []
    gather, (outer, red_n, inner) = reduce_layout(x.shape, tuple(node.attrs["axis"]))
    steps, src = [], x
    if gather is not None:      # gather x as (kept..., reduced...)
        sizes, order = gather
        src = scratch(x, (x.size,), x.dtype)
        xst = c_strides(sizes)
        steps += gather_steps(x, src, [sizes[d] for d in order], [xst[d] for d in order],
                              "reduce_gather")
    kernel = reduce_sum_kernel(*_types(out), current().row_block)
    return steps + row_steps(kernel, outer * inner, (flat(src), flat(out), outer, red_n, inner),
                             f"reduce_sum {short(out.dtype)}")


def _rows_cols(a):
    """``(rows, cols)`` of ``a`` viewed as 2-D over its last axis."""
    shape = tuple(a.shape)           # the simulator's shape type has no negative indexing
    return _math.prod(shape[:-1]), shape[-1]


def _softmax(log):
    def build(node, ins, outs):
        x, out = ins[0], outs[0]
        rows, cols = _rows_cols(x)
        if out.size == 0:
            return []
        kernel = softmax_kernel(log, *_types(out), current().row_block)
        return row_steps(kernel, rows, (flat(x), flat(out), rows, cols),
                         f"{'log_' if log else ''}softmax {short(out.dtype)}")
    build.__doc__ = f"``out = {'log_' if log else ''}softmax(x)`` over the last axis."
    return build


def _softmax_grad(log):
    def build(node, ins, outs):
        rows, cols = _rows_cols(ins[0])
        if outs[0].size == 0:
            return []
        kernel = softmax_grad_kernel(log, *_types(outs[0]), current().row_block)
        return row_steps(kernel, rows, (flat(ins[0]), flat(ins[1]), flat(outs[0]), rows, cols),
                         f"{'log_' if log else ''}softmax_grad {short(outs[0].dtype)}")
    build.__doc__ = f"``dx = {'log_' if log else ''}softmax_grad(y, dy)`` over the last axis."
    return build


def build_sparse_xent(node, ins, outs):
    """``prob, out = sparse_softmax_cross_entropy(prediction [N, C], label [N] int64)``."""
    rows, cols = _rows_cols(ins[0])
    if outs[0].size == 0:        # no rows, or no classes (then every label is out of range)
        return fill_steps(outs[1], np.nan)
    kernel = sparse_xent_kernel(*_types(outs[0]), current().row_block)
    return row_steps(kernel, rows, (flat(ins[0]), flat(ins[1]), flat(outs[0]), flat(outs[1]),
                                    rows, cols), f"sparse_xent {short(outs[0].dtype)}")


def build_sparse_xent_grad(node, ins, outs):
    """``dx = sparse_softmax_cross_entropy_grad(dy [N], label [N] int64, prob [N, C])``."""
    rows, cols = _rows_cols(ins[2])
    kernel = sparse_xent_grad_kernel(*_types(outs[0]))
    return flat_steps(kernel, outs[0].size, (flat(ins[0]), flat(ins[1]), flat(ins[2]),
                                             flat(outs[0]), cols),
                      f"sparse_xent_grad {short(outs[0].dtype)}")


BUILDERS = {
    "reduce_sum": build_reduce_sum,
    "softmax": _softmax(False),
    "log_softmax": _softmax(True),
    "softmax_grad": _softmax_grad(False),
    "log_softmax_grad": _softmax_grad(True),
    "sparse_softmax_cross_entropy": build_sparse_xent,
    "sparse_softmax_cross_entropy_grad": build_sparse_xent_grad,
}
"""Op type -> builder for the reductions and row ops."""
