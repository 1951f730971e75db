"""Pooling on the CPU: ``max_pool_2d``, ``avg_pool_2d``, ``adaptive_avg_pool2d`` and their
gradients (their builders: ``kernels.common.pool``; these are the step makers). One ``(n, c)``
plane per (parallel) iteration.

Max pool is separable: the window's winner under one total order ("first maximum in scan order,
a NaN wins, the last NaN in scan order wins", scan order being the flat index ``ih * W + iw``;
:func:`takes`) is associative, so each output row is reduced over the window's rows first (per
input column, contiguous), then over its columns at stride 1 (every window start, contiguous),
and every ``stride``-th start is kept. Both passes are loops of selects over contiguous rows,
which vectorize; a pass per tap over strided outputs (the kernel before this one) did not, and
was 4.5x slower than PyTorch's.

The max-pool gradient scatters ``dy`` to ``indice``, accumulating in a compute-type plane, then
rounds once. The average-pool and adaptive gradients gather: each ``dx`` is written once, with
divisors and window tables precomputed by the builder. A global average pool (output 1x1, as at
the end of a ResNet) is a sum of each contiguous plane and, backwards, a fill of it.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ...ops.pool import avg_divisors
from ..common import pool
from ..common.precision import compute_dtype
from .common import jit, kview, loop_for, use_parallel
from .fp16 import load, store, to_compute

__all__ = ["takes", "max_pool_kernel", "max_pool_grad_kernel", "avg_pool_kernel",
           "avg_pool_grad_kernel", "adaptive_windows", "adaptive_avg_pool_kernel",
           "adaptive_avg_pool_grad_kernel", "global_avg_pool_kernel",
           "global_avg_pool_grad_kernel", "BUILDERS"]


@jit(False)
def takes(v, k, best, at):
    """Whether candidate ``(v, k)`` (value, flat index; ``k < 0``: none) beats ``(best, at)`` as a
    max pool's winner: anything beats none; a NaN beats a number, and a later NaN an earlier one;
    otherwise the larger value, and on a tie the earlier index (PyTorch's and OneFlow's scan with
    ``val > max || isnan(val)``, as a commutative, associative choice)."""
    nan_v, num_b = v != v, best == best
    return (k >= 0) & ((at < 0) | (nan_v & (num_b | (k > at)))
                       | (num_b & ((v > best) | ((v == best) & (k < at)))))


@functools.cache
def max_pool_kernel(parallel: bool):
    """``kernel(x, y, indice, window, col_v, col_i, row_v, row_i)``: per plane (``x``
    ``[P, H, W]``, ``y`` / ``indice`` ``[P, OH, OW]``, kernel views) the max of each window and
    the flat index ``ih * W + iw`` of its winner (:func:`takes`); ``-inf`` and -1 for a window
    outside the input.

    Per output row ``i``: ``col_*[c]`` = the winner of column ``c`` over the window's rows, then
    ``row_*[t]`` = the winner over the window's columns of the window starting at column
    ``t - pw``, for every ``t`` of ``range((OW - 1) * sw + 1)``; output ``j`` is ``row_*[j * sw]``.
    The scratch rows (compute type / int64) are ``[S, W]`` and ``[S, T]``, one row per plane of
    the parallel variant (S = P), one for the serial one (S = 1).
    """
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, y, indice, window, col_v, col_i, row_v, row_i):
        h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw = window
        t_n = row_v.shape[1]
        for pl_ in loop(x.shape[0]):
            pl = np.int64(pl_)
            s = pl if parallel else 0
            cv, ci, rv, ri = col_v[s], col_i[s], row_v[s], row_i[s]
            for i in range(oh):
                cv[:] = -math.inf
                ci[:] = -1
                for p in range(kh):
                    ih = i * sh - ph + p * dh
                    if ih < 0 or ih >= h:
                        continue
                    src, base = x[pl, ih], ih * w
                    for c in range(w):
                        v, k, b, a = load(src, c), base + c, cv[c], ci[c]
                        t = takes(v, k, b, a)
                        cv[c] = v if t else b
                        ci[c] = k if t else a
                rv[:] = -math.inf
                ri[:] = -1
                for q in range(kw):
                    off = q * dw - pw
                    t0, t1 = max(0, -off), min(t_n, w - off)
                    if t1 <= t0:
                        continue
                    dv, di = rv[t0:t1], ri[t0:t1]
                    sv, si = cv[t0 + off:t1 + off], ci[t0 + off:t1 + off]
                    for t_ in range(t1 - t0):      # fresh slices from 0: vectorizes
                        v, k, b, a = sv[t_], si[t_], dv[t_], di[t_]
                        t = takes(v, k, b, a)
                        dv[t_] = v if t else b
                        di[t_] = k if t else a
                yr, ir = y[pl, i], indice[pl, i]
                for j in range(ow):
                    store(yr, j, rv[j * sw])
                    ir[j] = ri[j * sw]

    return kernel


@functools.cache
def max_pool_grad_kernel(narrow: bool, parallel: bool):
    """``kernel(indice, dy, acc, dx)``: per plane, ``acc[indice[k]] += dy[k]`` (``acc``
    ``[P, H*W]`` compute type, zeroed first); ``narrow``: then rounded once into ``dx``, otherwise
    ``acc`` is ``dx``."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(indice, dy, acc, dx):
        for pl_ in loop(acc.shape[0]):
            pl = np.int64(pl_)
            ap, ip, dp = acc[pl], indice[pl], dy[pl]
            ap[:] = 0
            for k in range(ip.size):
                if ip[k] >= 0:
                    ap[ip[k]] += load(dp, k)
            if narrow:
                xp = dx[pl]
                for k in range(ap.size):
                    store(xp, k, ap[k])

    return kernel


@jit(False)
def _cover(i, stride, pad, k, count):
    """``[o0, o1)``: the windows ``o`` of ``range(count)`` (start ``o * stride - pad``, size
    ``k``) that contain position ``i``."""
    o0 = max(0, (i + pad - k + stride) // stride)   # ceil((i + pad - k + 1) / stride)
    o1 = min(count, (i + pad) // stride + 1)
    return o0, max(o0, o1)


@functools.cache
def avg_pool_kernel(parallel: bool):
    """``kernel(x, y, divisor, window)``: per plane, each window's sum over the input divided by
    ``divisor[i*OW + j]`` (precomputed, :func:`avg_divisors`)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, y, divisor, window):
        h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw = window
        for pl_ in loop(x.shape[0]):
            pl = np.int64(pl_)
            xp, yp = x[pl], y[pl]
            for i in range(oh):
                h0, h1 = max(i * sh - ph, 0), min(i * sh - ph + kh, h)
                for j in range(ow):
                    w0, w1 = max(j * sw - pw, 0), min(j * sw - pw + kw, w)
                    s = to_compute(divisor, 0.0)
                    for ih in range(h0, h1):
                        for iw in range(w0, w1):
                            s += load(xp, ih * w + iw)
                    store(yp, i * ow + j, s / divisor[i * ow + j])

    return kernel


@functools.cache
def avg_pool_grad_kernel(parallel: bool):
    """``kernel(dy, dx, divisor, window)``: ``dx[ih, iw] = sum dy[i, j] / divisor[i, j]`` over
    the windows containing ``(ih, iw)`` (each ``dx`` written once)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(dy, dx, divisor, window):
        h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw = window
        for pl_ in loop(dx.shape[0]):
            pl = np.int64(pl_)
            dyp, dxp = dy[pl], dx[pl]
            for ih in range(h):
                i0, i1 = _cover(ih, sh, ph, kh, oh)
                for iw in range(w):
                    j0, j1 = _cover(iw, sw, pw, kw, ow)
                    s = to_compute(divisor, 0.0)
                    for i in range(i0, i1):
                        for j in range(j0, j1):
                            s += load(dyp, i * ow + j) / divisor[i * ow + j]
                    store(dxp, ih * w + iw, s)

    return kernel


def adaptive_windows(size: int, out: int) -> np.ndarray:
    """``[4, max(size, out)]`` int64 table of one axis of an adaptive pool: rows 0-1 the window
    ``[start, end)`` of each output cell (PyTorch's ``floor(i*size/out)``,
    ``ceil((i+1)*size/out)``), rows 2-3 the output cells ``[first, last]`` whose windows contain
    each input position (``floor(k*out/size)`` .. ``((k+1)*out - 1) // size``)."""
    t = np.zeros((4, max(size, out)), np.int64)
    i, k = np.arange(out), np.arange(size)
    t[0, :out], t[1, :out] = (i * size) // out, -(-((i + 1) * size) // out)
    t[2, :size], t[3, :size] = (k * out) // size, ((k + 1) * out - 1) // size
    return t


@functools.cache
def adaptive_avg_pool_kernel(parallel: bool):
    """``kernel(x, y, rows, cols)``: per plane (``[P, H, W]`` / ``[P, OH, OW]``), output
    ``(i, j)`` is the mean of its window (``rows`` / ``cols``: :func:`adaptive_windows`)."""
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("reassoc",))
    def kernel(x, y, rows, cols):
        oh, ow = y.shape[1], y.shape[2]
        for pl_ in loop(x.shape[0]):
            pl = np.int64(pl_)
            for i in range(oh):
                h0, h1 = rows[0, i], rows[1, i]
                for j in range(ow):
                    w0, w1 = cols[0, j], cols[1, j]
                    s = to_compute(y, 0.0)
                    for ih in range(h0, h1):
                        xr = x[pl, ih, w0:w1]
                        for k in range(w1 - w0):
                            s += load(xr, k)
                    store(y[pl, i], j, s / to_compute(y, (h1 - h0) * (w1 - w0)))

    return kernel


@functools.cache
def adaptive_avg_pool_grad_kernel(parallel: bool):
    """``kernel(dy, dx, rows, cols)``: ``dx[ih, iw] = sum dy[i, j] / area(i, j)`` over the
    windows containing ``(ih, iw)`` (``rows`` / ``cols``: :func:`adaptive_windows`); each ``dx``
    written once."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(dy, dx, rows, cols):
        h, w = dx.shape[1], dx.shape[2]
        for pl_ in loop(dx.shape[0]):
            pl = np.int64(pl_)
            for ih in range(h):
                out = dx[pl, ih]
                for iw in range(w):
                    s = to_compute(dx, 0.0)
                    for i in range(rows[2, ih], rows[3, ih] + 1):
                        hn = rows[1, i] - rows[0, i]
                        for j in range(cols[2, iw], cols[3, iw] + 1):
                            wn = cols[1, j] - cols[0, j]
                            s += load(dy[pl, i], j) / to_compute(dx, hn * wn)
                    store(out, iw, s)

    return kernel


@functools.cache
def global_avg_pool_kernel(parallel: bool):
    """``kernel(x, y)``: ``y[p] = mean(x[p, :])`` per plane (``x`` ``[P, HW]``, ``y`` ``[P]``,
    kernel views), summed in the compute type."""
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("reassoc",))
    def kernel(x, y):
        n = x.shape[1]
        for pl_ in loop(x.shape[0]):
            pl = np.int64(pl_)
            src, s = x[pl], to_compute(y, 0.0)
            for k in range(n):
                s += load(src, k)
            store(y, pl, s / to_compute(y, n))

    return kernel


@functools.cache
def global_avg_pool_grad_kernel(parallel: bool):
    """``kernel(dy, dx)``: ``dx[p, :] = dy[p] / HW`` per plane (``dy`` ``[P]``, ``dx``
    ``[P, HW]``, kernel views)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(dy, dx):
        n = dx.shape[1]
        for pl_ in loop(dx.shape[0]):
            pl = np.int64(pl_)
            v, dst = load(dy, pl) / to_compute(dx, n), dx[pl]
            for k in range(n):
                store(dst, k, v)

    return kernel


def _planes(a: np.ndarray) -> np.ndarray:
    """``a`` ``[N, C, H, W]`` as the kernel view ``[N*C, H*W]``."""
    return kview(a).reshape(a.shape[0] * a.shape[1], -1)


def _planes3(a: np.ndarray) -> np.ndarray:
    """``a`` ``[N, C, H, W]`` as the kernel view ``[N*C, H, W]``."""
    return kview(a).reshape(a.shape[0] * a.shape[1], a.shape[2], a.shape[3])


def _parallel(a: np.ndarray) -> bool:
    return use_parallel(a.size) and a.shape[0] * a.shape[1] > 1


def max_steps(ins, outs, g, attrs):
    """The step of ``max_pool_2d`` (scratch rows allocated now)."""
    (x,), (y, ind) = ins, outs
    parallel = _parallel(x)
    rows, ct = g.planes if parallel else 1, compute_dtype(y.dtype)
    t_n = (g.ow - 1) * g.sw + 1
    scratch = (np.empty((rows, g.w), ct), np.empty((rows, g.w), np.int64),
               np.empty((rows, t_n), ct), np.empty((rows, t_n), np.int64))
    return [(max_pool_kernel(parallel), (_planes3(x), _planes3(y), _planes3(ind), g.window(),
                                         *scratch))]


def max_grad_steps(ins, outs, g, attrs):
    """The step of ``max_pool_2d_grad``: a scatter into a compute-type plane, rounded once."""
    (_, ind, dy), (dx,) = ins, outs
    narrow = dx.dtype != compute_dtype(dx.dtype)
    acc = np.empty(_planes(dx).shape, compute_dtype(dx.dtype)) if narrow else _planes(dx)
    kernel = max_pool_grad_kernel(narrow, _parallel(dx))
    return [(kernel, (_planes(ind), _planes(dy), acc, _planes(dx)))]


def _divisors(g, attrs, dtype):
    return avg_divisors(g, attrs).astype(compute_dtype(dtype)).reshape(-1)


def avg_steps(ins, outs, g, attrs):
    """The step of ``avg_pool_2d``."""
    (x,), (y,) = ins, outs
    return [(avg_pool_kernel(_parallel(x)), (_planes(x), _planes(y), _divisors(g, attrs, y.dtype),
                                             g.window()))]


def avg_grad_steps(ins, outs, g, attrs):
    """The step of ``avg_pool_2d_grad``."""
    (_, dy), (dx,) = ins, outs
    return [(avg_pool_grad_kernel(_parallel(dx)),
             (_planes(dy), _planes(dx), _divisors(g, attrs, dx.dtype), g.window()))]


def adaptive_steps(ins, outs, size, attrs):
    """The step of ``adaptive_avg_pool2d`` (a global one: the sum of each plane)."""
    (x,), (y,), (oh, ow) = ins, outs, size
    if (oh, ow) == (1, 1):
        return [(global_avg_pool_kernel(_parallel(x)), (_planes(x), kview(y).reshape(-1)))]
    rows, cols = adaptive_windows(x.shape[2], oh), adaptive_windows(x.shape[3], ow)
    return [(adaptive_avg_pool_kernel(_parallel(x)), (_planes3(x), _planes3(y), rows, cols))]


def adaptive_grad_steps(ins, outs, size, attrs):
    """The step of ``adaptive_avg_pool2d_grad`` (a global one: a fill of each plane)."""
    (_, dy), (dx,), (oh, ow) = ins, outs, size
    if (oh, ow) == (1, 1):
        return [(global_avg_pool_grad_kernel(_parallel(dx)), (kview(dy).reshape(-1),
                                                              _planes(dx)))]
    rows, cols = adaptive_windows(dx.shape[2], oh), adaptive_windows(dx.shape[3], ow)
    return [(adaptive_avg_pool_grad_kernel(_parallel(dx)),
             (_planes3(dy), _planes3(dx), rows, cols))]


BUILDERS = pool.builders(max_pool_2d=max_steps, max_pool_2d_grad=max_grad_steps,
                         avg_pool_2d=avg_steps, avg_pool_2d_grad=avg_grad_steps,
                         adaptive_avg_pool2d=adaptive_steps,
                         adaptive_avg_pool2d_grad=adaptive_grad_steps)
"""Op type -> builder of the pooling ops (the pool family on the CPU)."""
