"""Reduction CPU kernels and builders: reduce_sum, softmax / log_softmax (+ grads), sparse softmax
cross entropy (+ grad). Sums accumulate in the compute type (float32 for f16/f32, float64 for f64);
``reduce_sum`` in blocks of :data:`SUM_BLOCK` terms whose sums add up in float64, so that a long
sum keeps float32's precision (one float32 accumulator over 2**24 ones stops at 16777216; NumPy's
pairwise and PyTorch's cascade sums, whose error grows as log n, do not).

``reduce_sum`` views its input as ``(outer, red, inner)`` (``kernels.common.reduce`` plans the
layout and the gather for both backends; :func:`sum_steps` picks the loop). Row ops work on the
last axis, the input viewed as ``(rows, cols)``.
"""
from __future__ import annotations

import functools
import math

import numba
import numpy as np

from .common import flat, jit, loop_for, scratch, use_parallel
from .elementwise import cast_steps
from .fp16 import load, store, to_compute
from .movement import transpose_steps
from .special import exp_compute
from ..common import reduce
from ..common.reduce import gathered, with_log
from ..common.precision import compute_dtype

__all__ = ["reduce_sum_kernel", "reduce_sum_columns_kernel", "softmax_kernel",
           "softmax_grad_kernel", "sparse_xent_kernel", "sparse_xent_grad_kernel", "sum_steps",
           "softmax_steps", "softmax_grad_steps", "xent_steps", "xent_grad_steps", "BUILDERS"]

LABEL_ERROR = "sparse_softmax_cross_entropy: label out of range [0, num_classes)"


# ----------------------------------------------------------------------------- kernels
SUM_BLOCK = 128
"""Terms ``reduce_sum`` adds in the compute type before adding their sum to a float64 total: the
error of a float32 sum of n terms is then about ``SUM_BLOCK`` float32 roundings, whatever n."""


@functools.cache
def reduce_sum_kernel(parallel: bool):
    """``kernel(x, out, outer, red, inner)``: ``out[o, k] = sum_r x[o, r, k]`` (x, out 1-D views),
    :data:`SUM_BLOCK` terms at a time in the compute type, their sums in float64."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, outer, red, inner):
        for ok_ in loop(outer * inner):
            ok = np.int64(ok_)  # prange indices are unsigned
            o = ok // inner
            base = o * red * inner + (ok - o * inner)
            total = 0.0
            for r0 in range(0, red, SUM_BLOCK):
                acc = to_compute(x, 0.0)
                for r in range(r0, min(r0 + SUM_BLOCK, red)):
                    acc += load(x, base + r * inner)
                total += np.float64(acc)
            store(out, ok, total)

    return kernel


COLUMN_BLOCK = 512
"""Columns one iteration of :func:`reduce_sum_columns_kernel` adds up (its unit of parallelism)."""


@functools.cache
def reduce_sum_columns_kernel(parallel: bool):
    """``kernel(x, out, acc, total, outer, red, inner)``: ``out[o, k] = sum_r x[o, r, k]`` row by
    row: ``acc[o, k] += x[o, r, k]`` for :data:`SUM_BLOCK` rows at a time, contiguous in k so the
    loop vectorizes, then ``total[o, k] += acc[o, k]`` in float64 (each sum adds in the same order
    as :func:`reduce_sum_kernel`, so the bits agree). ``acc`` is a compute-type scratch of out's
    size, ``total`` a float64 one; blocks of ``COLUMN_BLOCK`` columns run in parallel."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, acc, total, outer, red, inner):
        blocks = (inner + COLUMN_BLOCK - 1) // COLUMN_BLOCK
        for ob_ in loop(outer * blocks):
            ob = np.int64(ob_)  # prange indices are unsigned
            o = ob // blocks
            k0 = o * inner + (ob - o * blocks) * COLUMN_BLOCK
            n = min(COLUMN_BLOCK, (o + 1) * inner - k0)
            a, t = acc[k0:k0 + n], total[k0:k0 + n]
            t[:] = 0
            for r0 in range(0, red, SUM_BLOCK):
                a[:] = 0
                for r in range(r0, min(r0 + SUM_BLOCK, red)):
                    xr = x[k0 + o * (red - 1) * inner + r * inner:]
                    for k in range(n):
                        a[k] += load(xr, k)
                for k in range(n):
                    t[k] += np.float64(a[k])
            outr = out[k0:]
            for k in range(n):
                store(outr, k, t[k])

    return kernel


@jit(False)
def _row_max(x, base, cols):
    """The row's max, NaN elements left out, in a loop that vectorizes (no exit at a NaN): a NaN
    element is carried by its exponential, exp(NaN - m), into the row's sum and every output."""
    m = to_compute(x, -math.inf)
    for c in range(cols):
        v = load(x, base + c)
        m = v if v > m else m
    return m


@jit(False, fastmath=("reassoc",))
def _exp_row(x, base, cols, m, e):
    """``sum exp(x - m)`` over the row, in partial sums (reassociated: the loop vectorizes), each
    ``exp(x[c] - m)`` kept in ``e[c]`` (compute-type scratch of ``cols``) for the outputs: one
    exponential an element, not two (4096 x 64 on one Zen 4 core, with :func:`_row_max`: float32
    362 -> 236 us, bfloat16 488 -> 337; the same bits)."""
    s = to_compute(x, 0.0)
    for c in range(cols):
        v = exp_compute(load(x, base + c) - m)
        e[c] = v
        s += v
    return s


SCRATCH_GUARD = 1024
"""Bytes :func:`_rows_scratch` leaves unused before the rows it hands out."""


def _rows_scratch(x, cols: int, parallel: bool) -> np.ndarray:
    """Compute-type scratch for :func:`_exp_row`: a row of ``cols`` per thread of the kernel's
    loop (``numba.get_thread_id``), allocated when the step is built, with ``SCRATCH_GUARD``
    unused bytes before its first row.

    The guard keeps the bits independent of where the allocator put the buffers. LLVM runs
    :func:`_exp_row`'s loop (it stores ``e`` and reads ``x``) vectorized only after a run-time
    check that the store cannot reach the row of ``x`` it reads within one vector step: ``e``
    less than a vector step (``VF x interleave x size``: at most 256 bytes) past the row's
    start fails it, and the scalar loop runs, which adds in another order than the
    vectorized one's partial sums. Without the guard that happened to the last rows whenever
    the scratch was allocated just past ``x`` (two identical trainings differed in a loss's
    last bit: ``tests/test_checkpoint.py``, resumed against uninterrupted); with it ``e`` lies
    below ``x`` (the check's difference wraps around: passes) or at least ``SCRATCH_GUARD``
    bytes past its end. The kernels index ``x`` unsigned: a signed index adds a second window,
    past ``x``'s end by the row's offset (the negative-index wraparound)."""
    slots = numba.config.NUMBA_NUM_THREADS if parallel else 1
    dtype = np.dtype(compute_dtype(x.dtype))
    guard = -(-SCRATCH_GUARD // (cols * dtype.itemsize)) if cols else 0
    return scratch(x, (guard + slots, cols), dtype)[guard:]


@functools.cache
def softmax_kernel(log: bool, parallel: bool):
    """``kernel(x, out, rows, cols, e)``: per row, ``out = exp(x - m) / s`` or, for ``log``,
    ``out = x - m - log(s)`` with ``m = max(x)``, ``s = sum exp(x - m)`` (NaN rows NaN; ``e``:
    :func:`_rows_scratch`)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, rows, cols, e):
        # unsigned offsets: no negative-index wraparound check, so that the row loops
        # vectorize in the parallel variant too
        ucols = np.uint64(cols)
        for r_ in loop(rows):
            base = np.uint64(r_) * ucols
            er = e[numba.get_thread_id() if parallel else 0]
            m = _row_max(x, base, ucols)
            s = _exp_row(x, base, ucols, m, er)
            if log:
                log_s = math.log(s)
                for c in range(ucols):
                    store(out, base + c, load(x, base + c) - m - log_s)
            else:
                for c in range(ucols):
                    store(out, base + c, er[c] / s)

    return kernel


@jit(False, fastmath=("reassoc",))
def _row_sum(x, base, cols):
    """``sum x`` over the row in the compute type, in partial sums (reassociated: the loop
    vectorizes)."""
    s = to_compute(x, 0.0)
    for c in range(cols):
        s += load(x, base + c)
    return s


@jit(False, fastmath=("reassoc",))
def _row_dot(y, dy, base, cols):
    """``sum dy * y`` over the row, as :func:`_row_sum` (4096 x 64 softmax_grad on one Zen 4 core:
    float32 150 -> 38 us, bfloat16 280 -> 91 against the sum in order)."""
    s = to_compute(dy, 0.0)
    for c in range(cols):
        s += load(dy, base + c) * load(y, base + c)
    return s


@functools.cache
def softmax_grad_kernel(log: bool, parallel: bool):
    """``kernel(y, dy, dx, rows, cols)``, per row: ``dx = y * (dy - sum(dy * y))``, or for ``log``
    (y = log_softmax) ``dx = dy - exp(y) * sum(dy)``."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(y, dy, dx, rows, cols):
        ucols = np.uint64(cols)       # unsigned indices, as softmax_kernel's
        for r_ in loop(rows):
            base = np.uint64(r_) * ucols
            # ``log`` branches as statements, which Numba prunes: as ``a if log else b`` inside
            # the loops the serial variant did not vectorize (4096 x 64 float32, one Zen 4
            # core: 268 us, 153 us so)
            if log:
                s = _row_sum(dy, base, ucols)
                for c in range(ucols):
                    store(dx, base + c, load(dy, base + c) - exp_compute(load(y, base + c)) * s)
            else:
                s = _row_dot(y, dy, base, ucols)
                for c in range(ucols):
                    yc = load(y, base + c)
                    store(dx, base + c, yc * (load(dy, base + c) - s))

    return kernel


@jit(False)
def _check_labels(label, cols):
    """Raise ValueError unless every label is in [0, cols)."""
    for r in range(label.size):
        if label[r] < 0 or label[r] >= cols:
            raise ValueError(LABEL_ERROR)


@functools.cache
def sparse_xent_kernel(parallel: bool):
    """``kernel(x, label, prob, out, rows, cols, e)``: per row ``prob = softmax(x)``,
    ``out[r] = m + log(s) - x[r, label[r]]`` (= logsumexp - picked logit; ``e``:
    :func:`_rows_scratch`).

    Raises:
        ValueError: a label outside [0, cols).
    """
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, label, prob, out, rows, cols, e):
        _check_labels(label, cols)
        ucols = np.uint64(cols)       # unsigned offsets, as softmax_kernel's (_rows_scratch)
        for r_ in loop(rows):
            base = np.uint64(r_) * ucols
            er = e[numba.get_thread_id() if parallel else 0]
            m = _row_max(x, base, ucols)
            s = _exp_row(x, base, ucols, m, er)
            for c in range(ucols):
                store(prob, base + c, er[c] / s)
            store(out, r_, m + math.log(s) - load(x, base + np.uint64(label[r_])))

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


# ----------------------------------------------------------------------------- step makers
def sum_steps(x: np.ndarray, out: np.ndarray, outer: int, red: int, inner: int):
    """Steps for ``out[o, k] = sum_r x[o, r, k]``: a copy when ``red == 1`` (keeps -0.0, as
    NumPy's sum), :func:`reduce_sum_columns_kernel` when ``inner > 1``, else
    :func:`reduce_sum_kernel`."""
    parallel = use_parallel(x.size) and outer * inner > 1
    if red == 1:
        return cast_steps(x, out)
    if inner > 1:
        acc = np.empty(out.size, compute_dtype(out.dtype))
        kernel = reduce_sum_columns_kernel(parallel)
        return [(kernel, (flat(x), flat(out), acc, np.empty(out.size), outer, red, inner))]
    return [(reduce_sum_kernel(parallel), (flat(x), flat(out), outer, red, inner))]


def softmax_steps(log: bool, ins, outs, plan, attrs):
    """One call of :func:`softmax_kernel` (with ``log`` bound: a step maker)."""
    (x,), (out,), (rows, cols) = ins, outs, plan
    parallel = use_parallel(x.size)
    return [(softmax_kernel(log, parallel),
             (flat(x), flat(out), rows, cols, _rows_scratch(x, cols, parallel)))]


def softmax_grad_steps(log: bool, ins, outs, plan, attrs):
    """One call of :func:`softmax_grad_kernel` (with ``log`` bound: a step maker)."""
    (y, dy), (dx,), (rows, cols) = ins, outs, plan
    kernel = softmax_grad_kernel(log, use_parallel(y.size))
    return [(kernel, (flat(y), flat(dy), flat(dx), rows, cols))]


def xent_steps(ins, outs, plan, attrs):
    """One call of :func:`sparse_xent_kernel` (it raises ValueError for a label out of range)."""
    (x, label), (prob, out), (rows, cols) = ins, outs, plan
    parallel = use_parallel(x.size)
    return [(sparse_xent_kernel(parallel), (flat(x), label.reshape(-1), flat(prob), flat(out),
                                            rows, cols, _rows_scratch(x, cols, parallel)))]


def xent_grad_steps(ins, outs, plan, attrs):
    """One call of :func:`sparse_xent_grad_kernel` (it raises ValueError for a label out of
    range)."""
    (dy, label, prob), (dx,), (rows, cols) = ins, outs, plan
    kernel = sparse_xent_grad_kernel(use_parallel(prob.size))
    return [(kernel, (flat(dy), label.reshape(-1), flat(prob), flat(dx), rows, cols))]


BUILDERS = reduce.builders(reduce_sum=gathered(transpose_steps, scratch, sum_steps),
                           **with_log(softmax=softmax_steps, softmax_grad=softmax_grad_steps),
                           sparse_softmax_cross_entropy=xent_steps,
                           sparse_softmax_cross_entropy_grad=xent_grad_steps)
"""Op type -> builder for the reductions and row ops."""
