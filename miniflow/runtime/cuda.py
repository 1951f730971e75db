"""The cuda backend's runtime (``miniflow.runtime.backend.CudaBackend`` uses it): the plans'
stream, launches packed once, CUDA graph replay, pinned input staging, pooled outputs and
asynchronous read-backs.

Why. Calling a numba-cuda kernel (``kernel[grid, block](*args)``) resolves the overload and packs
every argument at every call: 10-60 us of host time per launch (measured with
``benchmarks/cuda_host_overhead.py``), so a 21-launch training step cost ~0.6 ms of host time
where the cpu backend runs the whole step in ~0.06 ms. A plan's launches never change (the same
kernels, the same buffers, the same scalars), so here everything is done once, when a plan first
runs (:func:`prepare`):

* **Packed launches** (:func:`packed_launch`): the overload is resolved (compiled, or loaded from
  Numba's cache) with numba-cuda's own typing, the arguments are converted with numba-cuda's own
  ``_Kernel._prepare_args`` and packed with cuda.core's ``ParamHolder`` (what
  ``cuda.core.launch`` does at every call), and each step becomes one call of the driver's
  ``cuLaunchKernel`` (``cuda.bindings``) with that parameter array, on the backend's stream.
* **CUDA graph** (:func:`capture_graph`): when every step of the plan is a kernel launch (no host
  step: the MPI collective copies through host memory) and the installed ``cuda.bindings`` has
  stream capture, the packed launches are captured once into a CUDA graph and every run is one
  ``cuGraphLaunch``; if capture fails for any reason the plan keeps its packed launches. This path
  can only run on a real GPU: without one it is tested up to the capture decision and the
  fallback (``tests/test_cuda_host_path.py``).
* **Inputs** (:class:`InputStager`): copied into pinned host buffers (two sets, used in turn) and
  from there asynchronously on the stream; a set is refilled only once the copies made from it
  two runs earlier have completed (an event per set; waiting is needed only when the GPU is two
  steps behind).
* **Outputs** (:class:`OutputPool`): the plan's output buffer is copied, on the stream, into a
  buffer of a per-output pool and returned as a new device array: the next run never overwrites a
  returned array (it copies into another pool buffer), and a pool buffer is reused once nothing
  refers to its memory any more (numba-cuda counts the references to an allocation, views
  included: ``MemoryPointer.refct``). A loop that keeps no results uses two buffers per output and
  allocates nothing after its second step; one that keeps every result allocates one buffer per
  result, as ``clone`` did.
* **Read-backs** (:class:`Readback`): asynchronous device-to-host copies into pinned buffers and
  an event (``miniflow.runtime.readback``).

Kernels run on the backend's stream, created by numba-cuda with the default flags, so it
synchronises with the legacy default stream that numba-cuda's own calls use (``copy_to_host``,
eager ops): everything stays in program order.

Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) there is no driver: :data:`SIMULATOR`
selects, here and only here, the plain numba-cuda path (each step calls the dispatcher, inputs
are copied with ``copy_to_device``, outputs cloned, read-backs copied at once).
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from ..kernels.cuda.common import SIMULATOR
from ..kernels.cuda.launch import Launch

__all__ = ["SIMULATOR", "CudaDriverError", "packed_launch", "prepare", "graph_capture_reason",
           "capture_graph", "InputStager", "OutputPool", "Readback", "clone", "GRAPHS"]

GRAPHS = [True]
"""Whether :func:`prepare` tries to capture plans as CUDA graphs (``GRAPHS[0] = False`` keeps
packed launches; tests and ``benchmarks/cuda_host_overhead.py`` switch it)."""


class CudaDriverError(RuntimeError):
    """A driver call of the cuda runtime failed (the message names the call and the error)."""


def _driver():
    """``cuda.bindings.driver`` (looked up when a plan is prepared, so a stubbed driver installed
    before that is the one used)."""
    from cuda.bindings import driver
    return driver


def _check(result, what: str):
    """The values of a ``cuda.bindings`` call's result tuple, after its error code.

    Raises:
        CudaDriverError: the error code is not ``CUDA_SUCCESS``, naming ``what`` and the code.
    """
    if result[0]:
        raise CudaDriverError(f"{what} failed: {getattr(result[0], 'name', result[0])}")
    return result[1:]


def _stream_handle(stream):
    return stream.handle


def _pointer(array) -> int:
    """The device (or pinned host) address of a numba array's first element."""
    if isinstance(array, np.ndarray):
        return array.ctypes.data
    return array.__cuda_array_interface__["data"][0]


# ----------------------------------------------------------------------------- launches
def packed_launch(launch: Launch, args: tuple, stream):
    """A function of no arguments that launches ``launch`` (a step's ``Launch``) with ``args`` on
    ``stream``: one ``cuLaunchKernel`` with a parameter array packed now.

    The overload is resolved as numba-cuda's dispatcher resolves it (each argument typed by
    ``typeof``; compiled, or loaded from the disk cache, when missing); the arguments are
    converted by the overload's ``_prepare_args`` and packed by cuda.core's ``ParamHolder``, so
    the driver gets the same bytes as from ``kernel[grid, block, stream](*args)``. The returned
    function keeps the packed arguments (``kernelargs``, ``params``: the parameter array's
    address) and everything they point to alive.

    Raises:
        TypeError: an argument is a host array (numba-cuda would copy it at every launch).
        CudaDriverError: at a call, when the launch fails.
    """
    from cuda.core._kernel_arg_handler import ParamHolder
    from numba.cuda.errors import normalize_kernel_dimensions

    kernel = launch.kernel
    overload = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    overload.bind()
    kernelargs, writeback = [], []
    for ty, value in zip(overload.argument_types, args):
        overload._prepare_args(ty, value, stream, writeback, kernelargs)
    if writeback:
        raise TypeError(f"{launch.name}: a kernel argument is a host array; plan steps take "
                        f"device arrays only")
    holder = ParamHolder(kernelargs)
    grid, block = normalize_kernel_dimensions(launch.grid, launch.block)
    handle = overload._codelibrary.get_cufunc().handle
    call = functools.partial(_driver().cuLaunchKernel, handle, *grid, *block, 0,
                             _stream_handle(stream), holder.ptr, 0)
    name = launch.name

    def run(call=call):
        result = call()
        if result[0]:
            _check(result, f"cuLaunchKernel of {name}")

    run.__name__ = name
    run.launch, run.kernelargs, run.params = launch, kernelargs, holder.ptr
    run.launch_args = call.args
    run._keep = (holder, args, overload)
    return run


def graph_capture_reason(steps) -> str | None:
    """Why ``steps`` cannot be captured as one CUDA graph, or None when they can: under the
    simulator, turned off (:data:`GRAPHS`), a host step (neither a kernel ``Launch`` nor a step
    marked ``capturable``, the cuBLAS GEMM: e.g. the MPI collective, which copies through host
    memory), an empty plan, or no stream capture in the installed ``cuda.bindings``."""
    if SIMULATOR:
        return "the CUDA simulator has no graphs"
    if not GRAPHS[0]:
        return "CUDA graphs are turned off"
    if not steps:
        return "the plan has no steps"
    host = [getattr(fn, "__name__", "?") for fn, _ in steps
            if not isinstance(fn, Launch) and not getattr(fn, "capturable", False)]
    if host:
        return f"host steps ({', '.join(sorted(set(host)))}) cannot be captured"
    drv = _driver()
    missing = [f for f in ("cuStreamBeginCapture", "cuStreamEndCapture", "cuGraphInstantiate",
                           "cuGraphLaunch") if not hasattr(drv, f)]
    if missing:
        return f"cuda.bindings has no {', '.join(missing)}"
    return None


def capture_graph(launches, stream):
    """``(run, None)``: ``launches`` (packed launches) captured once into a CUDA graph, ``run()``
    replaying it with one ``cuGraphLaunch`` on ``stream``; or ``(None, why)`` when capturing or
    instantiating fails (then nothing was launched, and the caller keeps the launches)."""
    drv = _driver()
    handle = _stream_handle(stream)
    mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    begun = drv.cuStreamBeginCapture(handle, mode)
    if begun[0]:
        return None, f"cuStreamBeginCapture: {getattr(begun[0], 'name', begun[0])}"
    failure = None
    try:
        for run in launches:
            run()
    except CudaDriverError as e:
        failure = str(e)
    ended = drv.cuStreamEndCapture(handle)
    if failure or ended[0]:
        return None, failure or f"cuStreamEndCapture: {getattr(ended[0], 'name', ended[0])}"
    graph = ended[1]
    made = drv.cuGraphInstantiate(graph, 0)
    if made[0]:
        return None, f"cuGraphInstantiate: {getattr(made[0], 'name', made[0])}"
    graph_exec = made[1]
    call = functools.partial(drv.cuGraphLaunch, graph_exec, handle)

    def run(call=call):
        result = call()
        if result[0]:
            _check(result, "cuGraphLaunch")

    run.__name__ = f"cuda_graph[{len(launches)} kernels]"
    run._keep = (graph, graph_exec, launches)
    return run, None


def prepare(steps, stream):
    """The calls that run ``steps`` (a plan's ``(fn, args)`` list) on ``stream``:
    ``(calls, step_of, graph_note)``.

    ``calls`` is a list of ``(fn, args)`` to call in order; ``step_of[k]`` is the index of the
    step call ``k`` runs (None for a CUDA graph, which runs them all); ``graph_note`` says why
    the plan is not a CUDA graph (None when it is). Under the simulator the steps themselves
    (numba-cuda's dispatcher at every call); otherwise packed launches (host steps stay as they
    are; a step with ``on_stream(stream)``, the cuBLAS GEMM, is bound to the stream), captured
    into a CUDA graph when :func:`graph_capture_reason` allows it.
    """
    if SIMULATOR:
        return list(steps), list(range(len(steps))), "the CUDA simulator has no graphs"
    calls = [((packed_launch(fn, args, stream), ()) if isinstance(fn, Launch)
              else (fn.on_stream(stream), ()) if hasattr(fn, "on_stream") else (fn, args))
             for fn, args in steps]
    note = graph_capture_reason(steps)
    if note is None:
        run, note = capture_graph([fn for fn, _ in calls], stream)
        if run is not None:
            return [(run, ())], [None], None
    return calls, list(range(len(steps))), note


# ----------------------------------------------------------------------------- inputs
class InputStager:
    """Copies host arrays into a plan's input buffers: ``stager(arrays)``.

    Each array goes into a pinned host buffer, then asynchronously to its device buffer on
    ``stream``. Two sets of pinned buffers are used in turn, each with an event recorded after
    its copies; a set is refilled only after its event (from two calls earlier) has completed.

    Raises (at a call):
        TypeError: an array's dtype is not its buffer's; ValueError: its shape is not.
    """

    def __init__(self, buffers, stream):
        drv = _driver()
        handle = _stream_handle(stream)
        self._buffers = list(buffers)
        self._sets = []
        for _ in range(2):
            pinned = [cuda.pinned_array(b.shape, b.dtype) for b in self._buffers]
            copies = [functools.partial(drv.cuMemcpyHtoDAsync, _pointer(b), _pointer(p),
                                        p.nbytes, handle)
                      for b, p in zip(self._buffers, pinned) if p.nbytes]
            event = cuda.event(timing=False)
            record = functools.partial(drv.cuEventRecord, event.handle, handle)
            self._sets.append((pinned, copies, event, record))
        self._used = [False, False]
        self._turn = 0
        self._query, self._sync = drv.cuEventQuery, drv.cuEventSynchronize
        self._not_ready = drv.CUresult.CUDA_ERROR_NOT_READY

    def __call__(self, arrays) -> None:
        k = self._turn = 1 - self._turn
        pinned, copies, event, record = self._sets[k]
        if self._used[k]:
            err = self._query(event.handle)[0]
            if err == self._not_ready:
                err = self._sync(event.handle)[0]
            if err:
                _check((err,), "waiting for the input copies")
        for host, buf, a in zip(pinned, self._buffers, arrays):
            check_copy(buf, a)
            np.copyto(host, a, casting="no")
        for copy in copies:
            result = copy()
            if result[0]:
                _check(result, "cuMemcpyHtoDAsync")
        _check(record(), "cuEventRecord")
        self._used[k] = True


def check_copy(dst, src) -> None:
    """``src`` (a host array) can be copied into ``dst`` (same dtype and shape).

    Raises:
        TypeError: dtype mismatch; ValueError: shape mismatch.
    """
    if src.dtype != dst.dtype:
        raise TypeError(f"cannot copy a {src.dtype} array into a {dst.dtype} device buffer; "
                        f"convert it with .astype({dst.dtype})")
    if src.shape != dst.shape:
        raise ValueError(f"cannot copy an array of shape {src.shape} into a device buffer of "
                         f"shape {dst.shape}")


# ----------------------------------------------------------------------------- outputs
def clone(array):
    """A copy of a device array in new device memory (numba-cuda's API, default stream)."""
    out = cuda.device_array_like(array)
    out.copy_to_device(array)
    return out


class OutputPool:
    """``pool()``: a new device array holding a copy of ``source`` (a plan's output buffer), made
    on ``stream`` into a pooled buffer (see the module docstring)."""

    def __init__(self, source, stream):
        self._source = source
        self._stream = stream
        self._handle = _stream_handle(stream)
        self._copy = _driver().cuMemcpyDtoDAsync
        self._buffers: list = []            # (allocation, its own array: keeps one reference)

    def __call__(self):
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
        from numba.cuda.cudadrv.driver import OwnedPointer
        src = self._source
        if src.size == 0:
            return cuda.device_array(src.shape, src.dtype)
        for mem, anchor in self._buffers:
            if mem.refct == 1:              # only the anchor refers to it: free to reuse
                break
        else:
            anchor = cuda.device_array(src.shape, src.dtype)
            mem = anchor.gpu_data._mem      # a weak proxy of the allocation (numba-cuda's own)
            self._buffers.append((mem, anchor))
        _check(self._copy(_pointer(anchor), _pointer(src), anchor.alloc_size, self._handle),
               "cuMemcpyDtoDAsync")
        return DeviceNDArray(src.shape, src.strides, src.dtype,
                             gpu_data=OwnedPointer(mem))

    def __len__(self) -> int:
        return len(self._buffers)


# ----------------------------------------------------------------------------- read-backs
class Readback:
    """Asynchronous copies of device ``arrays`` into pinned host arrays
    (``miniflow.runtime.readback``): ``copy(i)`` enqueues array ``i``'s copy on ``stream``,
    ``record()`` an event after the copies, ``ready()`` tells (without waiting) whether they
    completed, ``wait()`` waits and returns the host arrays (valid until the next ``copy``)."""

    def __init__(self, arrays, stream):
        drv = _driver()
        handle = _stream_handle(stream)
        self.pending = False
        self.hosts = [cuda.pinned_array(a.shape, a.dtype) for a in arrays]
        self._copies = [functools.partial(drv.cuMemcpyDtoHAsync, _pointer(h), _pointer(a),
                                          h.nbytes, handle) for a, h in zip(arrays, self.hosts)]
        self._event = cuda.event(timing=False)
        self._record = functools.partial(drv.cuEventRecord, self._event.handle, handle)
        self._query = functools.partial(drv.cuEventQuery, self._event.handle)
        self._sync = functools.partial(drv.cuEventSynchronize, self._event.handle)
        self._not_ready = drv.CUresult.CUDA_ERROR_NOT_READY
        self._done = True

    def copy(self, i: int) -> None:
        _check(self._copies[i](), "cuMemcpyDtoHAsync")

    def record(self) -> None:
        _check(self._record(), "cuEventRecord")
        self._done = False

    def ready(self) -> bool:
        if not self._done:
            err = self._query()[0]
            if err == self._not_ready:
                return False
            _check((err,), "cuEventQuery")
            self._done = True
        return True

    def wait(self) -> list:
        if not self._done:                  # a real wait only when ready() has not seen it done
            _check(self._sync(), "cuEventSynchronize")
            self._done = True
        return self.hosts


