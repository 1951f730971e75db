"""``miniflow.cuda``: PyTorch's ``torch.cuda.is_available()`` and ``device_count()``, as scripts
pick their device (the PyTorch MNIST example's ``use_cuda = torch.cuda.is_available()``, then
``torch.device("cuda" if use_cuda else "cpu")``). miniflow has one backend per process
(``miniflow.set_backend``, ``MINIFLOW_BACKEND``), and a ``device="cuda"`` is taken only on the
CUDA backend: so CUDA is "available" here when this process runs on it, whatever GPUs the
machine has (``miniflow info`` says which it has)."""
from __future__ import annotations

import types
import warnings

from .runtime.backend import get_backend

__all__ = ["is_available", "device_count", "amp"]


def is_available() -> bool:
    """True when this process runs on the CUDA backend (a GPU, or Numba's simulator), so that
    ``device="cuda"`` is its device; False on the CPU backend, GPU or not."""
    return get_backend().name == "cuda"


def device_count() -> int:
    """1 on the CUDA backend (miniflow uses one GPU per process), else 0."""
    return 1 if is_available() else 0


def _grad_scaler(*args, **kwargs):
    """``torch.cuda.amp.GradScaler(...)``, PyTorch's deprecated spelling of
    ``torch.amp.GradScaler("cuda", ...)`` (nanoGPT's ``GradScaler(enabled=(dtype ==
    'float16'))``): :class:`miniflow.amp.GradScaler` with these arguments on this process's
    backend, after PyTorch's ``FutureWarning``."""
    warnings.warn("miniflow.cuda.amp.GradScaler(args...) is deprecated, as "
                  "torch.cuda.amp.GradScaler is: use miniflow.amp.GradScaler(args...) instead",
                  FutureWarning, stacklevel=2)
    from .amp import GradScaler
    return GradScaler(None, *args, **kwargs)


amp = types.SimpleNamespace(GradScaler=_grad_scaler)
"""``torch.cuda.amp``'s ``GradScaler`` (miniflow's AMP itself is a graph setting,
``config.enable_amp``: there is no ``autocast``)."""
