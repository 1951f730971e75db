"""The indexing ops on the CPU (builders: ``kernels.common.indexing``; these are the step makers):
``gather`` and ``unsorted_segment_sum_like`` (Numba loops over ``[outer, n, inner]``),
``dim_gather`` and the ``dim_scatter`` ops (Numba loops over index's elements), ``slice``,
``slice_grad``, ``slice_update`` (the movement family's flat copy first) and ``cat``
(``np.copyto`` through a strided view planned at build time), ``tril``
and ``masked_fill`` (Numba loops that copy elements as stored: float16 and bfloat16 as their bits,
the fill value converted to out's dtype once, at build time); the one-axis ``reduce_max``,
``argmax`` and ``reduce_max_grad`` (Numba loops, one output per (parallel) iteration); ``top_k``
(a Numba loop per row: an insertion into the row's sorted k indices, or for a larger k a stable
merge sort of the row, ``kernels.common.indexing.top_k_sort``); ``cumsum`` /
``cumsum_grad`` and ``cumprod`` / ``cumprod_grad`` (a Numba loop per running sum or product,
in order).

``gather`` checks every index before it copies and raises IndexError on one outside ``[0, n)``;
the executor then names it (``OpDef.diagnose``). ``unsorted_segment_sum_like`` adds in a scratch
of the compute type (float32 for half types), in the order of the indices, then rounds once:
deterministic, whatever the repeats. ``dim_gather`` and the ``dim_scatter`` ops do the same:
the gather and the scatters of user data check first and raise, the scatters add or write in
index order in a compute-type scratch (the last write wins).
"""
from __future__ import annotations

import functools

import numpy as np
from numba.extending import register_jitable

from ..common import indexing
from .common import flat, jit, jitable, kview, loop_for, use_parallel
from .fp16 import load, store, to_compute
from .movement import copy_steps

_before = jitable(indexing.top_k_before)
_sort = jitable(indexing.top_k_sort)

__all__ = ["gather_kernel", "segment_sum_kernel", "dim_gather_kernel", "dim_scatter_kernel",
           "tril_kernel", "masked_fill_kernel",
           "max_kernel", "argmax_kernel", "max_grad_kernel", "top_k_kernel", "top_k_sort_kernel",
           "cumsum_kernel", "cumprod_kernel", "cumprod_grad_kernel", "BUILDERS"]


@functools.cache
def gather_kernel(parallel: bool):
    """``kernel(x, idx, out, outer, n, inner)``: ``out[o, j, i] = x[o, idx[j], i]`` (flat kernel
    views); IndexError, before anything is written, if an index is outside ``[0, n)``."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, idx, out, outer, n, inner):
        m = idx.size
        for j in range(m):
            if idx[j] < 0 or idx[j] >= n:
                raise IndexError("gather: an index is out of range")
        for t_ in loop(outer * m):
            t = np.int64(t_)
            src = (t // m * n + idx[t % m]) * inner
            dst = t * inner
            for i in range(inner):
                out[dst + i] = x[src + i]

    return kernel


@functools.cache
def segment_sum_kernel():
    """``kernel(data, ids, acc, out, outer, n, inner)``: ``acc = 0``, ``acc[o, ids[j], i] +=
    data[o, j, i]`` for every j in order (ids outside ``[0, n)`` dropped), ``out = acc`` rounded
    to out's dtype (``acc`` in the compute type)."""

    @jit(False)
    def kernel(data, ids, acc, out, outer, n, inner):
        m = ids.size
        acc[:] = 0
        for o in range(outer):
            for j in range(m):
                s = ids[j]
                if 0 <= s < n:
                    dst, src = (o * n + s) * inner, (o * m + j) * inner
                    for i in range(inner):
                        acc[dst + i] += load(data, src + i)
        for k in range(acc.size):
            store(out, k, acc[k])

    return kernel


@register_jitable
def _offset(t, shape, strides):
    """Element offset of C-order flat index ``t`` of ``shape`` with element ``strides``."""
    off = 0
    for d in range(len(shape) - 1, -1, -1):
        off += t % shape[d] * strides[d]
        t //= shape[d]
    return off


@functools.cache
def dim_gather_kernel(parallel: bool):
    """``kernel(x, idx, out, shape, xst, sd, n)``: ``out[t] = x[offset of t in shape . xst +
    idx[t] * sd]`` (``kernels.common.indexing.dim_layout``: x's strides with dim's zeroed, dim's
    stride ``sd``); IndexError, before anything is written, if an index is outside ``[0, n)``."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, idx, out, shape, xst, sd, n):
        m = idx.size
        for j in range(m):
            if idx[j] < 0 or idx[j] >= n:
                raise IndexError("dim_gather: an index is out of range")
        for t_ in loop(m):
            t = np.int64(t_)
            out[t] = x[_offset(t, shape, xst) + idx[t] * sd]

    return kernel


@functools.cache
def dim_scatter_kernel(add: bool, like: bool):
    """``kernel(x, src, ss, idx, acc, out, shape, ost, sd, n)``: ``acc = x`` (0 if ``like``;
    ``acc`` in the compute type), then for every t in order ``acc[offset of t in shape . ost +
    idx[t] * sd] += src[t * ss]`` (``add``) or ``=`` it (``ss`` 0: one value for every t),
    ``out = acc`` rounded to out's dtype. An index outside ``[0, n)`` is dropped if ``like``,
    else an IndexError before anything is written (``dim_scatter_*``: the executor names it)."""

    @jit(False)
    def kernel(x, src, ss, idx, acc, out, shape, ost, sd, n):
        if not like:
            for j in range(idx.size):
                if idx[j] < 0 or idx[j] >= n:
                    raise IndexError("dim_scatter: an index is out of range")
        for k in range(acc.size):
            acc[k] = 0 if like else load(x, k)
        for t in range(idx.size):
            k = idx[t]
            if 0 <= k < n:
                p = _offset(t, shape, ost) + k * sd
                if add:
                    acc[p] += load(src, t * ss)
                else:
                    acc[p] = load(src, t * ss)
        for k in range(acc.size):
            store(out, k, acc[k])

    return kernel


@functools.cache
def tril_kernel(parallel: bool):
    """``kernel(x, out, rows, cols, diagonal, fill)``: ``out[..., r, c] = x[..., r, c]`` where
    ``c - r <= diagonal``, else ``fill[0]`` (out's dtype, as stored).

    One select per element over the whole row, not a copy loop up to the diagonal and a fill
    loop after it: their trip counts change from row to row, and the vectorized loops' scalar
    remainders cost more than the copy (the GPT's causal mask, 16 x 4 x 64 x 64 float32 / float16
    on one Sapphire Rapids core: 117 / 193 us as two loops, 48 / 20 us as one select, against
    35 / 15 for ``np.copyto``)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, rows, cols, diagonal, fill):
        f = fill[0]
        for k_ in loop(out.size // cols):            # every row of every matrix
            k = np.int64(k_)
            base = np.uint64(k) * np.uint64(cols)        # unsigned: no negative-index wraparound
            last = k % rows + diagonal                   # columns c <= r + diagonal kept
            for c in range(cols):
                i = base + np.uint64(c)
                out[i] = x[i] if c <= last else f

    return kernel


@functools.cache
def masked_fill_kernel(parallel: bool):
    """``kernel(x, mask, out, shape, mask_strides, fill)``: ``out[i] = fill[0]`` where the mask
    element broadcast to flat index ``i`` of ``shape`` (C order; stride 0 along broadcast axes)
    is nonzero, else ``x[i]``."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, mask, out, shape, mask_strides, fill):
        nd = len(shape)
        for i_ in loop(out.size):
            i = np.int64(i_)
            rest, off = i, 0
            for d in range(nd - 1, -1, -1):
                off += rest % shape[d] * mask_strides[d]
                rest //= shape[d]
            out[i] = fill[0] if mask[off] != 0 else x[i]

    return kernel


@register_jitable
def _max_at(x, base, n, inner):
    """``(maximum, index)`` of ``x[base + j * inner]`` for j < n (n >= 1): the first NaN wins,
    else the first largest."""
    best, k = load(x, base), 0
    if best != best:
        return best, k
    for j in range(1, n):
        v = load(x, base + j * inner)
        if v != v:
            return v, j
        if v > best:
            best, k = v, j
    return best, k


@functools.cache
def max_kernel(parallel: bool):
    """``kernel(x, out, outer, n, inner)``: ``out[o, i] = max_j x[o, j, i]`` (NaN propagates)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, outer, n, inner):
        for t_ in loop(outer * inner):
            t = np.int64(t_)
            store(out, t, _max_at(x, t // inner * n * inner + t % inner, n, inner)[0])

    return kernel


@functools.cache
def argmax_kernel(parallel: bool):
    """``kernel(x, out, outer, n, inner)``: ``out[o, i]`` = the index of the first maximum of
    ``x[o, :, i]`` (int64; of the first NaN if any)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, outer, n, inner):
        for t_ in loop(outer * inner):
            t = np.int64(t_)
            out[t] = _max_at(x, t // inner * n * inner + t % inner, n, inner)[1]

    return kernel


@functools.cache
def max_grad_kernel(parallel: bool):
    """``kernel(x, y, dy, dx, outer, n, inner)``: ``dx[o, j, i] = dy[o, i] / count`` where
    ``x[o, j, i]`` equals the maximum ``y[o, i]`` (both NaN counts as equal), else 0."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, y, dy, dx, outer, n, inner):
        for t_ in loop(outer * inner):
            t = np.int64(t_)
            base = t // inner * n * inner + t % inner
            m = load(y, t)
            count = 0
            for j in range(n):
                v = load(x, base + j * inner)
                if v == m or (v != v and m != m):
                    count += 1
            share, zero = load(dy, t) / count, to_compute(dx, 0.0)
            for j in range(n):
                v = load(x, base + j * inner)
                hit = v == m or (v != v and m != m)
                store(dx, base + j * inner, share if hit else zero)

    return kernel


@functools.cache
def top_k_kernel(parallel: bool):
    """``kernel(x, out, rows, n, k, largest)``: ``out[r, :k]`` = the indices of the ``k`` best
    of ``x[r, :n]``, best first, equal elements in index order: each element in turn is
    inserted into the row's sorted indices (values read back from x) when it beats the last."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, rows, n, k, largest):
        for r_ in loop(rows):
            r = np.int64(r_)
            base, first, count = r * n, r * k, 0
            for j in range(n):
                v = load(x, base + j)
                if count == k:
                    if not _before(v, load(x, base + out[first + k - 1]), largest):
                        continue
                    p = k - 1
                else:
                    p = count
                    count += 1
                while p > 0 and _before(v, load(x, base + out[first + p - 1]), largest):
                    out[first + p] = out[first + p - 1]
                    p -= 1
                out[first + p] = j

    return kernel


@functools.cache
def top_k_sort_kernel(parallel: bool):
    """``kernel(x, v, a, b, out, rows, n, k, largest)``: what :func:`top_k_kernel` computes, by a
    stable merge sort of each row (``kernels.common.indexing.top_k_sort``; ``v`` the values in the
    compute type, ``a`` and ``b`` int64 positions: scratch of x's size)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, v, a, b, out, rows, n, k, largest):
        for r_ in loop(rows):
            r = np.int64(r_)
            for j in range(r * n, (r + 1) * n):
                v[j] = load(x, j)
            _sort(v, a, b, out, r * n, r * k, n, k, largest)

    return kernel


def _fill(out, value: float) -> np.ndarray:
    """``value`` in out's dtype, as the kernels see it (a one-element kernel view)."""
    with np.errstate(over="ignore"):
        return kview(np.array([value], out.dtype))


def _compute_scratch(a: np.ndarray) -> np.ndarray:
    """An uninitialized array of ``a``'s size in its compute type: float64 and int64 as
    stored, float32 for the other (float) dtypes."""
    return np.empty(a.size, a.dtype if a.dtype in (np.float64, np.int64) else np.float32)


def gather_steps(x, idx, out, outer, n, inner):
    """The step of ``gather``."""
    return [(gather_kernel(use_parallel(out.size)), (flat(x), idx.reshape(-1), flat(out),
                                                     outer, n, inner))]


def segment_sum_steps(data, ids, out, outer, n, inner):
    """The step of ``unsorted_segment_sum_like`` (a compute-type scratch allocated here)."""
    acc = _compute_scratch(out)
    return [(segment_sum_kernel(), (flat(data), ids.reshape(-1), acc, flat(out), outer, n,
                                    inner))]


def dim_gather_steps(x, idx, out, dim):
    """The step of ``dim_gather``."""
    shape, _, _ = indexing.dim_layout(idx.shape, dim)
    _, xst, sd = indexing.dim_layout(x.shape, dim)
    n = int(x.shape[dim]) if x.ndim else 1
    return [(dim_gather_kernel(use_parallel(out.size)),
             (flat(x), idx.reshape(-1), flat(out), shape, xst, sd, n))]


def dim_scatter_steps(x, src, idx, out, dim, add):
    """The step of the ``dim_scatter`` ops (a compute-type scratch allocated here; int64 stays
    int64; a float ``src`` is one element of out's dtype read for every index)."""
    shape, _, _ = indexing.dim_layout(idx.shape, dim)
    _, ost, sd = indexing.dim_layout(out.shape, dim)
    n = int(out.shape[dim]) if out.ndim else 1
    acc = np.empty(out.size, out.dtype if out.dtype in (np.float64, np.int64) else np.float32)
    src, ss = (_fill(out, src), 0) if isinstance(src, float) else (flat(src), 1)
    return [(dim_scatter_kernel(add, x is None),
             (flat(out if x is None else x), src, ss, idx.reshape(-1), acc, flat(out), shape,
              ost, sd, n))]


def slice_steps(x, out, index, offset, strides):
    """``out = x[index]``: a copy from the strided view."""
    return [(np.copyto, (out, x[index]))]


def scatter_steps(src, dst, index, offset, strides):
    """``dst[index] = src``: a copy into the strided view."""
    return [(np.copyto, (dst[index], src))]


def slice_grad_steps(dy, dx, index, offset, strides):
    """``dx = 0``, then ``dx[index] = dy``."""
    return [(np.copyto, (dx, np.zeros((), dx.dtype)))] + scatter_steps(dy, dx, index, offset,
                                                                      strides)


def tril_steps(x, out, rows, cols, diagonal, fill_value):
    """The step of ``tril``."""
    if out.size == 0:
        return []
    return [(tril_kernel(use_parallel(out.size)), (flat(x), flat(out), rows, cols,
                                                   int(diagonal), _fill(out, fill_value)))]


def masked_fill_steps(x, mask, out, shape, mask_strides, value):
    """The step of ``masked_fill``."""
    return [(masked_fill_kernel(use_parallel(out.size)),
             (flat(x), mask.reshape(-1), flat(out), np.array(shape, np.int64),
              np.array(mask_strides, np.int64), _fill(out, value)))]


def max_steps(x, out, outer, n, inner, arg: bool):
    """The step of ``reduce_max`` (``arg``: of ``argmax``)."""
    kernel = (argmax_kernel if arg else max_kernel)(use_parallel(x.size) and outer * inner > 1)
    return [(kernel, (flat(x), flat(out), outer, n, inner))]


def max_grad_steps(x, y, dy, dx, outer, n, inner):
    """The step of ``reduce_max_grad``."""
    return [(max_grad_kernel(use_parallel(x.size) and outer * inner > 1),
             (flat(x), flat(y), flat(dy), flat(dx), outer, n, inner))]


@functools.cache
def cumsum_kernel(parallel: bool):
    """``kernel(x, out, outer, n, inner, reverse)``: ``out[o, j, i]`` = the running sum of
    ``x[o, :, i]`` up to j (``reverse``: from the end down to j), in order, in the compute
    dtype's accumulator (float64 for float64, else float32), each output rounded once."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, outer, n, inner, reverse):
        for t_ in loop(outer * inner):
            t = np.int64(t_)
            base = t // inner * n * inner + t % inner
            acc = to_compute(out, 0.0)
            for j_ in range(n):
                j = n - 1 - j_ if reverse else j_
                acc += load(x, base + j * inner)
                store(out, base + j * inner, acc)

    return kernel


def cumsum_steps(x, out, outer, n, inner, reverse: bool):
    """The step of ``cumsum`` (``reverse``: of ``cumsum_grad``)."""
    return [(cumsum_kernel(use_parallel(x.size) and outer * inner > 1),
             (flat(x), flat(out), outer, n, inner, bool(reverse)))]


@functools.cache
def cumprod_kernel(parallel: bool):
    """``kernel(x, out, outer, n, inner)``: ``out[o, j, i]`` = the running product of
    ``x[o, :j+1, i]``, in order in the compute dtype's accumulator (int64 for int64), each
    output rounded once."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, out, outer, n, inner):
        for t_ in loop(outer * inner):
            t = np.int64(t_)
            base = t // inner * n * inner + t % inner
            acc = to_compute(out, 1.0)
            for j in range(n):
                acc *= load(x, base + j * inner)
                store(out, base + j * inner, acc)

    return kernel


@functools.cache
def cumprod_grad_kernel(parallel: bool):
    """``kernel(dy, x, s, dx, outer, n, inner)``: ``dx[o, k, i] = p[k] * s[k]`` along
    ``x[o, :, i]``, ``s[k] = dy[k] + x[k+1] * s[k+1]`` from the end (kept in the compute-type
    scratch ``s``), ``p[k]`` the product of ``x[:k]``: no division, exact at zeros."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(dy, x, s, dx, outer, n, inner):
        for t_ in loop(outer * inner):
            t = np.int64(t_)
            base = t // inner * n * inner + t % inner
            last = base + (n - 1) * inner
            acc = load(dy, last)
            s[last] = acc
            for j_ in range(1, n):
                i = last - j_ * inner
                acc = load(dy, i) + load(x, i + inner) * acc
                s[i] = acc
            p = to_compute(dx, 1.0)
            for j in range(n):
                i = base + j * inner
                store(dx, i, p * s[i])
                p *= load(x, i)

    return kernel


def cumprod_steps(x, out, outer, n, inner):
    """The step of ``cumprod``."""
    return [(cumprod_kernel(use_parallel(x.size) and outer * inner > 1),
             (flat(x), flat(out), outer, n, inner))]


def cumprod_grad_steps(dy, x, dx, outer, n, inner):
    """The step of ``cumprod_grad`` (a compute-type scratch allocated here)."""
    s = _compute_scratch(dx)
    return [(cumprod_grad_kernel(use_parallel(x.size) and outer * inner > 1),
             (flat(dy), flat(x), s, flat(dx), outer, n, inner))]


def top_k_steps(x, out, rows, n, k, largest):
    """The step of ``top_k``: the insertion for ``k`` up to ``TOP_K_INSERTION_MAX``, else the
    merge sort (its scratch allocated here)."""
    parallel = use_parallel(x.size) and rows > 1
    if k <= indexing.TOP_K_INSERTION_MAX:
        return [(top_k_kernel(parallel), (flat(x), flat(out), rows, n, k, bool(largest)))]
    v = _compute_scratch(x)
    a, b = np.empty(x.size, np.int64), np.empty(x.size, np.int64)
    return [(top_k_sort_kernel(parallel), (flat(x), v, a, b, flat(out), rows, n, k,
                                           bool(largest)))]


BUILDERS = indexing.builders(gather_steps=gather_steps, segment_sum_steps=segment_sum_steps,
                             dim_gather_steps=dim_gather_steps,
                             dim_scatter_steps=dim_scatter_steps,
                             slice_steps=slice_steps, slice_grad_steps=slice_grad_steps,
                             scatter_steps=scatter_steps, copy_steps=copy_steps,
                             tril_steps=tril_steps,
                             masked_fill_steps=masked_fill_steps,
                             max_steps=max_steps, max_grad_steps=max_grad_steps,
                             top_k_steps=top_k_steps, cumsum_steps=cumsum_steps,
                             cumprod_steps=cumprod_steps, cumprod_grad_steps=cumprod_grad_steps)
"""Op type -> builder of the indexing ops."""
