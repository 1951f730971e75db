"""A fix to numba-cuda's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``): one ``cuda.shared.array``
per call site and launch, as on a GPU, whatever the interleaving of the simulated threads.

The simulator runs each CUDA thread of a block as a Python thread, and ``cuda.shared.array`` there
(``FakeCUDAShared.array`` in numba-cuda's ``simulator/kernelapi.py``, 0.30) looks the call site
(file, line) up in a dict of the launch and, when absent, stores a new ``np.empty`` array, without
a lock. Every thread of a block reaches the call at the start of the kernel; when CPython switches
threads between one thread's lookup and its store (every ``sys.getswitchinterval()``: the CUDA
simulator lane sets 0.2 ms, and a loaded machine makes the switch likelier), two threads create
an array each, and the threads of the block no longer share one: a thread reads another's
uninitialised ``np.empty`` memory after ``syncthreads``. Seen in the lane, once, at load 9 on 2
cores: the tiled matmul's float64 gradient check (finite differences 133868 against -0.546) and
one batch row of ``batch_matmul[s8-bf16]``; forcing a thread switch after the lookup reproduces
both every time. A GPU gives a block one shared array, so the kernels are right and unchanged:
this module only makes the simulator deterministic.

:func:`install` (called by ``kernels.cuda.common`` under the simulator) replaces the method with
the same lookup and store under a lock.
"""
from __future__ import annotations

import sys
import threading

import numpy as np
from numba import types
from numba.np import numpy_support

__all__ = ["install", "shared_array"]

_LOCK = threading.Lock()


def shared_array(self, shape, dtype, alignment=None):
    """``cuda.shared.array(shape, dtype)`` in a simulated kernel (replaces
    ``FakeCUDAShared.array``): the array of the caller's (file, line) in this launch, created by
    the first thread to get there, under a lock so that every thread of the block gets that one.

    Dynamic shared memory (``shape == 0``) and an ``alignment`` (an error in the simulator) go to
    the simulator's own method, which keeps no per-site dict for them.
    """
    if alignment is not None or shape == 0:
        return _ORIGINAL[0](self, shape, dtype, alignment)
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    caller = sys._getframe(1)
    site = (caller.f_code.co_filename, caller.f_lineno)
    with _LOCK:
        array = self._allocations.get(site)
        if array is None:
            array = self._allocations[site] = np.empty(shape, dtype)
    return array


_ORIGINAL: list = []


def install() -> None:
    """Make the simulator's ``cuda.shared.array`` :func:`shared_array` (once; a no-op after).

    Raises:
        RuntimeError: the installed numba-cuda's simulator has no ``FakeCUDAShared.array`` to
            replace (its layout changed): check whether its ``shared.array`` still races, then
            update this module.
    """
    from numba.cuda.simulator import kernelapi
    shared = getattr(kernelapi, "FakeCUDAShared", None)
    if shared is None or not hasattr(shared, "array"):
        raise RuntimeError("miniflow.kernels.cuda.simulator: numba-cuda's simulator has no "
                           "kernelapi.FakeCUDAShared.array to make thread-safe; check the "
                           "installed numba-cuda version and update this module")
    if shared.array is not shared_array:
        _ORIGINAL[:] = [shared.array]
        shared.array = shared_array
