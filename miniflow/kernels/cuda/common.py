"""Shared pieces of the CUDA kernels: the jit decorators, compute/storage types, device helpers,
scalar functions as device functions (:func:`device`).

Types. Kernels get device arrays in their storage dtype (float16 arrays are numba ``float16``
arrays; bfloat16 arrays, ``ml_dtypes.bfloat16`` device arrays, reach kernels as ``uint16`` views
of their bits, :func:`flat`). A kernel factory closes over three conversions (:func:`types_of`):
``ld``, the load of an element as its compute value; ``ct``, the compute type (float32 for f16,
bf16 and f32 storage, float64 for f64); and ``st``, the store into the output's storage. A load
is ``ld(a[i])`` and a store ``out[i] = st(v)``. For f16, f32, f64 and i64 ``ld`` and ``st`` are
numba types, each one PTX ``cvt`` on the GPU (``cvt.f32.f16`` widens exactly; ``cvt.rn.f16.f32``
/ ``cvt.rn.f16.f64`` / ``cvt.rn.f16.s64`` round once to nearest even, overflow to inf, keep
subnormals), the same results as NumPy's ``astype``. NaN stays NaN (hardware returns the
canonical NaN, so its sign and payload may differ from NumPy's). For bf16 they are the device
functions :func:`bf16_to_f32` (the bits shifted into a float32: exact) and :func:`to_bf16` (one
round to nearest even from float32, float64 or int64, through float32 rounded to odd, NaN to the
quiet NaN of its sign: the bits of ``ml_dtypes`` and of the CPU kernels, ``kernels.cpu.fp16``).
numba-cuda's own ``bfloat16`` type is not used: its conversions are C++ shims compiled by NVRTC
at link time (``numba.cuda.bf16``), which the PTX lane cannot link and the simulator does not
have (``numba.cuda.simulator``'s ``bfloat16`` is None). A new kernel gets bfloat16 by loading and
storing through ``types_of``. No arithmetic happens in a half type and no kernel uses atomics:
reductions combine partial results in shared memory.

Caching. Kernels are ``cuda.jit(cache=True)`` on a GPU when Numba has a writable cache folder
(``kernels.common.cache``), else ``cache=False``. Numba keys a cached kernel by its
bytecode and the pickled contents of its closure; the closures hold numba types, numbers and
``cuda.jit(device=True)`` dispatchers of module-level functions, which pickle by reference, so the
key is stable across processes. As on the CPU, the key also covers the miniflow sources compiled
into a kernel from other files (the ops' scalar functions, the scalar bodies of
``kernels.common``, device helpers of other modules: ``kernels.common.cache_key``).

The simulator (``NUMBA_ENABLE_CUDASIM=1``) runs kernels as Python: ``math.exp(1e4)`` raises
OverflowError and ``math.log(0.0)`` ValueError there, where CUDA returns inf and -inf. ``math``
in kernel modules (``from .common import math``) and in device-compiled scalar functions is
therefore, under the simulator only, :data:`SimulatorMath`: ``math`` with the functions that raise
on IEEE cases replaced by NumPy's (every other ``math`` function, ``erf`` say, is the real one, so a
new scalar function needs nothing here). Its ``cuda.shared.array`` is made thread-safe on import
(``kernels.cuda.simulator``).
"""
from __future__ import annotations

import functools
import math as _math
import types as _pytypes

import numpy as np
from numba import config as numba_config
from numba import cuda, types

from ..common import cache_key
from ..common.cache import CACHE
from ...dtype import as_dtype, bfloat16
from ...ops.elementwise import SCALAR_HELPERS, add

__all__ = ["SIMULATOR", "jit", "device", "compute_type", "storage_type", "load_type", "types_of",
           "short", "flat", "device_empty", "scratch", "math", "SimulatorMath", "nan_max",
           "block_sum", "block_max", "strided_offset", "bf16_to_f32", "to_bf16", "round_float32",
           "round_float64"]

SIMULATOR = bool(numba_config.ENABLE_CUDASIM)
"""True when numba runs CUDA kernels in its simulator (``NUMBA_ENABLE_CUDASIM=1``)."""

if SIMULATOR:       # the simulator's cuda.shared.array races between its threads: made safe here
    from . import simulator as _simulator
    _simulator.install()
elif CACHE.enabled:     # numba-cuda's copy of Numba's cache: the same extended key as the CPU's
    from numba.cuda.core import caching as _cuda_caching
    cache_key.install(_cuda_caching.Cache)


def _ieee(np_fn, name=None):
    """``np_fn`` (as ``math.<name>``, default its own name) without floating-point warnings: inf
    and NaN results, as CUDA gives them."""
    def fn(*x):
        with np.errstate(all="ignore"):
            return np_fn(*x)
    fn.__name__ = name or np_fn.__name__
    return fn


SimulatorMath = _pytypes.SimpleNamespace(**{
    **{k: getattr(_math, k) for k in dir(_math) if not k.startswith("_")},
    **{fn.__name__: _ieee(fn) for fn in (np.exp, np.expm1, np.log, np.log1p, np.log2, np.log10,
                                         np.sqrt, np.tanh, np.cosh, np.sinh)},
    "pow": _ieee(np.power, "pow")})
"""``math`` for kernels under the simulator: the functions that raise in Python on IEEE cases
(``exp`` overflow, ``log`` of 0 or a negative number ...) give CUDA's inf/NaN instead."""


math = SimulatorMath if SIMULATOR else _math
"""``math`` for kernel code: the real module, or :class:`SimulatorMath` under the simulator."""


def jit(fn):
    """Compile ``fn`` as a CUDA kernel (lazily, per argument types; cached on disk on a GPU when
    Numba can cache)."""
    return cuda.jit(cache=CACHE.enabled and not SIMULATOR)(fn)


_COMMON = __name__.rsplit(".", 2)[0] + ".common."
"""The package of the kernel bodies both backends compile (``miniflow.kernels.common.``)."""


@functools.cache
def device(fn):
    """The plain scalar function ``fn`` (an op's ``OpDef.scalar``, a body of ``kernels.common``)
    as a CUDA device function.

    Under the simulator ``fn`` is first rebuilt with :data:`SimulatorMath` as its ``math``. The
    helpers it calls (``ops.elementwise.SCALAR_HELPERS``, and the plain functions of ``fn``'s own
    module when that is a ``kernels.common`` one, as ``top_k_sort`` calls ``top_k_before``: plain
    functions, which device code cannot call) become device functions in its rebuilt globals.
    """
    names = fn.__code__.co_names
    common = fn.__module__.startswith(_COMMON)
    helpers = {name: device(h) for name in names
               if isinstance(h := fn.__globals__.get(name), _pytypes.FunctionType)
               and (h in SCALAR_HELPERS or common and h.__module__ == fn.__module__)}
    if SIMULATOR or helpers:
        extra = {"math": SimulatorMath} if SIMULATOR else {}
        fn = _pytypes.FunctionType(fn.__code__, {**fn.__globals__, **extra, **helpers},
                                   fn.__name__, fn.__defaults__, fn.__closure__)
    return cuda.jit(device=True)(fn)


# ----------------------------------------------------------------------------- bfloat16 bits
if SIMULATOR:
    def _float_as_bits(x):
        return int(np.array(x, np.float32).view(np.uint32))

    def _bits_as_float(b):
        return np.array(b & 0xFFFFFFFF, np.uint32).view(np.float32)[()]
else:
    from numba.cuda import libdevice as _libdevice

    @cuda.jit(device=True)
    def _float_as_bits(x):
        return types.int64(_libdevice.float_as_int(types.float32(x))) & 0xFFFFFFFF

    @cuda.jit(device=True)
    def _bits_as_float(b):
        return _libdevice.int_as_float(types.int32(types.uint32(b & 0xFFFFFFFF)))


@cuda.jit(device=True)
def bf16_to_f32(bits):
    """bf16 bits (uint16) -> float32, exact: the bits become the upper half of a float32."""
    return types.float32(_bits_as_float((types.int64(bits) & 0xFFFF) << 16))


@cuda.jit(device=True)
def to_bf16(x):
    """float32, float64 or int64 ``x`` -> bf16 bits (uint16), one round to nearest even: float32
    rounded to odd when inexact (which makes the second rounding exact), then ``+ 0x7FFF + lsb``
    and the upper 16 bits; overflow to inf; NaN to ``0x7FC0`` / ``0xFFC0``."""
    d = types.float64(x)
    f = types.float32(x)
    b = _float_as_bits(f)
    if d == d and types.float64(f) != d:
        if abs(types.float64(f)) > abs(d):
            b -= 1
        b |= 1
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return types.uint16(((b >> 16) & 0x8000) | 0x7FC0)
    return types.uint16(((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF)


_STORAGE = {np.dtype(np.float16): types.float16, np.dtype(np.float32): types.float32,
            np.dtype(np.float64): types.float64, np.dtype(np.int64): types.int64,
            bfloat16.np: to_bf16}
_LOAD = {np.dtype(np.float16): types.float32, np.dtype(np.float32): types.float32,
         np.dtype(np.float64): types.float64, np.dtype(np.int64): types.int64,
         bfloat16.np: bf16_to_f32}


def storage_type(dtype):
    """The store conversion into an array of NumPy ``dtype``: the numba type of its elements
    (f16, f32, f64, i64), or :func:`to_bf16` for bfloat16 (its bits).

    Raises:
        TypeError: another dtype, naming the supported ones.
    """
    try:
        return _STORAGE[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"cuda kernels: unsupported dtype {np.dtype(dtype)}; miniflow tensors are "
                        f"float16, bfloat16, float32, float64 or int64") from None


def load_type(dtype):
    """The load conversion of an element of NumPy ``dtype`` to its compute value: the compute
    type (float32 for f16/f32, float64, int64), or :func:`bf16_to_f32` for bfloat16 bits."""
    storage_type(dtype)
    return _LOAD[np.dtype(dtype)]


def compute_type(dtype):
    """The numba type kernels compute in for storage ``dtype``: float32 for f16, bf16 and f32,
    else the storage type."""
    storage_type(dtype)
    ld = _LOAD[np.dtype(dtype)]
    return types.float32 if ld is bf16_to_f32 else ld


def types_of(a):
    """``(ld, ct, st)`` of array ``a``'s elements: the load conversion, the compute type and the
    store conversion (what kernel factories close over; see the module docstring)."""
    return load_type(a.dtype), compute_type(a.dtype), storage_type(a.dtype)


def short(dtype) -> str:
    """``f16`` for float16 etc. (kernel labels)."""
    return as_dtype(np.dtype(dtype)).short


def flat(a):
    """A 1-D view of a C-contiguous (device) array, bfloat16 as its uint16 bits; a 0-d array
    becomes shape (1,)."""
    out = a.reshape(a.size)
    return out.view(np.uint16) if out.dtype == bfloat16.np else out


def device_empty(shape, dtype):
    """``cuda.device_array(shape, dtype)``: uninitialised device memory (a plan's buffers, the
    builders' scratch). Under the simulator it starts as NaN (floating types) or -1 (integers),
    not as the zeros that fresh host memory usually holds: a kernel that reads an element nobody
    wrote then gives a wrong result in every run of the lane, as uninitialised device memory may
    on a GPU. (The counting kernel of ``multi_count_not_finite`` once wrote its partial counts at
    a wrong row length; the data-parallel run on the simulator skipped its steps only when the
    memory happened to hold garbage.)"""
    buffer = cuda.device_array(shape, dtype)
    if SIMULATOR:
        buffer.copy_to_device(np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -1,
                                      dtype))
    return buffer


def scratch(like, shape, dtype):
    """A scratch buffer allocated once at build time, in the same memory as ``like``.

    Device memory for device arrays (:func:`device_empty`); host memory when builders are run
    on host stand-ins (the PTX test does that to list every kernel signature without a GPU).
    """
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype)
    return device_empty(shape, dtype)


# ----------------------------------------------------------------------------- device helpers
if SIMULATOR:                   # the simulator computes in NumPy and contracts nothing
    @cuda.jit(device=True)
    def round_float32(x):
        """x rounded to float32."""
        return types.float32(x)

    @cuda.jit(device=True)
    def round_float64(x):
        """x rounded to float64."""
        return types.float64(x)
else:
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def round_float32(x):
        """x rounded to float32, never merged with a neighbouring multiply or add: the libdevice
        add with explicit round-to-nearest (``add.rn.f32``, which neither NVVM nor ptxas
        contracts into an FMA) of -0.0 (``x + -0.0`` is ``x`` for every x, -0.0, inf and NaN
        included). Fused kernels round every float32 result through it (``kernels.cuda.fused``)."""
        return libdevice.fadd_rn(types.float32(x), types.float32(-0.0))

    @cuda.jit(device=True)
    def round_float64(x):
        """:func:`round_float32` in float64 (``add.rn.f64``)."""
        return libdevice.dadd_rn(types.float64(x), types.float64(-0.0))


@cuda.jit(device=True)
def nan_max(a, b):
    """max(a, b), NaN if either is NaN (CPU kernels stop at the first NaN of a row)."""
    if b > a or b != b:
        return b
    return a


def _block_reduce(combine, what):
    """A device function ``reduce(sm, v)``: ``combine`` of ``v`` over the block's threads (1-D block
    of power-of-two size), returned to every thread.

    ``sm`` is a shared array of ``blockDim.x`` elements: a tree reduction with one ``syncthreads``
    per level, and a last one so that ``sm`` may be reused as soon as this returns.
    """
    def reduce(sm, v):
        t = cuda.threadIdx.x
        sm[t] = v
        cuda.syncthreads()
        s = cuda.blockDim.x // 2
        while s > 0:
            if t < s:
                sm[t] = combine(sm[t], sm[t + s])
            cuda.syncthreads()
            s //= 2
        total = sm[0]
        cuda.syncthreads()
        return total

    reduce.__name__ = reduce.__qualname__ = f"block_{what}"
    reduce.__doc__ = f"{what} of ``v`` over the block's threads, returned to every thread."
    return cuda.jit(device=True)(reduce)


block_sum = _block_reduce(device(add), "sum")
"""``block_sum(sm, v)``: sum of ``v`` over the block's threads (shared scratch ``sm``)."""
block_max = _block_reduce(nan_max, "max")
"""``block_max(sm, v)``: NaN-propagating max of ``v`` over the block's threads."""


@cuda.jit(device=True)
def strided_offset(i, shape, strides):
    """Element offset of C-order flat index ``i`` of ``shape`` in an array with element ``strides``
    (tuples of equal length; stride 0 = broadcast)."""
    off = 0
    for d in range(len(shape) - 1, -1, -1):
        off += (i % shape[d]) * strides[d]
        i //= shape[d]
    return off
