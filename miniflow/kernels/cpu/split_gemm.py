"""BLAS products split over Numba's thread pool: one thread pool for the whole plan.

With more than one thread, a plan's Numba kernels and NumPy's BLAS both want the cores, and their
pools do not share them: OpenMP's (Numba's) and OpenBLAS's idle threads spin, waiting for the
next call, and take each other's cores (``common``'s module docstring: a 43 ms step where 3.2 ms
was possible). So until now BLAS kept the threads and every Numba kernel ran serial: a third of a
ResNet-50 step (the im2col, col2im, Winograd transforms, batch norm, ReLU, the SGD update) did not
scale from one thread to two. PyTorch avoids the clash by running its kernels and oneMKL's GEMMs
on one OpenMP pool; this module does the same for OpenBLAS's: :func:`gemm_step` computes ``out =
a @ b`` (2-D, or stacks of matrices as ``np.matmul``) as a few single-threaded ``cblas_?gemm``
calls of NumPy's own BLAS, one per block of out's rows (or columns, or stack members), run by a
Numba ``prange`` on Numba's pool, with BLAS held at one thread for the call. OpenBLAS's threads
then stay asleep while the plan runs, and the Numba kernels run their parallel variants
(``common.use_parallel``, ``common.one_pool``).

Bits: each block is the product OpenBLAS computes for those rows alone, and OpenBLAS's sgemm /
dgemm add each element's products in an order set by ``k`` alone (the blocking of ``k``, the
micro-kernel's ``k`` loop): the rows or columns a call covers change no element's bits, as its
own threads, which split ``m`` and ``n`` too, do not (``tests/test_split_gemm.py`` checks every
shape it runs against ``np.dot`` on one thread). The exception is OpenBLAS's small-matrix path
(products of at most 100^3 multiply-adds on AVX-512, which sum ``k`` without blocking it): a
product is split only into blocks of at least :data:`MIN_BLOCK_WORK` multiply-adds, above every
such path's limit, else it is one call on one thread. Shapes NumPy sends elsewhere (a dimension
of 1: ``gemv``; ``a @ a.T``: ``syrk``; strides BLAS cannot take) are left to NumPy
(:func:`gemm_step` returns None).

The library: NumPy's OpenBLAS, its ``cblas_sgemm`` and ``cblas_dgemm`` (``common.blas_gemm``).
Another BLAS (MKL, Accelerate), or none found: ``common.one_pool`` is False and the plan keeps
BLAS's own threads and serial Numba kernels.
"""
from __future__ import annotations

import functools

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .common import blas_gemm, jit, numpy_blas

__all__ = ["MIN_BLOCK_WORK", "ALIGN", "blocks", "gemm_step", "split_gemm_kernel", "SplitGemm"]

MIN_BLOCK_WORK = 1 << 20
"""Multiply-adds each block of a split product has at least (about 8 us at 140 GFLOP/s): above
the small-matrix limits of OpenBLAS's kernels (100^3 on AVX-512, 64^3 on SVE), whose sums are
ordered differently, and well above the cost of a parallel launch on a warm pool (1-3 us)."""
ALIGN = 64
"""Rows or columns a block boundary is a multiple of (a multiple of every OpenBLAS micro-kernel's
unroll, so that each block is computed in whole register tiles as in the unsplit product)."""
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112      # CBLAS_ORDER, CBLAS_TRANSPOSE (cblas.h)


@intrinsic
def _cblas_gemm(typingctx, fn, order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """Call the ``cblas_?gemm`` at address ``fn`` (an integer: a ctypes pointer would make the
    kernel uncacheable); ``a``, ``b``, ``c`` are addresses, the other arguments C ints (int32
    enums; int64 or int32 sizes) and the dtype's alpha and beta."""
    sig = types.void(fn, order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        pointers = (8, 10, 13)                      # a, b, c among the call's arguments
        tys = [i8p if i in pointers else context.get_value_type(t)
               for i, t in enumerate(signature.args) if i]
        vals = [builder.inttoptr(v, i8p) if i in pointers else v
                for i, v in enumerate(args) if i]
        fnty = ir.FunctionType(ir.VoidType(), tys)
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), vals)
        return context.get_dummy_value()

    return sig, codegen


@functools.cache
def split_gemm_kernel(double: bool, ilp64: bool):
    """``kernel(fn, calls, starts)``: the GEMM calls ``calls[q]`` (rows of int64: trans_a,
    trans_b, m, n, k, a address, lda, b address, ldb, c address, ldc) of the ``cblas_?gemm`` at
    address ``fn`` (``double``: ``dgemm``; ``ilp64``: 64-bit sizes), calls ``starts[t]`` to
    ``starts[t + 1]`` on one thread of Numba's pool each."""
    real = np.float64 if double else np.float32
    size = np.int64 if ilp64 else np.int32

    @jit(True)
    def kernel(fn, calls, starts):
        for t in numba.prange(len(starts) - 1):
            for q in range(starts[t], starts[t + 1]):
                r = calls[q]
                _cblas_gemm(fn, np.int32(_ROW_MAJOR), np.int32(r[0]), np.int32(r[1]),
                            size(r[2]), size(r[3]), size(r[4]), real(1.0), r[5], size(r[6]),
                            r[7], size(r[8]), real(0.0), r[9], size(r[10]))

    return kernel


class SplitGemm:
    """A step function: ``fn()`` runs :func:`split_gemm_kernel` on its table of calls, with every
    multithreaded BLAS library of NumPy's held at one thread for the call (restored to the count
    it had when the step was made), and keeps the operands whose addresses the table holds
    alive."""

    __slots__ = ("kernel", "args", "arrays", "libs", "__name__")

    def __init__(self, kernel, args, arrays, blocks: int):
        self.kernel, self.args, self.arrays = kernel, args, arrays
        self.libs = [(lib, lib.num_threads) for lib in numpy_blas() if lib.num_threads > 1]
        product = "dot" if arrays[0].ndim == 2 else "matmul"        # NumPy's call it stands for
        self.__name__ = f"{product} split over Numba's pool ({blocks} blocks)"

    def __call__(self):
        for lib, _ in self.libs:
            lib.set_num_threads(1)
        try:
            self.kernel(*self.args)
        finally:
            for lib, n in self.libs:
                lib.set_num_threads(n)


def _operand(x):
    """``(transposed, leading dimension)`` of a 2-D operand as row-major CBLAS reads it in place,
    or None where its strides do not allow that."""
    s0, s1 = x.strides
    isz = x.itemsize
    if s0 % isz or s1 % isz:
        return None
    if s1 == isz and s0 // isz >= x.shape[1]:
        return False, s0 // isz
    if s0 == isz and s1 // isz >= x.shape[0]:
        return True, s1 // isz
    return None


def blocks(m: int, n: int, k: int, parts: int) -> tuple:
    """``(axis, bounds)``: out's rows (axis 0) or columns (1), whichever is longer, cut at
    multiples of :data:`ALIGN` into at most ``parts`` blocks of at least :data:`MIN_BLOCK_WORK`
    multiply-adds each, as equal as that allows (``bounds``: the cut points from 0 to the end;
    one block where the product is too small to split)."""
    axis = 0 if m >= n else 1
    length = (m, n)[axis]
    per_unit = k * (n, m)[axis]                 # multiply-adds of one row (column) of out
    units = -(-length // ALIGN)
    parts = max(1, min(parts, units, (m * n * k) // MIN_BLOCK_WORK))
    cuts = [min(length, ALIGN * (units * p // parts)) for p in range(parts + 1)]
    cuts = [c for i, c in enumerate(cuts) if i == 0 or c > cuts[i - 1]]
    while len(cuts) > 2 and min(b - a for a, b in zip(cuts, cuts[1:])) * per_unit < MIN_BLOCK_WORK:
        small = min(range(1, len(cuts)), key=lambda i: cuts[i] - cuts[i - 1])
        del cuts[small if small < len(cuts) - 1 else small - 1]
    return axis, cuts


def _calls(a, b, out, parts: int) -> list | None:
    """The ``cblas_?gemm`` calls (rows of :func:`split_gemm_kernel`'s table) computing the 2-D
    ``out = a @ b`` in at most ``parts`` blocks, or None (see :func:`gemm_step`)."""
    (m, k), n = a.shape, b.shape[1]
    opa, opb, opo = _operand(a), _operand(b), _operand(out)
    if min(m, n, k) < 2 or opa is None or opb is None or opo is None or opo[0]:
        return None
    if a.ctypes.data == b.ctypes.data and a.T.strides == b.strides:
        return None                                 # NumPy calls syrk for a @ a.T
    (ta, lda), (tb, ldb), ldc = opa, opb, opo[1]
    isz = out.itemsize
    axis, cuts = blocks(m, n, k, parts)
    calls = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        if axis == 0:       # rows lo:hi of out: rows of A (columns of its stored transpose)
            pa = a.ctypes.data + lo * (1 if ta else lda) * isz
            pb, pc, mm, nn = b.ctypes.data, out.ctypes.data + lo * ldc * isz, hi - lo, n
        else:               # columns lo:hi of out: columns of B (rows of its stored transpose)
            pa, mm, nn = a.ctypes.data, m, hi - lo
            pb = b.ctypes.data + lo * (ldb if tb else 1) * isz
            pc = out.ctypes.data + lo * isz
        calls.append((_TRANS if ta else _NO_TRANS, _TRANS if tb else _NO_TRANS, mm, nn, k,
                      pa, lda, pb, ldb, pc, ldc))
    return calls


def gemm_step(a, b, out, parts: int):
    """The step computing ``out = a @ b`` as ``np.dot`` (2-D) or ``np.matmul`` (stacks: ``a``
    ``[..., m, k]``, ``b`` ``[..., k, n]``, ``out`` ``[..., m, n]``, one leading shape) would,
    float32 or float64, as single-threaded BLAS calls on at most ``parts`` threads of Numba's
    pool: a 2-D out in blocks of rows or columns (:func:`blocks`), a stack's members shared out
    whole. Returns
    ``(SplitGemm, ())``, or None where it would be one call (a product too small to split:
    :data:`MIN_BLOCK_WORK`), ``common.blas_gemm`` found none, the dtypes differ or are not float32 /
    float64, the stacks broadcast, or NumPy would not call ``gemm`` on every (whole) product: a
    dimension of 1, ``a @ a.T``, strides BLAS cannot read, an out whose rows are not of unit
    stride."""
    lib = blas_gemm()
    if (lib is None or not a.dtype == b.dtype == out.dtype
            or out.dtype not in (np.float32, np.float64) or out.size == 0):
        return None
    if a.ndim == 2:
        calls = _calls(a, b, out, parts)
        groups = 0 if calls is None else len(calls)
    else:
        lead = out.shape[:-2]
        if a.shape[:-2] != lead or b.shape[:-2] != lead:
            return None                             # broadcast stacks: left to np.matmul
        members = [_calls(a[i], b[i], out[i], 1) for i in np.ndindex(lead)]
        calls = None if any(c is None for c in members) else [c for cs in members for c in cs]
        groups = 0 if calls is None else max(1, min(parts, len(calls), out.size * a.shape[-1]
                                                    // MIN_BLOCK_WORK))
    if calls is None or groups < 2:
        return None
    starts = np.array([len(calls) * t // groups for t in range(groups + 1)], np.int64)
    kernel = split_gemm_kernel(out.dtype == np.float64, lib[2])
    args = (lib[1] if out.dtype == np.float64 else lib[0], np.array(calls, np.int64), starts)
    return SplitGemm(kernel, args, (a, b, out), groups), ()
