"""The indexing ops on CUDA (builders: ``kernels.common.indexing``; these are the step makers),
grid-stride kernels over flat views (``launch.flat_steps``), no atomics:

* ``gather``: one thread per output element; an index outside ``[0, n)`` gives NaN there (a
  kernel cannot raise; the CPU kernel raises, as the cross-entropy kernels do for a bad label).
* ``unsorted_segment_sum_like``: one thread per output element, summing the ``data`` elements
  whose id is its segment, in index order, in the compute type (deterministic; ``O(out *
  indices)`` work, fine for an embedding's gradient, no atomics).
* ``dim_gather``: one thread per output element, NaN for an index value outside ``[0, n)`` as
  ``gather`` (the CPU kernel raises IndexError; PyTorch's CUDA kernel fails a device assert).
* ``dim_scatter_add_like``: one thread per column of index along ``dim`` (index's elements with
  all but their ``dim`` coordinate in common), adding its ``src`` elements in index order into
  the column of out they reach, in the compute type (a float32 scratch for the half types,
  rounded once at the end): deterministic and without ``cuda.atomic.add`` (which float16 and
  bfloat16 storage lacks, and whose order varies from run to run), as the CPU kernel, since no
  other thread reaches that column; ``O(out + index)`` work (a column of length m is m
  additions in order on one thread). The same kernel, started from the input, does
  ``dim_scatter_add``, and writing instead of adding (the last in index order wins, as on the
  CPU) ``dim_scatter_update`` and ``dim_scatter_update_scalar``; an index out of range is
  dropped (the CPU kernels raise IndexError; PyTorch's CUDA kernel fails a device assert).
* ``slice``: the strided gather of ``kernels.cuda.movement`` from the slice's first element;
  ``slice_grad``: a fill with zero, then a strided scatter of ``dy``; ``slice_update``: the
  movement family's flat copy of ref, then a strided scatter of value; ``cat``: the strided
  scatter of each input.
* ``tril``, ``masked_fill``: elementwise selects; values move as stored, the fill value is
  rounded to out's dtype.
* ``reduce_max``, ``argmax``, ``reduce_max_grad`` (one axis): one thread per output, looping
  over the reduced axis; ``top_k``: one thread per row, inserting each element into the row's
  sorted indices when it beats the last, or for a larger k merge-sorting the row (the CPU's
  loops, the sort's body shared); ``cumsum`` / ``cumsum_grad`` and ``cumprod`` /
  ``cumprod_grad``: one thread per running sum or product, in order (the CPU's loops).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from ..common import indexing
from .common import (compute_type, device, flat, jit, scratch, short, strided_offset,
                     types_of)
from .elementwise import cast_steps
from .launch import flat_steps
from .movement import copy_steps, fill_steps, gather_steps as strided_gather_steps

__all__ = ["gather_kernel", "segment_sum_kernel", "dim_gather_kernel", "dim_scatter_kernel",
           "scatter_kernel", "tril_kernel",
           "masked_fill_kernel", "max_kernel", "max_grad_kernel", "top_k_kernel",
           "top_k_sort_kernel", "cumsum_kernel", "cumprod_kernel", "cumprod_grad_kernel",
           "BUILDERS"]


@functools.cache
def gather_kernel(ld, ct, st):
    """``kernel(x, idx, out, m, n, inner)``: ``out[o, j, i] = x[o, idx[j], i]`` (``j < m``), NaN
    for an index outside ``[0, n)``."""

    @jit
    def kernel(x, idx, out, m, n, inner):
        for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            i = t % inner
            j = t // inner % m
            o = t // (inner * m)
            k = idx[j]
            if 0 <= k < n:
                out[t] = x[(o * n + k) * inner + i]
            else:
                out[t] = st(ct(math.nan))

    return kernel


@functools.cache
def segment_sum_kernel(ld, ct, st):
    """``kernel(data, ids, out, m, n, inner)``: ``out[o, s, i] = sum over j < m with ids[j] == s
    of data[o, j, i]``, in index order, in the compute type."""

    @jit
    def kernel(data, ids, out, m, n, inner):
        for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            i = t % inner
            s = t // inner % n
            o = t // (inner * n)
            acc = ct(0)
            for j in range(m):
                if ids[j] == s:
                    acc += ld(data[(o * m + j) * inner + i])
            out[t] = st(acc)

    return kernel


@functools.cache
def dim_gather_kernel(ld, ct, st):
    """``kernel(x, idx, out, shape, xst, sd, n)``: ``out[t] = x[offset of t in shape . xst +
    idx[t] * sd]`` (``kernels.common.indexing.dim_layout``), NaN for an index outside
    ``[0, n)``."""

    @jit
    def kernel(x, idx, out, shape, xst, sd, n):
        for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            k = idx[t]
            if 0 <= k < n:
                out[t] = x[strided_offset(t, shape, xst) + k * sd]
            else:
                out[t] = st(ct(math.nan))

    return kernel


@functools.cache
def dim_scatter_kernel(ld, ct, add: bool, scalar: bool):
    """``kernel(src, value, idx, acc, ishape, ist, ost, dim, isd, osd, n, columns)``: one thread
    per column of index along ``dim`` (a multi-index ``c`` of index's shape with ``c[dim]``
    left out; ``columns`` of them), which adds (``add``) or writes ``src`` there (``value`` if
    ``scalar``) into ``acc[c with c[dim] = idx[c]]`` for every ``c[dim] < ishape[dim]`` in order,
    in the compute type: the elements of acc a column reaches are its own, so no two threads
    write one element and the order is index order. ``ist`` / ``ost`` index's and acc's strides
    with dim's zeroed, ``isd`` / ``osd`` dim's (src has index's shape). An index outside ``[0,
    n)`` is dropped."""

    @jit
    def kernel(src, value, idx, acc, ishape, ist, ost, dim, isd, osd, n, columns):
        for t in range(cuda.grid(1), columns, cuda.gridsize(1)):
            rest, ib, ob = t, 0, 0
            for d in range(len(ishape) - 1, -1, -1):
                if d != dim:
                    c = rest % ishape[d]
                    rest //= ishape[d]
                    ib += c * ist[d]
                    ob += c * ost[d]
            for j in range(ishape[dim]):
                p = ib + j * isd
                s = idx[p]
                if 0 <= s < n:
                    v = ct(value) if scalar else ld(src[p])
                    o = ob + s * osd
                    acc[o] = acc[o] + v if add else v

    return kernel


@functools.cache
def scatter_kernel():
    """``kernel(src, out, shape, ost)``: ``out[idx . ost] = src[idx]``, idx over ``shape`` (src's)."""

    @jit
    def kernel(src, out, shape, ost):
        for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
            out[strided_offset(i, shape, ost)] = src[i]

    return kernel


@functools.cache
def tril_kernel(ld, ct, st):
    """``kernel(x, out, rows, cols, diagonal, fill)``: ``out[..., r, c] = x[..., r, c]`` where
    ``c - r <= diagonal``, else ``fill`` rounded to out's dtype."""

    @jit
    def kernel(x, out, rows, cols, diagonal, fill):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            c = i % cols
            r = i // cols % rows
            if c - r <= diagonal:
                out[i] = x[i]
            else:
                out[i] = st(ct(fill))

    return kernel


@functools.cache
def masked_fill_kernel(ld, ct, st):
    """``kernel(x, mask, out, shape, mst, value)``: ``out[i] = value`` (rounded to out's dtype)
    where ``mask[offset of i . mst]`` is nonzero, else ``x[i]``."""

    @jit
    def kernel(x, mask, out, shape, mst, value):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            if mask[strided_offset(i, shape, mst)] != 0:
                out[i] = st(ct(value))
            else:
                out[i] = x[i]

    return kernel


@functools.cache
def max_kernel(ld, ct, st, arg: bool):
    """``kernel(x, out, outer, n, inner)``: ``out[o, i]`` = the maximum of ``x[o, :, i]`` (the
    first NaN wins, else the first largest), or with ``arg`` its index (int64 out)."""

    @jit
    def kernel(x, out, outer, n, inner):
        for t in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
            base = t // inner * n * inner + t % inner
            best, k = ld(x[base]), 0
            if best == best:
                for j in range(1, n):
                    v = ld(x[base + j * inner])
                    if v != v:
                        best, k = v, j
                        break
                    if v > best:
                        best, k = v, j
            if arg:
                out[t] = k
            else:
                out[t] = st(best)

    return kernel


@functools.cache
def max_grad_kernel(ld, ct, st):
    """``kernel(x, y, dy, dx, outer, n, inner)``: ``dx[o, j, i] = dy[o, i] / count`` where
    ``x[o, j, i]`` equals the maximum ``y[o, i]`` (both NaN counts as equal), else 0."""

    @jit
    def kernel(x, y, dy, dx, outer, n, inner):
        for t in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
            base = t // inner * n * inner + t % inner
            m = ld(y[t])
            count = 0
            for j in range(n):
                v = ld(x[base + j * inner])
                if v == m or (v != v and m != m):
                    count += 1
            share = ct(ld(dy[t]) / ct(count))
            for j in range(n):
                v = ld(x[base + j * inner])
                if v == m or (v != v and m != m):
                    dx[base + j * inner] = st(share)
                else:
                    dx[base + j * inner] = st(ct(0))

    return kernel


@functools.cache
def top_k_kernel(ld, largest: bool):
    """``kernel(x, out, rows, n, k)``: ``out[r, :k]`` = the indices of the ``k`` best of
    ``x[r, :n]``, best first, equal elements in index order (the CPU kernel's insertion)."""
    before = device(indexing.top_k_before)

    @jit
    def kernel(x, out, rows, n, k):
        for r in range(cuda.grid(1), rows, cuda.gridsize(1)):
            base, first, count = r * n, r * k, 0
            for j in range(n):
                v = ld(x[base + j])
                if count == k:
                    if not before(v, ld(x[base + out[first + k - 1]]), largest):
                        continue
                    p = k - 1
                else:
                    p = count
                    count += 1
                while p > 0 and before(v, ld(x[base + out[first + p - 1]]), largest):
                    out[first + p] = out[first + p - 1]
                    p -= 1
                out[first + p] = j

    return kernel


@functools.cache
def top_k_sort_kernel(ld, largest: bool):
    """``kernel(x, v, a, b, out, rows, n, k)``: what :func:`top_k_kernel` computes, one thread
    per row, by a stable merge sort of the row (``kernels.common.indexing.top_k_sort``, the CPU
    kernel's; ``v`` the values in the compute type, ``a`` and ``b`` int64 positions: scratch of
    x's size)."""
    sort = device(indexing.top_k_sort)

    @jit
    def kernel(x, v, a, b, out, rows, n, k):
        for r in range(cuda.grid(1), rows, cuda.gridsize(1)):
            for j in range(r * n, (r + 1) * n):
                v[j] = ld(x[j])
            sort(v, a, b, out, r * n, r * k, n, k, largest)

    return kernel


@functools.cache
def cumsum_kernel(ld, ct, st):
    """``kernel(x, out, outer, n, inner, reverse)``: ``out[o, j, i]`` = the running sum of
    ``x[o, :, i]`` up to j (``reverse``: from the end down to j), in order in the compute type,
    each output rounded once (the CPU kernel's loop)."""

    @jit
    def kernel(x, out, outer, n, inner, reverse):
        for t in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
            base = t // inner * n * inner + t % inner
            acc = ct(0)
            for j_ in range(n):
                j = n - 1 - j_ if reverse else j_
                acc = ct(acc + ld(x[base + j * inner]))
                out[base + j * inner] = st(acc)

    return kernel


def cumsum_steps(x, out, outer, n, inner, reverse: bool):
    """A grid-stride launch of :func:`cumsum_kernel`, one thread per running sum."""
    return flat_steps(cumsum_kernel(*types_of(x)), outer * inner,
                      (flat(x), flat(out), outer, n, inner, bool(reverse)),
                      f"{'cumsum_grad' if reverse else 'cumsum'} {short(x.dtype)}")


@functools.cache
def cumprod_kernel(ld, ct, st):
    """``kernel(x, out, outer, n, inner)``: ``out[o, j, i]`` = the running product of
    ``x[o, :j+1, i]``, in order in the compute type, each output rounded once (the CPU's
    loop)."""

    @jit
    def kernel(x, out, outer, n, inner):
        for t in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
            base = t // inner * n * inner + t % inner
            acc = ct(1)
            for j in range(n):
                acc = ct(acc * ld(x[base + j * inner]))
                out[base + j * inner] = st(acc)

    return kernel


@functools.cache
def cumprod_grad_kernel(ld, ct, st):
    """``kernel(dy, x, s, dx, outer, n, inner)``: ``dx[o, k, i] = p[k] * s[k]``, ``s[k] =
    dy[k] + x[k+1] * s[k+1]`` from the end in the compute-type scratch ``s``, ``p[k]`` the
    product of ``x[:k]`` (the CPU's loops: no division, exact at zeros)."""

    @jit
    def kernel(dy, x, s, dx, outer, n, inner):
        for t in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
            base = t // inner * n * inner + t % inner
            last = base + (n - 1) * inner
            acc = ct(ld(dy[last]))
            s[last] = acc
            for j in range(1, n):
                i = last - j * inner
                acc = ct(ld(dy[i]) + ld(x[i + inner]) * acc)
                s[i] = acc
            p = ct(1)
            for j in range(n):
                i = base + j * inner
                dx[i] = st(ct(p * s[i]))
                p = ct(p * ld(x[i]))

    return kernel


def cumprod_steps(x, out, outer, n, inner):
    """A grid-stride launch of :func:`cumprod_kernel`, one thread per running product."""
    return flat_steps(cumprod_kernel(*types_of(x)), outer * inner,
                      (flat(x), flat(out), outer, n, inner), f"cumprod {short(x.dtype)}")


def cumprod_grad_steps(dy, x, dx, outer, n, inner):
    """A grid-stride launch of :func:`cumprod_grad_kernel` (its compute-type scratch allocated
    here), one thread per row along dim."""
    s = scratch(dx, (dx.size,), np.float64 if dx.dtype == np.float64 else np.float32)
    return flat_steps(cumprod_grad_kernel(*types_of(dx)), outer * inner,
                      (flat(dy), flat(x), s, flat(dx), outer, n, inner),
                      f"cumprod_grad {short(dx.dtype)}")


def top_k_steps(x, out, rows, n, k, largest):
    """A grid-stride launch over the rows of :func:`top_k_kernel` for ``k`` up to
    ``TOP_K_INSERTION_MAX``, else of :func:`top_k_sort_kernel` (its scratch allocated here)."""
    label = f"top_k {'largest' if largest else 'smallest'} {short(x.dtype)}"
    ld = types_of(x)[0]
    if k <= indexing.TOP_K_INSERTION_MAX:
        return flat_steps(top_k_kernel(ld, bool(largest)), rows, (flat(x), flat(out), rows, n, k),
                          label)
    v = scratch(x, x.size, str(compute_type(x.dtype)))
    a, b = scratch(x, x.size, "int64"), scratch(x, x.size, "int64")
    return flat_steps(top_k_sort_kernel(ld, bool(largest)), rows,
                      (flat(x), v, a, b, flat(out), rows, n, k), f"{label} sort")


def max_steps(x, out, outer, n, inner, arg: bool):
    """A grid-stride launch of :func:`max_kernel` over the outputs."""
    return flat_steps(max_kernel(*types_of(x), bool(arg)), outer * inner,
                      (flat(x), flat(out), outer, n, inner),
                      f"{'argmax' if arg else 'reduce_max'} {short(x.dtype)}")


def max_grad_steps(x, y, dy, dx, outer, n, inner):
    """A grid-stride launch of :func:`max_grad_kernel` over the outputs of the reduction."""
    return flat_steps(max_grad_kernel(*types_of(x)), outer * inner,
                      (flat(x), flat(y), flat(dy), flat(dx), outer, n, inner),
                      f"reduce_max_grad {short(x.dtype)}")


def gather_steps(x, idx, out, outer, n, inner):
    """A grid-stride launch of :func:`gather_kernel` over out."""
    return flat_steps(gather_kernel(*types_of(out)), out.size,
                      (flat(x), flat(idx), flat(out), int(idx.size), n, inner),
                      f"gather {short(out.dtype)}")


def segment_sum_steps(data, ids, out, outer, n, inner):
    """A grid-stride launch of :func:`segment_sum_kernel` over out."""
    return flat_steps(segment_sum_kernel(*types_of(out)), out.size,
                      (flat(data), flat(ids), flat(out), int(ids.size), n, inner),
                      f"unsorted_segment_sum_like {short(out.dtype)}")


def dim_gather_steps(x, idx, out, dim):
    """A grid-stride launch of :func:`dim_gather_kernel` over out."""
    shape, _, _ = indexing.dim_layout(idx.shape, dim)
    _, xst, sd = indexing.dim_layout(x.shape, dim)
    n = int(x.shape[dim]) if x.ndim else 1
    return flat_steps(dim_gather_kernel(*types_of(out)), out.size,
                      (flat(x), flat(idx), flat(out), shape, xst, sd, n),
                      f"dim_gather {short(out.dtype)}")


def dim_scatter_steps(x, src, idx, out, dim, add):
    """``acc = x`` (``x`` None: zeros), a grid-stride launch of :func:`dim_scatter_kernel` over
    index's columns, then ``out = acc`` rounded once: ``acc`` is out itself when out's dtype is
    its compute type, else a float32 scratch allocated here. ``O(out + index)`` work. A float
    ``src`` is that value (the src array the kernel then never reads is out's)."""
    ishape, ist, isd = indexing.dim_layout(idx.shape, dim)
    _, ost, osd = indexing.dim_layout(out.shape, dim)
    ld, ct, _ = types_of(out)
    acc = out if str(ct) == out.dtype.name else scratch(out, out.size, str(ct))
    scalar = isinstance(src, float)
    m = ishape[int(dim)]
    columns = idx.size // m if m else 0
    return (fill_steps(acc, 0.0) if x is None else cast_steps(x, acc)) + flat_steps(
        dim_scatter_kernel(ld, ct, add, scalar), columns,
        (flat(out if scalar else src), src if scalar else 0.0, flat(idx), flat(acc), ishape, ist,
         ost, int(dim), isd, osd, int(out.shape[dim]) if out.ndim else 1, columns),
        f"dim_scatter {short(out.dtype)}") + ([] if acc is out else cast_steps(acc, out))


def _dims(shape, strides) -> tuple:
    return tuple(int(s) for s in shape) or (1,), tuple(int(s) for s in strides) or (0,)


def slice_steps(x, out, index, offset, strides):
    """``out = x[index]``: the strided gather from element ``offset`` of x."""
    if out.size == 0:
        return []
    shape, xst = _dims(out.shape, strides)
    return strided_gather_steps(flat(x)[offset:], out, shape, xst, "slice")


def scatter_steps(src, dst, index, offset, strides):
    """The strided scatter of ``src`` from element ``offset`` of dst (nothing for an empty
    src)."""
    if src.size == 0:
        return []
    shape, ost = _dims(src.shape, strides)
    return flat_steps(scatter_kernel(), src.size, (flat(src), flat(dst)[offset:], shape, ost),
                      f"scatter {short(dst.dtype)}")


def slice_grad_steps(dy, dx, index, offset, strides):
    """``dx = 0``, then the strided scatter of ``dy`` from element ``offset`` of dx."""
    return fill_steps(dx, 0.0) + scatter_steps(dy, dx, index, offset, strides)


def tril_steps(x, out, rows, cols, diagonal, fill_value):
    """A grid-stride launch of :func:`tril_kernel` over out."""
    return flat_steps(tril_kernel(*types_of(out)), out.size,
                      (flat(x), flat(out), rows, cols, int(diagonal), float(fill_value)),
                      f"tril {short(out.dtype)}")


def masked_fill_steps(x, mask, out, shape, mask_strides, value):
    """A grid-stride launch of :func:`masked_fill_kernel` over out."""
    return flat_steps(masked_fill_kernel(*types_of(out)), out.size,
                      (flat(x), flat(mask), flat(out), shape, mask_strides, float(value)),
                      f"masked_fill {short(out.dtype)}")


BUILDERS = indexing.builders(gather_steps=gather_steps, segment_sum_steps=segment_sum_steps,
                             dim_gather_steps=dim_gather_steps,
                             dim_scatter_steps=dim_scatter_steps,
                             slice_steps=slice_steps, slice_grad_steps=slice_grad_steps,
                             scatter_steps=scatter_steps, copy_steps=copy_steps,
                             tril_steps=tril_steps, masked_fill_steps=masked_fill_steps,
                             max_steps=max_steps, max_grad_steps=max_grad_steps,
                             top_k_steps=top_k_steps, cumsum_steps=cumsum_steps,
                             cumprod_steps=cumprod_steps, cumprod_grad_steps=cumprod_grad_steps)
"""Op type -> builder of the indexing ops."""
