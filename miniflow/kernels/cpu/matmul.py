"""``matmul`` on the CPU: NumPy's BLAS, plus register-blocked Numba loops for the shapes where BLAS
is slow; ``batch_matmul`` is one ``np.matmul`` over the stacks in float32 and float64, else one such
product per batch index (``kernels.common.batch``).

``out = A @ B`` with ``A = op(a)`` of shape ``[m, k]`` and ``B = op(b)`` of shape ``[k, n]``
(``op`` = transpose when the node says so; transposed operands are ``.T`` views, read in place).
:func:`build_matmul` takes, per product, the steps of one of :data:`CANDIDATES`: the built-in
rules below (:func:`numba_steps`), BLAS alone (:func:`blas_steps`), BLAS on one thread
(:func:`blas_one_thread_steps`) or the packed GEMM (:func:`packed_steps`: both operands widened
into packed float32 panels, BLIS's loop nest, ``packed_gemm``), as ``tune`` measured for the
product's class on the machine it runs on, at the threads in force (BLAS unless another is
clearly faster; ``MINIFLOW_MATMUL`` overrides). The convolutions' GEMMs are chosen alike
(:func:`gemm_steps`). The rules' thresholds and the register tile were measured on one Zen 4
core, and are 2-3x off on other CPUs, where BLAS then wins. The rules pick one step per
product when the plan is built (measured on one Zen 4 core with OpenBLAS 0.3.31; single-core
sgemm peak about 104-110 GFLOP/s; ``benchmarks/kernels.py`` prints GFLOP/s and % of the measured
peak for every product of the MLPs):

* ``B`` stored transposed (a layer's forward ``x @ W.T``, ``W`` ``[n, k]``), ``k >= DOT_MIN_K``
  and ``B`` big (``BIG`` elements), ``m <= DOT_MAX_ROWS``, or any product below ``TINY``
  multiply-adds (the digits MLP at batch 1-3): :func:`dot_block_kernel`, dot products
  in 4 x 4 blocks (four rows of ``x`` against four rows of ``W``: sixteen accumulators that LLVM
  vectorizes along ``k``, each loaded element used four times). Nothing is packed or copied: it
  runs at 95-105 GFLOP/s (98% of the peak) from 8 rows up, where OpenBLAS's gemm, which packs
  the 4 MiB weight on every call, does 25 (m = 8), 40 (16), 76 (64) and 97 (256).
* ``m < OUTER_MIN_ROWS`` rows against a big ``B`` stored ``[k, n]`` (an input gradient
  ``dy @ W`` at batch 1-3): :func:`rows_times_kernel` streams ``B`` once.
* ``B`` stored ``[k, n]`` (rows of unit stride) with ``n >= OUTER_MIN_COLS``, ``m >=
  OUTER_MIN_ROWS``, and ``A`` C-contiguous or smaller than ``BIG`` (every input gradient
  ``dy @ W`` and weight gradient ``dy.T @ x`` of an MLP from batch 4 up, float32 and the half
  types): :func:`outer_block_kernel`, a BLAS micro-kernel's register tile (the target's:
  ``target.ISA``, 4 x 64 outputs in sixteen vectors with AVX-512, 6 x 16 in twelve with AVX2;
  ``simd``) without BLAS's packing. On the wide MLP at batch 16 it runs the
  input gradient (16 x 1024 x 1024) at 99-102% of the peak and the weight gradient
  (1024 x 16 x 1024) at 67-101% (it writes its 4 MiB output once), where OpenBLAS did 48-56%
  and 32-40%; at batch 64 101-104% against 79-85%. A strided ``A`` bigger than ``BIG`` (the
  weight gradient ``dy.T`` from batch 256), read in place, would run at 91.6% where BLAS, which
  packs it, does 98.6%: it is copied contiguous first (:func:`transpose_kernel`, widened in the
  same pass; :func:`_transposed_copies` gives the measurements), as is a smaller one read for
  ``COPY_A_MIN_COLS`` columns of out or more (the weight gradient at batch 16 and 64, whose
  ``k`` elements a broadcast reads lie in one L1 set at 1024 features), and ``W.T`` of every
  forward :func:`dot_block_kernel` does not take (many rows, a short ``k``, a small ``W``).
* bfloat16 where the CPU has AVX512-BF16 (``simd.HAS_BF16_DOT``) and ``k`` is even: the same tile
  with ``vdot_pairs``, two products per lane and instruction. Below ``PACK_MIN_ROWS`` rows of out
  the ``"pairs"`` layout, rows ``p`` and ``p + 1`` of ``B`` interleaved as they load (the input
  gradient at batch 16: 149 GFLOP/s, against 95-105 for the float32 tile); from there ``B`` is
  packed into pairs first, the ``"packed"`` layout: a ``B`` stored ``[k, n]`` by
  :func:`interleave_pairs_kernel` (the gradients at batch 64: 185-204 GFLOP/s, 214-217 at 256,
  packing included, against 145-150 interleaving as they load), ``W`` of ``x @ W.T`` by
  :func:`transpose_kernel` on its pairs viewed as float32 words (167 GFLOP/s at batch 64, 212
  at 256; a scalar loop over the words did 126 and 183), except at ``SWAP_ROWS`` rows (the
  tile's width: batch 64), where ``out.T = W @ x.T`` packs only ``x`` and reads ``W`` once in
  place (:func:`swapped_pairs_kernel`; 890-1025 us against 1339-1974). ``x @ W.T`` with ``k``
  a multiple of 32 and ``DOT_PAIRS_K_PER_ROW`` steps of it a row of out (or a ``W`` too narrow
  for the tile):
  :func:`dot_pairs_kernel`, dot products on the pairs as stored (the forward at batch 16: 175
  GFLOP/s, against 89 for :func:`dot_block_kernel` on widened elements and a rounding pass);
  with fewer, ``W`` packed from ``OUTER_MIN_ROWS`` rows. Those are Zen 4's numbers:
  on Sapphire Rapids ``vdpbf16ps`` issues at half the FMAs' rate and the tile did 37-77 GFLOP/s,
  where the tuner takes the ``packed`` candidate (:func:`packed_steps`, 85-128).
* otherwise one ``np.dot`` (BLAS; less call overhead than ``np.matmul``). From
  ``ONE_THREAD_FROM`` multiply-adds it runs with BLAS on one thread (:class:`OneThreadBlas`)
  when BLAS has more: a multithreaded BLAS pays only for large products, and under load its
  spinning threads made a 64x64x128 product take 70 us instead of 12 (a 62 us training step took
  420 us). From ``ONE_THREAD_BELOW`` the product is split across Numba's threads, each part one
  BLAS call on one thread (``blas_split``: one thread pool, so the other kernels run parallel
  too), or, where NumPy's BLAS has no CBLAS GEMM to split, BLAS takes its own threads. Below
  ``ONE_THREAD_FROM`` OpenBLAS uses one thread by itself, and switching (about 3 us) would only
  cost.

The loops accumulate in the compute type (float32 for f16/f32) in a fixed order, so results are
deterministic, but not the bits BLAS gives. Half types (float16, bfloat16): the product is float32,
rounded into out once (a GPU half GEMM's contract); the loops read the half operands as they
are (widening each element or vector as it loads, or into the register tile's panel of a few
columns: no widened copy of a whole half weight is made), BLAS gets them widened into float32
scratch first.
"""
from __future__ import annotations

import functools
import math

import numba

import numpy as np

from ...dtype import is_bfloat16
from . import blas_split, fp16, mkl_gemm, tune
from .packed_gemm import packed_kernel
from ..common.batch import batched
from .common import (jit, jitable, kview, loop_for, numpy_blas, one_pool, store_counted,
                     use_parallel)
from .elementwise import cast_steps
from .fp16 import load, store, to_compute
from .loss_scale import cast_count_steps, sum_counts_kernel
from .simd import (HAS_BF16_DOT, LANES, fma_scalar, vcount_nonfinite, vdot_pairs, vfma, vfold1,
                   vfold2, vfold4, vfold8, vlane, vload, vload_pairs, vload_run, vsplat,
                   vsplat_pair, vstore, vtranspose_block, vzero)
from .target import ISA

__all__ = ["BUILDERS", "OUTER_MIN_ROWS", "OUTER_MIN_COLS", "PACK_MIN_ROWS", "PAIRS_COPY_MIN_COLS",
           "SWAP_ROWS", "swapped_pairs_kernel",
           "LAYOUTS", "WIDEN_MAX", "WIDEN_REUSE", "TINY", "COPY_MIN_ROWS", "COPY_MIN_WORK",
           "COPY_A_MIN_COLS", "BIG",
           "DOT_MIN_K",
           "DOT_MAX_ROWS", "DOT_PAIRS_K_PER_ROW", "ONE_THREAD_FROM", "ONE_THREAD_BELOW",
           "OneThreadBlas", "dot_block_kernel", "dot_pairs_kernel", "outer_block_kernel",
           "interleave_pairs_kernel", "transpose_kernel", "rows_times_kernel",
           "batch_pairs_kernel", "build_matmul", "numba_steps", "blas_steps",
           "blas_one_thread_steps", "packed_steps", "mkl_steps", "mkl_blocked_steps", "MKL",
           "CANDIDATES", "GEMM_CANDIDATES", "gemm_steps"]

OUTER_MIN_ROWS = 4
"""Rows from which :func:`outer_block_kernel` (four rows a block) beats :func:`rows_times_kernel`
(at 4 x 1024 x 1024: 109 us against 255; at one row 141 against 85)."""
OUTER_MIN_COLS = 64
"""Columns from which :func:`outer_block_kernel` is used (the AVX-512 register tile is 64 wide)."""
PACK_MIN_ROWS = 64
"""Rows of out from which a bfloat16 product packs ``B`` into pairs for the ``vdot_pairs`` tile
(:func:`interleave_pairs_kernel`, or :func:`transpose_kernel` of 32-bit words: 170 us for a
1024 x 1024 ``W`` of ``x @ W.T``). ``x @ W.T`` at 64 x 1024 x 1024: 810 us in all against 1500
for :func:`dot_block_kernel`, at 256 rows 2510 against 5900; at 16 rows the packing would cost
more than it saves (the input gradient there: 226 us interleaving as it loads)."""
SWAP_ROWS = ISA.columns if HAS_BF16_DOT else 0
"""Rows of out (the batch) at which a bfloat16 ``x @ W.T`` that packs ``W`` is computed as
``out.T = W @ x.T`` instead (:func:`swapped_pairs_kernel`): out's rows then fill the ``vdot_pairs``
tile's width once, so ``W`` is read once where it is stored and only ``x`` is packed. One Zen 4
core, ``x @ W.T`` at m x 1024 x 1024, us, packing ``W`` / swapped, medians of 21 alternated
calls, 2 MiB of other data touched before each, three runs: m = 64 1339-1974 / 890-1025; m = 80,
96, 112, 128 (a second, partial column of tiles; ``W`` read twice) 1516-2933 / 1442-3491, no
gain; m = 48 (no whole tile) 1697 / 1846."""
PAIRS_COPY_MIN_COLS = 512
"""Columns of out from which a bfloat16 product copies an ``a`` stored transposed for the paired
tile (:func:`_pairs_copy`; each pair of ``a`` is read once per 64 columns). One Zen 4 core,
``dy.T @ x`` at 1024 x 256 x n, us, in place / copied (the copy 46 us): n = 64 151 / 194, 256
629 / 645, 512 1320 / 1265, 1024 2467-2981 / 2413-2561 (the strided reads vary from process
to process); at n = 1024 and k = 16, 128, 512: 242 / 237, 1544 / 1317, 5016 / 4845."""
WIDEN_MAX = 1 << 16
"""Elements up to which a half operand is widened into float32 scratch once per product (an
activation or gradient of a batch up to 64 on 1024 features, about 5 us), rather than converted
at every load: each vector of it feeds four or more multiply-adds, and the conversions compete
with them (a float16 ``dy @ W`` at batch 16: 364 us with dy converted as it loads, against 303 in
float32)."""
WIDEN_REUSE = 128
"""Uses of each element (the other operand's free dimension) from which a half operand of any
size is widened once: a float16 ``dy @ W`` at batch 256 took 5572 us with ``W`` converted at
every load, against 4991 for the float32 product (widening ``W`` costs about 150 us)."""
COPY_MIN_ROWS, COPY_MIN_WORK = 16, 1 << 18
"""Rows of out, or multiply-adds, from which ``x @ W.T`` copies ``W.T`` for
:func:`outer_block_kernel` (see :func:`_transposed_copies`)."""
COPY_A_MIN_COLS = 128
"""Columns of out from which ``dy.T @ x`` copies ``dy.T`` contiguous for
:func:`outer_block_kernel`, from ``COPY_MIN_WORK`` multiply-adds (see
:func:`_transposed_copies`)."""
BIG = 1 << 18
"""Elements of the big operand (or output) from which the loops pay (below it BLAS is as fast)."""
DOT_MIN_K = 256
"""Inner dimension from which :func:`dot_block_kernel` beats BLAS (at k = 64 it reaches 55
GFLOP/s: each dot product is too short for its final reductions)."""
DOT_PAIRS_K_PER_ROW = 32
"""Steps of ``k`` per row of out from which a bfloat16 ``x @ W.T`` takes
:func:`dot_pairs_kernel` rather than packing ``W`` for the ``vdot_pairs`` tile (one Zen 4 core,
us, dot products / packed, ``k`` x ``n``: 1024 x 1024 at 16, 32, 64, 128 rows 200 / 264, 373 /
412, 767 / 835, 1592 / 1553; 256 x 1024 at 16 and 32 rows 76 / 76, 148 / 113; 1024 x 256 at 32
and 64 rows 95 / 95, 191 / 166: each dot product's fold and scalar store costs as much as
about 32 steps of its chain)."""
DOT_MAX_ROWS = 128
"""Rows up to which :func:`dot_block_kernel` is used (98% of the peak at 16 and 64 rows, 82% at
256, where BLAS, which blocks for the caches, reaches 91% and :func:`outer_block_kernel` on a
transposed copy of ``W`` 95%)."""
TINY = 1 << 15
"""Multiply-adds below which a product is one Numba call: :func:`dot_block_kernel` takes
``x @ W.T`` (BLAS's call costs more than the work; in bfloat16 with ``vdot_pairs`` and ``k`` a
multiple of 32, :func:`dot_pairs_kernel`), and half operands are read as they are
rather than widened first (each widening is a kernel call). The digits MLP at batch 1, one Zen 5
core: 1 x 64 x 128 float16 2.59 us in four steps (two widenings, BLAS, the rounding) against
1.47 in two, float32 1.22 against 1.19; its weight gradient 128 x 1 x 64 1.33 us widened, 0.88
read as it is; at 16 x 64 x 128 (131072) the widenings no longer cost more than they save."""
ONE_THREAD_FROM, ONE_THREAD_BELOW = 1 << 18, 1 << 22
"""Multiply-adds for which BLAS runs on one thread: OpenBLAS's own single-thread limit (2^18), and
the measured crossover on 2 cores (2^21-2^23)."""
PANEL_TILES = 4
"""Tiles of columns whose ``b`` the narrow (6-row) register tile packs into one panel at a time
(see :func:`outer_block_kernel`)."""
PANEL_ACROSS = 1 << 13
"""Elements of a panel up to which (it stays in L1: 32 KiB) the 6-row tile runs each block of
rows across the panel's tiles, storing along out's rows (AVX2, 256 x 10 x 1024: 30 GFLOP/s down
the columns, 100 across), rather than each tile down all the rows, which reuses a bigger panel
while it is in cache."""
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
                    u0, u1, u2, u3 = load(w0, p), load(w1, p), load(w2, p), load(w3, p)
                    c = load(x0, p)
                    a00 += c * u0
                    a01 += c * u1
                    a02 += c * u2
                    a03 += c * u3
                    c = load(x1, p)
                    a10 += c * u0
                    a11 += c * u1
                    a12 += c * u2
                    a13 += c * u3
                    c = load(x2, p)
                    a20 += c * u0
                    a21 += c * u1
                    a22 += c * u2
                    a23 += c * u3
                    c = load(x3, p)
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
                        acc += load(xi, p) * load(wj, p)
                    out[i, jj] = acc
        for j in range(n4, n):                  # the rows of w past the last block of four
            wj = w[j]
            for i in range(m):
                xi, acc = x[i], z
                for p in range(k):
                    acc += load(xi, p) * load(wj, p)
                out[i, j] = acc

    return kernel


@jitable
def _dots4(x, i, di, w, j, dj):
    """The dot products of rows ``x[i + t di]`` and ``w[j + t dj]`` (bfloat16 bits, ``k`` a
    multiple of 32) for ``t < 4``, as lanes 0-3 of one vector: four chains of ``vdot_pairs``,
    their lanes summed by the fold tree of :func:`dot_pairs_kernel`'s blocks (the same bits)."""
    a0 = a1 = a2 = a3 = vzero()
    for p in range(0, x.shape[1], 32):
        a0 = vdot_pairs(a0, vload_run(x, i, p), vload_run(w, j, p))
        a1 = vdot_pairs(a1, vload_run(x, i + di, p), vload_run(w, j + dj, p))
        a2 = vdot_pairs(a2, vload_run(x, i + 2 * di, p), vload_run(w, j + 2 * dj, p))
        a3 = vdot_pairs(a3, vload_run(x, i + 3 * di, p), vload_run(w, j + 3 * dj, p))
    h = vfold4(vfold8(a0, a1), vfold8(a2, a3))
    return vfold1(vfold2(h, h), h)


@functools.cache
def dot_pairs_kernel(parallel: bool, counted: bool):
    """``kernel(x, w, out, count)``: ``out = x @ w.T`` for bfloat16 bits ``x`` ``[m, k]`` and ``w``
    ``[n, k]`` (C-contiguous, ``k`` a multiple of 32; ``simd.HAS_BF16_DOT``), out float32 or
    bfloat16 bits (rows of unit stride), each element rounded once as it is stored; with
    ``counted``, ``count[0]`` = the number of non-finite elements of out.

    :func:`dot_block_kernel`'s 4 x 4 blocks on ``vdot_pairs``: a row of ``x`` and a row of ``w``
    hold their pairs side by side already (``k`` is the contracted axis of both), so each
    instruction takes 32 elements of each as they are stored, with nothing packed or widened:
    sixteen accumulators of 16 lanes advance along ``k``, their lanes summed by one fold tree
    (``vfold8`` .. ``vfold1``: lane ``4 r + c`` is out ``[i + r, j + c]``). Rows past the last
    blocks take four dot products at a time (:func:`_dots4`). For the forward ``x @ W.T`` of a
    layer at small batches: the wide MLP's 16 x 1024 x 1024 on one Zen 4 core, out bfloat16, in
    192 us (175 GFLOP/s; float32 out 167 us, 200) where :func:`dot_block_kernel` on widened
    elements and a rounding pass took 375. (A ``k % 32`` tail one product at a time after the
    fold, even when empty, cost 130 us there: ``k`` must be a multiple of 32.) The parallel
    variant splits the blocks of ``w``'s rows. Subnormal products are lost (``vdot_pairs``)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, w, out, count):
        m, k = x.shape
        n = w.shape[0]
        m4, n4 = m - m % 4, n - n % 4
        bad = 0
        for jb in loop(n4 // 4):
            j = 4 * np.int64(jb)
            for i in range(0, m4, 4):
                a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = vzero()
                a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = vzero()
                for p in range(0, k, 32):
                    u0, u1 = vload_run(w, j, p), vload_run(w, j + 1, p)
                    u2, u3 = vload_run(w, j + 2, p), vload_run(w, j + 3, p)
                    c = vload_run(x, i, p)
                    a00, a01 = vdot_pairs(a00, c, u0), vdot_pairs(a01, c, u1)
                    a02, a03 = vdot_pairs(a02, c, u2), vdot_pairs(a03, c, u3)
                    c = vload_run(x, i + 1, p)
                    a10, a11 = vdot_pairs(a10, c, u0), vdot_pairs(a11, c, u1)
                    a12, a13 = vdot_pairs(a12, c, u2), vdot_pairs(a13, c, u3)
                    c = vload_run(x, i + 2, p)
                    a20, a21 = vdot_pairs(a20, c, u0), vdot_pairs(a21, c, u1)
                    a22, a23 = vdot_pairs(a22, c, u2), vdot_pairs(a23, c, u3)
                    c = vload_run(x, i + 3, p)
                    a30, a31 = vdot_pairs(a30, c, u0), vdot_pairs(a31, c, u1)
                    a32, a33 = vdot_pairs(a32, c, u2), vdot_pairs(a33, c, u3)
                sums = vfold1(
                    vfold2(vfold4(vfold8(a00, a01), vfold8(a02, a03)),
                           vfold4(vfold8(a10, a11), vfold8(a12, a13))),
                    vfold2(vfold4(vfold8(a20, a21), vfold8(a22, a23)),
                           vfold4(vfold8(a30, a31), vfold8(a32, a33))))
                for r in range(4):
                    for c4 in range(4):
                        bad += store_counted(out, i + r, j + c4, vlane(sums, 4 * r + c4), counted)
            for i in range(m4, m):      # the rows of x past the last block: one by four
                sums = _dots4(x, i, 0, w, j, 1)
                for c4 in range(4):
                    bad += store_counted(out, i, j + c4, vlane(sums, c4), counted)
        for j in range(n4, n):          # the rows of w past the last block: four by one
            for i in range(0, m4, 4):
                sums = _dots4(x, i, 1, w, j, 0)
                for r in range(4):
                    bad += store_counted(out, i + r, j, vlane(sums, r), counted)
            for i in range(m4, m):      # and past both: lane 0 of four equal chains
                bad += store_counted(out, i, j, vlane(_dots4(x, i, 0, w, j, 0), 0), counted)
        if counted:
            count[0] = bad

    return kernel


@jitable
def _put4(out, i, j, v0, v1, v2, v3, counted):
    """``out[i, j:j + 4 LANES] = v0, v1, v2, v3`` (rounded to out's type); with ``counted``, how
    many of the values are not finite once rounded (else 0)."""
    vstore(out, i, j, v0)
    vstore(out, i, j + LANES, v1)
    vstore(out, i, j + 2 * LANES, v2)
    vstore(out, i, j + 3 * LANES, v3)
    if not counted:
        return 0
    return (vcount_nonfinite(out, v0) + vcount_nonfinite(out, v1) + vcount_nonfinite(out, v2)
            + vcount_nonfinite(out, v3))


@jitable
def _put2(out, i, j, v0, v1, counted):
    """``out[i, j:j + 2 LANES] = v0, v1`` (rounded to out's type); with ``counted``, how many of
    the values are not finite once rounded (else 0)."""
    vstore(out, i, j, v0)
    vstore(out, i, j + LANES, v1)
    if not counted:
        return 0
    return vcount_nonfinite(out, v0) + vcount_nonfinite(out, v1)


@jitable
def _splat(a, i, p):
    """``a[i, p]`` (as float32) in every lane: one step of the inner loop."""
    return vsplat(load(a, (i, p)))


@jitable
def _splat_pair(a, i, p):
    """The bfloat16 pair ``(a[i, p], a[i, p + 1])`` in every lane: two steps of the inner loop."""
    return vsplat_pair(a, i, p)


@jitable
def _fma(acc, x, y):
    """``acc + x * y`` (the float32 tile's multiply-add, in ``vdot_pairs``' argument order)."""
    return vfma(x, y, acc)


@jitable
def _load_rows(b, p, j):
    """``b[p, j:j + 16]`` as float32 (``b`` stored ``[k, n]``: the ``"rows"`` layout)."""
    return vload(b, p, j)


@jitable
def _load_pairs(b, p, j):
    """Rows ``p`` and ``p + 1`` of bfloat16 ``b``, columns ``j:j + 16``, interleaved into pairs
    as they load (the ``"pairs"`` layout)."""
    return vload_pairs(b, p, j)


@jitable
def _dot_pairs(acc, x, y):
    """``acc`` plus the products of the bfloat16 pairs ``x`` and ``y`` (the paired tile's
    multiply-add)."""
    return vdot_pairs(acc, x, y)


@jitable
def _load_packed(b, p, j):
    """The pairs of steps ``p, p + 1`` for columns ``j:j + 16`` from the ``"packed"`` layout (row
    ``p // 2`` holds them side by side)."""
    return vload_run(b, p >> 1, 2 * j)


@jitable
def _at(b, p, j):
    """``b[p, j]`` as float32 (``b`` stored ``[k, n]``)."""
    return load(b, (p, j))


@jitable
def _packed_at(b, p, j):
    """Element ``[p, j]`` of the product's ``b`` from the ``"packed"`` layout."""
    return load(b, (p >> 1, 2 * j + (p & 1)))


@jitable
def _pack_panel(b, j, panel):
    """``(panel, 0)`` with ``panel[p, :] = b[p, j:j + panel.shape[1]]`` widened to float32, one
    vector at a time: the columns of ``b`` a register tile reads, contiguous (see
    :func:`outer_block_kernel`)."""
    for p in range(panel.shape[0]):
        for v in range(0, panel.shape[1], LANES):
            vstore(panel, p, v, vload(b, p, j + v))
    return panel, 0


@jitable
def _in_place(b, j, panel):
    """``(b, j)``: a tile reads ``b`` itself (the bfloat16 pair layouts)."""
    return b, j


LAYOUTS = ("rows", "pairs", "packed")
"""How :func:`outer_block_kernel` reads ``b``: float32 vectors of rows ``[k, n]``; bfloat16 rows
paired as they load; bfloat16 pairs packed ahead (``[k / 2, 2 n]``: row ``q`` holds rows ``2q``
and ``2q + 1`` interleaved) by :func:`interleave_pairs_kernel`, or ``W`` of ``x @ W.T``
transposed as 32-bit words (one pair each) by :func:`transpose_kernel`."""


@functools.cache
def outer_block_kernel(parallel: bool, counted: bool, layout: str = "rows"):
    """``kernel(a, b, out, count)``: ``out = a @ b`` for ``b`` stored ``[k, n]`` (rows of unit
    stride) and any ``a`` (a ``.T`` view too; its elements are read one at a time); ``a``, ``b`` and
    ``out`` float32 or half bits (``fp16``). With ``counted``, ``count[0]`` = the number of
    non-finite elements of out (the loss scaler's check, made as out is written). ``layout``
    (:data:`LAYOUTS`): ``"rows"`` multiplies float32 vectors; ``"pairs"`` and ``"packed"``
    (bfloat16 ``a`` and ``b``, even ``k``, ``simd.HAS_BF16_DOT``) make each multiply-add a
    ``vdot_pairs`` over two steps of ``p``, twice the work per instruction, with ``b`` stored
    ``[k, n]`` or packed ahead (``[k / 2, 2 n]``).

    The register tile of a BLAS micro-kernel (``simd``), its shape the target's (``target.ISA``,
    after BLIS's and XNNPACK's per-ISA micro-kernels): a block of out of ``rows`` x ``vectors``
    vectors stays in registers while ``p`` runs over the whole inner dimension; per ``p`` the
    ``vectors`` vectors of ``b[p]`` are loaded (paired: rows ``p`` and ``p + 1`` interleaved) and each of ``a``'s ``rows`` elements is broadcast into
    ``vectors`` multiply-adds. AVX-512: 4 rows x 4 vectors of 16 (4 x 64, sixteen of the 32
    registers); AVX2: 6 x 2 vectors of 8 (6 x 16, twelve of 16, BLIS's haswell sgemm), NEON and
    SSE 6 x 2 of 4 (6 x 8). With float32 vectors (``"rows"``) the tile reads ``b`` from a panel:
    the columns of ``b`` of one tile (``PANEL_TILES`` tiles for the 6-row one) copied
    contiguous and widened to float32 first, once per call for all of out's rows (as BLIS packs
    ``B``; one panel per thread, allocated per call). In place, a tile reads 64 or 256 bytes of
    a row of ``b`` per step, and with a power-of-two row stride (1024 columns: 4 KiB) every row
    maps to the same few L1 sets, 12 ways each (one Zen 5 core, 256 x 1024 x 1024: the AVX-512
    tile 87 GFLOP/s in place, 164-193 from the panel; the AVX2 tile at 252 rows 50 in place, 95
    with 1040 columns, 99-102 from the panel). The bfloat16 pair layouts read ``b`` in place
    (``"packed"`` is packed ahead). Each output element is rounded once to out's type as it is
    stored. Rows past the last block: with the 6-row tile, where 4 remain, a block of 4 rows by 2
    vectors (eight chains; at 16 rows, as AVX2, a bfloat16 ``dy @ W`` of 16 x 1024 x 1024 took 418
    us with an overlapping block of 6, 394 with it), where 5 remain, one more block of 6 ending at
    the last row (the rows it shares with the block before are computed again, to the same bits,
    and not counted again), else one row at a time; columns past the last tile are
    vectors (with the 4 x 4-vector tile, two of them four rows at a time: eight chains), then
    scalars. Sums run in float32 in order of ``p``, one rounding per multiply-add (``vfma``,
    ``fma_scalar`` in the scalar columns: every element of out gets the same bits whatever the tile,
    so the AVX2, AVX-512 and generic builds agree; per product of a pair when paired). The
    parallel variant splits the tiles' columns (then, for the last columns, the rows).
    """
    loop = loop_for(parallel)
    step = 1 if layout == "rows" else 2
    # Plain jitable functions only: a closure over an intrinsic (vload, vdot_pairs) pickles a
    # per-process uuid into Numba's cache key, and the kernel would compile again in every process.
    load_b, b_at = {"rows": (_load_rows, _at), "pairs": (_load_pairs, _at),
                    "packed": (_load_packed, _packed_at)}[layout]
    splat, mac = (_splat, _fma) if layout == "rows" else (_splat_pair, _dot_pairs)
    prepare = _pack_panel if layout == "rows" else _in_place
    wide = ISA.vectors == 4 or layout != "rows"     # the 4 x 4-vector tile, else 6 x 2 vectors
    rows, width = ISA.rows, ISA.columns
    group = 1 if wide else PANEL_TILES              # tiles one panel holds
    slots = numba.config.NUMBA_NUM_THREADS if parallel else 1      # a panel per thread

    @jit(parallel)
    def kernel(a, b, out, count):
        m, k = a.shape
        n = out.shape[1]
        nw, nl = n - n % width, n - n % LANES
        tiles, mr = nw // width, m - m % rows
        four = not wide and m - mr == 4         # 4 rows left: a block of 4 (eight chains)
        overlap = not wide and m - mr == 5 and m >= 6     # 5 left: a last 6-row block
        blocks, m_tiled = mr // rows + (1 if overlap else 0), m if overlap or four else mr
        bad = 0
        panels = np.empty((slots, k if layout == "rows" else 0, group * width), np.float32)
        across = k * group * width <= PANEL_ACROSS     # rows outer: stores along out's rows
        for cb in loop((tiles + group - 1) // group):
            t0 = group * np.int64(cb)
            t1 = min(t0 + group, tiles)
            panel = panels[numba.get_thread_id() if parallel else 0, :, :(t1 - t0) * width]
            src, jc = prepare(b, width * t0, panel)     # b's columns of tiles t0..t1, or b
            if wide:                        # one tile (group 1)
                j, q0 = width * t0, jc      # out's column, src's column
                q1, q2, q3 = q0 + LANES, q0 + 2 * LANES, q0 + 3 * LANES
                for i in range(0, mr, 4):
                    c00 = c01 = c02 = c03 = c10 = c11 = c12 = c13 = vzero()
                    c20 = c21 = c22 = c23 = c30 = c31 = c32 = c33 = vzero()
                    for p in range(0, k, step):
                        b0, b1 = load_b(src, p, q0), load_b(src, p, q1)
                        b2, b3 = load_b(src, p, q2), load_b(src, p, q3)
                        x = splat(a, i, p)
                        c00, c01, c02, c03 = (mac(c00, x, b0), mac(c01, x, b1),
                                              mac(c02, x, b2), mac(c03, x, b3))
                        x = splat(a, i + 1, p)
                        c10, c11, c12, c13 = (mac(c10, x, b0), mac(c11, x, b1),
                                              mac(c12, x, b2), mac(c13, x, b3))
                        x = splat(a, i + 2, p)
                        c20, c21, c22, c23 = (mac(c20, x, b0), mac(c21, x, b1),
                                              mac(c22, x, b2), mac(c23, x, b3))
                        x = splat(a, i + 3, p)
                        c30, c31, c32, c33 = (mac(c30, x, b0), mac(c31, x, b1),
                                              mac(c32, x, b2), mac(c33, x, b3))
                    bad += (_put4(out, i, j, c00, c01, c02, c03, counted)
                            + _put4(out, i + 1, j, c10, c11, c12, c13, counted)
                            + _put4(out, i + 2, j, c20, c21, c22, c23, counted)
                            + _put4(out, i + 3, j, c30, c31, c32, c33, counted))
                for i in range(mr, m):          # the rows past the last block of four
                    c0 = c1 = c2 = c3 = vzero()
                    for p in range(0, k, step):
                        x = splat(a, i, p)
                        c0, c1 = mac(c0, x, load_b(src, p, q0)), mac(c1, x, load_b(src, p, q1))
                        c2, c3 = mac(c2, x, load_b(src, p, q2)), mac(c3, x, load_b(src, p, q3))
                    bad += _put4(out, i, j, c0, c1, c2, c3, counted)
                continue
            nt = t1 - t0
            for u in range(blocks * nt):    # (block, tile) pairs, in the order of `across`
                ib, t = (u // nt, t0 + u % nt) if across else (u % blocks, t0 + u // blocks)
                i = min(6 * ib, m - 6)      # the last block may overlap the one before
                new = 6 * ib - i            # rows written before: not counted again
                j, q0 = width * t, jc + width * (t - t0)
                q1 = q0 + LANES
                c00 = c01 = c10 = c11 = c20 = c21 = vzero()
                c30 = c31 = c40 = c41 = c50 = c51 = vzero()
                for p in range(0, k, step):
                    b0, b1 = load_b(src, p, q0), load_b(src, p, q1)
                    x = splat(a, i, p)
                    c00, c01 = mac(c00, x, b0), mac(c01, x, b1)
                    x = splat(a, i + 1, p)
                    c10, c11 = mac(c10, x, b0), mac(c11, x, b1)
                    x = splat(a, i + 2, p)
                    c20, c21 = mac(c20, x, b0), mac(c21, x, b1)
                    x = splat(a, i + 3, p)
                    c30, c31 = mac(c30, x, b0), mac(c31, x, b1)
                    x = splat(a, i + 4, p)
                    c40, c41 = mac(c40, x, b0), mac(c41, x, b1)
                    x = splat(a, i + 5, p)
                    c50, c51 = mac(c50, x, b0), mac(c51, x, b1)
                bad += (_put2(out, i, j, c00, c01, counted and new <= 0)
                        + _put2(out, i + 1, j, c10, c11, counted and new <= 1)
                        + _put2(out, i + 2, j, c20, c21, counted and new <= 2)
                        + _put2(out, i + 3, j, c30, c31, counted and new <= 3)
                        + _put2(out, i + 4, j, c40, c41, counted and new <= 4)
                        + _put2(out, i + 5, j, c50, c51, counted and new <= 5))
            for t in range(t0, t1 if four else t0):
                j, q0 = width * t, jc + width * (t - t0)
                c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = vzero()
                for p in range(0, k, step):
                    b0, b1 = load_b(src, p, q0), load_b(src, p, q0 + LANES)
                    x0, x1, x2, x3 = splat(a, mr, p), splat(a, mr + 1, p), splat(
                        a, mr + 2, p), splat(a, mr + 3, p)
                    c00, c01, c10, c11 = mac(c00, x0, b0), mac(c01, x0, b1), mac(
                        c10, x1, b0), mac(c11, x1, b1)
                    c20, c21, c30, c31 = mac(c20, x2, b0), mac(c21, x2, b1), mac(
                        c30, x3, b0), mac(c31, x3, b1)
                bad += (_put2(out, mr, j, c00, c01, counted)
                        + _put2(out, mr + 1, j, c10, c11, counted)
                        + _put2(out, mr + 2, j, c20, c21, counted)
                        + _put2(out, mr + 3, j, c30, c31, counted))
            for i in range(m_tiled, m):     # then one row at a time
                for t in range(t0, t1):
                    j, q0 = width * t, jc + width * (t - t0)
                    q1 = q0 + LANES
                    c0 = c1 = vzero()
                    for p in range(0, k, step):
                        x = splat(a, i, p)
                        c0, c1 = mac(c0, x, load_b(src, p, q0)), mac(c1, x, load_b(src, p, q1))
                    bad += _put2(out, i, j, c0, c1, counted)
        two = wide and nw + 2 * LANES <= nl     # two or three vectors past the last tile:
        for ib in loop(m // 4 if two else 0):   # their first two, four rows at a time
            i = 4 * np.int64(ib)
            c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = vzero()
            for p in range(0, k, step):     # eight chains: the multiply-adds' latency is hidden
                b0, b1 = load_b(b, p, nw), load_b(b, p, nw + LANES)
                x0, x1, x2, x3 = splat(a, i, p), splat(a, i + 1, p), splat(a, i + 2, p), splat(
                    a, i + 3, p)
                c00, c01, c10, c11 = mac(c00, x0, b0), mac(c01, x0, b1), mac(c10, x1, b0), mac(
                    c11, x1, b1)
                c20, c21, c30, c31 = mac(c20, x2, b0), mac(c21, x2, b1), mac(c30, x3, b0), mac(
                    c31, x3, b1)
            bad += (_put2(out, i, nw, c00, c01, counted) + _put2(out, i + 1, nw, c10, c11, counted)
                    + _put2(out, i + 2, nw, c20, c21, counted)
                    + _put2(out, i + 3, nw, c30, c31, counted))
        for i in loop(m if nw < n else 0):      # the columns past the last tile
            for j in range(nw + 2 * LANES if two and i < m - m % 4 else nw, nl, LANES):
                c = vzero()
                for p in range(0, k, step):
                    c = mac(c, splat(a, i, p), load_b(b, p, j))
                vstore(out, i, j, c)
                if counted:
                    bad += vcount_nonfinite(out, c)
            for j in range(nl, n):
                acc = np.float32(0)
                for p in range(k):
                    acc = fma_scalar(load(a, (i, p)), b_at(b, p, j), acc)
                bad += store_counted(out, i, j, acc, counted)
        if counted:
            count[0] = bad

    return kernel


@functools.cache
def interleave_pairs_kernel(parallel: bool):
    """``kernel(b, packed)``: for bfloat16 bits ``b`` ``[k, n]`` (``k`` even; a ``b`` stored
    ``[k, n]``), ``packed[q, 2j + r] = b[2q + r, j]``: rows ``2q`` and ``2q + 1`` interleaved
    into pairs once (:func:`outer_block_kernel`'s ``"packed"`` layout), instead of at every load
    of a row by each block of four output rows. The parallel variant splits the pairs of rows."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(b, packed):
        k, n = b.shape
        for q in loop(k // 2):
            even, odd, row = b[2 * q], b[2 * q + 1], packed[q]
            for j in range(n):
                row[2 * j] = even[j]
                row[2 * j + 1] = odd[j]

    return kernel


@functools.cache
def transpose_kernel(parallel: bool):
    """``kernel(src, dst)``: ``dst = src.T`` in ``dst``'s type, ``src`` ``[r, c]`` (float32 or
    half bits, C-contiguous) into float32 ``dst`` ``[c, r]`` (or bfloat16 bits into bfloat16 bits:
    :func:`_pairs_copy`): blocks of ``LANES`` x ``LANES`` transposed in registers
    (``simd.vtranspose_block``), the rows and columns past the last full block one element at a
    time. It makes a product's strided operand contiguous (and float32) for
    :func:`outer_block_kernel`. float32 into float32 moves any 32-bit words bit for bit (no
    arithmetic): the bfloat16 pairs of ``W`` in ``x @ W.T``, packed for ``vdot_pairs``. The
    parallel variant splits the blocks of ``src``'s rows."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(src, dst):
        r, c = src.shape
        rl, cl = r - r % LANES, c - c % LANES
        for ib in loop(rl // LANES):
            i = LANES * np.int64(ib)
            for j in range(0, cl, LANES):
                vtranspose_block(src, i, j, dst, j, i)
            for j in range(cl, c):
                for q in range(i, i + LANES):
                    store(dst, (j, q), load(src, (q, j)))
        for q in range(rl, r):
            for j in range(c):
                store(dst, (j, q), load(src, (q, j)))

    return kernel


_PAIRS, _PACKED = outer_block_kernel(False, False, "pairs"), outer_block_kernel(False, False,
                                                                                  "packed")
_PACKED_COUNTED = outer_block_kernel(False, True, "packed")
_TRANSPOSE = transpose_kernel(False)
"""The serial kernels :func:`batch_pairs_kernel` and :func:`swapped_pairs_kernel` call: module
globals, so that their disk-cache keys stay the same from process to process (a closure over a
dispatcher pickles a per-process id)."""


@functools.cache
def swapped_pairs_kernel(parallel: bool, counted: bool):
    """``kernel(x, w, out, words, out_t, count)``: ``out = x @ w.T`` for bfloat16 bits ``x``
    ``[m, k]`` and ``w`` ``[n, k]`` (C-contiguous, ``k`` even; a layer's forward ``x @ W.T``),
    computed as ``out.T = w @ x.T``: ``x``'s pairs transposed as 32-bit words into ``words``
    (``[k / 2, m]`` float32 words, :func:`transpose_kernel`: ``x.T`` in the ``"packed"``
    layout), :func:`outer_block_kernel`'s ``vdot_pairs`` tile with ``w`` as its broadcast
    operand, read once in place, into ``out_t`` ``[n, m]`` (rounded and, with ``counted``,
    counted into ``count[0]`` as it is written), then ``out_t`` transposed into ``out``. The
    same bits as packing ``W`` in every finite element (each is the same sum in the same order)
    and the same count; where an overflowing product meets one of the other sign, an infinity
    can take another sign than the packed tile's scalar columns give (they round each product
    alone). What it saves is packing the weight, the big operand, on every call. Taken where ``m`` is the
    tile's width (:data:`SWAP_ROWS`). The parallel variant splits ``w``'s rows, in blocks of
    four, across the threads."""
    loop = loop_for(parallel)
    tile = _PACKED_COUNTED if counted else _PACKED
    parts = numba.config.NUMBA_NUM_THREADS if parallel else 1

    @jit(parallel)
    def kernel(x, w, out, words, out_t, count):
        _TRANSPOSE(x, words)
        n = w.shape[0]
        chunk = ((n + parts - 1) // parts + 3) // 4 * 4       # rows of w a thread
        counts = np.zeros(parts, np.int64)
        bits = words.view(np.int16)
        for t in loop(parts):
            r0 = min(chunk * np.int64(t), n)
            r1 = min(r0 + chunk, n)
            if r1 > r0:
                tile(w[r0:r1], bits, out_t[r0:r1], counts[t:t + 1])
        _TRANSPOSE(out_t, out)
        if counted:
            count[0] = counts.sum()

    return kernel


@functools.cache
def batch_pairs_kernel(parallel: bool, packed: bool):
    """``kernel(a, b, out, scratch)``: ``out[z] = a[z] @ b[z]`` for every matrix ``z`` of stacks
    of bfloat16 bits (``simd.HAS_BF16_DOT``, even ``k``): ``a`` ``[B, m, k]`` at any strides (a
    transposed view too), ``out`` ``[B, m, n]`` rows of unit stride, ``b`` ``[B, k, n]`` rows of
    unit stride (:func:`outer_block_kernel`'s ``"pairs"`` layout, read in place) or, with
    ``packed``, ``b``'s transpose as stored, ``[B, n, k / 2]`` 32-bit words (one pair each),
    packed per matrix into ``scratch[thread]`` (``[k / 2, n]`` float32 words) by
    :func:`transpose_kernel` for the ``"packed"`` layout. The attention products of the GPT in
    bfloat16: 64 heads of 64 x 64 x 32 in 110 us where widening, ``np.matmul`` and rounding
    took 372 (one Zen 4 core). The parallel variant splits the stack."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(a, b, out, scratch):
        count = np.zeros(1, np.int64)
        for z in loop(a.shape[0]):
            if packed:
                words = scratch[numba.get_thread_id() if parallel else 0]
                _TRANSPOSE(b[z], words)
                _PACKED(a[z], words.view(np.int16), out[z], count)
            else:
                _PAIRS(a[z], b[z], out[z], count)

    return kernel


def _batch_pairs_apply(a, b, out, ta: bool) -> bool:
    """Whether :func:`batch_pairs_kernel` computes ``batch_matmul`` of these operands and out:
    bfloat16 throughout, ``vdot_pairs``, an even ``k``, ``b`` and out contiguous, at least
    ``OUTER_MIN_ROWS`` rows and two vectors of columns (fewer: the columns one vector a row)."""
    (m, n), k = out.shape[-2:], a.shape[-2 if ta else -1]
    return (HAS_BF16_DOT and is_bfloat16(a.dtype) and a.dtype == b.dtype == out.dtype
            and k % 2 == 0 and b.flags.c_contiguous and out.flags.c_contiguous
            and m >= OUTER_MIN_ROWS and n >= 2 * LANES and out.size > 0)


def _batch_pairs_steps(a, b, out, ta: bool, tb: bool):
    """:func:`batch_pairs_kernel`'s step for ``batch_matmul`` where :func:`_batch_pairs_apply`."""
    (m, n), k = out.shape[-2:], a.shape[-2 if ta else -1]
    batch = out.size // (m * n)
    a3 = kview(a).reshape((batch,) + a.shape[-2:])
    a3 = np.swapaxes(a3, 1, 2) if ta else a3
    b3 = kview(b).reshape((batch,) + b.shape[-2:])
    if tb:                  # stored [n, k]: its words, packed per matrix
        b3 = b3.view(np.float32)
    scratch = np.empty((numba.config.NUMBA_NUM_THREADS, k // 2, n) if tb else (1, 0, 0),
                       np.float32)
    kernel = batch_pairs_kernel(use_parallel(out.size), tb)
    return [(kernel, (a3, b3, kview(out).reshape((batch, m, n)), scratch))]


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
                    xip, o = load(x, (i, p)), out[i, j0:j1]
                    for j in range(j1 - j0):
                        o[j] += xip * load(wp, j)

    return kernel


class OneThreadBlas:
    """A step function: ``fn(*args)`` with each BLAS library of ``libs`` that has more threads
    when it is called limited to one during the call, and given back the count it had then
    (threadpoolctl): a caller's own ``threadpool_limits`` around a graph's run stays in force,
    whatever the count was when the step was made."""

    __slots__ = ("fn", "libs", "__name__")

    def __init__(self, fn, libs):
        self.fn, self.libs = fn, list(libs)
        self.__name__ = f"{fn.__name__} (1 BLAS thread)"

    def __call__(self, *args):
        counts = [lib.num_threads for lib in self.libs]
        for lib, n in zip(self.libs, counts):
            if n > 1:
                lib.set_num_threads(1)
        try:
            return self.fn(*args)
        finally:
            for lib, n in zip(self.libs, counts):
                if n > 1:
                    lib.set_num_threads(n)


def _blas_step(a, b, out):
    """``out = a @ b`` through NumPy's BLAS (``np.dot``; ``np.matmul`` for stacks) on the
    threads that pay (see the module docstring): from ``ONE_THREAD_BELOW`` multiply-adds split
    across Numba's threads (``blas_split``) where they are the one pool, else BLAS's own threads;
    from ``ONE_THREAD_FROM`` BLAS on one thread; below, as BLAS decides (one thread). In the one
    pool every product from ``ONE_THREAD_FROM`` runs with BLAS on one thread whatever its count
    when the plan was built (:class:`OneThreadBlas` checks at each call): a plan built inside a
    ``threadpool_limits(1)`` block and run outside it must not call a threaded BLAS from Numba's
    threads, nor wake BLAS's spinning ones."""
    (m, k), n = a.shape[-2:], b.shape[-1]
    macs = m * k * n * math.prod(a.shape[:-2])
    pooled = one_pool()
    step = (blas_split.split_step(a, b, out) if pooled and macs >= ONE_THREAD_BELOW
            else None) or (np.dot if a.ndim == 2 else np.matmul, (a, b, out))
    if macs >= ONE_THREAD_FROM and pooled:
        return OneThreadBlas(step[0], numpy_blas()), step[1]
    multithreaded = [lib for lib in numpy_blas() if lib.num_threads > 1]
    if multithreaded and ONE_THREAD_FROM <= macs < ONE_THREAD_BELOW:
        return OneThreadBlas(step[0], multithreaded), step[1]
    return step


def _vector_kinds() -> set:
    """The kernel dtypes :mod:`simd` vectors load and store (float16 bits on F16C's path only)."""
    return {np.dtype(np.float32), np.dtype(np.int16)} | (
        {np.dtype(np.uint16)} if fp16.PATH == "intrinsic" else set())


def _outer_fits(a, b, out, paired: bool) -> bool:
    """Whether :func:`outer_block_kernel` computes ``out = a @ b`` (kernel views; see the module
    docstring); ``paired``: with ``vdot_pairs``, which beats BLAS on a big strided ``a`` too."""
    m, n = a.shape[0], b.shape[1]
    return ({a.dtype, b.dtype, out.dtype} <= _vector_kinds() and b.strides[1] == b.itemsize
            and out.strides[1] == out.itemsize and n >= OUTER_MIN_COLS and m >= OUTER_MIN_ROWS
            and (a.flags.c_contiguous or a.size < BIG or paired))


def _packs(a, b, out) -> bool:
    """Whether ``out = x @ W.T`` (bfloat16 bits, ``b = W.T``) packs ``W`` into pairs for
    :func:`outer_block_kernel`: from ``PACK_MIN_ROWS`` rows of ``x``, or from
    ``OUTER_MIN_ROWS`` where ``k`` is a multiple of 32 (:func:`_dot_pairs_takes` has declined
    it: fewer than ``DOT_PAIRS_K_PER_ROW`` steps of ``k`` a row of out)."""
    (m, k), n = a.shape, b.shape[1]
    rows = OUTER_MIN_ROWS if k % 32 == 0 else PACK_MIN_ROWS
    return (b.flags.f_contiguous and not b.flags.c_contiguous and a.flags.c_contiguous
            and out.dtype in _vector_kinds() and m >= rows and n >= OUTER_MIN_COLS)


def _dot_pairs_takes(a, b, out) -> bool:
    """Whether :func:`dot_pairs_kernel` computes ``out = a @ b`` (bfloat16 bits, ``b = W.T``
    of a C-contiguous ``W``, ``k`` a positive multiple of 32): where the packed tile cannot
    (fewer than ``OUTER_MIN_ROWS`` rows; a ``W`` of fewer than ``OUTER_MIN_COLS`` rows, at any
    number of rows: the wide MLP's last layer at batch 256, 256 x 1024 x 10, 44 us against 134
    for BLAS on widened copies and a rounding pass, one Zen 4 core), or where ``k`` is at least
    ``DOT_PAIRS_K_PER_ROW`` times the rows (at most ``DOT_MAX_ROWS``)."""
    (m, k), n = a.shape, b.shape[1]
    return (b.T.flags.c_contiguous and a.flags.c_contiguous
            and out.dtype in (np.dtype(np.float32), np.dtype(np.int16))
            and out.strides[1] == out.itemsize and k % 32 == 0 and k > 0
            and (m < OUTER_MIN_ROWS or n < OUTER_MIN_COLS
                 or DOT_PAIRS_K_PER_ROW * m <= k and m <= DOT_MAX_ROWS))


def _dot_block_takes(m: int, k: int, n: int) -> bool:
    """Whether :func:`dot_block_kernel` computes ``x @ W.T`` of these sizes (module docstring;
    any product below ``TINY``)."""
    return k >= DOT_MIN_K and k * n >= BIG and m <= DOT_MAX_ROWS or m * k * n < TINY


def _loop_step(a, b, out):
    """A Numba loop computing ``out = a @ b`` into a float32 or float64 ``out`` (see the module
    docstring), or None where BLAS is faster. ``a`` and ``b`` may be ``.T`` views and kernel
    views of a half type (their bits: the loops widen each element as they load it)."""
    (m, k), n = a.shape, b.shape[1]
    transposed = b.flags.f_contiguous and not b.flags.c_contiguous
    if transposed and a.flags.c_contiguous and _dot_block_takes(m, k, n):
        return dot_block_kernel(use_parallel(b.size)), (a, b.T, out)
    if m < OUTER_MIN_ROWS and not transposed and k * n >= BIG and a.flags.c_contiguous:
        return rows_times_kernel(use_parallel(b.size)), (a, b, out)
    return None


def _product_step(a, b, out):
    """The step computing ``out = a @ b`` (a, b possibly ``.T`` views, of out's dtype) where
    :func:`outer_block_kernel` does not: a loop where one is faster, else BLAS."""
    return _loop_step(a, b, out) or _blas_step(a, b, out)


def _widened(x, steps: list, most: float = np.inf):
    """``x`` widened into float32 scratch by a step appended to ``steps`` if it is a half type of
    at most ``most`` elements, else ``x`` itself."""
    if x.dtype.itemsize != 2 or x.size > most:
        return x
    wide = np.empty(x.shape, np.float32)
    steps += cast_steps(x, wide)
    return wide


def _transposed_copies(a, b, out, ta: bool, tb: bool) -> tuple:
    """``(copy_a, copy_b)``: whether ``out = op(a) @ op(b)`` (``op`` = transpose where ``ta`` /
    ``tb``) first copies ``op(a)`` / ``op(b)`` contiguous in float32 (:func:`transpose_kernel`,
    widening a half operand in the same pass) so that :func:`outer_block_kernel` takes a product
    it would otherwise leave to BLAS, which packs both operands at every call. Only where out's
    columns fill whole register tiles (a multiple of ``OUTER_MIN_COLS``: the kernel's columns
    past them are single vectors and dot products, and the copies lost there, 0.51-0.76 at
    100 x 300 x 200 and 256 x 300 x 500). Times are one core's, old / new:

    * ``a`` transposed and big (``BIG`` elements; the weight gradient ``dy.T @ x`` from batch 256
      at 1024 features): 1024 x 256 x 1024 in float32 6004 / 5370 us with the count, float16
      5687 / 4906 (batch 512: 11248 / 10235).
    * ``a`` transposed and out ``COPY_A_MIN_COLS`` columns wide or more, from ``COPY_MIN_WORK``
      multiply-adds (the weight gradients of the wide MLP at batch 16 and 64): the tile
      broadcasts ``a[i, p]`` for ``p < k``, ``k`` elements a row's width apart in ``dy``; at 4
      KiB apart (1024 features) they all fall in one set of the L1 cache (8 ways), so from 16
      steps of ``k`` every tile reads them again from L2, and the 6-row AVX2 tile reads them once
      per 16 columns. One Zen 4 core, old (``dy.T`` read as stored, widened first where it is
      bfloat16) / new (copied, then the product), float32 and bfloat16 ``dy``: as AVX2 1024 x 16
      x 1024 601 / 427, 614 / 492; 1024 x 64 x 1024 1695 / 1337, 1611 / 1416; 256 x 16 x 256 31
      / 25, 35 / 31; 10 x 64 x 1024 27 / 17; with AVX-512 1024 x 16 x 1024 443 / 338, 391 / 377;
      1024 x 64 x 256 354 / 319, 337 / 327; at 128 columns the new takes 0.85-0.90 of the time
      as AVX2, 0.95-1.00 with AVX-512. At 64 columns the AVX-512 tile (64 wide) reads ``a`` once
      and the copy lost (1024 x 64 x 64: 87 / 96); below ``COPY_MIN_WORK`` its call costs more
      than it saves (10 x 64 x 128: 2.6 / 3.1).
    * ``b`` transposed (``x @ W.T``) wherever :func:`dot_block_kernel` does not take it, from
      ``COPY_MIN_ROWS`` rows or ``COPY_MIN_WORK`` multiply-adds: 256 x 1024 x 1024 float32 5784
      / 5518 us, float16 6573 / 6085; the first layer of the wide MLP, k = 64, at batch 16 / 64 /
      256: 55.9 / 38.0, 131 / 96, 442 / 351 us (float16 62.5 / 37.7, 143 / 96, 475 / 328); the
      digits MLP's 16 x 64 x 128: 7.0 / 3.7 us; 64 x 256 x 512: 220 / 175 us. At 8 x 64 x 128 the
      copy lost (2.2 / 2.8 us), at 4 x 64 x 1024 it won (37.9 / 18.9).

    Only for C-contiguous operands whose types, and out's, the vectors load and store (float32,
    half bits), and only where the other operand then suits the kernel (rows of unit stride,
    ``OUTER_MIN_ROWS`` rows)."""
    (m, n), k = out.shape, a.shape[0 if ta else 1]
    if (not {kview(a).dtype, kview(b).dtype, kview(out).dtype} <= _vector_kinds()
            or not (a.flags.c_contiguous and b.flags.c_contiguous)):
        return False, False
    fits = n % OUTER_MIN_COLS == 0 and m >= OUTER_MIN_ROWS
    copy_b = (fits and tb and not _dot_block_takes(m, k, n)
              and (m >= COPY_MIN_ROWS or m * k * n >= COPY_MIN_WORK))
    read_across = n >= COPY_A_MIN_COLS and m * k * n >= COPY_MIN_WORK
    copy_a = fits and ta and (a.size >= BIG or read_across) and (copy_b or not tb)
    return copy_a, copy_b


def _transposed(x, steps: list):
    """``x.T`` copied into float32 scratch (C-contiguous) by a step appended to ``steps``."""
    copy = np.empty(x.shape[::-1], np.float32)
    steps.append((transpose_kernel(use_parallel(x.size)), (kview(x), copy)))
    return copy


def _pairs_copy(a, steps: list):
    """bfloat16 bits ``a`` stored transposed (a ``.T`` view of a C-contiguous array: the weight
    gradient's ``dy.T``) copied C-contiguous by a step appended to ``steps`` (16-bit words: widened
    and rounded back, exact but for a NaN's payload, which the product loses anyway), so that
    :func:`outer_block_kernel`'s paired tile broadcasts each pair ``a[i, p:p + 2]`` from one 32-bit
    load rather than two loads through the strides (``simd.vsplat_pair``); see
    :data:`PAIRS_COPY_MIN_COLS`."""
    copy = np.empty(a.shape, a.dtype)
    steps.append((transpose_kernel(use_parallel(a.size)), (a.T, copy)))
    return copy


def _bucket(x: int) -> int:
    """The power of two at or above ``x`` (a class's size: sizes within a factor of two share)."""
    return 1 << max(0, x - 1).bit_length()


def build_matmul(node, ins, outs):
    """``out = op(a) @ op(b)`` (2-D; ``op`` = transpose when ``transpose_a``/``transpose_b``);
    with ``count_not_finite`` also ``outs[1][0]`` = the number of non-finite elements of out.

    The steps of the candidate of :data:`CANDIDATES` (the built-in rules, :func:`numba_steps`;
    BLAS alone, :func:`blas_steps`; BLAS on one thread; oneMKL's half-type GEMM on AMX,
    :func:`mkl_steps`, or the same in blocks of out's rows, :func:`mkl_blocked_steps`, where
    ``mkl_gemm.offered``, its class saying ``amx``) that ``tune``
    measures fastest for the product's class on this machine (``MINIFLOW_MATMUL`` overrides):
    its dtypes, transposes, counting and the powers of two at or above ``m``, ``k`` and ``n``."""
    a, b, out = ins[0], ins[1], outs[0]
    ta, tb = node.attrs.get("transpose_a", False), node.attrs.get("transpose_b", False)
    (m, n), k = out.shape, a.shape[0 if ta else 1]
    mkl = mkl_gemm.offered(a.T if ta else a, b.T if tb else b, out)
    key = (f"{a.dtype.name}{'.T' if ta else ''} @ {b.dtype.name}{'.T' if tb else ''} -> "
           f"{out.dtype.name}{' counted' if len(outs) > 1 else ''} "
           f"m{_bucket(m)} k{_bucket(k)} n{_bucket(n)}{' amx' if mkl else ''}")
    candidates = CANDIDATES if mkl else {k: v for k, v in CANDIDATES.items() if k not in MKL}
    return tune.choose("matmul", key, node, ins, outs, candidates)


def _target(out, counted: bool):
    """Where a product that is not rounded in its kernel's stores goes: out itself, or float32
    scratch for a half (or float32 for a counted) out."""
    half = out.dtype.itemsize == 2
    return np.empty(out.shape, np.float32 if half else out.dtype) if half or counted else out


def _into_out(target, outs) -> list:
    """Steps rounding ``target`` into ``outs[0]`` (if it is another array), counting its
    non-finite elements into ``outs[1]`` where the node counts."""
    if len(outs) > 1:               # count_not_finite: counted where the product is rounded
        return cast_count_steps(target, outs[0], outs[1])
    return cast_steps(target, outs[0]) if target is not outs[0] else []


def blas_steps(node, ins, outs, product=_blas_step):
    """:func:`build_matmul`'s steps through BLAS alone: half operands widened into float32
    scratch, one ``np.dot`` (``product``'s step), the product rounded into a half out (and
    counted) by one pass."""
    a, b, out = ins[0], ins[1], outs[0]
    ta, tb = node.attrs.get("transpose_a", False), node.attrs.get("transpose_b", False)
    steps = []
    target = _target(out, len(outs) > 1)
    a, b = _widened(a, steps), _widened(b, steps)
    steps.append(product(a.T if ta else a, b.T if tb else b, target))
    return steps + _into_out(target, outs)


def _one_thread_differs() -> bool:
    """Whether one BLAS thread is not how :func:`_blas_step` runs every product anyway: BLAS
    has more threads, or products split across Numba's (``common.one_pool``)."""
    return any(lib.num_threads > 1 for lib in numpy_blas()) or one_pool()


def _one_thread_step(a, b, out):
    """``out = a @ b`` by one ``np.dot`` (``np.matmul`` for stacks) with BLAS on one thread
    (:class:`OneThreadBlas`)."""
    return OneThreadBlas(np.dot if a.ndim == 2 else np.matmul, numpy_blas()), (a, b, out)


def blas_one_thread_steps(node, ins, outs):
    """:func:`blas_steps` with BLAS on one thread for the product, never split
    (:func:`_one_thread_step`), or None where BLAS has one thread and nothing splits: on a
    machine whose other cores are busy, a threaded BLAS waits for threads that are not
    scheduled, and the tuner measures whether it does."""
    return blas_steps(node, ins, outs, _one_thread_step) if _one_thread_differs() else None


def packed_steps(node, ins, outs):
    """:func:`build_matmul`'s steps through the packed GEMM (``packed_gemm.packed_kernel``: both
    operands widened into packed float32 panels, BLIS's loop nest, out rounded and counted as it
    is stored), or None where its vectors do not take the types (float64; float16 off F16C's
    path) or out's rows are not of unit stride. One step, no scratch of out's size: where a half
    product's candidates go through float32 copies and a rounding pass, it reads the half
    operands once and writes out once."""
    a, b, out = ins[0], ins[1], outs[0]
    ta, tb = node.attrs.get("transpose_a", False), node.attrs.get("transpose_b", False)
    bits_a, bits_b, bits_out = kview(a), kview(b), kview(out)
    if (not {bits_a.dtype, bits_b.dtype, bits_out.dtype} <= _vector_kinds() or a.ndim != 2
            or bits_out.strides[1] != bits_out.itemsize):
        return None
    counted = len(outs) > 1
    count = outs[1].reshape(-1) if counted else np.zeros(1, np.int64)
    kernel = packed_kernel(use_parallel(out.size), bits_a.dtype, bits_b.dtype, bits_out.dtype)
    return [(kernel, (bits_a.T if ta else bits_a, bits_b.T if tb else bits_b, bits_out, count,
                      counted))]


def mkl_steps(node, ins, outs):
    """:func:`build_matmul`'s steps through oneMKL's half-type GEMM (``mkl_gemm``, on AMX): the
    float32 product into out (float32, not counted) or into float32 scratch, rounded into a half
    out (and counted) by one pass, as :func:`blas_steps`.

    Raises:
        MissingExtraError: oneMKL is not installed (the ``amx`` extra).
        ValueError: oneMKL does not take the product (``mkl_gemm.takes``).
    """
    a, b, out = ins[0], ins[1], outs[0]
    ta, tb = node.attrs.get("transpose_a", False), node.attrs.get("transpose_b", False)
    target = _target(out, len(outs) > 1)
    step = mkl_gemm.gemm_step(a.T if ta else a, b.T if tb else b, target)
    return [step] + _into_out(target, outs)


def mkl_blocked_steps(node, ins, outs):
    """:func:`mkl_steps` in blocks of out's rows, each rounded while it is in cache: for each
    block of ``mkl_gemm.block_rows`` rows one oneMKL call computes its float32 product into one
    scratch block (``mkl_gemm.BLOCK_BYTES``, reused by every block) and one pass rounds it into
    out's rows (counting each block's non-finite elements, summed by one last step, where the
    node counts). :func:`mkl_steps` writes the whole float32 product and then reads it back to
    round it: from the L3 cache or memory once it is bigger than L2 (the weight gradient ``dy.T
    @ x`` of a 1024 x 1024 layer: 4 MiB). None where nothing is rounded (a float32 out, not
    counted) or out is one block.

    One core of an Intel Xeon (Sapphire Rapids), oneMKL 2026.2, ``dy.T @ x`` in bfloat16 into a
    bfloat16 out, 1024 x 256 x 1024: 1534-1762 us in blocks of 128 or 256 rows against
    1851-2209 us in one call (its rounding pass alone 600 us, reading 4 MiB from L3); 1024 x 64
    x 1024: 1064 against 1827 (``benchmarks/README.md``, "Third round on the Intel machine").

    Raises:
        MissingExtraError: oneMKL is not installed (the ``amx`` extra).
        ValueError: oneMKL does not take the product (``mkl_gemm.takes``).
    """
    a, b, out = ins[0], ins[1], outs[0]
    ta, tb = node.attrs.get("transpose_a", False), node.attrs.get("transpose_b", False)
    counted = len(outs) > 1
    rows = mkl_gemm.block_rows(out.shape[1])
    if not (counted or out.dtype.itemsize == 2) or out.shape[0] <= rows:
        return None
    a, b = (a.T if ta else a), (b.T if tb else b)
    scratch = np.empty((rows, out.shape[1]), np.float32)
    starts = range(0, out.shape[0], rows)
    counts = np.zeros(len(starts), np.int64)
    steps = []
    for q, i in enumerate(starts):
        block = scratch[:min(rows, out.shape[0] - i)]
        steps.append(mkl_gemm.gemm_step(a[i:i + len(block)], b, block))
        steps += _into_out(block, [out[i:i + len(block)]] + ([counts[q:q + 1]] if counted else []))
    if counted:
        steps.append((sum_counts_kernel, (counts, outs[1].reshape(-1))))
    return steps


def numba_steps(node, ins, outs):
    """:func:`build_matmul`'s steps by the built-in rules (the module docstring).

    :func:`outer_block_kernel` writes out in its own type and counts as it writes. Otherwise the
    product goes into a float32 scratch (for a half or counted out) and one pass rounds it into
    out, counting. Half operands of a product of ``TINY`` multiply-adds or more: small ones
    (activations, gradients, ``WIDEN_MAX``) and ones each of whose elements is used
    ``WIDEN_REUSE`` times or more are widened into float32 scratch once; the others (a weight at a small batch) are read as they are by the loops (widened as
    they load; ``vdot_pairs`` reads bfloat16 pairs directly), and widened for BLAS. Operands
    stored transposed are copied where :func:`_transposed_copies` says (for ``vdot_pairs``,
    which packs its own ``b``, only ``a``: :func:`_pairs_copy`)."""
    a, b, out = ins[0], ins[1], outs[0]
    ta, tb = node.attrs.get("transpose_a", False), node.attrs.get("transpose_b", False)
    counted = len(outs) > 1
    count = outs[1].reshape(-1) if counted else np.zeros(1, np.int64)
    paired = (HAS_BF16_DOT and a.dtype == b.dtype and is_bfloat16(a.dtype)
              and a.shape[0 if ta else 1] % 2 == 0)
    steps = []
    if not paired:      # transposed copies where they pay, then widen small or much reused halves
        (m, n), k = out.shape, a.shape[0 if ta else 1]
        copy_a, copy_b = _transposed_copies(a, b, out, ta, tb)
        tiny = m * k * n < TINY                 # no widening: read as they are
        a = (_transposed(a, steps) if copy_a
             else _widened(a, steps, -1 if tiny else np.inf if n >= WIDEN_REUSE else WIDEN_MAX))
        b = (_transposed(b, steps) if copy_b
             else _widened(b, steps, -1 if tiny else np.inf if m >= WIDEN_REUSE else WIDEN_MAX))
        ta, tb = ta and not copy_a, tb and not copy_b
    bits_a, bits_b = kview(a).T if ta else kview(a), kview(b).T if tb else kview(b)
    bits_out = kview(out)
    if _outer_fits(bits_a, bits_b, bits_out, paired):
        if (paired and bits_a.flags.f_contiguous and not bits_a.flags.c_contiguous
                and out.shape[1] >= PAIRS_COPY_MIN_COLS):
            bits_a = _pairs_copy(bits_a, steps)     # dy.T: each pair one 32-bit load
        if paired and out.shape[0] >= PACK_MIN_ROWS:    # b's rows interleaved in pairs once
            packed = np.empty((bits_b.shape[0] // 2, 2 * bits_b.shape[1]), np.int16)
            return steps + [(interleave_pairs_kernel(use_parallel(packed.size)), (bits_b, packed)),
                            (outer_block_kernel(use_parallel(out.size), counted, "packed"),
                             (bits_a, packed, bits_out, count))]
        kernel = outer_block_kernel(use_parallel(out.size), counted, "pairs" if paired else "rows")
        return steps + [(kernel, (bits_a, bits_b, bits_out, count))]
    if paired and _dot_pairs_takes(bits_a, bits_b, bits_out):   # x @ W.T at a small batch
        return [(dot_pairs_kernel(use_parallel(bits_a.size + bits_b.size), counted),
                 (bits_a, bits_b.T, bits_out, count))]
    if paired and _packs(bits_a, bits_b, bits_out):     # x @ W.T in bfloat16: W packed in pairs
        w = bits_b.T
        if out.shape[0] == SWAP_ROWS:                   # ... or out.T = W @ x.T, W as stored
            words = np.empty((w.shape[1] // 2, out.shape[0]), np.float32)
            out_t = np.empty(out.shape[::-1], bits_out.dtype)
            return [(swapped_pairs_kernel(use_parallel(out.size), counted),
                     (bits_a.view(np.float32), w, bits_out, words, out_t, count))]
        packed = np.empty((w.shape[1] // 2, w.shape[0]), np.float32)      # words, not numbers
        return [(transpose_kernel(use_parallel(w.size)), (w.view(np.float32), packed)),
                (outer_block_kernel(use_parallel(out.size), counted, "packed"),
                 (bits_a, packed.view(np.int16), bits_out, count))]
    target = _target(out, counted)
    step = _loop_step(bits_a, bits_b, target) if out.dtype.itemsize == 2 else None
    if step is not None:
        steps.append(step)
    else:                                   # BLAS: the product in float32 on widened copies
        a, b = _widened(a, steps), _widened(b, steps)
        steps.append(_product_step(a.T if ta else a, b.T if tb else b, target))
    return steps + _into_out(target, outs)


def _layout(x) -> str:
    """``C`` (C-contiguous), ``F`` (a transposed view of one) or ``S`` (other strides)."""
    return "C" if x.flags.c_contiguous else "F" if x.flags.f_contiguous else "S"


def _gemm_blas(node, ins, outs):
    """A GEMM candidate: ``np.dot`` (``np.matmul`` for stacks) on the threads
    :func:`_blas_step` gives it (split across Numba's where they are the one pool)."""
    return [_blas_step(ins[0], ins[1], outs[0])]


def _gemm_blas_one_thread(node, ins, outs):
    """A GEMM candidate: one ``np.dot`` (``np.matmul``) on one BLAS thread
    (:func:`_one_thread_step`), or None where :func:`_gemm_blas` runs so anyway
    (:func:`_one_thread_differs`)."""
    return [_one_thread_step(ins[0], ins[1], outs[0])] if _one_thread_differs() else None


def _gemm_tile(node, ins, outs):
    """A GEMM candidate: :func:`outer_block_kernel` where it computes the 2-D float32 product
    (``_outer_fits``), else None."""
    a, b, out = ins[0], ins[1], outs[0]
    if a.ndim != 2 or out.dtype != np.float32 or not _outer_fits(a, b, out, False):
        return None
    return [(outer_block_kernel(use_parallel(out.size), False, "rows"),
             (a, b, out, np.zeros(1, np.int64)))]


GEMM_CANDIDATES = {"blas": _gemm_blas, "blas 1 thread": _gemm_blas_one_thread,
                   "tile": _gemm_tile}
"""The tuner's candidates for a GEMM of another kernel (:func:`gemm_steps`): BLAS, the built-in
rule, first."""


def gemm_steps(a, b, out) -> list:
    """Steps for ``out = a @ b``, float32 or float64, 2-D (``np.dot``) or stacks of matrices
    (``np.matmul``; Winograd's 16 products): the candidate of :data:`GEMM_CANDIDATES` ``tune``
    measured fastest for the GEMM's class on this machine (its dtype, the powers of two at or
    above ``m``, ``k``, ``n`` and the stack, each operand's layout, the threads in force). The
    convolutions' im2col and Winograd GEMMs (``conv``) go through it.

    Raises:
        ValueError: ``MINIFLOW_MATMUL`` is not one of ``tune.MODES``."""
    (m, k), n = a.shape[-2:], b.shape[-1]
    stack = f"s{_bucket(a.shape[0])} " if a.ndim == 3 else ""
    key = (f"{a.dtype.name} {stack}m{_bucket(m)} k{_bucket(k)} n{_bucket(n)} "
           f"a{_layout(a)} b{_layout(b)} out{_layout(out)}")
    return tune.choose("gemm", key, None, [a, b], [out], GEMM_CANDIDATES)


CANDIDATES = {"numba": numba_steps, "blas": blas_steps, "blas 1 thread": blas_one_thread_steps,
              "packed": packed_steps, "mkl": mkl_steps, "mkl blocked": mkl_blocked_steps}
"""The tuner's candidates for a product (``tune.choose``): the built-in rules first; one entry
per candidate (``(node, ins, outs) -> steps``, or None where it does not apply). Those named
``mkl...`` (:data:`MKL`) are offered only where ``mkl_gemm.offered``."""
MKL = ("mkl", "mkl blocked")
"""The candidates that call oneMKL (``mkl_gemm``)."""

_PER_BATCH = batched(build_matmul)


def takes_strided(node) -> bool:
    """Whether ``node``'s steps read its operands and write its out as the arrays they are
    given, at any strides: a ``batch_matmul`` of operands and out of one dtype, float32 or
    float64, non-empty (:func:`build_batch_matmul`'s one ``np.matmul``, which calls BLAS on
    every matrix of a stack whose rows or columns are contiguous). The plan then gives it the
    transpose of an operand, or of its out, as a strided view, no copy (``runtime.plan.allocate``:
    the GPT's attention heads, split and merged; fp32 step, one core: 16 ``transpose`` nodes,
    1.8 ms, none left)."""
    if node.op.name != "batch_matmul" or len(node.outputs) != 1:
        return False
    dtypes = {v.dtype.np for v in (*node.inputs, node.outputs[0])}
    return (len(dtypes) == 1 and np.dtype(dtypes.pop()) in (np.float32, np.float64)
            and all(n > 0 for n in node.outputs[0].shape))


def _batch_blas(node, ins, outs):
    """``batch_matmul``'s steps as one ``np.matmul`` over the stacks (operands and out of one
    dtype; half types widened into float32 scratch, the product rounded back and counted by one
    pass each)."""
    a, b, out = ins[0], ins[1], outs[0]
    steps = []
    target = _target(out, len(outs) > 1)
    a, b = _widened(a, steps), _widened(b, steps)
    a = np.swapaxes(a, -1, -2) if node.attrs.get("transpose_a", False) else a
    b = np.swapaxes(b, -1, -2) if node.attrs.get("transpose_b", False) else b
    return steps + [_blas_step(a, b, target)] + _into_out(target, outs)


def _batch_paired(node, ins, outs):
    """``batch_matmul``'s steps by :func:`batch_pairs_kernel` where it applies (not counted,
    :func:`_batch_pairs_apply`), else :func:`_batch_blas`."""
    a, b, out = ins[0], ins[1], outs[0]
    ta, tb = node.attrs.get("transpose_a", False), node.attrs.get("transpose_b", False)
    if len(outs) > 1 or not _batch_pairs_apply(a, b, out, ta):
        return _batch_blas(node, ins, outs)
    return _batch_pairs_steps(a, b, out, ta, tb)


BATCH_CANDIDATES = {"numba": _batch_paired, "blas": _batch_blas}
"""The tuner's candidates for a bfloat16 ``batch_matmul`` the paired tile takes: the tile (the
rule: 3.4x the widened BLAS products on Zen 4) and BLAS on widened copies (Sapphire Rapids issues
``vdpbf16ps`` at half the FMAs' rate)."""


def build_batch_matmul(node, ins, outs):
    """``batch_matmul``'s steps: one ``np.matmul`` over the stacks where the operands and out
    share one dtype (NumPy calls BLAS for every product from C: the GPT's attention products, 64
    of 64 x 64 x 32 per node, took 255-287 us per node this way against 570 us as 64 steps).
    Half types as :func:`blas_steps` does a 2-D product: each operand widened into float32
    scratch by one pass, the float32 product rounded into out (and counted, for
    ``count_not_finite``) by one pass (AMP fp16 GPT step: 12 nodes 9.6 -> 4.0 ms against 64
    products per node, each with its own widening). bfloat16 where the CPU has ``vdot_pairs``:
    :func:`batch_pairs_kernel` or that, as the tuner measured them on this machine
    (:data:`BATCH_CANDIDATES`; the class: the powers of two at or above the stack, ``m``, ``k``
    and ``n``, and the transposes). Other dtype mixes: one :func:`build_matmul` product per batch
    index (``kernels.common.batch``).

    Raises:
        ValueError: ``MINIFLOW_MATMUL`` is not one of ``tune.MODES``."""
    a, b, out = ins[0], ins[1], outs[0]
    if not (a.dtype == b.dtype == out.dtype) or out.size == 0:
        return _PER_BATCH(node, ins, outs)
    ta, tb = node.attrs.get("transpose_a", False), node.attrs.get("transpose_b", False)
    if len(outs) > 1 or not _batch_pairs_apply(a, b, out, ta):
        return _batch_blas(node, ins, outs)
    (m, n), k = out.shape[-2:], a.shape[-2 if ta else -1]
    key = (f"{a.dtype.name} s{_bucket(out.size // (m * n))} m{_bucket(m)} k{_bucket(k)} "
           f"n{_bucket(n)} ta{int(ta)} tb{int(tb)}")
    return tune.choose("batch_matmul", key, node, ins, outs, BATCH_CANDIDATES)


BUILDERS = {"matmul": build_matmul, "batch_matmul": build_batch_matmul}
"""Op type -> builder."""
