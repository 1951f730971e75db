"""A packed GEMM for the CPU: both operands widened to float32 and packed contiguous, then one
register tile per block of out (Goto and van de Geijn, "Anatomy of high-performance matrix
multiplication", ACM TOMS 34(3), 2008; BLIS's ``bli_gemm`` loop nest).

``out = a @ b`` for ``a`` ``[m, k]`` and ``b`` ``[k, n]`` of any strides (a ``.T`` view too),
float32 or half bits (``fp16``: float16 as ``uint16`` on the ``"intrinsic"`` path, bfloat16 as
``int16``), out float32 or half bits, rounded once as each element is stored:

1. ``a`` is packed into ``ap[m / MR, k, MR]`` float32 (a column of ``MR`` rows of ``a`` per step,
   rows past ``m`` zero), read in the order of its smaller stride;
2. for each panel of ``NR`` columns of out (the parallel variant splits the panels between the
   threads), the panel of ``b`` is packed into ``bp[k, NR]`` float32 (columns past ``n`` zero;
   ``b`` stored transposed, a layer's ``W.T``, is transposed in registers, ``LANES`` x ``LANES``
   blocks at a time: ``simd.vtranspose_block``);
3. per block of ``MR`` rows (the last by a ``TAIL``-row tile where it has that few rows: at 16
   rows the 6-row tile on AVX2 did 18 rows' work, 445 -> 421 us for a bfloat16 ``x @ W.T`` of
   16 x 1024 x 1024), ``simd.tile_intrinsic``'s register tile runs ``p`` over
   ``KC`` steps at a time, all the blocks of one panel reading the same ``KC`` rows of ``bp``
   from L1 before the next ``KC`` (the accumulators of each block wait in a float32 scratch
   ``[m / MR, MR, NR]`` between them: stored and reloaded exactly);
4. the block is rounded into out (and, with ``counted``, its non-finite elements counted).

Every element of out is ``fma(a[i, p], b[p, j], acc)`` for ``p = 0, 1, ...`` from zero, one
rounding each: the bits of ``matmul.outer_block_kernel``'s float32 tile, on any CPU, whatever
the tile and ``KC``; run to run the same.

Measured and left out (one Sapphire Rapids core, bfloat16): reading ``b``'s rows in place,
widened as they load, instead of packing its panels: 43-101 GFLOP/s against 52-111 packed for
``dy @ W`` at 16-256 x 1024 x 1024 (with 2 KiB between rows, a block of ``KC`` rows falls into
few L1 sets; ``matmul.outer_block_kernel`` measured the same for float32).

Why (issue 23): on one core of an Intel Xeon (Sapphire Rapids), ``vdpbf16ps`` zmm issues one
every two cycles (16 independent accumulators: 106 GFLOP/s, where ``vfmadd231ps`` reaches 214),
so bfloat16 products run faster widened into float32 FMAs than on AVX512-BF16's dot product,
and the unpacked register tile (``a``'s elements loaded one by one, a 4 x 64 tile reading
``b`` from L2) reached 50-60 GFLOP/s there. The tile shape is the target's (``target.ISA.packed``).
"""
from __future__ import annotations

import functools

import numba
import numpy as np

from .common import jit, jitable, loop_for, store_counted
from .fp16 import load
from .simd import LANES, tile_intrinsic, vcount_nonfinite, vload, vstore, vtranspose_block
from .target import ISA

__all__ = ["MR", "NR", "KC", "TAIL", "packed_kernel"]

MR, VECTORS = ISA.packed
"""Rows of out one register tile covers, and its vectors of ``LANES`` columns."""
NR = VECTORS * LANES
"""Columns of out one register tile (and one packed panel of ``b``) covers."""
KC = 256
"""Steps of ``p`` a tile runs before the next block of rows (a ``KC`` x ``NR`` float32 block of
``bp``, 32 KiB with AVX-512's 12 x 32 tile, stays in L1 for all of them)."""

_TILE = tile_intrinsic(MR, VECTORS)
TAIL = 4
"""Rows of the register tile that takes the last block of rows where at most ``TAIL`` rows of
it are in out (``m % MR``: 4 at every power of two from 16 with the 6- and 12-row tiles), rather
than the full tile on rows of zeros (8 chains of multiply-adds, enough to hide their latency)."""
_TAIL_TILE = tile_intrinsic(TAIL, VECTORS)


@jitable
def _pack_a(a, ap):
    """``ap[ib, p, r] = a[ib * MR + r, p]`` widened to float32, rows past ``a``'s zero."""
    m, k = a.shape
    ap[-1] = 0
    if a.strides[1] <= a.strides[0]:            # rows of a contiguous: along p
        for i in range(m):
            blk, r = divmod(i, MR)
            for p in range(k):
                ap[blk, p, r] = load(a, (i, p))
    else:                                       # a .T view: along i
        for p in range(k):
            for i in range(m):
                ap[i // MR, p, i % MR] = load(a, (i, p))


@jitable
def _pack_b(b, j0, bp):
    """``bp[p, c] = b[p, j0 + c]`` widened to float32 (columns past ``b``'s zero)."""
    k, n = b.shape
    cols = min(NR, n - j0)
    if cols < NR:
        bp[:, cols:] = 0
    if b.strides[1] == b.itemsize:              # rows of b contiguous: vectors along them
        whole = cols - cols % LANES
        for p in range(k):
            for c in range(0, whole, LANES):
                vstore(bp, p, c, vload(b, p, j0 + c))
            for c in range(whole, cols):
                bp[p, c] = load(b, (p, j0 + c))
        return
    w = b.T                                     # b = W.T: W's rows, transposed in registers
    if w.strides[1] == w.itemsize:
        kl, cl = k - k % LANES, cols - cols % LANES
        for c in range(0, cl, LANES):
            for p in range(0, kl, LANES):
                vtranspose_block(w, j0 + c, p, bp, p, c)
        for c in range(cl, cols):
            for p in range(kl):
                bp[p, c] = load(w, (j0 + c, p))
        for c in range(cols):
            for p in range(kl, k):
                bp[p, c] = load(w, (j0 + c, p))
        return
    for p in range(k):                          # any other strides: one element at a time
        for c in range(cols):
            bp[p, c] = load(b, (p, j0 + c))


@jitable
def _put(out, i0, j0, tile, counted):
    """Round ``tile``'s rows and columns that fall inside out into ``out[i0:, j0:]``; with
    ``counted``, how many of them are not finite once rounded (else 0)."""
    m, n = out.shape
    rows, cols = min(MR, m - i0), min(NR, n - j0)
    whole = cols - cols % LANES
    bad = 0
    for r in range(rows):
        for c in range(0, whole, LANES):
            v = vload(tile, r, c)
            vstore(out, i0 + r, j0 + c, v)
            if counted:
                bad += vcount_nonfinite(out, v)
        for c in range(whole, cols):
            bad += store_counted(out, i0 + r, j0 + c, tile[r, c], counted)
    return bad


@functools.cache
def packed_kernel(parallel: bool, a_bits: np.dtype, b_bits: np.dtype, out_bits: np.dtype):
    """``kernel(a, b, out, count, counted)``: ``out = a @ b`` by the packed GEMM (module
    docstring) for operands of these kinds (``common.kview``'s: float32, bfloat16 bits ``int16``,
    float16 bits ``uint16``); with ``counted``, ``count[0]`` = the number of non-finite elements
    of out (else ``count`` is not written). ``a`` ``[m, k]``, ``b`` ``[k, n]`` of any strides, out
    ``[m, n]`` with rows of unit stride, count int64 ``[1]``; ``parallel``: the panels split
    between Numba's threads (the same bits as serial).

    Compiled once per variant and kinds, when asked for: arrays typed ``"A"`` (``.T`` views and
    contiguous arrays take the same code), ``counted`` a run-time flag (a branch per vector
    stored); it compiles nothing more (other kinds raise ``TypeError``: no matching definition).

    Raises:
        TypeError: a kind the vectors do not load (float64; float16 off ``fp16``'s
            ``"intrinsic"`` path).
    """
    loop = loop_for(parallel)
    slots = numba.config.NUMBA_NUM_THREADS if parallel else 1

    @jit(parallel)
    def kernel(a, b, out, count, counted):
        m, k = a.shape
        n = out.shape[1]
        if counted:
            count[0] = 0
        if m == 0 or n == 0:
            return
        blocks, panels = (m + MR - 1) // MR, (n + NR - 1) // NR
        full = blocks - 1 if 0 < m % MR <= TAIL < MR else blocks    # the last block's tile
        ap = np.empty((blocks, k, MR), np.float32)
        _pack_a(a, ap)
        bps = np.empty((slots, k, NR), np.float32)
        accs = np.empty((slots, blocks, MR, NR), np.float32)
        bad = 0
        for jp in loop(panels):
            slot = numba.get_thread_id() if parallel else 0
            bp, acc = bps[slot], accs[slot]
            j0 = NR * np.int64(jp)
            _pack_b(b, j0, bp)
            acc[:] = 0
            for p0 in range(0, k, KC):
                p1 = min(p0 + KC, k)
                for ib in range(full):
                    _TILE(ap[ib, p0:p1], bp[p0:p1], acc[ib])
                if full < blocks:
                    _TAIL_TILE(ap[full, p0:p1, :TAIL], bp[p0:p1], acc[full, :TAIL])
            for ib in range(blocks):
                bad += _put(out, MR * ib, j0, acc[ib], counted)
        if counted:
            count[0] = bad

    def operand(bits, writable=False):
        return numba.types.Array(numba.from_dtype(np.dtype(bits)), 2, "A", readonly=not writable)

    kernel.compile((operand(a_bits), operand(b_bits), operand(out_bits, True),
                    numba.types.Array(numba.types.int64, 1, "A"), numba.types.boolean))
    kernel.disable_compile()
    return kernel
