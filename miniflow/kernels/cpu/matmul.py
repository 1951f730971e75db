"""``matmul`` on the CPU: NumPy's BLAS, plus register-blocked Numba loops for the shapes where BLAS
is slow.

``out = A @ B`` with ``A = op(a)`` of shape ``[m, k]`` and ``B = op(b)`` of shape ``[k, n]``
(``op`` = transpose when the node says so; transposed operands are ``.T`` views, read in place).
The builder picks one step per product when the plan is built (measured on one Zen 4 core with
OpenBLAS 0.3.31; single-core sgemm peak about 104-110 GFLOP/s; ``benchmarks/kernels.py`` prints
GFLOP/s and % of the measured peak for every product of the MLPs):

* ``B`` stored transposed (a layer's forward ``x @ W.T``, ``W`` ``[n, k]``), ``k >= DOT_MIN_K``
  and ``B`` big (``BIG`` elements), ``m <= DOT_MAX_ROWS``: :func:`dot_block_kernel`, dot products
  in 4 x 4 blocks (four rows of ``x`` against four rows of ``W``: sixteen accumulators that LLVM
  vectorizes along ``k``, each loaded element used four times). Nothing is packed or copied: it
  runs at 95-105 GFLOP/s (98% of the peak) from 8 rows up, where OpenBLAS's gemm, which packs
  the 4 MiB weight on every call, does 25 (m = 8), 40 (16), 76 (64) and 97 (256).
* ``m <= SKINNY`` rows against a big ``B`` stored ``[k, n]`` (an input gradient ``dy @ W`` at
  batch 1-4): :func:`rows_times_kernel` streams ``B`` once.
* ``k <= RANK_MAX_INNER`` against a big output (``4 * BIG`` elements; a weight gradient
  ``dy.T @ x`` at batch 1-16):
  :func:`rank_update_kernel`, the output written once per block of 8 rows of ``B``, four output
  rows at a time (k = 1 is an outer product).
* ``m <= SWAP_MAX_ROWS`` rows of a C-contiguous ``A`` against a big ``B`` with ``n >= 4 m`` (the
  input gradient ``dy @ W`` at batch 8-128): BLAS on the transposed problem, ``out.T = B.T @ A.T`` into a ``[n, m]``
  scratch, then one transposing copy (:func:`swapped_dot`): OpenBLAS is 5-40% faster on the
  tall-and-skinny form than on the short-and-wide one.
* otherwise one ``np.dot`` (BLAS; less call overhead than ``np.matmul``). Between
  ``ONE_THREAD_FROM`` and ``ONE_THREAD_BELOW`` multiply-adds it runs with BLAS on one thread
  (:class:`OneThreadBlas`) when BLAS has more: a multithreaded BLAS pays only for large products,
  and under load its spinning threads made a 64x64x128 product take 70 us instead of 12 (a 62 us
  training step took 420 us). Below ``ONE_THREAD_FROM`` OpenBLAS uses one thread by itself, and
  switching (about 3 us) would only cost.

The loops accumulate in the compute type (float32 for f16/f32) in a fixed order, so results are
deterministic, but not the bits BLAS gives. Half types (float16, bfloat16): a and b are widened
into float32 scratch and the float32 product rounded into out (a GPU half GEMM's contract).
"""
from __future__ import annotations

import functools

import numpy as np

from .common import blas_libraries, jit, loop_for, use_parallel
from .elementwise import cast_steps
from .fp16 import to_compute
from .loss_scale import cast_count_steps

__all__ = ["BUILDERS", "SKINNY", "BIG", "DOT_MIN_K", "DOT_MAX_ROWS", "RANK_MAX_INNER",
           "SWAP_MAX_ROWS", "ONE_THREAD_FROM", "ONE_THREAD_BELOW", "OneThreadBlas",
           "dot_block_kernel", "rows_times_kernel", "rank_update_kernel", "swapped_dot",
           "build_matmul"]

SKINNY = 4
"""Rows up to which :func:`rows_times_kernel` beats BLAS on a big ``B`` stored ``[k, n]``."""
BIG = 1 << 18
"""Elements of the big operand (or output) from which the loops pay (below it BLAS is as fast)."""
DOT_MIN_K = 256
"""Inner dimension from which :func:`dot_block_kernel` beats BLAS (at k = 64 it reaches 55
GFLOP/s: each dot product is too short for its final reductions)."""
DOT_MAX_ROWS = 128
"""Rows up to which :func:`dot_block_kernel` is used (98% of the peak at 16 and 64 rows, 82% at
256, where BLAS, which blocks for the caches, reaches 91%)."""
RANK_MAX_INNER = 16
"""Inner dimension up to which :func:`rank_update_kernel` beats BLAS on an output of at least
``4 * BIG`` elements (the 1024 x 1024 weight gradient at batch 16: 56-67 GFLOP/s against 42-53;
at 32 BLAS is faster, and on the 256 x 1024 input gradient of a 10-wide layer too)."""
SWAP_MAX_ROWS = 128
"""Rows up to which :func:`swapped_dot` (BLAS on the transposed problem) pays."""
ONE_THREAD_FROM, ONE_THREAD_BELOW = 1 << 18, 1 << 22
"""Multiply-adds for which BLAS runs on one thread: OpenBLAS's own single-thread limit (2^18), and
the measured crossover on 2 cores (2^21-2^23)."""
COLUMNS = 1024
"""Columns of out one parallel iteration of :func:`rows_times_kernel` owns."""


@functools.cache
def dot_block_kernel(parallel: bool):
    """``kernel(x, w, out)``: ``out = x @ w.T`` for ``x`` ``[m, k]`` and ``w`` ``[n, k]`` (both
    C-contiguous): ``out[i, j] = dot(x[i], w[j])``.

    Blocks of four rows of ``w`` by four rows of ``x``: sixteen dot products advance together
    along ``k``, so every loaded element feeds four multiply-adds (LLVM vectorizes the ``k`` loop,
    reassociating the sums: sixteen vector accumulators). Rows and columns past the last full
    block are single dot products. The parallel variant splits the blocks of ``w``'s rows.
    """
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("reassoc", "contract"))
    def kernel(x, w, out):
        m, k = x.shape
        n = w.shape[0]
        z = to_compute(out, 0.0)
        m4, n4 = m - m % 4, n - n % 4
        for jb in loop(n4 // 4):
            j = 4 * np.int64(jb)
            w0, w1, w2, w3 = w[j], w[j + 1], w[j + 2], w[j + 3]
            for i in range(0, m4, 4):
                x0, x1, x2, x3 = x[i], x[i + 1], x[i + 2], x[i + 3]
                a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = z
                a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = z
                for p in range(k):
                    u0, u1, u2, u3 = w0[p], w1[p], w2[p], w3[p]
                    c = x0[p]
                    a00 += c * u0
                    a01 += c * u1
                    a02 += c * u2
                    a03 += c * u3
                    c = x1[p]
                    a10 += c * u0
                    a11 += c * u1
                    a12 += c * u2
                    a13 += c * u3
                    c = x2[p]
                    a20 += c * u0
                    a21 += c * u1
                    a22 += c * u2
                    a23 += c * u3
                    c = x3[p]
                    a30 += c * u0
                    a31 += c * u1
                    a32 += c * u2
                    a33 += c * u3
                out[i, j], out[i, j + 1], out[i, j + 2], out[i, j + 3] = a00, a01, a02, a03
                out[i + 1, j], out[i + 1, j + 1] = a10, a11
                out[i + 1, j + 2], out[i + 1, j + 3] = a12, a13
                out[i + 2, j], out[i + 2, j + 1] = a20, a21
                out[i + 2, j + 2], out[i + 2, j + 3] = a22, a23
                out[i + 3, j], out[i + 3, j + 1] = a30, a31
                out[i + 3, j + 2], out[i + 3, j + 3] = a32, a33
            for jj in range(j, j + 4):          # the rows of x past the last block of four
                wj = w[jj]
                for i in range(m4, m):
                    xi, acc = x[i], z
                    for p in range(k):
                        acc += xi[p] * wj[p]
                    out[i, jj] = acc
        for j in range(n4, n):                  # the rows of w past the last block of four
            wj = w[j]
            for i in range(m):
                xi, acc = x[i], z
                for p in range(k):
                    acc += xi[p] * wj[p]
                out[i, j] = acc

    return kernel


@functools.cache
def rows_times_kernel(parallel: bool):
    """``kernel(x, w, out)``: ``out = x @ w`` for few rows of ``x`` ``[m, k]`` and ``w`` stored
    ``[k, n]``, reading ``w`` once: ``out[i, :] += x[i, p] * w[p, :]`` for ``p = 0, 1, ...``.
    The parallel variant splits the columns of out."""
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("reassoc", "contract"))
    def kernel(x, w, out):
        m, k = x.shape
        n = out.shape[1]
        for b in loop((n + COLUMNS - 1) // COLUMNS):
            j0 = COLUMNS * np.int64(b)
            j1 = min(j0 + COLUMNS, n)
            out[:, j0:j1] = 0
            for p in range(k):
                wp = w[p, j0:j1]
                for i in range(m):
                    xip, o = x[i, p], out[i, j0:j1]
                    for j in range(j1 - j0):
                        o[j] += xip * wp[j]

    return kernel


@functools.cache
def rank_update_kernel(parallel: bool):
    """``kernel(a, b, out)``: ``out = a @ b`` for a small inner dimension ``k``:
    ``out[i, :] = sum_p a[i, p] * b[p, :]`` (``b`` is ``[k, n]`` C-contiguous; ``a`` may be a
    transposed view). Four output rows at a time take eight rows of ``b`` per pass (each loaded
    element of ``b`` feeds four multiply-adds, each output element is read and written once per
    pass); the rows of ``b`` past the last block of eight are one pass each, as are the output
    rows past the last block of four. The parallel variant splits the blocks of output rows."""
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("contract",))
    def kernel(a, b, out):
        m, k = a.shape
        n = out.shape[1]
        m4, k8 = m - m % 4, k - k % 8
        for ib in loop((m4 + 3) // 4 + (m - m4)):
            i = 4 * np.int64(ib) if 4 * np.int64(ib) < m4 else m4 + np.int64(ib) - m4 // 4
            rows = 4 if i < m4 else 1
            for r in range(rows):
                out[i + r] = 0
            for p in range(0, k8, 8):
                b0, b1, b2, b3 = b[p], b[p + 1], b[p + 2], b[p + 3]
                b4, b5, b6, b7 = b[p + 4], b[p + 5], b[p + 6], b[p + 7]
                for r in range(rows):
                    o = out[i + r]
                    d0, d1, d2, d3 = a[i + r, p], a[i + r, p + 1], a[i + r, p + 2], a[i + r, p + 3]
                    d4, d5, d6, d7 = (a[i + r, p + 4], a[i + r, p + 5], a[i + r, p + 6],
                                      a[i + r, p + 7])
                    for j in range(n):
                        o[j] += (d0 * b0[j] + d1 * b1[j] + d2 * b2[j] + d3 * b3[j]
                                 + d4 * b4[j] + d5 * b5[j] + d6 * b6[j] + d7 * b7[j])
            for p in range(k8, k):
                bp = b[p]
                for r in range(rows):
                    o, d = out[i + r], a[i + r, p]
                    for j in range(n):
                        o[j] += d * bp[j]

    return kernel


def swapped_dot(a, b, out, scratch):
    """``out = a @ b`` as BLAS computes ``scratch = b.T @ a.T`` (``scratch``: ``[n, m]``), then
    one transposing copy into ``out``."""
    np.dot(b.T, a.T, scratch)
    np.copyto(out, scratch.T)


class OneThreadBlas:
    """A step function: ``fn(*args)`` with every BLAS library that has more threads limited to one
    during the call, and restored to the count it had when the step was made (threadpoolctl)."""

    __slots__ = ("fn", "libs", "__name__")

    def __init__(self, fn, libs):
        self.fn, self.libs = fn, [(lib, lib.num_threads) for lib in libs]
        self.__name__ = f"{fn.__name__} (1 BLAS thread)"

    def __call__(self, *args):
        for lib, _ in self.libs:
            lib.set_num_threads(1)
        try:
            return self.fn(*args)
        finally:
            for lib, n in self.libs:
                lib.set_num_threads(n)


def _blas_step(a, b, out):
    """``np.dot(a, b, out)``, on one BLAS thread for a small product (see the module docstring)."""
    (m, k), n = a.shape, b.shape[1]
    multithreaded = [lib for lib in blas_libraries() if lib.num_threads > 1]
    if ONE_THREAD_FROM <= m * k * n < ONE_THREAD_BELOW and multithreaded:
        return OneThreadBlas(np.dot, multithreaded), (a, b, out)
    return np.dot, (a, b, out)


def _product_step(a, b, out):
    """The step computing ``out = a @ b`` (a, b possibly ``.T`` views; see the module docstring)."""
    (m, k), n = a.shape, b.shape[1]
    transposed = b.flags.f_contiguous and not b.flags.c_contiguous
    if (transposed and a.flags.c_contiguous and k >= DOT_MIN_K and k * n >= BIG
            and m <= DOT_MAX_ROWS):
        return dot_block_kernel(use_parallel(b.size)), (a, b.T, out)
    if m <= SKINNY and not transposed and k * n >= BIG and a.flags.c_contiguous:
        return rows_times_kernel(use_parallel(b.size)), (a, b, out)
    if k <= RANK_MAX_INNER and (k == 1 or m * n >= 4 * BIG) and b.flags.c_contiguous:
        return rank_update_kernel(use_parallel(out.size)), (a, b, out)
    if m <= SWAP_MAX_ROWS and n >= 4 * m and k * n >= BIG and a.flags.c_contiguous:
        return swapped_dot, (a, b, out, np.empty((n, m), out.dtype))
    return _blas_step(a, b, out)


def build_matmul(node, ins, outs):
    """``out = op(a) @ op(b)`` (2-D; ``op`` = transpose when ``transpose_a``/``transpose_b``);
    with ``count_not_finite`` also ``outs[1][0]`` = the number of non-finite elements of out,
    counted in the pass that rounds the float32 product into a half out (a float32 out is
    computed into a scratch and copied by that pass)."""
    a, b, out = ins[0], ins[1], outs[0]
    steps = []
    if len(outs) > 1 and out.dtype.itemsize != 2:
        target = np.empty(out.shape, out.dtype)
        a = a.T if node.attrs.get("transpose_a", False) else a
        b = b.T if node.attrs.get("transpose_b", False) else b
        return [_product_step(a, b, target)] + cast_count_steps(target, out, outs[1])
    if out.dtype.itemsize == 2:             # a half type: the product in float32
        a32, b32, out32 = (np.empty(t.shape, np.float32) for t in (a, b, out))
        steps += cast_steps(a, a32) + cast_steps(b, b32)
        a, b, target = a32, b32, out32
    else:
        target = out
    a = a.T if node.attrs.get("transpose_a", False) else a
    b = b.T if node.attrs.get("transpose_b", False) else b
    steps.append(_product_step(a, b, target))
    if len(outs) > 1:                   # count_not_finite: counted where the product is rounded
        steps += cast_count_steps(target, out, outs[1])
    elif target is not out:
        steps += cast_steps(target, out)
    return steps


BUILDERS = {"matmul": build_matmul}
"""Op type -> builder."""
