"""A stand-in CUDA driver for measuring the cuda backend's host side without a GPU.

``install()`` replaces only what talks to the NVIDIA driver, so that everything above it is
numba-cuda's and miniflow's real code: typing and overload resolution in numba-cuda's dispatcher,
its argument packing (``_Kernel._prepare_args``, then cuda.core's ``ParamHolder``), its memory
manager (allocations, the pending-deallocation queue that frees in bursts), its device arrays and
copies, and miniflow's plans. Kernels are really compiled (NVVM to PTX for compute capability
9.0), only never run.

What is stood in (numba-cuda 0.30, ``numba_cuda/numba/cuda``):

* the device and its context: ``driver.devices[0]`` is a compute-capability-9.0 stand-in (132
  SMs) whose primary context is numba-cuda's own ``Context`` around a fake handle;
* every driver function numba-cuda calls through its ``Driver`` object (``cuMemAlloc``,
  ``cuMemcpyHtoD``, ``cuMemFree``, ``cuStreamCreate``, ``cuEventRecord`` ...), set on the
  ``Driver`` singleton: "device" memory is host memory (``ctypes`` buffers), so copies really copy
  and a value written to the device reads back;
* the module loader (``CUDACodeLibrary.get_cufunc``): the PTX is compiled, the cubin never loaded;
  the kernel handle is a number;
* the launch: numba-cuda's call of ``cuda.core.launch`` packs the arguments with cuda.core's
  ``ParamHolder`` (what ``launch`` does before its driver call) and records them, and
  ``cuda.bindings.driver.cuLaunchKernel`` (miniflow's pre-packed launches) records its packed
  parameters; neither runs anything;
* CUDA graph capture (``cuStreamBeginCapture``): refused with ``CUDA_ERROR_NOT_SUPPORTED``
  unless ``SETTINGS["graphs"]``; then the launches made during a capture become the graph (not
  counted as launches) and ``cuGraphLaunch`` is counted as ``graph_launch``.

:data:`COUNTS` counts what a step costs: ``launch`` (kernel launches), ``graph_launch``,
``alloc`` / ``free`` (device memory), ``host_alloc`` (pinned memory), ``h2d`` / ``d2h`` / ``d2d``
(copies, ``_async`` when on a stream), ``sync`` (calls that wait for the device: synchronous
device-to-host copies, synchronous host-to-device copies from pageable memory, stream, context
and event synchronisation), ``event_query``.

Install it before anything creates a CUDA context (before ``miniflow.set_backend("cuda")``), in
a process of its own: it changes numba-cuda for good.
"""
from __future__ import annotations

import ctypes
import itertools
from collections import Counter

__all__ = ["install", "COUNTS", "LAUNCHES", "SETTINGS", "GRAPHS", "param_bytes",
           "StandInDevice"]

COUNTS: Counter = Counter()
"""What the stand-in driver was asked to do (see the module docstring)."""
LAUNCHES: list = []
"""The launches recorded while ``SETTINGS["record"]``: ``("dispatcher", kernel handle, grid,
block, packed parameter bytes)`` for numba-cuda's launches, ``("packed", kernel handle, grid,
block, parameter array address)`` for ``cuLaunchKernel``."""
SETTINGS = {"record": False, "graphs": False, "events_done": True, "lag": None}
"""Switches, read at every call: record launches; accept CUDA graph capture; whether events have
completed when queried (False: ``cuEventQuery`` answers ``CUDA_ERROR_NOT_READY``, as when the GPU
runs behind the host, until ``cuEventSynchronize`` waits for the event); ``lag`` (with
``events_done`` False): an event has also completed once ``lag`` events were recorded after it
(a GPU that runs that far behind the host)."""
GRAPHS: dict = {}
"""Captured graphs: handle -> the kernel handles launched during the capture."""

_MEMORY: dict = {}                      # address -> ctypes buffer (device and pinned memory)
_HANDLES = itertools.count(0x1000)


def param_bytes(kernelargs, params_ptr: int) -> bytes:
    """The bytes a launch passes: ``params_ptr`` is a ``void*[]`` (``ParamHolder.ptr``), one
    pointer per entry of ``kernelargs`` (numba-cuda's argument list: Python ints are packed as
    8-byte integers, ctypes values as themselves)."""
    table = (ctypes.c_void_p * len(kernelargs)).from_address(params_ptr)
    out = bytearray()
    for k, a in enumerate(kernelargs):
        size = 8 if isinstance(a, int) else ctypes.sizeof(a)
        out += ctypes.string_at(table[k], size)
    return bytes(out)


def _host_buffer(size: int) -> int:
    buf = ctypes.create_string_buffer(max(int(size), 1))
    addr = ctypes.addressof(buf)
    _MEMORY[addr] = buf
    return addr


class StandInDevice:
    """Device 0: compute capability 9.0, 132 SMs (an H100's numbers)."""

    id = 0
    compute_capability = (9, 0)
    name = b"stand-in sm_90 (stubbed driver)"
    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    _ATTRIBUTES = {"MULTIPROCESSOR_COUNT": 132, "MAX_THREADS_PER_BLOCK": 1024,
                   "MAX_GRID_DIM_X": 2 ** 31 - 1, "MAX_GRID_DIM_Y": 65535,
                   "MAX_GRID_DIM_Z": 65535, "MAX_BLOCK_DIM_X": 1024, "MAX_BLOCK_DIM_Y": 1024,
                   "MAX_BLOCK_DIM_Z": 64, "WARP_SIZE": 32, "CAN_MAP_HOST_MEMORY": 1,
                   "UNIFIED_ADDRESSING": 1, "CONCURRENT_MANAGED_ACCESS": 1,
                   "PCI_DOMAIN_ID": 0, "PCI_BUS_ID": 0, "PCI_DEVICE_ID": 0,
                   "COMPUTE_CAPABILITY_MAJOR": 9, "COMPUTE_CAPABILITY_MINOR": 0}

    def __init__(self):
        self.primary_context = None

    def __getattr__(self, attr):
        try:
            return self._ATTRIBUTES[attr]
        except KeyError:
            raise AttributeError(attr) from None

    def get_primary_context(self):
        import weakref
        from numba.cuda.cudadrv import driver as drv
        if self.primary_context is None:
            self.primary_context = drv.Context(weakref.proxy(self), drv.binding.CUcontext(0xC0DE))
        return self.primary_context

    def get_device_identity(self):
        return {"pci_domain_id": 0, "pci_bus_id": 0, "pci_device_id": 0}

    @property
    def supports_float16(self):
        return True

    @property
    def supports_bfloat16(self):
        return True

    def reset(self):
        pass

    def release_primary_context(self):
        pass


class _CoreStream:
    """What numba-cuda's ``_to_core_stream`` returns (a cuda.core Stream): only its handle."""

    def __init__(self, handle):
        self.handle = handle


class _FakeModule:
    initialized = True

    def setup(self):
        pass

    def get_global_symbol(self, name):
        raise NotImplementedError("the stubbed driver keeps no module globals")


class _FakeKernel:
    """cuda.core's ``Kernel`` as the launch sees it: a handle."""

    def __init__(self, handle):
        self.handle = handle


class _FakeCufunc:
    """numba-cuda's ``CudaPythonFunction`` of a loaded kernel."""

    def __init__(self, name):
        from numba.cuda.cudadrv import driver as drv
        self.name = name
        self.handle = drv.binding.CUkernel(next(_HANDLES))
        self.kernel = _FakeKernel(self.handle)
        self.module = _FakeModule()
        self.attrs = drv.FuncAttr(regs=32, shared=0, local=0, const=0, maxthreads=1024)

    def set_shared_memory_carveout(self, carveout):
        pass

    def cache_config(self, *args, **kwargs):
        pass


def install() -> None:
    """Stand the driver in (see the module docstring; :data:`SETTINGS` switch recording and graph
    capture).

    Raises:
        RuntimeError: numba's CUDA simulator is on, or a CUDA context already exists.
    """
    from numba import config
    if config.ENABLE_CUDASIM:
        raise RuntimeError("cuda_stub.install: NUMBA_ENABLE_CUDASIM is set; the stubbed driver "
                           "stands under numba-cuda's real launch path, not the simulator's")
    import numba.cuda.codegen as codegen
    import numba.cuda.dispatcher as dispatcher
    from cuda.bindings import driver as cudrv
    from cuda.core._kernel_arg_handler import ParamHolder
    from numba.cuda.cudadrv import devices, driver as drv
    if devices._runtime._get_attached_context() is not None:
        raise RuntimeError("cuda_stub.install: a CUDA context exists already; install first")
    b = drv.binding
    d = drv.driver
    success, not_ready = b.CUresult.CUDA_SUCCESS, b.CUresult.CUDA_ERROR_NOT_READY
    state = {"current": b.CUcontext(0), "capturing": None}

    def count(kind, n=1):
        COUNTS[kind] += n

    def memmove(dst, src, size):
        ctypes.memmove(int(dst), int(src), int(size))

    def alloc(size):
        count("alloc")
        return b.CUdeviceptr(_host_buffer(size))

    def free(ptr):
        count("free")
        _MEMORY.pop(int(ptr), None)

    def host_alloc(size, flags=0):
        count("host_alloc")
        return _host_buffer(size)

    def push(handle):
        state["current"] = handle

    def pop():
        handle, state["current"] = state["current"], b.CUcontext(0)
        return handle

    def copy(kind, blocking):
        def fn(dst, src, size, stream=None):
            count(kind if stream is None else kind + "_async")
            if blocking and stream is None:
                count("sync")
            memmove(dst, src, size)
        return fn

    def memset(ptr, byte, n, stream=None):
        count("memset")
        ctypes.memset(int(ptr), int(byte), int(n))

    def sync(*args):
        count("sync")

    done = set()                                     # events waited for since their record
    recorded = {}                                    # event -> serial number of its record

    def event_record(event, stream=None):
        count("event_record")
        done.discard(int(event))
        recorded[int(event)] = state["records"] = state.get("records", 0) + 1

    def event_sync(event):
        count("sync")
        count("event_wait")
        done.add(int(event))

    def event_query(event):
        count("event_query")
        lag = SETTINGS["lag"]
        behind = lag is None or state.get("records", 0) - recorded.get(int(event), 0) < lag
        if not SETTINGS["events_done"] and int(event) not in done and behind:
            raise drv.CudaAPIError(not_ready, "cuEventQuery: not ready")

    fns = {
        "cuInit": lambda flags: None, "cuDeviceGetCount": lambda: 1,
        "cuDriverGetVersion": lambda: 12090, "cuDeviceGet": lambda n: b.CUdevice(n),
        "cuCtxGetCurrent": lambda: state["current"], "cuCtxGetDevice": lambda: b.CUdevice(0),
        "cuCtxPushCurrent": push, "cuCtxPopCurrent": pop, "cuCtxSetCurrent": push,
        "cuMemGetInfo": lambda: (80 * 2 ** 30, 80 * 2 ** 30),
        "cuMemAlloc": alloc, "cuMemFree": free, "cuMemHostAlloc": host_alloc,
        "cuMemFreeHost": lambda ptr: (count("host_free"), _MEMORY.pop(int(ptr), None)),
        "cuMemcpyHtoD": copy("h2d", True), "cuMemcpyHtoDAsync": copy("h2d", False),
        "cuMemcpyDtoH": copy("d2h", True), "cuMemcpyDtoHAsync": copy("d2h", False),
        "cuMemcpyDtoD": copy("d2d", False), "cuMemcpyDtoDAsync": copy("d2d", False),
        "cuMemsetD8": memset, "cuMemsetD8Async": memset,
        "cuCtxSynchronize": sync, "cuStreamSynchronize": sync,
        "cuStreamCreate": lambda flags: (count("stream_create"), b.CUstream(next(_HANDLES)))[1],
        "cuStreamDestroy": lambda h: None, "cuStreamWaitEvent": lambda *a: None,
        "cuEventCreate": lambda flags: b.CUevent(next(_HANDLES)),
        "cuEventDestroy": lambda h: None, "cuEventRecord": event_record,
        "cuEventQuery": event_query, "cuEventSynchronize": event_sync,
        "cuEventElapsedTime": lambda a, b_: 0.0,
        "cuDevicePrimaryCtxRelease": lambda n: None, "cuDevicePrimaryCtxReset": lambda n: None,
        "cuModuleUnload": lambda h: None, "cuLibraryUnload": lambda h: None,
    }
    def binding_call(fn):
        """``fn`` as ``cuda.bindings.driver`` returns: ``(CUresult, *values)``."""
        def call(*args):
            try:
                r = fn(*args)
            except drv.CudaAPIError as e:
                return (e.code,)
            return (success,) if r is None else (success, *r) if isinstance(r, tuple) \
                else (success, r)
        return call

    for name, fn in fns.items():
        setattr(d, name, fn)                  # numba-cuda's Driver: values, errors raised
        setattr(cudrv, name, binding_call(fn))
    d.is_initialized, d.initialization_error, d.pid = True, None, None
    drv._logger = drv.make_logger()             # what Driver.ensure_initialized would set
    d.devices[0] = StandInDevice()
    drv._to_core_stream = lambda stream: _CoreStream(getattr(stream, "handle", stream) or 0)

    def get_cufunc(self):
        cache = self._cufunc_cache
        if 0 not in cache:
            self.get_asm_str()               # the PTX is compiled; nothing is loaded
            cache[0] = _FakeCufunc(self._entry_name)
        return cache[0]

    codegen.CUDACodeLibrary.get_cufunc = get_cufunc

    def core_launch(stream, config, kernel, *kernelargs):
        """cuda.core's ``launch`` up to its driver call: the arguments packed by ParamHolder."""
        holder = ParamHolder(kernelargs)
        count("launch")
        if SETTINGS["record"]:
            LAUNCHES.append(("dispatcher", int(kernel.handle), tuple(config.grid),
                             tuple(config.block), param_bytes(kernelargs, holder.ptr)))

    dispatcher.launch = core_launch

    def cu_launch_kernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        if state["capturing"] is not None:
            state["capturing"].append(int(f))
            return (success,)
        count("launch")
        if SETTINGS["record"]:
            LAUNCHES.append(("packed", int(f), (gx, gy, gz), (bx, by, bz), int(params)))
        return (success,)

    cudrv.cuLaunchKernel = cu_launch_kernel
    not_supported = b.CUresult.CUDA_ERROR_NOT_SUPPORTED

    def begin_capture(stream, mode):
        if not SETTINGS["graphs"]:
            return (not_supported,)
        state["capturing"] = []
        return (success,)

    def end_capture(stream):
        nodes, state["capturing"] = state["capturing"], None
        handle = next(_HANDLES)
        GRAPHS[handle] = nodes
        return (success, b.CUgraph(handle))

    def instantiate(graph, flags):
        return (success, b.CUgraphExec(int(graph)))

    def graph_launch(graph_exec, stream):
        count("graph_launch")
        return (success,)

    cudrv.cuStreamBeginCapture = begin_capture
    cudrv.cuStreamEndCapture = end_capture
    cudrv.cuGraphInstantiate = instantiate
    cudrv.cuGraphInstantiateWithFlags = instantiate
    cudrv.cuGraphLaunch = graph_launch
    cudrv.cuGraphDestroy = lambda g: (success,)
    cudrv.cuGraphExecDestroy = lambda g: (success,)
    COUNTS.clear()
