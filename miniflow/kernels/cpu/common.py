"""Shared pieces of the CPU kernels: the ``jit`` decorator, the serial/parallel choice, array views,
scalar functions made callable from kernels (:func:`jitable`).

Kernels are ``numba.njit(cache=True, error_model="numpy")`` functions (IEEE semantics: x/0 = inf, no
ZeroDivisionError). Each kernel factory takes ``parallel`` and closes over the loop it uses,
``numba.prange`` or ``range``: the closure is part of Numba's cache key, so the serial and the
parallel compilation of one source never share a cache entry.

Builders pick the parallel variant (:func:`use_parallel`, when the plan is built) for arrays of at
least ``PARALLEL_MIN_SIZE`` elements, when Numba has more than one thread and its pool is the only
one: the products split across it (``blas_split``), BLAS on one thread inside every step.
Below 2^16 elements a launch of Numba's default (OpenMP) pool costs more than it saves (2 cores:
relu on 16K elements 2.2 us serial, 2.8 us parallel; on 64K, 8.1 us against 5.8 us). Two pools
do not share cores: OpenMP's and OpenBLAS's idle threads both spin, waiting for the next call,
and take each other's cores (the 64-1024-1024-10 MLP's training step at batch 64 took 43 ms with
both pools on 2 threads, 4.5 ms with both on one, 3.2 ms with a 2-thread BLAS and serial Numba
kernels). So where NumPy's BLAS exports no CBLAS GEMM to split (:func:`cblas_gemm`), BLAS
keeps the threads and the kernels run serially, unless BLAS has one thread. One pool against
that: ResNet-50's fp32 training step at 2 threads, batch 2 / 16, 552.5 / 3592.7 ms -> 440.3 /
2866.8 (``benchmarks/README.md``, "One thread pool"); a sleeping pool (``OMP_WAIT_POLICY=passive``,
Numba's workqueue layer) costs 75-130 us per launch instead.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os

import numba
import numpy as np
from numba.extending import register_jitable

from . import fp16

__all__ = ["PARALLEL_MIN_SIZE", "jit", "loop_for", "use_parallel", "one_pool", "cblas_gemm",
           "blas_libraries", "numpy_blas",
           "pinned_threads", "flat",
           "kview", "jitable", "store_counted", "scratch", "TENSOR_PACK", "tensor_packs", "pack"]

PARALLEL_MIN_SIZE = 1 << 16
"""Elements from which builders choose the ``parallel=True`` variant of a kernel."""


def jit(parallel: bool, fastmath=(), signature=None):
    """The decorator for CPU kernels (``cache`` follows ``fp16.JIT_CACHE``); ``fastmath``: LLVM
    fast-math flags, e.g. ``("reassoc",)`` to let a sum vectorize (it changes the order of adds);
    ``signature``: Numba's signature (compiled when decorated, for those argument types only; a
    C-contiguous array passes as an ``A`` one), else one compilation per argument types met."""
    options = dict(cache=fp16.JIT_CACHE, parallel=parallel, error_model="numpy",
                   fastmath=set(fastmath))
    return numba.njit(signature, **options) if signature is not None else numba.njit(**options)


def loop_for(parallel: bool):
    """``numba.prange`` for parallel kernels, ``range`` for serial ones."""
    return numba.prange if parallel else range


def use_parallel(size: int) -> bool:
    """Whether a kernel over ``size`` elements runs its parallel variant: at least
    ``PARALLEL_MIN_SIZE`` elements and more than one Numba thread, Numba's pool being the only
    one (:func:`one_pool`) or BLAS on one thread (see the module docstring; decided when the plan
    is built)."""
    return (size >= PARALLEL_MIN_SIZE and numba.get_num_threads() > 1
            and (one_pool() or all(lib.num_threads == 1 for lib in numpy_blas())))


def one_pool() -> bool:
    """Whether the kernels run on one thread pool, Numba's: it has more than one thread and
    NumPy's BLAS exports a CBLAS GEMM (:func:`cblas_gemm`), so the big products split across
    Numba's threads, each part one BLAS call on one thread (``blas_split``)."""
    return numba.get_num_threads() > 1 and cblas_gemm() is not None


_CBLAS_GEMMS = (("scipy_cblas_{}gemm64_", 64), ("cblas_{}gemm64_", 64), ("scipy_cblas_{}gemm", 32),
                ("cblas_{}gemm", 32))
"""CBLAS GEMM names a NumPy BLAS exports (``{}``: ``s`` or ``d``; NumPy's wheel bundles OpenBLAS
with the prefix ``scipy_`` and, for its 64-bit integer interface, the suffix ``64_``) and the
width of their integer arguments."""


@functools.cache
def cblas_gemm():
    """``(integer bits, {"s": name, "d": name})``: the CBLAS ``sgemm`` / ``dgemm`` of NumPy's BLAS
    (the first library of :func:`numpy_blas` exporting one of the known names, found with
    ``ctypes``), registered with LLVM under those names so that Numba kernels call them by name
    (``blas_split``); None where none does."""
    import ctypes

    import llvmlite.binding as llvm
    for lib in numpy_blas():
        try:
            dll = ctypes.CDLL(lib.filepath)
        except OSError:
            continue
        for pattern, bits in _CBLAS_GEMMS:
            names = {t: pattern.format(t) for t in "sd"}
            if all(hasattr(dll, n) for n in names.values()):
                for n in names.values():
                    llvm.add_symbol(n, ctypes.cast(getattr(dll, n), ctypes.c_void_p).value)
                return bits, names
    return None


@functools.cache
def blas_libraries() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded in this process (looked up once)."""
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController().select(user_api="blas").lib_controllers


@contextlib.contextmanager
def pinned_threads(n: int):
    """Numba's pool and every BLAS library on ``n`` threads while the block runs (Numba's at most
    ``NUMBA_NUM_THREADS``), both set back to the counts they had when it ends (threadpoolctl's
    ``threadpool_limits`` context for the BLAS), so code called in-process (a test, a notebook,
    ``miniflow train --ddp``) leaves the caller's threads as they were."""
    from threadpoolctl import threadpool_limits
    before = numba.get_num_threads()
    with threadpool_limits(n, user_api="blas"):
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        try:
            yield
        finally:
            numba.set_num_threads(before)


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


@jitable
def store_counted(out, i, j, v, counted):
    """``out[i, j] = v`` rounded to out's type (``fp16.store``); with ``counted``, 1 if the
    stored value is not finite (the loss scaler's count, made as a kernel writes), else 0: the
    scalar columns of the register-tile kernels."""
    fp16.store(out, (i, j), v)
    return 1 if counted and not math.isfinite(fp16.load(out, (i, j))) else 0


_BITS = {"float16": np.dtype(np.uint16), "bfloat16": np.dtype(np.int16)}
"""NumPy dtype name -> the integer view each half type reaches kernels as (``fp16``: uint16 is
float16, int16 is bfloat16); by name, so that no float32 array imports ``ml_dtypes``."""


def kview(a: np.ndarray) -> np.ndarray:
    """The array as kernels see it: float16 as its uint16 bits, bfloat16 as its int16 bits,
    everything else as is."""
    bits = _BITS.get(a.dtype.name)
    return a if bits is None else a.view(bits)


def flat(a: np.ndarray) -> np.ndarray:
    """A 1-D C-contiguous kernel view of a C-contiguous array (a 0-d array becomes shape (1,))."""
    return kview(a).reshape(-1)



TENSOR_PACK = 8
"""Tensors one call of a multi-tensor kernel takes (the fused optimizer updates, the loss scale's
counting): a tuple's length is part of Numba's signature, so a kernel given every parameter of a
model in one tuple compiled once more for each model size met, and longer tuples compile slower
(the SGD update with momentum, float32 models and float16 copies: 0.36 s for 4 tensors, 0.51 s
for 8, 0.92 s for 16, 4.9 s for 54, ResNet-18's count; AMD Zen 4). Packs of a fixed length
compile once per dtype and option, whatever the model. (OneFlow's multi-tensor updates launch
once per ``kMaxTuples`` = 32 tensors too, their pointers in a fixed-size ``TensorTupleParams``:
``oneflow/user/kernels/multi_tensor_model_update_kernel_util.h``.)"""


def tensor_packs(n: int) -> list:
    """The calls of a multi-tensor kernel over ``n`` tensors: ``range`` s of at most
    :data:`TENSOR_PACK` consecutive tensor indices."""
    return [range(s, min(s + TENSOR_PACK, n)) for s in range(0, n, TENSOR_PACK)]


def pack(views: list) -> tuple:
    """``views`` (1 to :data:`TENSOR_PACK` arrays of one type) as a tuple of the power of two at
    or above their number (1, 2, 4 or 8: at most four compilations per dtype and option), padded
    with the first one: a kernel given the pack and ``len(views)`` reads only the real entries,
    the padding only fixes the tuple's length (its type). Not always ``TENSOR_PACK``: Numba
    unboxes every array of a tuple at each call, about 0.1 us each (one Zen 4 core), and a
    small model's step makes a few such calls.

    Raises:
        ValueError: no views, or more than TENSOR_PACK."""
    if not 0 < len(views) <= TENSOR_PACK:
        raise ValueError(f"pack: {len(views)} views; a pack holds 1 to {TENSOR_PACK}")
    return tuple(views) + (views[0],) * ((1 << (len(views) - 1).bit_length()) - len(views))


def scratch(like, shape, dtype) -> np.ndarray:
    """A scratch buffer allocated once at build time (host memory, like every CPU array)."""
    return np.empty(shape, dtype)
