"""Two fixes to numba-cuda's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), for numba-cuda 0.30's
``simulator/kernelapi.py`` and ``simulator/kernel.py``; kernels and their results are unchanged.

1. **One ``cuda.shared.array`` per call site and launch**, as on a GPU, whatever the interleaving of
the simulated threads. The simulator runs each CUDA thread of a block as a Python thread, and
``cuda.shared.array`` there (``FakeCUDAShared.array``) looks the call site (file, line) up in a
dict of the launch and, when absent, stores a new ``np.empty`` array, without a lock. Every thread
of a block reaches the call at the start of the kernel; when CPython switches threads between one
thread's lookup and its store (a loaded machine makes the switch likelier), two threads create an
array each, and the threads of the block no longer share one: a thread reads another's
uninitialised ``np.empty`` memory after ``syncthreads``. Seen in the lane, once, at load 9 on 2
cores: the tiled matmul's float64 gradient check (finite differences 133868 against -0.546) and
one batch row of ``batch_matmul[s8-bf16]``; forcing a thread switch after the lookup reproduces
both every time. :func:`shared_array` does the same lookup and store under a lock.

2. **A block manager that waits instead of polling.** ``BlockManager.run`` starts a block's
threads and then loops over them without pause, asking each whether it waits in ``syncthreads``
and whether it is still alive (``Thread.is_alive``, 4.2 million calls for a quarter of the lane),
until all live threads wait (then it releases them) or none is alive. The loop holds the GIL the
simulated threads need: in a quarter of the CUDA lane it took most of the CPU time. Its
replacement, :func:`run_block`, keeps the rule (release the block when every live thread waits in
``syncthreads``; stop the block at a thread's exception, aborting the others) but sleeps on a
condition variable that a thread notifies when it reaches ``syncthreads`` or ends
(:func:`syncthreads`, :func:`_run_thread`). A quarter of the lane (346 cases, warm Numba cache,
one thread per pool, Intel Xeon, Sapphire Rapids class): 22.3 s -> 13.4 s wall, 26.7 -> 16.9 s
CPU; with CPython's default switch interval (5 ms) 14.6 s and 15.0 s CPU, so nothing sets a
shorter one any more (the polling loop had needed 0.2 ms).

:func:`install` (called by ``kernels.cuda.common`` under the simulator) makes both replacements.
"""
from __future__ import annotations

import sys
import threading

import numpy as np
from numba import types
from numba.np import numpy_support

__all__ = ["install", "shared_array", "syncthreads", "run_block"]

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


def syncthreads(self) -> None:
    """``cuda.syncthreads()`` in a simulated thread (replaces ``BlockThread.syncthreads``): mark
    the thread waiting and tell the block's manager (:func:`run_block`), then wait to be released.

    Raises:
        RuntimeError: the block was aborted (another thread raised), before or after the wait,
            as the simulator's own method does.
    """
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads call")
    changed = self._manager.changed
    with changed:
        self.syncthreads_blocked = True
        changed.notify()
    self.syncthreads_event.wait()
    self.syncthreads_event.clear()
    if self.abort:
        raise RuntimeError("abort flag set on syncthreads clear")


def _run_thread(self) -> None:
    """``BlockThread.run`` (the kernel, its exception recorded), then mark the thread ended and
    tell the block's manager."""
    try:
        _ORIGINAL_RUN[0](self)
    finally:
        changed = self._manager.changed
        with changed:
            self.ended = True
            changed.notify()


def run_block(self, grid_point, *args) -> None:
    """Run one block of a simulated launch (replaces ``BlockManager.run``): start a thread per
    point of the block, then, until every thread has ended, sleep until each live thread waits in
    ``syncthreads`` and release them all together (a barrier for the threads still running, as the
    simulator's polling loop did).

    Raises:
        The first exception a simulated thread raised (message with its ``tid`` and ``ctaid``), the
        block's other threads aborted first, as the simulator does.
    """
    from numba.cuda.simulator.kernel import BlockThread
    self.changed = changed = threading.Condition()
    threads = []
    for block_point in np.ndindex(*self._block_dim):
        def target():
            self._f(*args)
        thread = BlockThread(target, self, grid_point, block_point, self._debug)
        thread.ended = False
        threads.append(thread)
    for thread in threads:
        thread.start()
    live = threads
    while live:
        with changed:
            while True:
                live = [t for t in live if not t.ended]
                failed = next((t for t in threads if t.exception), None)
                if failed or all(t.syncthreads_blocked for t in live):
                    break
                changed.wait()
        if failed:
            for t in threads:
                t.abort = True
                t.syncthreads_blocked = False
                t.syncthreads_event.set()
            raise failed.exception[0].with_traceback(failed.exception[1])
        for t in live:
            t.syncthreads_blocked = False
            t.syncthreads_event.set()
    for thread in threads:
        thread.join()


_ORIGINAL_RUN: list = []


def install() -> None:
    """Make the simulator's ``cuda.shared.array`` :func:`shared_array`, its block threads'
    ``syncthreads`` :func:`syncthreads` and its block manager :func:`run_block` (once; a no-op
    after).

    Raises:
        RuntimeError: the installed numba-cuda's simulator lacks what is replaced
            (``FakeCUDAShared.array``, ``BlockThread.run`` / ``syncthreads``,
            ``BlockManager.run``: its layout changed); check the fixes above against it, then
            update this module.
    """
    from numba.cuda.simulator import kernel, kernelapi
    shared = getattr(kernelapi, "FakeCUDAShared", None)
    thread, manager = (getattr(kernel, name, None) for name in ("BlockThread", "BlockManager"))
    if shared is None or thread is None or manager is None or not all(
            hasattr(*where) for where in ((shared, "array"), (thread, "syncthreads"),
                                          (thread, "run"), (manager, "run"))):
        raise RuntimeError("miniflow.kernels.cuda.simulator: numba-cuda's simulator lacks "
                           "kernelapi.FakeCUDAShared.array, kernel.BlockThread.run/syncthreads or "
                           "kernel.BlockManager.run; check the installed numba-cuda version "
                           "and update this module")
    if shared.array is not shared_array:
        _ORIGINAL[:] = [shared.array]
        shared.array = shared_array
    if manager.run is not run_block:
        _ORIGINAL_RUN[:] = [thread.run]
        thread.run, thread.syncthreads, manager.run = _run_thread, syncthreads, run_block
