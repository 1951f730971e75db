"""The precision contract every backend's kernels keep: f16, bf16 and f32 compute in float32, f64
in float64 (``miniflow/kernels/cpu/__init__.py``, "Precision"). :func:`compute_dtype` is its one
statement as a NumPy dtype, for the scratch and accumulator arrays a builder allocates."""
from __future__ import annotations

import numpy as np

__all__ = ["compute_dtype"]


def compute_dtype(dtype) -> np.dtype:
    """The NumPy dtype kernels compute in for storage ``dtype`` (any ``np.dtype`` argument):
    float64 for f64, else float32."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)
