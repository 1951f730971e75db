"""PyTorch's factory keywords ``device=`` and ``dtype=`` of the layers that create parameters and
buffers (``torch.nn.Linear(..., device=None, dtype=None)`` and the other layers' "factory
kwargs"): :func:`param_dtype` checks both and gives the NumPy dtype the layer creates its
floating-point state in.

miniflow has no per-tensor device: the backend (``cpu`` or ``cuda``) is chosen for the process
(``miniflow.set_backend``, ``MINIFLOW_BACKEND``), so a device is accepted when it names that
backend (``"cpu"``, ``"cuda"``, ``"cuda:0"``, or a ``torch.device`` of one) and refused
otherwise. The dtype is any floating dtype of miniflow (float32 by default, as PyTorch's
default dtype; float64, float16, bfloat16), given as a miniflow dtype, a NumPy dtype, a name
(``"float64"``) or a ``torch.dtype`` (``torch.float64``).
"""
from __future__ import annotations

import numpy as np

from ..dtype import DType, as_dtype
from ..runtime.backend import check_device

__all__ = ["param_dtype"]

_FLOATS = "float32 (the default), float64, float16 or bfloat16"


def _dtype(layer: str, dtype) -> DType:
    """``dtype`` as a miniflow DType (a ``torch.dtype`` by its name: ``dtype.as_dtype``)."""
    try:
        return as_dtype(dtype)
    except TypeError:
        raise TypeError(f"{layer}: dtype={dtype!r} is not a dtype miniflow has; its parameters "
                        f"can be {_FLOATS}") from None


def param_dtype(layer: str, device=None, dtype=None) -> np.dtype:
    """The NumPy dtype a layer's parameters and floating buffers are created in, from PyTorch's
    factory keywords (see the module docstring).

    Args:
        layer: the layer's name, for errors (``"Linear"``).
        device: None, or the process's backend (``"cpu"``; ``"cuda"`` / ``"cuda:0"`` on the CUDA
            backend), as a string or an object whose ``str`` is one (``torch.device``).
        dtype: None (float32) or a floating dtype.

    Raises:
        ValueError: a device other than the process's backend, naming it and how to choose it.
        TypeError: a dtype miniflow does not have, or an integer one (parameters are
            floating point; PyTorch's initialisers refuse integer dtypes too).
    """
    check_device(layer, device)
    if dtype is None:
        return np.dtype(np.float32)
    dt = _dtype(layer, dtype)
    if not dt.is_float:
        raise TypeError(f"{layer}: dtype={dtype!r}: parameters must be floating point, "
                        f"{_FLOATS}")
    return np.dtype(dt.np)
