"""Shared pieces of the CPU kernels: the ``jit`` decorator, the serial/parallel choice, array views,
scalar functions made callable from kernels (:func:`jitable`).

Kernels are ``numba.njit(cache=True, error_model="numpy")`` functions (IEEE semantics: x/0 = inf, no
ZeroDivisionError). Each kernel factory takes ``parallel`` and closes over the loop it uses,
``numba.prange`` or ``range``: the closure is part of Numba's cache key, so the serial and the
parallel compilation of one source never share a cache entry.

Builders pick the parallel variant (:func:`use_parallel`, when the plan is built) for arrays of at
least ``PARALLEL_MIN_SIZE`` elements, when Numba has more than one thread and BLAS runs on one.
Below 2^16 elements a launch of Numba's default (OpenMP) pool costs more than it saves (2 cores:
relu on 16K elements 2.2 us serial, 2.8 us parallel; on 64K, 8.1 us against 5.8 us). And the two
pools do not share cores: OpenMP's and OpenBLAS's idle threads both spin, waiting for the next
call, and take each other's cores (the 64-1024-1024-10 MLP's training step at batch 64 took 43 ms
with both pools on 2 threads, 4.5 ms with both on one, 3.2 ms with a 2-thread BLAS and serial
Numba kernels). The matmuls are most of the work, so BLAS keeps the threads; a sleeping pool
(``OMP_WAIT_POLICY=passive``, Numba's workqueue layer) costs 75-130 us per launch instead.
Hence one pool: where NumPy's BLAS is OpenBLAS, a plan with more than one Numba thread runs its
BLAS products on Numba's pool too, as single-threaded calls split over it (``split_gemm``), and
its Numba kernels run parallel; elsewhere BLAS keeps the threads and the kernels run serial.
"""
from __future__ import annotations

import ctypes
import functools
import os

import numba
import numpy as np
from numba.extending import register_jitable

from . import fp16
from ...dtype import bfloat16

__all__ = ["PARALLEL_MIN_SIZE", "jit", "loop_for", "use_parallel", "blas_gemm", "one_pool",
           "blas_libraries", "numpy_blas",
           "flat",
           "kview", "jitable", "scratch"]

PARALLEL_MIN_SIZE = 1 << 16
"""Elements from which builders choose the ``parallel=True`` variant of a kernel."""


def jit(parallel: bool, fastmath=()):
    """The decorator for CPU kernels (``cache`` follows ``fp16.JIT_CACHE``); ``fastmath``: LLVM
    fast-math flags, e.g. ``("reassoc",)`` to let a sum vectorize (it changes the order of adds)."""
    return numba.njit(cache=fp16.JIT_CACHE, parallel=parallel, error_model="numpy",
                      fastmath=set(fastmath))


def loop_for(parallel: bool):
    """``numba.prange`` for parallel kernels, ``range`` for serial ones."""
    return numba.prange if parallel else range


def use_parallel(size: int) -> bool:
    """Whether a kernel over ``size`` elements runs its parallel variant: at least
    ``PARALLEL_MIN_SIZE`` elements, more than one Numba thread, and BLAS on one thread or the
    plan's BLAS products split over Numba's pool (:func:`one_pool`; see the module docstring;
    decided when the plan is built)."""
    return (size >= PARALLEL_MIN_SIZE and numba.get_num_threads() > 1
            and (one_pool() or all(lib.num_threads == 1 for lib in numpy_blas())))


_CBLAS_NAMES = ("scipy_cblas_{}gemm64_", "cblas_{}gemm64_", "cblas_{}gemm")
"""Symbol patterns of ``cblas_?gemm`` in OpenBLAS builds: NumPy's wheels (ILP64, prefixed), other
ILP64 builds, LP64 builds."""


@functools.cache
def blas_gemm():
    """``(cblas_sgemm address, cblas_dgemm address, ILP64)`` of NumPy's BLAS where it is one
    OpenBLAS library exporting them under one of :data:`_CBLAS_NAMES`, else None (another BLAS:
    MKL, Accelerate). ``split_gemm`` calls them."""
    libs = numpy_blas()
    if len(libs) != 1 or libs[0].internal_api != "openblas":
        return None
    try:
        lib = ctypes.CDLL(libs[0].filepath)
    except OSError:
        return None
    for pattern in _CBLAS_NAMES:
        try:
            fns = [getattr(lib, pattern.format(t)) for t in "sd"]
        except AttributeError:
            continue
        return (ctypes.cast(fns[0], ctypes.c_void_p).value,
                ctypes.cast(fns[1], ctypes.c_void_p).value, "64_" in pattern)
    return None


def one_pool() -> bool:
    """Whether a plan built now runs on Numba's pool alone: Numba has more than one thread and
    :func:`blas_gemm` found NumPy's OpenBLAS; its BLAS products are then split over that pool
    (``split_gemm.gemm_step``) or run on one BLAS thread, and its Numba kernels run their
    parallel variants (:func:`use_parallel`)."""
    return numba.get_num_threads() > 1 and blas_gemm() is not None


@functools.cache
def blas_libraries() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded in this process (looked up once)."""
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController().select(user_api="blas").lib_controllers


def numpy_blas() -> list:
    """threadpoolctl's controllers of the BLAS that ``np.dot`` calls: those loaded from NumPy's
    own folders (a wheel's ``numpy.libs``), else every BLAS loaded (a NumPy linked to the
    system's). Another package's BLAS (SciPy's, loaded by scikit-learn or JAX) is not NumPy's:
    its thread count (left at the default when it is loaded after a ``threadpool_limits``) says
    nothing about ``np.dot``'s."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    libs = blas_libraries()
    own = [lib for lib in libs if os.path.abspath(lib.filepath).startswith(
        (os.path.join(site, "numpy") + os.sep, os.path.join(site, "numpy.libs") + os.sep))]
    return own or libs


_REGISTERED: set = set()


def jitable(fn):
    """Make a plain scalar function (an op's ``OpDef.scalar``, a body of ``kernels.common``)
    callable from njit code.

    No Numba-IR inlining (``inline="always"``): on Numba 0.68 it miscompiles some kernels (a tuple
    assignment followed by a conditional expression lost its stores); LLVM inlines these small
    functions anyway.

    ``register_jitable`` leaves ``fn`` itself unchanged, so kernels close over the plain function:
    it pickles by reference, which keeps Numba's cache key stable across processes (a closure over
    a Dispatcher would pickle a per-process uuid and never hit the cache).
    """
    if fn not in _REGISTERED:
        register_jitable(fn)
        _REGISTERED.add(fn)
    return fn


_BITS = {np.dtype(np.float16): np.dtype(np.uint16), bfloat16.np: np.dtype(np.int16)}
"""The integer view each half type reaches kernels as (``fp16``: uint16 is float16, int16 is
bfloat16)."""


def kview(a: np.ndarray) -> np.ndarray:
    """The array as kernels see it: float16 as its uint16 bits, bfloat16 as its int16 bits,
    everything else as is."""
    bits = _BITS.get(a.dtype)
    return a if bits is None else a.view(bits)


def flat(a: np.ndarray) -> np.ndarray:
    """A 1-D C-contiguous kernel view of a C-contiguous array (a 0-d array becomes shape (1,))."""
    return kview(a).reshape(-1)



def scratch(like, shape, dtype) -> np.ndarray:
    """A scratch buffer allocated once at build time (host memory, like every CPU array)."""
    return np.empty(shape, dtype)
