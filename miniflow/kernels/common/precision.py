"""The precision contract every backend's kernels keep: f16, bf16 and f32 compute in float32, f64
in float64 (``miniflow/kernels/cpu/__init__.py``, "Precision"). :func:`compute_dtype` is its one
statement as a NumPy dtype, for the scratch and accumulator arrays a builder allocates."""
from __future__ import annotations

import numpy as np

__all__ = ["compute_dtype", "compute_scalars"]


def compute_dtype(dtype) -> np.dtype:
    """The NumPy dtype kernels compute in for storage ``dtype`` (any ``np.dtype`` argument):
    float64 for f64, else float32."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)


def compute_scalars(dtype, values) -> tuple:
    """``values`` (Python floats: an elementwise op's ``scalar_args``) as NumPy scalars of
    ``dtype``'s compute type, each rounded once (round to nearest even, as a cast in a kernel):
    the scalar operands the map kernels pass to the scalar function."""
    ct = compute_dtype(dtype).type
    return tuple(ct(v) for v in values)
