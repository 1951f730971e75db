"""Backend selection and the backend protocol (:class:`Backend`, the one place it is written).

Backends: ``cpu`` (NumPy arrays, Numba CPU kernels) and ``cuda`` (numba-cuda device arrays and
kernels; needs the ``cuda`` extra, ``pip install "miniflow[cuda]"``, and an NVIDIA GPU).

Selection: ``miniflow.set_backend("cpu" | "cuda")`` or the environment variable ``MINIFLOW_BACKEND``
(read on first use; any case and surrounding spaces accepted, ``" Cuda "`` is ``"cuda"``; another
value is ``miniflow.environment``'s one line naming the variable). The default is ``"cuda"`` when a
real GPU is usable, else ``"cpu"``. Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``,
where ``numba.cuda.is_available()`` is true) the default stays ``"cpu"``: the simulated ``cuda``
backend runs only when asked for.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import sys

import numpy as np

from ..environment import read

__all__ = ["Backend", "CpuBackend", "CudaBackend", "BackendUnavailableError", "UnknownBackendError",
           "get_backend", "set_backend", "default_backend_name", "cuda_status", "BACKENDS",
           "check_device", "device"]


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine (the message says why and what to do)."""


class UnknownBackendError(ValueError):
    """A backend name that is not one of :data:`BACKENDS` (``set_backend``'s argument; the
    message names it and the valid ones)."""


class Backend:
    """The backend protocol: what a backend provides. Subclasses fill ``name`` and every method.

    Memory (backend arrays: NumPy arrays for ``cpu``, numba-cuda device arrays for ``cuda``):

    * ``empty(shape, np_dtype)``: a new C-contiguous array (contents undefined);
    * ``from_numpy(array)``: a copy of a host array in backend memory;
    * ``to_numpy(array)``: a host copy;
    * ``clone(array)``: a copy in backend memory (no host round trip);
    * ``copy_in(dst, src)``: host array ``src`` into the backend buffer ``dst`` (same shape and
      dtype, else TypeError / ValueError);
    * ``owns(array)``: whether ``array`` lives in this backend's memory (plans check variables).

    Kernels: ``builder_for(op)`` is the kernel builder of op type ``op`` (an ``OpDef``), or None
    when the backend has none (the plan then raises NotImplementedError naming the op). A
    backend's kernel package (``miniflow.kernels.cpu``, ``miniflow.kernels.cuda``) keeps a table
    ``KERNELS`` (op name -> builder) and derives the builder of every elementwise op from its
    scalar function when asked (``kernels.common.elementwise``), so an op registered at any time
    runs on it.

    The builder contract: ``builder(node, ins, outs) -> [(fn, args), ...]``.

    * ``ins`` / ``outs`` are the node's preallocated buffers, one backend array per input / output
      Value, C-contiguous, of the Values' shapes and dtypes.
    * The builder runs once, when the plan is built. It reads ``node.attrs`` and the buffers'
      shapes and dtypes, raises what inference could not check (ValueError / TypeError naming
      the op), and precomputes everything a step needs: kernel views, launch configurations,
      stride tables, scratch buffers (allocated now, in the backend's memory).
    * A step ``fn(*args)`` reads ``ins`` and writes every element of ``outs`` (an op with
      ``Node.written`` inputs also writes those in place), using only its own scratch buffers
      besides. It allocates nothing, copies nothing between host and device (except the
      collectives' steps on ``cuda``, which stage device buffers through host buffers for MPI:
      ``kernels.cuda.collective``), looks nothing up and keeps no state between calls; steps run
      in the order returned (an empty output may have none). A step may raise on bad data
      (ValueError, e.g. a label out of range): the plan names the node. ``fn.__name__`` labels
      it in ``Plan.describe()``.
    * Precision: f16 and f32 compute in float32, f64 in float64; every result is rounded once,
      when it is stored in its dtype.

    Running plans (``miniflow.runtime.plan``; all built when a plan first runs):

    * ``prepare(steps) -> (calls, step_of, note)``: the calls that run the plan's steps, in
      order (``(fn, args)``; ``step_of[k]``: the step call ``k`` runs, None when it runs them
      all, e.g. a CUDA graph; ``note``: a phrase on how, for ``Plan.describe``). Kernels are
      compiled (or loaded from the cache) here at the latest.
    * ``input_stager(buffers) -> stage``: ``stage(arrays)`` copies host arrays into the input
      buffers (as ``copy_in``, possibly asynchronously: the arrays may be changed as soon as it
      returns).
    * ``output_copier(buffer) -> copy``: ``copy()`` returns a new backend array holding
      ``buffer``'s values; later runs never change it.
    * ``readback(arrays)``: a reusable read-back of device ``arrays`` into host arrays
      (``miniflow.runtime.readback``: ``copy(i)``, ``record()``, ``ready()``, ``wait()``);
      ``readback_depth``: how many may be pending per plan.
    """

    name = "?"
    readback_depth = 1

    def begin_plan(self, collective: bool = False) -> None:
        """Called once before a plan's steps are built (the default: nothing; the cpu backend
        gives the kernel tuner a new measuring budget: ``kernels.cpu.tune``). ``collective``:
        every rank of the MPI world builds this plan now, in step (a data-parallel graph)."""

    def begin_run(self) -> int:
        """Called before every run of a plan's calls; returns what :meth:`end_run` takes after it
        (the default: nothing to do, 0; the cpu backend runs them on fewer of Numba's threads
        while other processes keep its cores busy: ``kernels.cpu.team``)."""
        return 0

    def end_run(self, token: int) -> None:
        """Called after every run of a plan's calls with :meth:`begin_run`'s ``token``."""

    def builder_for(self, op):
        raise NotImplementedError

    def fused_builder(self, producer, consumer):
        """A builder ``(producer_node, consumer_node, ins, outs)`` of op types ``producer`` then
        ``consumer`` (OpDefs) as one, or None (the default: none). ``ins`` are the producer's
        inputs then the consumer's other inputs, ``outs`` the consumer's outputs; the producer's
        output is read by the consumer only (``runtime.plan.fused_pairs``)."""
        return None

    def group_builder(self, op):
        """A ``kernels.common.table.GroupBuilder`` of several nodes of op type ``op`` (an
        OpDef) as one kernel (multi-tensor updates), or None (the default: none). The plan
        groups nodes where moving them together changes no result
        (``runtime.plan.grouped_nodes``)."""
        return None

    def empty(self, shape, np_dtype):
        raise NotImplementedError

    def view(self, array, shape):
        """``array`` seen as ``shape`` without a copy (same memory, same size), or None (the
        default) where the backend does not share buffers: a ``reshape`` or ``flatten`` then
        copies (``runtime.plan.view_nodes``)."""
        return None

    def transpose_view(self, array, perm, nodes):
        """``array`` with its axes permuted by ``perm`` without a copy (a strided view of the
        same memory), or None (the default) unless the kernels of every node in ``nodes`` (the
        nodes that read the view, or the one that writes it) take strided arrays: a
        ``transpose`` then copies (``runtime.plan.allocate``)."""
        return None

    def from_numpy(self, array: np.ndarray):
        raise NotImplementedError

    def to_numpy(self, array) -> np.ndarray:
        raise NotImplementedError

    def clone(self, array):
        raise NotImplementedError

    def copy_in(self, dst, src: np.ndarray) -> None:
        raise NotImplementedError

    def owns(self, array) -> bool:
        raise NotImplementedError

    def prepare(self, steps):
        raise NotImplementedError

    def input_stager(self, buffers):
        raise NotImplementedError

    def output_copier(self, buffer):
        raise NotImplementedError

    def readback(self, arrays):
        raise NotImplementedError


class CpuBackend(Backend):
    """NumPy arrays in host memory; Numba CPU kernels (``miniflow.kernels.cpu``)."""

    name = "cpu"
    _team = None
    """``kernels.cpu.team``, imported at the first run."""

    def begin_plan(self, collective: bool = False) -> None:
        """A new model for the kernel tuner: ``tune.BUDGET_S`` of measuring for its new
        classes (rank 0 measuring for every rank when ``collective``)."""
        from ..kernels.cpu import tune
        tune.begin_model(collective)

    def begin_run(self) -> int:
        """Numba's thread count to set back after the run, where other processes keep this
        process's cores busy and the run uses fewer threads (``kernels.cpu.team``), else 0."""
        if self._team is None:
            from ..kernels.cpu import team
            CpuBackend._team = team
        return self._team.begin()

    def end_run(self, token: int) -> None:
        self._team.end(token)

    def builder_for(self, op):
        from ..kernels.cpu import builder_for
        return builder_for(op)

    def empty(self, shape, np_dtype):
        return np.empty(shape, np_dtype)

    def view(self, array, shape):
        """``array.reshape(shape)`` where that is a view (``array`` C-contiguous), else None."""
        return array.reshape(shape) if array.flags.c_contiguous else None

    def transpose_view(self, array, perm, nodes):
        """``array.transpose(perm)`` (a NumPy view) where the steps of every node in ``nodes``
        read and write their arrays at any strides (``kernels.cpu.matmul.takes_strided``:
        ``batch_matmul`` as one ``np.matmul``), else None."""
        from ..kernels.cpu.matmul import takes_strided
        if nodes and all(takes_strided(n) for n in nodes):
            return array.transpose(tuple(perm))
        return None

    def from_numpy(self, array):
        return np.array(array, copy=True, order="C")

    def to_numpy(self, array):
        return np.array(array, copy=True)

    def clone(self, array):
        return np.array(array, copy=True)

    def copy_in(self, dst, src):
        np.copyto(dst, src, casting="no")

    def owns(self, array) -> bool:
        return isinstance(array, np.ndarray)

    def prepare(self, steps):
        """The steps themselves, called one after the other."""
        return list(steps), list(range(len(steps))), "steps called in turn"

    def input_stager(self, buffers):
        """``np.copyto`` into each buffer."""
        buffers = list(buffers)

        def stage(arrays):
            for buf, a in zip(buffers, arrays):
                np.copyto(buf, a, casting="no")
        return stage

    def output_copier(self, buffer):
        """A NumPy copy of ``buffer`` per call."""
        return functools.partial(np.array, buffer, copy=True)

    def readback(self, arrays):
        """Copies made at once (``readback.HostReadback``)."""
        from .readback import HostReadback
        return HostReadback(arrays, lambda array, host: np.copyto(host, array))


_DRIVER_LIBRARIES = ("libcuda.so", "libcuda.so.1", "/usr/lib/libcuda.so", "/usr/lib/libcuda.so.1",
                     "/usr/lib64/libcuda.so", "/usr/lib64/libcuda.so.1")
"""Where numba-cuda looks for the CUDA driver on Linux (``numba.cuda.cudadrv.driver``'s
``locate_driver_and_loader``: the library search path, then /usr/lib and /usr/lib64)."""
NO_DRIVER = ("CUDA driver library cannot be found. Ensure that a compatible NVIDIA driver is "
             "installed and available on your system path.")
"""numba-cuda's reason when no driver library loads (its ``DRIVER_NOT_FOUND_MSG``)."""


def _no_driver_library() -> bool:
    """True on Linux when none of :data:`_DRIVER_LIBRARIES` loads, so numba-cuda would find no
    driver either (not where ``NUMBA_CUDA_DRIVER`` names a folder of its own, nor off Linux)."""
    if not sys.platform.startswith("linux") or os.environ.get("NUMBA_CUDA_DRIVER"):
        return False
    for name in _DRIVER_LIBRARIES:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return False
    return True


def cuda_status() -> tuple:
    """``(usable, description)`` of CUDA on this machine, without raising.

    ``usable`` is True for a real GPU, or for numba's simulator when ``NUMBA_ENABLE_CUDASIM=1``;
    ``description`` is the GPU's name, ``"CUDA simulator"``, or why there is no GPU
    (numba-cuda not installed, no driver, no device).

    Without a driver library (:func:`_no_driver_library`) it answers without importing
    ``numba.cuda``, which takes 0.3 s and imports ``ml_dtypes`` (0.6 s more; numba-cuda 0.30,
    ml_dtypes 0.7.0) in every process that picks its backend; once ``numba.cuda`` is imported
    (its driver may be stood in: ``benchmarks/cuda_stub.py``), numba-cuda answers.
    """
    if importlib.util.find_spec("numba_cuda") is None:
        return False, "numba-cuda is not installed"
    from numba import config
    if not config.ENABLE_CUDASIM and "numba.cuda" not in sys.modules and _no_driver_library():
        return False, NO_DRIVER
    try:
        from numba import cuda
    except Exception as e:  # noqa: BLE001 (a broken CUDA install: report it, do not crash)
        return False, f"numba.cuda cannot be imported: {e}"
    if config.ENABLE_CUDASIM:
        return True, "CUDA simulator"
    if cuda.is_available():
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        major, minor = dev.compute_capability
        return True, f"{name} (compute capability {major}.{minor})"
    try:                                     # ask the driver why, keep only its message
        from numba.cuda.cudadrv.driver import driver
        driver.get_device_count()
        reason = "the CUDA driver reports no usable device"
    except Exception as e:  # noqa: BLE001 (CudaSupportError, CudaDriverError, OSError ...)
        reason = " ".join(str(e).replace("Error at driver init:", "").split()).rstrip(" :")
        reason = reason or type(e).__name__
    return False, reason


def _real_gpu_present() -> bool:
    """True when a real CUDA GPU is usable (never under the simulator)."""
    from numba import config
    usable, _ = cuda_status()
    return usable and not config.ENABLE_CUDASIM


class CudaBackend(Backend):
    """numba-cuda device arrays and CUDA kernels (``miniflow.kernels.cuda``).

    Host copies happen only in ``from_numpy`` / ``copy_in`` (parameters, optimizer state),
    ``to_numpy`` (``Tensor.numpy()``), a plan's input stager and read-backs; kernels read and
    write device arrays. Plans run on the backend's stream (``stream``) as packed launches or a
    CUDA graph, with pinned inputs and pooled outputs (``miniflow.runtime.cuda``).

    Raises:
        BackendUnavailableError: on construction, when there is no CUDA device (or no numba-cuda),
            saying how to use the cpu backend instead.
    """

    name = "cuda"

    def __init__(self):
        usable, why = cuda_status()
        if not usable:
            raise BackendUnavailableError(
                f"miniflow: the cuda backend was requested but no CUDA device was found ({why}). "
                f"Use the cpu backend: unset MINIFLOW_BACKEND or set MINIFLOW_BACKEND=cpu "
                f"(in Python: miniflow.set_backend('cpu')). To use an NVIDIA GPU, install its "
                f"driver and the cuda extra: pip install 'miniflow[cuda]'.")
        from numba import cuda
        self._cuda = cuda
        self._stream = None

    readback_depth = 8

    @property
    def stream(self):
        """The stream every plan of this backend runs on (created on first use)."""
        if self._stream is None:
            self._stream = self._cuda.stream()
        return self._stream

    def builder_for(self, op):
        from ..kernels.cuda import builder_for
        return builder_for(op)

    def fused_builder(self, producer, consumer):
        """The CUDA kernels' fused pairs (``kernels.cuda.fused_builder``)."""
        from ..kernels.cuda import fused_builder
        return fused_builder(producer, consumer)

    def group_builder(self, op):
        """The CUDA kernels' multi-tensor updates (``kernels.cuda.group_builder``)."""
        from ..kernels.cuda import group_builder
        return group_builder(op)

    def empty(self, shape, np_dtype):
        from ..kernels.cuda.common import device_empty
        return device_empty(shape, np_dtype)

    def from_numpy(self, array):
        return self._cuda.to_device(np.asarray(array, order="C"))

    def to_numpy(self, array):
        if isinstance(array, np.ndarray):
            return np.array(array, copy=True)
        return array.copy_to_host()

    def clone(self, array):
        from . import cuda as runtime
        return runtime.clone(array)

    def copy_in(self, dst, src):
        """Copy host ``src`` into device buffer ``dst`` (same shape and dtype, as the CPU's
        ``np.copyto(casting="no")``).

        Raises:
            TypeError: dtype mismatch; ValueError: shape mismatch.
        """
        from .cuda import check_copy
        src = np.asarray(src)
        check_copy(dst, src)
        dst.copy_to_device(np.asarray(src, order="C"))

    def owns(self, array) -> bool:
        """A numba device array (or the simulator's stand-in for one)."""
        return not isinstance(array, np.ndarray) and hasattr(array, "copy_to_host")

    def prepare(self, steps):
        """Packed launches on :attr:`stream`, or one CUDA graph (``runtime.cuda.prepare``)."""
        from . import cuda as runtime
        calls, step_of, why_not_graph = runtime.prepare(steps, self.stream)
        note = ("one CUDA graph" if why_not_graph is None
                else f"packed launches (no CUDA graph: {why_not_graph})")
        return calls, step_of, "dispatcher calls" if runtime.SIMULATOR else note

    def input_stager(self, buffers):
        """Pinned host buffers, asynchronous copies (``runtime.cuda.InputStager``)."""
        from . import cuda as runtime
        if runtime.SIMULATOR:
            buffers = list(buffers)

            def stage(arrays):
                for buf, a in zip(buffers, arrays):
                    self.copy_in(buf, a)
            return stage
        return runtime.InputStager(buffers, self.stream)

    def output_copier(self, buffer):
        """A pooled device copy per call (``runtime.cuda.OutputPool``)."""
        from . import cuda as runtime
        if runtime.SIMULATOR:
            return functools.partial(runtime.clone, buffer)
        return runtime.OutputPool(buffer, self.stream)

    def readback(self, arrays):
        """Asynchronous copies into pinned buffers (``runtime.cuda.Readback``)."""
        from . import cuda as runtime
        if runtime.SIMULATOR:
            from .readback import HostReadback
            return HostReadback(arrays, lambda array, host: array.copy_to_host(host))
        return runtime.Readback(arrays, self.stream)


BACKENDS: dict = {"cpu": CpuBackend, "cuda": CudaBackend}
_current: list = []


def default_backend_name() -> str:
    """``MINIFLOW_BACKEND`` if set (lower-cased, spaces stripped), else ``"cuda"`` with a real GPU,
    else ``"cpu"``.

    Raises:
        miniflow.environment.EnvironmentValueError: ``MINIFLOW_BACKEND`` names no backend
            (naming the variable, its value and the valid values).
    """
    name = read("MINIFLOW_BACKEND")
    return name or ("cuda" if _real_gpu_present() else "cpu")


def set_backend(name: str) -> Backend:
    """Select the backend for graphs compiled and eager ops run from now on.

    Raises:
        UnknownBackendError: unknown backend name (a ValueError), listing the known ones.
        BackendUnavailableError: ``"cuda"`` without a CUDA device.
    """
    if not isinstance(name, str) or name not in BACKENDS:
        raise UnknownBackendError(f"set_backend: unknown backend {name!r}; choose one of "
                                  f"{', '.join(repr(b) for b in sorted(BACKENDS))}")
    backend = BACKENDS[name]()
    _current[:] = [backend]
    return backend


def get_backend() -> Backend:
    """The current backend (chosen by :func:`default_backend_name` on first use)."""
    if not _current:
        set_backend(default_backend_name())
    return _current[0]


class device:
    """``torch.device``: a device type (``"cpu"``, ``"cuda"`` ...) and an optional index, what
    :attr:`Tensor.device` returns (the process's backend: ``cpu``, or ``cuda:0``) and what the
    ``device=`` arguments take (:func:`check_device` reads ``str(d)``). ``device("cuda:0")``,
    ``device("cuda", 0)``; equal to a device of the same type and index (not to a string, as
    PyTorch's); made for any type, as PyTorch's, and refused where used if it is not the
    process's.

    Raises:
        TypeError: a type that is not a string, an index that is not an int.
        ValueError: an index given twice, or a negative one.
    """

    def __init__(self, type, index=None):
        if isinstance(type, device):
            type, index = type.type, type.index if index is None else index
        if not isinstance(type, str):
            raise TypeError(f"device(): expected a string like 'cpu' or 'cuda:0', got "
                            f"{type!r}")
        kind, colon, number = type.partition(":")
        if colon:
            if index is not None:
                raise ValueError(f"device(): type (string) must not include an index because "
                                 f"index was passed explicitly: {type}")
            if not number.isdigit():
                raise ValueError(f"device(): invalid device string: {type!r}")
            index = int(number)
        if index is not None and (isinstance(index, bool) or not isinstance(index, int)
                                  or index < 0):
            raise ValueError(f"device(): device index must be an int >= 0, got {index!r}")
        self.type, self.index = kind, index

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        index = "" if self.index is None else f", index={self.index}"
        return f"device(type={self.type!r}{index})"

    def __eq__(self, other) -> bool:
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))


def check_device(owner: str, device) -> None:
    """Accept None or a PyTorch device naming the process's backend (``"cpu"``; ``"cuda"`` /
    ``"cuda:0"`` on the CUDA backend; a string or an object whose ``str`` is one, such as a
    ``torch.device``): miniflow has no per-tensor device, so such a device changes nothing
    (the layers' ``device=``, ``Tensor.to(device)``, ``Module.to(device)``).

    Raises:
        ValueError: another device, naming the backend and how it is chosen.
    """
    if device is None:
        return
    kind, _, index = str(device).partition(":")
    current = get_backend().name
    if kind != current or index not in ("", "0"):
        raise ValueError(
            f"{owner}: device={device!r} is not this process's device: miniflow runs every "
            f"tensor on one backend per process, here {current!r} (chosen with "
            f"miniflow.set_backend or MINIFLOW_BACKEND before models are made); pass "
            f"device=None or {current!r}")
