"""Reduction CPU kernels and builders: reduce_sum, softmax / log_softmax (+ grads), sparse softmax
cross entropy (+ grad). Sums accumulate in the compute type (float32 for f16/f32, float64 for f64).

``reduce_sum`` views its input as ``(outer, red, inner)``: size-1 dims are dropped and adjacent dims
of the same kind (kept / reduced) merged; when the reduced dims are not one block (e.g. axis (0, 2)
of a 3-D tensor) the builder first copies the input, kept dims first, into a scratch buffer.
Row ops work on the last axis, the input viewed as ``(rows, cols)``.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .cpu_common import flat, jit, loop_for, use_parallel
from .cpu_elementwise import cast_steps
from .fp16 import load, store, to_compute
from .layout import reduce_layout

__all__ = ["reduce_sum_kernel", "reduce_sum_columns_kernel", "softmax_kernel", "softmax_grad_kernel",
           "sparse_xent_kernel",
           "sparse_xent_grad_kernel", "BUILDERS"]

LABEL_ERROR = "sparse_softmax_cross_entropy: label out of range [0, num_classes)"


# ----------------------------------------------------------------------------- kernels
@functools.cache
def reduce_sum_kernel(parallel: bool):
    """``kernel(x, out, outer, red, inner)``: ``out[o, k] = sum_r x[o, r, k]`` (x, out 1-D views)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, outer, red, inner):
        for ok_ in loop(outer * inner):
            ok = np.int64(ok_)  # prange indices are unsigned
            o = ok // inner
            base = o * red * inner + (ok - o * inner)
            acc = to_compute(x, 0.0)
            for r in range(red):
                acc += load(x, base + r * inner)
            store(out, ok, acc)

    return kernel


COLUMN_BLOCK = 512
"""Columns one iteration of :func:`reduce_sum_columns_kernel` adds up (its unit of parallelism)."""


@functools.cache
def reduce_sum_columns_kernel(parallel: bool):
    """``kernel(x, out, acc, outer, red, inner)``: ``out[o, k] = sum_r x[o, r, k]`` row by row:
    ``acc[o, k] += x[o, r, k]`` for ``r = 0, 1, ...``, contiguous in k so the loop vectorizes (each
    sum adds in the same order as :func:`reduce_sum_kernel`, so the bits agree). ``acc`` is a
    compute-type scratch of out's size; blocks of ``COLUMN_BLOCK`` columns run in parallel."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, acc, outer, red, inner):
        blocks = (inner + COLUMN_BLOCK - 1) // COLUMN_BLOCK
        for ob_ in loop(outer * blocks):
            ob = np.int64(ob_)  # prange indices are unsigned
            o = ob // blocks
            k0 = o * inner + (ob - o * blocks) * COLUMN_BLOCK
            n = min(COLUMN_BLOCK, (o + 1) * inner - k0)
            a = acc[k0:k0 + n]
            a[:] = 0
            for r in range(red):
                xr = x[k0 + o * (red - 1) * inner + r * inner:]
                for k in range(n):
                    a[k] += load(xr, k)
            outr = out[k0:]
            for k in range(n):
                store(outr, k, a[k])

    return kernel


@jit(False)
def _row_max_sumexp(x, base, cols):
    """``(m, s)``: the row's max (nan if any element is nan) and ``sum exp(x - m)``."""
    m = to_compute(x, -math.inf)
    for c in range(cols):
        v = load(x, base + c)
        if v > m or v != v:
            m = v
            if v != v:
                break
    s = to_compute(x, 0.0)
    for c in range(cols):
        s += math.exp(load(x, base + c) - m)
    return m, s


@functools.cache
def softmax_kernel(log: bool, parallel: bool):
    """``kernel(x, out, rows, cols)``: per row, ``out = exp(x - m) / s`` or, for ``log``,
    ``out = x - m - log(s)`` with ``m = max(x)``, ``s = sum exp(x - m)``."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, rows, cols):
        for r_ in loop(rows):
            r = np.int64(r_)  # prange indices are unsigned
            base = r * cols
            m, s = _row_max_sumexp(x, base, cols)
            if log:
                log_s = math.log(s)
                for c in range(cols):
                    store(out, base + c, load(x, base + c) - m - log_s)
            else:
                for c in range(cols):
                    store(out, base + c, math.exp(load(x, base + c) - m) / s)

    return kernel


@functools.cache
def softmax_grad_kernel(log: bool, parallel: bool):
    """``kernel(y, dy, dx, rows, cols)``, per row: ``dx = y * (dy - sum(dy * y))``, or for ``log``
    (y = log_softmax) ``dx = dy - exp(y) * sum(dy)``."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(y, dy, dx, rows, cols):
        for r_ in loop(rows):
            r = np.int64(r_)  # prange indices are unsigned
            base = r * cols
            s = to_compute(dy, 0.0)
            for c in range(cols):
                s += load(dy, base + c) if log else load(dy, base + c) * load(y, base + c)
            for c in range(cols):
                yc, dyc = load(y, base + c), load(dy, base + c)
                store(dx, base + c, dyc - math.exp(yc) * s if log else yc * (dyc - s))

    return kernel


@jit(False)
def _check_labels(label, cols):
    """Raise ValueError unless every label is in [0, cols)."""
    for r in range(label.size):
        if label[r] < 0 or label[r] >= cols:
            raise ValueError(LABEL_ERROR)


@functools.cache
def sparse_xent_kernel(parallel: bool):
    """``kernel(x, label, prob, out, rows, cols)``: per row ``prob = softmax(x)``,
    ``out[r] = m + log(s) - x[r, label[r]]`` (= logsumexp - picked logit).

    Raises:
        ValueError: a label outside [0, cols).
    """
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, label, prob, out, rows, cols):
        _check_labels(label, cols)
        for r_ in loop(rows):
            r = np.int64(r_)  # prange indices are unsigned
            base = r * cols
            m, s = _row_max_sumexp(x, base, cols)
            for c in range(cols):
                store(prob, base + c, math.exp(load(x, base + c) - m) / s)
            store(out, r, m + math.log(s) - load(x, base + label[r]))

    return kernel


@functools.cache
def sparse_xent_grad_kernel(parallel: bool):
    """``kernel(dy, label, prob, dx, rows, cols)``: ``dx[r, c] = dy[r] * (prob[r, c] - (c == label[r]))``.

    Raises:
        ValueError: a label outside [0, cols).
    """
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(dy, label, prob, dx, rows, cols):
        _check_labels(label, cols)
        for r_ in loop(rows):
            r = np.int64(r_)  # prange indices are unsigned
            base, g = r * cols, load(dy, r)
            for c in range(cols):
                p = load(prob, base + c)
                store(dx, base + c, g * (p - to_compute(prob, 1.0)) if c == label[r] else g * p)

    return kernel


# ----------------------------------------------------------------------------- builders
def build_reduce_sum(node, ins, outs):
    """``out = x.sum(axis=attrs["axis"], keepdims=attrs["keepdims"])``, accumulated in compute type."""
    x, out = ins[0], outs[0]
    if out.size == 0:
        return []
    gather, (outer, red_n, inner) = reduce_layout(x.shape, tuple(node.attrs["axis"]))
    steps, src = [], x
    if gather is not None:                # copy x as (kept..., reduced...)
        sizes, order = gather
        src = np.empty(x.size, x.dtype)
        moved = src.reshape([sizes[d] for d in order])
        steps.append((np.copyto, (moved, x.reshape(sizes).transpose(order))))
    parallel = use_parallel(x.size) and outer * inner > 1
    if red_n == 1:                        # nothing to add up: a copy (keeps -0.0, as NumPy's sum)
        return steps + cast_steps(src, out)
    if inner > 1:
        acc = np.empty(out.size, np.float64 if out.dtype == np.float64 else np.float32)
        kernel = reduce_sum_columns_kernel(parallel)
        return steps + [(kernel, (flat(src), flat(out), acc, outer, red_n, inner))]
    return steps + [(reduce_sum_kernel(parallel), (flat(src), flat(out), outer, red_n, inner))]


def _rows_cols(a: np.ndarray):
    """``(rows, cols)`` of ``a`` viewed as 2-D over its last axis."""
    return math.prod(a.shape[:-1]), a.shape[-1]


def _softmax(log):
    def build(node, ins, outs):
        rows, cols = _rows_cols(ins[0])
        kernel = softmax_kernel(log, use_parallel(ins[0].size))
        return [(kernel, (flat(ins[0]), flat(outs[0]), rows, cols))]
    build.__doc__ = f"``out = {'log_' if log else ''}softmax(x)`` over the last axis."
    return build


def _softmax_grad(log):
    def build(node, ins, outs):
        rows, cols = _rows_cols(ins[0])
        kernel = softmax_grad_kernel(log, use_parallel(ins[0].size))
        return [(kernel, (flat(ins[0]), flat(ins[1]), flat(outs[0]), rows, cols))]
    build.__doc__ = f"``dx = {'log_' if log else ''}softmax_grad(y, dy)`` over the last axis."
    return build


def build_sparse_xent(node, ins, outs):
    """``prob, out = sparse_softmax_cross_entropy(prediction [N, C], label [N] int64)``."""
    rows, cols = _rows_cols(ins[0])
    kernel = sparse_xent_kernel(use_parallel(ins[0].size))
    return [(kernel, (flat(ins[0]), ins[1].reshape(-1), flat(outs[0]), flat(outs[1]),
                      rows, cols))]


def build_sparse_xent_grad(node, ins, outs):
    """``dx = sparse_softmax_cross_entropy_grad(dy [N], label [N] int64, prob [N, C])``."""
    rows, cols = _rows_cols(ins[2])
    kernel = sparse_xent_grad_kernel(use_parallel(ins[2].size))
    return [(kernel, (flat(ins[0]), ins[1].reshape(-1), flat(ins[2]), flat(outs[0]), rows, cols))]


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
