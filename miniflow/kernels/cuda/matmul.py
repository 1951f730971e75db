"""``matmul`` on CUDA: a tiled kernel over shared memory (launch: ``launch.tile_steps``).

The product accumulates in the compute type (float32 for f16/f32, float64 for f64) and is rounded
once to out's dtype; the transposes are strides, read in place.
"""
from __future__ import annotations

import functools

from numba import cuda

from .common import flat, jit, short, types_of
from .launch import current, tile_steps
from .loss_scale import count_steps

__all__ = ["BUILDERS", "matmul_kernel", "build_matmul"]


@functools.cache
def matmul_kernel(ld, ct, st, tile: int):
    """``kernel(a, b, out, M, N, K, sam, sak, sbk, sbn)``:
    ``out[m, n] = sum_k a[m*sam + k*sak] * b[k*sbk + n*sbn]`` (a, b, out flat; the strides encode
    the transposes).

    Tiled: block (bx, by) of ``tile x tile`` threads computes the output tile at rows
    ``by*tile ...``, columns ``bx*tile ...``; for every ``tile``-wide slice of K it loads one tile
    of op(a) and one of op(b) into shared memory (widened to the compute type, zero past the edges,
    so M, N and K need not be multiples of the tile), synchronises, and each thread accumulates its
    dot product in the compute type. One rounding to out's dtype at the end.
    """

    @jit
    def kernel(a, b, out, M, N, K, sam, sak, sbk, sbn):
        sa = cuda.shared.array((tile, tile), ct)
        sb = cuda.shared.array((tile, tile), ct)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        row = cuda.blockIdx.y * tile + ty
        col = cuda.blockIdx.x * tile + tx
        acc = ct(0)
        for k0 in range(0, K, tile):
            ka, kb = k0 + tx, k0 + ty
            sa[ty, tx] = ld(a[row * sam + ka * sak]) if row < M and ka < K else ct(0)
            sb[ty, tx] = ld(b[kb * sbk + col * sbn]) if kb < K and col < N else ct(0)
            cuda.syncthreads()
            for kk in range(tile):
                acc += sa[ty, kk] * sb[kk, tx]
            cuda.syncthreads()
        if row < M and col < N:
            out[row * N + col] = st(acc)

    return kernel


def build_matmul(node, ins, outs):
    """``out = op(a) @ op(b)`` (2-D; ``op`` = transpose when ``transpose_a``/``transpose_b``)."""
    a, b, out = ins[0], ins[1], outs[0]
    ta, tb = node.attrs.get("transpose_a", False), node.attrs.get("transpose_b", False)
    m, n = out.shape
    k = a.shape[0] if ta else a.shape[1]
    sam, sak = (1, m) if ta else (k, 1)          # a is [K, M] when transposed, else [M, K]
    sbk, sbn = (1, k) if tb else (n, 1)          # b is [N, K] when transposed, else [K, N]
    kernel = matmul_kernel(*types_of(out), current().tile)
    steps = tile_steps(kernel, m, n, (flat(a), flat(b), flat(out), m, n, k, sam, sak, sbk, sbn),
                       f"matmul {short(out.dtype)}")
    return steps + (count_steps(out, outs[1]) if len(outs) > 1 else [])  # count_not_finite


BUILDERS = {"matmul": build_matmul}
"""Op type -> builder."""
