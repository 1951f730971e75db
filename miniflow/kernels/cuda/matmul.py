"""``matmul`` on CUDA: a register-tiled kernel over shared memory (launch:
``launch.tile_steps``), or cuBLAS when its binding is installed (``kernels.cuda.cublas``);
``batch_matmul`` is one such product per batch index (``kernels.common.batch``).

The product accumulates in the compute type (float32 for f16/f32, float64 for f64) and is rounded
once to out's dtype; the transposes are read in place, each operand in the order its memory is
laid out, so that consecutive threads read consecutive addresses in all four transpose
combinations.
"""
from __future__ import annotations

import functools

from numba import cuda

from . import cublas
from ..common.batch import batched
from .common import flat, jit, short, types_of
from .launch import current, tile_steps
from .loss_scale import count_steps

__all__ = ["BUILDERS", "matmul_kernel", "build_matmul"]


@functools.cache
def matmul_kernel(ld, ct, st, ta: bool, tb: bool, tile: int, tile_k: int, reg: int):
    """``kernel(a, b, out, M, N, K)``: ``out = op(a) @ op(b)`` (a, b, out flat, C order; ``a`` is
    ``[K, M]`` when ``ta`` else ``[M, K]``, ``b`` is ``[N, K]`` when ``tb`` else ``[K, N]``).

    Block (bx, by) of ``(tile / reg)^2`` threads computes the output tile at rows ``by*tile ...``
    and columns ``bx*tile ...``. For every ``tile_k``-wide slice of K it stages ``op(a)``'s
    ``tile x tile_k`` tile and ``op(b)``'s ``tile_k x tile`` tile in shared memory (widened to the
    compute type, zero past the edges, so M, N and K need not be multiples of anything; rows
    padded by one element against bank conflicts). Loads are coalesced: thread ``t`` of the block
    reads element ``t + q * threads`` of the tile in the operand's memory order (along K for ``a``
    untransposed and ``b`` transposed, along M or N otherwise). Then each thread accumulates its
    ``reg x reg`` outputs, rows ``ty + i * tile/reg`` and columns ``tx + j * tile/reg``, from
    registers: ``reg`` values of each tile per K step, ``reg^2`` multiply-adds. Every output sums
    over K in order; one rounding to out's dtype at the end (Volkov and Demmel's register
    blocking, as in CUTLASS's SIMT GEMMs, without double buffering or vector loads).
    """
    threads = tile // reg
    count = threads * threads
    loads = tile * tile_k // count
    padded = tile + 1                               # a closure constant: the shared arrays' shape

    @jit
    def kernel(a, b, out, M, N, K):
        sa = cuda.shared.array((tile_k, padded), ct)
        sb = cuda.shared.array((tile_k, padded), ct)
        acc = cuda.local.array((reg, reg), ct)
        ra = cuda.local.array(reg, ct)
        rb = cuda.local.array(reg, ct)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        t = ty * threads + tx
        row0, col0 = cuda.blockIdx.y * tile, cuda.blockIdx.x * tile
        for i in range(reg):
            for j in range(reg):
                acc[i, j] = ct(0)
        for k0 in range(0, K, tile_k):
            for q in range(loads):
                e = t + q * count
                if ta:                                  # a is [K, M]: contiguous along M
                    m, kk = e % tile, e // tile
                else:                                   # a is [M, K]: contiguous along K
                    m, kk = e // tile_k, e % tile_k
                gm, gk = row0 + m, k0 + kk
                if gm < M and gk < K:
                    sa[kk, m] = ld(a[gk * M + gm]) if ta else ld(a[gm * K + gk])
                else:
                    sa[kk, m] = ct(0)
                if tb:                                  # b is [N, K]: contiguous along K
                    n, kk = e // tile_k, e % tile_k
                else:                                   # b is [K, N]: contiguous along N
                    n, kk = e % tile, e // tile
                gn, gk = col0 + n, k0 + kk
                if gn < N and gk < K:
                    sb[kk, n] = ld(b[gn * K + gk]) if tb else ld(b[gk * N + gn])
                else:
                    sb[kk, n] = ct(0)
            cuda.syncthreads()
            for kk in range(tile_k):
                for i in range(reg):
                    ra[i] = sa[kk, ty + i * threads]
                for j in range(reg):
                    rb[j] = sb[kk, tx + j * threads]
                for i in range(reg):
                    for j in range(reg):
                        acc[i, j] += ra[i] * rb[j]
            cuda.syncthreads()
        for i in range(reg):
            r = row0 + ty + i * threads
            if r < M:
                for j in range(reg):
                    c = col0 + tx + j * threads
                    if c < N:
                        out[r * N + c] = st(acc[i, j])

    return kernel


def build_matmul(node, ins, outs):
    """``out = op(a) @ op(b)`` (2-D; ``op`` = transpose when ``transpose_a``/``transpose_b``): one
    cuBLAS GEMM when ``cublas.available()``, else one launch of :func:`matmul_kernel`."""
    a, b, out = ins[0], ins[1], outs[0]
    ta, tb = node.attrs.get("transpose_a", False), node.attrs.get("transpose_b", False)
    m, n = out.shape
    k = a.shape[0] if ta else a.shape[1]
    if cublas.available(a, b, out):
        steps = cublas.gemm_steps(a, b, out, ta, tb, m, n, k)
    else:
        cfg = current()
        kernel = matmul_kernel(*types_of(out), bool(ta), bool(tb), cfg.tile, cfg.tile_k,
                               cfg.tile_reg)
        steps = tile_steps(kernel, m, n, (flat(a), flat(b), flat(out), m, n, k),
                           f"matmul {'T' if ta else 'N'}{'T' if tb else 'N'} {short(out.dtype)}")
    return steps + (count_steps(out, outs[1]) if len(outs) > 1 else [])  # count_not_finite


BUILDERS = {"matmul": build_matmul, "batch_matmul": batched(build_matmul)}
"""Op type -> builder."""
