"""One GEMM split across Numba's threads, each part one call of NumPy's own BLAS on one thread:
one thread pool for the whole step.

Why: a threaded BLAS and Numba's OpenMP pool do not share cores (``common``'s docstring: each
pool's idle threads spin and take the other's cores), so at more than one thread the Numba
kernels ran serially and the threads went to BLAS. Then everything that is not a product (the
elementwise, batch-norm and im2col passes: a third of ResNet-50's step) used one core of two.
With the products split across Numba's own threads instead, BLAS stays on one thread and every
kernel can take its parallel variant.

:func:`split_gemm_kernel` computes ``out = a @ b`` (float32 or float64, 2-D or stacks of
matrices as ``np.matmul`` without broadcasting, each operand with rows or columns of unit stride:
a transposed view is read in place) as ``parts`` calls of ``cblas_sgemm`` / ``cblas_dgemm`` in a
``prange`` loop: a stack of at least ``parts`` matrices in runs of whole matrices (Winograd's 16
GEMMs, the GPT's attention heads), else each matrix in blocks of out's columns (at multiples of
``COLUMN_ALIGN``) where out has ``COLUMNS_FROM`` columns per part or more, else blocks of its rows.
A block of columns reads all of ``a`` and its columns of ``b`` (a row block would pack all of
``b`` in every thread: 64 x 1024 x 1024 took 1.41 ms split by rows, 0.79 by columns, against
OpenBLAS's own two threads at 0.73-0.79; OpenBLAS 0.3.31 on one Sapphire Rapids core: 256 x
1024 x 1024 in 2.21 ms against 2.10 for its own two threads and 4.12 for one; 128 x 1152 x 784
1.03 against 1.06 and 1.77).

Bits: the split is deterministic (the same blocks at the same thread count), and it gives one
call's bits where the BLAS computes every element of out the same way in whichever block it
lies: OpenBLAS's SkylakeX kernels (AVX-512) do at these blocks; its Haswell kernels (AVX2: what
OpenBLAS picks on a Zen 3, or with ``OPENBLAS_CORETYPE=Haswell``) do not: the elements at some
columns and rows of a block (8-13 of a block of 16, the edge of its last 6-row panel) are summed
in another order than in one call, and differ in the last bits. :func:`keeps_bits` checks which
on this machine; the tests assert one call's bits where it holds, float32 rounding elsewhere. A
training's result at two threads can thus differ from one thread's in the last bits on an AVX2
machine, and on any machine where, at one Numba thread, a product runs on BLAS's own threads:
OpenBLAS's threaded GEMM sums elements in another order than its one-thread call, which the
split reproduces (float32 254 x 513 x 61: 9656 of 15494 elements differ, SkylakeX kernels, two
OpenBLAS threads; found by a fuzz of the matmul kernels). It is the same from run to run at
either.

The BLAS is the one ``np.dot`` calls (``common.numpy_blas``: NumPy's wheel bundles OpenBLAS, its
CBLAS symbols prefixed ``scipy_`` and, for the 64-bit integer interface, suffixed ``64_``), its
functions found with ``ctypes`` and declared to Numba as external functions by name (so the
kernels load from Numba's cache in a new process once the names are registered with LLVM,
``common.cblas_gemm``). The calls must find BLAS on one thread (the builder wraps the step in
``matmul.OneThreadBlas`` where it has more): two calls from two threads into a threaded OpenBLAS
queue on its one server.
"""
from __future__ import annotations

import functools
import math

import numba
import numpy as np
from numba import types
from numba.extending import overload

from .common import cblas_gemm, jit, one_pool, pinned_threads

__all__ = ["COLUMN_ALIGN", "COLUMNS_FROM", "PROBES", "describe", "keeps_bits", "sgemm", "dgemm",
           "split_gemm_kernel", "SplitDot", "operand", "stacked", "split_step"]

COLUMN_ALIGN = 16
"""Column blocks start at multiples of this (a 64-byte line of float32)."""
COLUMNS_FROM = 64
"""Columns of out per part from which the blocks are of columns (else of rows)."""
PROBES = ((64, 512, 1024), (129, 130, 131), (300, 33, 100), (7, 5, 3))
"""``(m, k, n)`` of the products :func:`keeps_bits` computes split in two and whole: blocks of
columns, of columns past whole blocks, of rows, and a product smaller than one block."""
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112      # CBLAS_LAYOUT, CBLAS_TRANSPOSE (cblas.h)


def sgemm(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """CBLAS's ``cblas_sgemm`` of NumPy's BLAS, callable from Numba kernels (addresses as
    integers); Python never calls it."""
    raise NotImplementedError("sgemm is called from Numba kernels only")


def dgemm(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """CBLAS's ``cblas_dgemm`` of NumPy's BLAS, as :func:`sgemm`."""
    raise NotImplementedError("dgemm is called from Numba kernels only")


def _external(kind: str):
    """An implementation of :func:`sgemm` (``kind`` ``"s"``) or :func:`dgemm` for Numba: a call
    of the external function of ``common.cblas_gemm`` by its name. Kernels refer to the stubs, not
    to the external function's type, which pickles differently in every process (Numba's cache
    key holds a kernel's closure: it would never load)."""
    def typer(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        bits, names = cblas_gemm()
        i = types.int64 if bits == 64 else types.int32
        f = types.float32 if kind == "s" else types.float64
        ptr = types.uintp       # an address: the same argument as a pointer in C's convention
        gemm = types.ExternalFunction(names[kind], types.void(
            types.int32, types.int32, types.int32, i, i, i, f, ptr, i, ptr, i, f, ptr, i))

        def impl(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
            gemm(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
        return impl
    return typer


overload(sgemm)(_external("s"))
overload(dgemm)(_external("d"))


def describe() -> str:
    """How the kernels use the threads, for ``miniflow info``."""
    threads = numba.get_num_threads()
    if one_pool():
        bits = ("one call's bits" if keeps_bits() else
                "not one call's bits: this BLAS sums some elements of a block in another order")
        return (f"one pool, Numba's {threads} (big products split across them, each part "
                f"{cblas_gemm()[1]['s']} on one BLAS thread; {bits})")
    if threads == 1:
        return "one (Numba's kernels serial, BLAS as configured)"
    return (f"Numba {threads}; its kernels parallel only where BLAS has one thread (NumPy's "
            f"BLAS exports no CBLAS GEMM to split products across Numba's)")


@functools.cache
def keeps_bits() -> bool:
    """Whether the split gives one call's bits with NumPy's BLAS on this machine (the module
    docstring): each of :data:`PROBES`, float32 and float64, computed in two parts by
    :func:`split_gemm_kernel` and in one ``np.dot``, both with BLAS on one thread, compared bit
    for bit (once per process: 34 ms, after the two kernels' load from Numba's cache, 0.44 s).
    False where NumPy's BLAS exports no CBLAS GEMM (no split happens there)."""
    if cblas_gemm() is None:
        return False
    r = np.random.default_rng(0)
    with pinned_threads(1):
        for dtype, kind in ((np.float32, "s"), (np.float64, "d")):
            for m, k, n in PROBES:
                a = r.standard_normal((1, m, k)).astype(dtype)
                b = r.standard_normal((1, k, n)).astype(dtype)
                out = np.empty((1, m, n), dtype)
                split_gemm_kernel(kind)(a, b, out, _NO_TRANS, k, _NO_TRANS, n, n, 2, m, k, n)
                if not np.array_equal(out[0].view(np.uint8), np.dot(a[0], b[0]).view(np.uint8)):
                    return False
    return True


@functools.cache
def split_gemm_kernel(kind: str):
    """``kernel(a, b, out, ta, lda, tb, ldb, ldc, parts, m, k, n)``: ``out[s] = op(a[s]) @
    op(b[s])`` for every matrix ``s`` of the stacks (3-D arrays; a 2-D product is a stack of one)
    in BLAS calls over ``parts`` of Numba's threads (the module docstring): a stack of ``parts``
    matrices or more is split into runs of whole matrices, one call each; a smaller one matrix
    by matrix, each split into ``parts`` blocks of columns or rows. ``kind``: ``"s"`` (float32)
    or ``"d"`` (float64). ``ta`` / ``tb``: CBLAS's transpose flags, ``ld*`` the leading
    dimensions in elements (:func:`operand`); each matrix is ``op(a[s])`` ``[m, k]``, ``op(b[s])``
    ``[k, n]`` and ``out[s]`` ``[m, n]``."""
    cblas_gemm()                 # the names registered with LLVM before a cached kernel loads
    gemm = sgemm if kind == "s" else dgemm
    one, zero = (np.float32(1), np.float32(0)) if kind == "s" else (1.0, 0.0)
    array = (types.float32 if kind == "s" else types.float64)[:, :, :]
    i = types.int64

    @jit(True, signature=types.void(array, array, array, i, i, i, i, i, i, i, i, i))
    def kernel(a, b, out, ta, lda, tb, ldb, ldc, parts, m, k, n):
        size = np.uintp(out.itemsize)
        count = out.shape[0]
        if count >= parts:                      # runs of whole matrices
            for t in numba.prange(parts):
                for q in range((count * t) // parts, (count * (t + 1)) // parts):
                    gemm(_ROW_MAJOR, ta, tb, m, n, k, one, a[q].ctypes.data, lda,
                         b[q].ctypes.data, ldb, zero, out[q].ctypes.data, ldc)
            return
        by_columns = n >= COLUMNS_FROM * parts
        for q in range(count):
            pa, pb, pc = a[q].ctypes.data, b[q].ctypes.data, out[q].ctypes.data
            for t in numba.prange(parts):
                if by_columns:
                    c0 = (n * t) // parts
                    c1 = (n * (t + 1)) // parts
                    c0 -= c0 % COLUMN_ALIGN
                    c1 = n if t == parts - 1 else c1 - c1 % COLUMN_ALIGN
                    ob = c0 * (ldb if tb == _TRANS else 1)
                    gemm(_ROW_MAJOR, ta, tb, m, c1 - c0, k, one, pa, lda,
                         pb + size * np.uintp(ob), ldb, zero, pc + size * np.uintp(c0), ldc)
                else:
                    r0 = (m * t) // parts
                    r1 = (m * (t + 1)) // parts
                    oa = r0 * (1 if ta == _TRANS else lda)
                    gemm(_ROW_MAJOR, ta, tb, r1 - r0, n, k, one, pa + size * np.uintp(oa), lda,
                         pb, ldb, zero, pc + size * np.uintp(r0 * ldc), ldc)

    return kernel


def operand(x) -> tuple | None:
    """``(CBLAS transpose flag, leading dimension in elements)`` of a 2-D operand whose rows
    (``NoTrans``) or columns (``Trans``: a transposed view) have unit stride, else None."""
    s0, s1 = (s // x.itemsize for s in x.strides)
    if s1 == 1 and s0 >= max(1, x.shape[1]):
        return _NO_TRANS, s0
    if s0 == 1 and s1 >= max(1, x.shape[0]):
        return _TRANS, s1
    return None


class SplitDot:
    """A step function: the :func:`split_gemm_kernel` ``kernel`` called with the step's
    arguments, named ``dot split <parts> ways`` (``matmul ...`` for stacks: BLAS's product, as
    the step of ``np.dot`` is named ``dot`` and that of ``np.matmul`` ``matmul``)."""

    __slots__ = ("kernel", "__name__")

    def __init__(self, kernel, parts: int, is_stack: bool):
        self.kernel = kernel
        self.__name__ = f"{'matmul' if is_stack else 'dot'} split {parts} ways"

    def __call__(self, *args):
        self.kernel(*args)


def stacked(x):
    """``x`` (``[..., r, c]``, two dimensions or more) as a 3-D stack of its matrices ``[count, r,
    c]``, a view, or None where its leading dimensions do not merge without a copy (a 4-D
    ``[B, H, T, D]`` merges where ``B``'s stride is ``H`` times ``H``'s: contiguous, or with its
    last two axes swapped; the heads of a ``[B, T, H, D]`` array viewed ``[B, H, T, D]`` do not).
    The rule of NumPy's no-copy reshape (``_attempt_nocopy_reshape``), for the leading axes: from
    the innermost, each axis longer than one steps by the span of those inside it."""
    if x.ndim == 2:
        return x[None]
    step, span = 0, None            # the innermost stride; the span of the axes merged so far
    for size, stride in zip(reversed(x.shape[:-2]), reversed(x.strides[:-2])):
        if size == 1:
            continue
        if span is None:
            step = stride
        elif stride != span:
            return None
        span = stride * size
    return np.lib.stride_tricks.as_strided(x, (math.prod(x.shape[:-2]), *x.shape[-2:]),
                                           (step, *x.strides[-2:]))


def split_step(a, b, out):
    """The step ``(SplitDot, args)`` computing ``out = a @ b`` (2-D, or stacks of matrices of one
    shape: ``np.matmul`` without broadcasting, any number of leading dimensions that
    :func:`stacked` merges into one) split across Numba's threads, or None where it does not
    apply: not ``common.one_pool``, another dtype than float32 / float64 (one for all three),
    stacks of other shapes, leading dimensions that do not merge, an empty product, or a matrix
    of an operand or of out without a unit stride (out's rows must have one)."""
    if not one_pool() or not (a.dtype == b.dtype == out.dtype) \
            or a.dtype not in (np.float32, np.float64) or not a.ndim == b.ndim == out.ndim \
            or a.ndim < 2 or a.shape[:-2] != b.shape[:-2] or 0 in out.shape \
            or a.shape[-1] == 0:
        return None
    is_stack = a.ndim > 2
    a, b, out = stacked(a), stacked(b), stacked(out)
    if a is None or b is None or out is None:
        return None
    op_a, op_b, op_out = operand(a[0]), operand(b[0]), operand(out[0])
    if op_a is None or op_b is None or op_out is None or op_out[0] != _NO_TRANS:
        return None
    (m, k), n = a.shape[1:], b.shape[2]
    parts = numba.get_num_threads()
    kernel = split_gemm_kernel("s" if a.dtype == np.float32 else "d")
    args = (a, b, out, op_a[0], op_a[1], op_b[0], op_b[1], op_out[1], parts, m, k, n)
    return SplitDot(kernel, parts, is_stack), args
