"""Shared pieces of the CPU kernels: the ``jit`` decorator, the serial/parallel choice, array views.

Kernels are ``numba.njit(cache=True, error_model="numpy")`` functions (IEEE semantics: x/0 = inf, no
ZeroDivisionError). Each kernel factory takes ``parallel`` and closes over the loop it uses,
``numba.prange`` or ``range``: the closure is part of Numba's cache key, so the serial and the
parallel compilation of one source never share a cache entry. Builders pick the parallel variant for
arrays of at least ``PARALLEL_MIN_SIZE`` elements (below it a parallel launch costs more than it saves).
"""
from __future__ import annotations

import numba
import numpy as np
from numba.extending import register_jitable

from . import fp16

__all__ = ["PARALLEL_MIN_SIZE", "jit", "loop_for", "use_parallel", "flat", "kview", "jitable"]

PARALLEL_MIN_SIZE = 1 << 16
"""Elements from which builders choose the ``parallel=True`` variant of a kernel."""


def jit(parallel: bool):
    """The decorator for CPU kernels (``cache`` follows ``fp16.JIT_CACHE``)."""
    return numba.njit(cache=fp16.JIT_CACHE, parallel=parallel, error_model="numpy")


def loop_for(parallel: bool):
    """``numba.prange`` for parallel kernels, ``range`` for serial ones."""
    return numba.prange if parallel else range


def use_parallel(size: int) -> bool:
    """Whether a kernel over ``size`` elements should run its parallel variant."""
    return size >= PARALLEL_MIN_SIZE


_REGISTERED: set = set()


def jitable(fn):
    """Make a plain scalar function (``miniflow.kernels.scalar``) callable from njit code.

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


def kview(a: np.ndarray) -> np.ndarray:
    """The array as kernels see it: float16 as its uint16 bits, everything else as is."""
    return a.view(np.uint16) if a.dtype == np.float16 else a


def flat(a: np.ndarray) -> np.ndarray:
    """A 1-D C-contiguous kernel view of a C-contiguous array (a 0-d array becomes shape (1,))."""
    return kview(a).reshape(-1)

