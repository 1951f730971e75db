"""miniflow: a small, readable lazy-graph deep-learning framework (OneFlow nn.Graph style).

User code in ``nn.Graph.build`` records ops into an IR; passes (autograd, optimizer, ...) rewrite it;
Numba kernels execute it. See ``README.md`` and ``tutorials/``.
"""
from .dtype import DType, float16, float32, float64, int64
from .random import manual_seed
from .runtime.backend import get_backend, set_backend
from .tensor import Tensor, tensor
from . import amp, ir, nn, ops, optim  # noqa: E402

__version__ = "0.1.0"

__all__ = ["DType", "Tensor", "amp", "float16", "float32", "float64", "get_backend", "int64", "ir",
           "manual_seed", "nn", "ops", "optim", "set_backend", "tensor"]
