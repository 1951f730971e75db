"""Tensor: an eager data holder, or a lazy proxy for an IR Value while an nn.Graph traces.

Every op goes through :func:`apply`: inside ``nn.Graph.build`` it records a Node (lazy); outside, it
runs the op's kernel at once (eager, forward only), on the same kernels a compiled plan uses.

:class:`Tensor` is :class:`~miniflow.tensor.core.TensorCore` (its state, properties and Python
conversions) with one method group per module mixed in: ``compare.py`` (``==``, ``<``, ...),
``casts.py`` (``to``, ``float``, ``detach``, ...), ``shape.py`` (PyTorch's shape and movement
surface), ``indexing.py`` (``x[key]``, ``x[key] = v``), ``reductions.py`` (``sum``, ``max``,
...; and the group ``Sampling``: ``topk``, ``sort``, and ``multinomial``, ``nonzero`` of eager
tensors) and
``arithmetic.py`` (operators, elementwise math, ``softmax``, ``masked_fill``). ``create.py`` makes
tensors (:func:`apply`, :func:`tensor`); ``dims.py`` checks dimension arguments.
"""
from .arithmetic import Arithmetic, mask_array
from .casts import Casts, to_args
from .compare import Comparisons
from .core import TensorCore
from .create import (apply, arange, as_numpy, from_numpy, full, ones, ones_like, rand, randint,
                     randn, tensor, tensor_class, zeros, zeros_like)
from .indexing import Indexing
from .reductions import Reductions, Sampling
from .shape import Shape

__all__ = ["Tensor", "tensor", "apply", "mask_array", "as_numpy", "to_args", "zeros", "ones",
           "full", "arange", "zeros_like", "ones_like", "rand", "randn", "randint",
           "from_numpy"]


@tensor_class
class Tensor(TensorCore, Comparisons, Casts, Shape, Indexing, Reductions, Sampling,
             Arithmetic):
    """A multi-dimensional array of one dtype.

    Eager tensors hold a backend array (``numpy()`` returns a host copy). Lazy tensors exist only
    during ``nn.Graph.build`` and stand for an IR Value; reading their data there is an error.
    """

    __array_priority__ = 100  # so ndarray (op) Tensor defers to Tensor's reflected operators
