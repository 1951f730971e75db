"""``matmul`` on the CPU: NumPy's BLAS, plus Numba loops for the skinny shapes where BLAS is slow.

``out = A @ B`` with ``A = op(a)`` of shape ``[m, k]`` and ``B = op(b)`` of shape ``[k, n]``
(``op`` = transpose when the node says so; transposed operands are ``.T`` views, read in place).
The builder picks one of three steps when the plan is built (measured on a 2-core Xeon with
OpenBLAS, one thread; ``benchmarks/kernels.py`` prints the comparison):

* ``m <= SKINNY`` rows (``SKINNY_DOT`` when ``B`` is stored transposed) against a big ``B`` (at
  least ``BIG`` elements): a layer's forward or input gradient at batch 2-8. OpenBLAS packs the
  big matrix as for a large product and takes 1.5-4x the time of reading it once;
  :func:`rows_times_kernel` streams ``B`` once (rows of ``B`` when it is stored ``[k, n]``,
  columns otherwise).
* ``k == 1`` (an outer product: a weight gradient at batch 1), or ``k <= SKINNY`` against a big
  output (at least ``BIG`` elements, batch 2-4): :func:`outer_sum_kernel` writes each output row
  once, 2-10x faster than BLAS's gemm there.
* otherwise one ``np.dot`` (BLAS; less call overhead than ``np.matmul``). Between
  ``ONE_THREAD_FROM`` and ``ONE_THREAD_BELOW`` multiply-adds it runs with BLAS on one thread
  (:class:`OneThreadBlas`) when BLAS has more: a multithreaded BLAS pays only for large products,
  and under load its spinning threads made a 64x64x128 product take 70 us instead of 12 (a 62 us
  training step took 420 us). Below ``ONE_THREAD_FROM`` OpenBLAS uses one thread by itself, and
  switching (about 3 us) would only cost.

The loops accumulate in the compute type (float32 for f16/f32) in a fixed order, so results are
deterministic, but not the bits BLAS gives. float16: a and b are widened into float32 scratch and
the float32 product rounded into out (a GPU fp16 GEMM's contract).
"""
from __future__ import annotations

import functools

import numpy as np

from .common import blas_libraries, jit, loop_for, use_parallel
from .elementwise import cast_steps
from .fp16 import to_compute

__all__ = ["BUILDERS", "SKINNY", "SKINNY_DOT", "BIG", "ONE_THREAD_FROM", "ONE_THREAD_BELOW", "OneThreadBlas",
           "rows_times_kernel",
           "outer_sum_kernel", "build_matmul"]

SKINNY = 4
"""Rows (or inner dimension) up to which the skinny loops beat BLAS on a big operand ..."""
SKINNY_DOT = 8
"""... and rows up to which the dot-product loop (``B`` stored ``[n, k]``) does."""
BIG = 1 << 18
"""Elements of the big operand from which the skinny loops pay (below it BLAS is as fast)."""
ONE_THREAD_FROM, ONE_THREAD_BELOW = 1 << 18, 1 << 22
"""Multiply-adds for which BLAS runs on one thread: OpenBLAS's own single-thread limit (2^18), and
the measured crossover on 2 cores (2^21-2^23)."""
COLUMNS = 1024
"""Columns of out one parallel iteration of :func:`rows_times_kernel` (``[k, n]`` case) owns."""


@functools.cache
def rows_times_kernel(transposed: bool, parallel: bool):
    """``kernel(x, w, out)``: ``out = x @ W`` for few rows of ``x`` ``[m, k]``, reading W once.

    ``transposed``: ``w`` is ``W`` stored ``[n, k]`` (``out[i, j] = dot(x[i], w[j])``, the dot
    products vectorized by letting LLVM reassociate them); else ``w`` is ``[k, n]``
    (``out[i, :] += x[i, p] * w[p, :]`` for ``p = 0, 1, ...``). The parallel variant splits the
    columns of out.
    """
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("reassoc", "contract"))
    def kernel(x, w, out):
        m, k = x.shape
        n = out.shape[1]
        if transposed:
            for j in loop(n):
                wj = w[j]
                for i in range(m):
                    acc = to_compute(out, 0.0)
                    for p in range(k):
                        acc += x[i, p] * wj[p]
                    out[i, j] = acc
        else:
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
def outer_sum_kernel(parallel: bool):
    """``kernel(a, b, out)``: ``out = a @ b`` for a small inner dimension ``k``:
    ``out[i, :] = sum_p a[i, p] * b[p, :]`` (``b`` is ``[k, n]``; ``a`` may be a transposed view),
    each output row written once. The parallel variant splits the rows."""
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("contract",))
    def kernel(a, b, out):
        k = a.shape[1]
        for i in loop(out.shape[0]):
            o = out[i]
            a0, b0 = a[i, 0], b[0]
            for j in range(o.size):
                o[j] = a0 * b0[j]
            for p in range(1, k):
                ap, bp = a[i, p], b[p]
                for j in range(o.size):
                    o[j] += ap * bp[j]

    return kernel


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
    if m <= (SKINNY_DOT if transposed else SKINNY) and k * n >= BIG and a.flags.c_contiguous:
        kernel = rows_times_kernel(transposed, use_parallel(b.size))
        return kernel, (a, b.T if transposed else b, out)
    if (k == 1 or 1 < k <= SKINNY and m * n >= BIG) and b.flags.c_contiguous:
        return outer_sum_kernel(use_parallel(out.size)), (a, b, out)
    return _blas_step(a, b, out)


def build_matmul(node, ins, outs):
    """``out = op(a) @ op(b)`` (2-D; ``op`` = transpose when ``transpose_a``/``transpose_b``)."""
    a, b, out = ins[0], ins[1], outs[0]
    steps = []
    if out.dtype == np.float16:
        a32, b32, out32 = (np.empty(t.shape, np.float32) for t in (a, b, out))
        steps += cast_steps(a, a32) + cast_steps(b, b32)
        a, b, target = a32, b32, out32
    else:
        target = out
    a = a.T if node.attrs.get("transpose_a", False) else a
    b = b.T if node.attrs.get("transpose_b", False) else b
    steps.append(_product_step(a, b, target))
    if target is not out:
        steps += cast_steps(target, out)
    return steps


BUILDERS = {"matmul": build_matmul}
"""Op type -> builder."""
