"""miniflow: a small, readable lazy-graph deep-learning framework (OneFlow nn.Graph style).

User code in ``nn.Graph.build`` records ops into an IR; passes (autograd, optimizer, ...) rewrite it;
Numba kernels execute it. See ``README.md`` and ``tutorials/``.

Numba's ``NUMBA_DISABLE_JIT=1`` is refused here, at import, with one sentence: the kernels' float16
helpers are LLVM intrinsics and Numba overloads, which exist only in compiled code, and plain Python
raises where kernels rely on IEEE results (``math.exp`` overflow, ``math.log(0.0)``). A
``NUMBA_NUM_THREADS`` that is not a positive whole number is refused with one sentence naming it
(Numba's own import error does not name the variable). A bad ``MINIFLOW_*`` value
(``miniflow.environment``) stops the process here with one line naming it and exit code 2.
"""
import importlib as _importlib
import os as _os


def _check_threads(value: str) -> None:
    """Refuse a ``NUMBA_NUM_THREADS`` that Numba would refuse (as ``int()`` reads it)."""
    try:
        ok = not value.strip() or int(value) > 0
    except ValueError:
        ok = False
    if not ok:
        raise ImportError(f"miniflow: NUMBA_NUM_THREADS={value.strip()!r} is not a positive whole "
                          f"number (the threads miniflow's kernels run on): set it to 1 or more, "
                          f"or unset it to use every core", name=__name__)


_check_threads(_os.environ.get("NUMBA_NUM_THREADS", ""))
del _os, _check_threads

from .environment import check_or_exit as _check_or_exit  # noqa: E402

_check_or_exit()        # a bad MINIFLOW_* value: one line and exit code 2, before anything runs
del _check_or_exit

import numba as _numba  # noqa: E402

if _numba.config.DISABLE_JIT:
    raise ImportError("miniflow does not support NUMBA_DISABLE_JIT=1 (its kernels need Numba's "
                      "compiler: float16 intrinsics and IEEE arithmetic); unset NUMBA_DISABLE_JIT "
                      "to use miniflow", name=__name__)

from .dtype import DType, bfloat16, bool_ as _bool, float16, float32, float64, int64
from .random import get_rng_state, manual_seed, set_rng_state
from .serialization import CheckpointError, load, save
from .runtime.backend import device, get_backend, set_backend
from .tensor import (Tensor, arange, from_numpy, full, ones, ones_like, rand, randint, randn,
                     tensor, zeros, zeros_like)
from .join import cat, stack
from .tensor.arithmetic import einsum, where
from .tensor.core import LISTED as _LISTED, not_there as _not_there
from .tensor.indexing import gather, scatter, scatter_add, take_along_dim
from .trace import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from . import amp, cuda, distributed, ir, models, nn, ops, optim  # noqa: E402

__version__ = "0.1.0"

# PyTorch's dtype aliases (dtype=torch.long, .to(torch.float)); not in __all__, so that
# ``from miniflow import *`` hides no builtin float.
long, half, double = int64, float16, float64
globals()["float"] = float32    # (so: a plain assignment would hide float() in this module)
globals()["bool"] = _bool       # torch.bool, the comparisons' dtype (hiding no builtin here)

__all__ = ["CheckpointError", "DType", "Tensor", "amp", "arange", "bfloat16", "cat", "cuda",
           "distributed", "device", "enable_grad", "float16", "float32", "float64", "gather",
           "get_backend", "get_rng_state", "int64", "ir", "is_grad_enabled", "load",
           "manual_seed", "models", "nn", "no_grad", "ops", "optim", "save", "set_backend",
           "set_grad_enabled", "set_rng_state", "stack",
           "tensor", "full", "ones", "ones_like", "zeros", "zeros_like", "rand", "randn",
           "randint", "from_numpy", "scatter", "scatter_add", "take_along_dim", "where",
           "einsum"]


def __getattr__(name):
    """``miniflow.onnx`` after ``import miniflow`` alone, as ``torch.onnx``: the package is
    imported when first asked for (it imports onnx itself only when ``export`` runs); so is
    ``miniflow.compile`` (``torch.compile``; the compiler package, ``miniflow.compiler``).

    Raises:
        AttributeError: any other name the package does not have; one that is a Tensor
            method (``torch.rsqrt(x)`` ported as ``miniflow.rsqrt(x)``) names the method, one
            miniflow has not yet what to write instead
            (``miniflow.tensor.core.NOT_THERE``), any other public name where the list is."""
    if name == "onnx":   # (not ``from . import onnx``: that asks this function again)
        return _importlib.import_module(f"{__name__}.onnx")
    if name == "compile":   # torch.compile; not in __all__, so that * hides no builtin compile
        from .compiler import compile
        globals()["compile"] = compile
        return compile
    if not name.startswith("_") and callable(getattr(Tensor, name, None)):
        raise AttributeError(f"module 'miniflow' has no attribute {name!r}: miniflow's tensor "
                             f"math is Tensor methods; write x.{name}(...) for "
                             f"torch.{name}(x, ...)")
    raise _not_there("module 'miniflow'", name, "" if name.startswith("_") else _LISTED)
