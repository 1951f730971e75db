"""Half-type products on Intel AMX through oneMKL's mixed-precision GEMM (the optional ``amx``
extra: ``pip install 'miniflow[amx]'``, the ``mkl`` wheel), called through ``ctypes``.

oneMKL's ``cblas_gemm_bf16bf16f32`` and ``cblas_gemm_f16f16f32`` (oneMKL Developer Reference,
"cblas_gemm_*": ``C = alpha * op(A) * op(B) + beta * C`` with bfloat16 / float16 ``A`` and
``B`` and a float32 ``C``, the products accumulated in float32) run on the AMX tile unit where
the CPU has it (AMX-BF16: Sapphire Rapids and later; AMX-FP16: Granite Rapids), and request
the Linux permission for the tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``) themselves. On one
Sapphire Rapids core a 256 x 1024 x 1024 bfloat16 product runs at about 716 GFLOP/s there,
against 146 for OpenBLAS's float32 sgemm; float16 (no AMX-FP16 on that CPU) at 137, as sgemm.

:func:`gemm_step` is the product of the ``"mkl"`` candidate of ``matmul.CANDIDATES``
(``matmul.mkl_steps``; the ``"mkl blocked"`` one, ``matmul.mkl_blocked_steps``, calls it once per
block of :func:`block_rows` rows of out, each block rounded while it is in cache), which
:func:`offered` says is offered for a product of two bfloat16
(float16) operands only where

* the target Numba compiles for (``target.cpu()``: its feature string) has ``amx-bf16``
  (``amx-fp16`` or ``avx512fp16`` for float16): a run as another CPU (``NUMBA_CPU_NAME=haswell``,
  whose features LLVM keeps to itself: an empty feature string) never uses it;
* ``MINIFLOW_MATMUL`` is ``auto`` (the tuner measures it against the other candidates and keeps
  it only where it is faster) or ``mkl`` (forced: every half-type product it takes);
* the ``mkl`` wheel is installed (its ``libmkl_rt``, found through the package's installed
  files, else the loader's search path). Forced without it: ``extras.MissingExtraError``, one
  sentence naming the extra.

Rounding: the product is float32 (every ``a[i, p] * b[p, j]`` exact in float32, summed in
float32 in oneMKL's order), rounded into a half out by the same pass as the other candidates
(``matmul.mkl_steps``). The order differs from the Numba kernels' and OpenBLAS's, so the bits
differ from theirs in the last places of the float32 sum: which candidate the tuner chose
decides the bits, and with the choice cached they are the same in every run (oneMKL runs on
one thread here, and its result was measured independent of the operands' alignment).
``MINIFLOW_MATMUL=numba`` / ``blas`` never call it.

Threads: oneMKL's ``SEQUENTIAL`` layer, unless ``MKL_THREADING_LAYER`` says otherwise (the
intel layer needs the ``intel-openmp`` wheel; a second thread pool would compete with Numba's
and OpenBLAS's).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

import numpy as np

from ...extras import missing
from . import target, tune

__all__ = ["EXTRA", "FUNCTIONS", "BLOCK_BYTES", "library", "available", "takes", "gemm_step",
           "block_rows", "offered", "describe"]

EXTRA = "amx"
"""The optional extra that installs oneMKL (``pyproject.toml``)."""
FUNCTIONS = {"bfloat16": ("cblas_gemm_bf16bf16f32", ("amx-bf16",)),
             "float16": ("cblas_gemm_f16f16f32", ("amx-fp16", "avx512fp16"))}
"""Operand dtype's name -> (oneMKL function, target features any of which offers it)."""
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112      # CBLAS_LAYOUT, CBLAS_TRANSPOSE (mkl_cblas.h)
_SEQUENTIAL = 1                                    # MKL_THREADING_SEQUENTIAL (mkl_service.h)
_INT_MAX = 2 ** 31 - 1                             # MKL_INT of the LP64 interface
BLOCK_BYTES = 1 << 19
"""Bytes of the float32 block of out's rows that ``matmul.mkl_blocked_steps`` computes per call
and rounds while it is in cache: a quarter of a Sapphire Rapids core's 2 MiB L2, so that the
block, the operands' rows it reads and the half rows it writes fit together (``dy.T @ x``, 1024 x
256 x 1024 in bfloat16, one core: 1534 us in 512 KiB blocks, 1762 in 1 MiB, 2090 in 256 KiB)."""


def _find() -> str | None:
    """The path of ``libmkl_rt``: from the ``mkl`` package's installed files, else the loader's
    search path (a conda or system oneMKL); None where neither has it."""
    from importlib import metadata
    try:
        files = metadata.distribution("mkl").files or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name.startswith("libmkl_rt.so") or f.name == "mkl_rt.dll":
            return str(f.locate())
    return ctypes.util.find_library("mkl_rt")


@functools.cache
def library():
    """oneMKL's ``libmkl_rt`` (``ctypes.CDLL``), its two functions typed, on the sequential
    layer unless ``MKL_THREADING_LAYER`` is set; None where it is not installed or cannot be
    loaded."""
    path = _find()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    if not os.environ.get("MKL_THREADING_LAYER"):
        lib.MKL_Set_Threading_Layer(ctypes.c_int(_SEQUENTIAL))
    i, p = ctypes.c_int, ctypes.c_void_p
    for name, _ in FUNCTIONS.values():
        fn = getattr(lib, name)
        fn.argtypes = [i, i, i, i, i, i, ctypes.c_float, p, i, p, i, ctypes.c_float, p, i]
        fn.restype = None
    return lib


def available() -> bool:
    """Whether oneMKL can be loaded (the ``amx`` extra is installed)."""
    return library() is not None


def _target_has(features) -> bool:
    """Whether the target Numba compiles for has any of ``features`` (its feature string; an
    empty one, a CPU named by ``NUMBA_CPU_NAME``, has none: see the module docstring)."""
    return any(f"+{f}" in target.cpu()[2].split(",") for f in features)


def _operand(x):
    """``(transpose, leading dimension)`` of the 2-D view ``x`` (``op(a)`` or ``op(b)``) for a
    row-major call: its rows (``_NO_TRANS``) or its columns (``_TRANS``) of unit stride; None
    where neither is (a strided view)."""
    (r, c), (s0, s1), size = x.shape, x.strides, x.itemsize
    if s1 == size and s0 % size == 0 and max(1, c) <= s0 // size <= _INT_MAX:
        return _NO_TRANS, s0 // size
    if s0 == size and s1 % size == 0 and max(1, r) <= s1 // size <= _INT_MAX:
        return _TRANS, s1 // size
    return None


def takes(a, b, out) -> bool:
    """Whether oneMKL computes ``out = a @ b`` (``a``, ``b`` possibly ``.T`` views): both of one
    half dtype of :data:`FUNCTIONS`, out float32 or a half type (the product is float32) and
    C-contiguous, no dimension zero or past the LP64 interface's ``int``, each operand's rows or
    columns of unit stride."""
    (m, k), n = a.shape, b.shape[1]
    return (a.dtype == b.dtype and a.dtype.name in FUNCTIONS and out.flags.c_contiguous
            and (out.dtype == np.float32 or out.dtype.name in FUNCTIONS)
            and 0 < min(m, k, n) and max(m, k, n) <= _INT_MAX
            and _operand(a) is not None and _operand(b) is not None)


class _Gemm:
    """A step function: one oneMKL call with its arguments fixed when the plan is built (the
    arrays held, so that their buffers live as long as the step)."""

    __slots__ = ("fn", "args", "arrays", "__name__")

    def __init__(self, fn, args, arrays):
        self.fn, self.args, self.arrays, self.__name__ = fn, args, arrays, fn.__name__

    def __call__(self):
        self.fn(*self.args)


def gemm_step(a, b, out):
    """The step computing ``out = a @ b`` by one oneMKL call (``a``, ``b`` possibly ``.T`` views
    of one half type; ``out`` float32, C-contiguous): ``(function, ())``, the call's arguments
    fixed when the plan is built.

    Raises:
        MissingExtraError: oneMKL is not installed (one sentence naming the extra).
        ValueError: :func:`takes` does not hold, or out is not C-contiguous float32.
    """
    lib = library()
    if lib is None:
        raise missing("mkl", EXTRA, "matmul's mkl candidate (oneMKL)")
    if not (takes(a, b, out) and out.dtype == np.float32):
        raise ValueError(f"matmul (mkl): oneMKL does not take {a.dtype} {a.shape} strides "
                         f"{a.strides} @ {b.dtype} {b.shape} strides {b.strides} -> {out.dtype} "
                         f"{out.shape}; use MINIFLOW_MATMUL=auto, numba or blas")
    (m, k), n = a.shape, b.shape[1]
    (ta, lda), (tb, ldb) = _operand(a), _operand(b)
    fn = getattr(lib, FUNCTIONS[a.dtype.name][0])
    args = (_ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, 0.0,
            out.ctypes.data, n)
    return _Gemm(fn, args, (a, b, out)), ()


def block_rows(n: int) -> int:
    """Rows of a float32 block of ``n`` columns in :data:`BLOCK_BYTES` (at least one)."""
    return max(1, BLOCK_BYTES // (4 * n))


def offered(a, b, out) -> bool:
    """Whether the ``"mkl"`` candidate (``matmul.mkl_steps``) is offered for ``out = a @ b``
    (the module docstring: a half product it takes, on a target with the feature, in mode
    ``auto`` or ``mkl``, oneMKL installed).

    Raises:
        MissingExtraError: ``MINIFLOW_MATMUL=mkl``, a half-type product and oneMKL is not
            installed (one sentence naming the extra).
    """
    how = tune.mode()
    if how not in ("auto", "mkl") or a.dtype.name not in FUNCTIONS:
        return False
    if how == "mkl" and not available():
        raise missing("mkl", EXTRA, "MINIFLOW_MATMUL=mkl (oneMKL's half-type matmul)")
    return _target_has(FUNCTIONS[a.dtype.name][1]) and available() and takes(a, b, out)


def describe() -> str:
    """One line for ``miniflow info``: whether the half-type products may run on oneMKL (AMX)."""
    have = [f"{dt} ({next(f for f in features if _target_has((f,)))})"
            for dt, (_, features) in FUNCTIONS.items() if _target_has(features)]
    have = ", ".join(have) or "no dtype (the target has no AMX-BF16, AMX-FP16 or AVX512-FP16)"
    if library() is None:
        return (f"oneMKL half-type matmul: not installed (pip install 'miniflow[{EXTRA}]'; "
                f"it would be a candidate for {have})")
    version = ctypes.create_string_buffer(256)
    library().mkl_get_version_string(version, 256)
    return f"oneMKL half-type matmul: {version.value.decode().strip()}; a candidate for {have}"
