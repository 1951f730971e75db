"""Optional cuBLAS GEMMs for ``matmul``, through CuPy's cuBLAS binding (``cupy_backends.cuda.libs
.cublas``: the ``cublas`` extra, ``pip install "miniflow[cublas]"``), used when it is installed
and a GPU is there (:func:`available`); else the register-tiled kernel of ``matmul.py`` runs.

Zero-copy: the GEMM reads and writes miniflow's device buffers by their addresses
(``__cuda_array_interface__``), nothing is converted or allocated. One ``cublasGemmEx`` per
matmul with the precision contract of the kernels: f16 operands and result with float32
accumulation (``CUBLAS_COMPUTE_32F``: tensor cores on sm_70 and later), f32 with float32
(``CUBLAS_COMPUTE_32F``, not TF32), f64 with float64. Row-major products are column-major products
of the transposes: ``out[M, N] = op(a) @ op(b)`` is computed as ``out^T = op(b)^T op(a)^T``
(:func:`gemm_layout`). The call is made on the plan's stream (``GemmStep.on_stream``) and can be
captured into the plan's CUDA graph.

Verified: the layout arithmetic (against a NumPy emulation of column-major GEMM, every transpose
pair) and the selection (the kernel runs without CuPy, under the simulator and on the host
stand-ins of the PTX lane). The GEMM itself has not run: no GPU was at hand
(``benchmarks/gpu_check.py`` compares both paths on one).
"""
from __future__ import annotations

import numpy as np

from ...environment import read
from .common import SIMULATOR, short

__all__ = ["ENABLED", "available", "gemm_layout", "GemmStep", "gemm_steps"]

ENABLED = [read("MINIFLOW_CUBLAS", "1") == "1"]
"""Whether matmul may use cuBLAS (``MINIFLOW_CUBLAS=0`` turns it off)."""

OP_N, OP_T = 0, 1
"""``cublasOperation_t``: no transpose, transpose."""
_TYPES = {np.dtype(np.float16): (2, 68, np.float32), np.dtype(np.float32): (0, 68, np.float32),
          np.dtype(np.float64): (1, 70, np.float64)}
"""dtype -> (``cudaDataType`` of the operands, ``cublasComputeType_t``, dtype of alpha/beta):
``CUDA_R_16F`` / ``CUDA_R_32F`` / ``CUDA_R_64F``; ``CUBLAS_COMPUTE_32F`` / ``CUBLAS_COMPUTE_64F``."""
GEMM_DEFAULT = -1
"""``CUBLAS_GEMM_DEFAULT``."""
_BINDING: list = []


def _binding():
    """CuPy's cuBLAS module and a handle getter, or None (not installed, or no GPU)."""
    if not _BINDING:
        try:
            import cupy
            from cupy_backends.cuda.libs import cublas
            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no device")
            _BINDING.append((cublas, cupy.cuda.device.get_cublas_handle))
        except Exception:  # noqa: BLE001 (not installed, no driver, no device: use the kernel)
            _BINDING.append(None)
    return _BINDING[0]


def available(a, b, out) -> bool:
    """Whether ``out = op(a) @ op(b)`` runs on cuBLAS: enabled, not the simulator, device arrays
    (not the host stand-ins the PTX lane builds with), a float dtype, CuPy's binding there."""
    return (ENABLED[0] and not SIMULATOR and not isinstance(out, np.ndarray)
            and np.dtype(out.dtype) in _TYPES and out.size > 0 and _binding() is not None)


def gemm_layout(ta: bool, tb: bool, m: int, n: int, k: int) -> tuple:
    """The column-major GEMM that computes the row-major ``out[m, n] = op(a) @ op(b)``:
    ``(op_first, op_second, rows, cols, inner, ld_first, ld_second, ld_out)``, where the first
    operand is ``b`` and the second ``a`` (``out^T = op(b)^T op(a)^T``; a row-major ``[r, c]``
    buffer is a column-major ``c x r`` matrix with leading dimension ``c``)."""
    op_b, ld_b = (OP_T, k) if tb else (OP_N, n)     # b is [n, k] when tb, else [k, n]
    op_a, ld_a = (OP_T, m) if ta else (OP_N, k)     # a is [k, m] when ta, else [m, k]
    return op_b, op_a, n, m, k, ld_b, ld_a, n


def _pointer(array) -> int:
    return array.__cuda_array_interface__["data"][0]


class GemmStep:
    """A plan step calling ``cublasGemmEx``: ``step()`` on the default stream, ``on_stream(stream)``
    a function of no arguments on ``stream`` (``runtime.cuda.prepare``). ``capturable``: it may
    be captured into a CUDA graph."""

    capturable = True

    def __init__(self, a, b, out, ta: bool, tb: bool, m: int, n: int, k: int):
        self.__name__ = f"cublas_gemm {'T' if ta else 'N'}{'T' if tb else 'N'} {short(out.dtype)}"
        dtype, compute, scalar = _TYPES[np.dtype(out.dtype)]
        self._scalars = np.array([1.0, 0.0], scalar)        # alpha, beta (host pointers)
        alpha = self._scalars.ctypes.data
        beta = alpha + self._scalars.itemsize
        op_b, op_a, rows, cols, inner, ld_b, ld_a, ld_out = gemm_layout(ta, tb, m, n, k)
        self._args = (op_b, op_a, rows, cols, inner, alpha, _pointer(b), dtype, ld_b,
                      _pointer(a), dtype, ld_a, beta, _pointer(out), dtype, ld_out, compute,
                      GEMM_DEFAULT)
        self._arrays = (a, b, out)                          # keep the buffers alive

    def _call(self, stream_handle: int) -> None:
        cublas, handle_of = _binding()
        handle = handle_of()
        cublas.setStream(handle, stream_handle)
        cublas.gemmEx(handle, *self._args)

    def __call__(self) -> None:
        self._call(0)

    def on_stream(self, stream):
        """The step on ``stream`` (a numba stream)."""
        handle = int(stream.handle)
        return lambda: self._call(handle)


def gemm_steps(a, b, out, ta: bool, tb: bool, m: int, n: int, k: int) -> list:
    """One :class:`GemmStep` for ``out = op(a) @ op(b)``."""
    return [(GemmStep(a, b, out, ta, tb, m, n, k), ())]
