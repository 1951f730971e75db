"""``miniflow.nn.init``: PyTorch's in-place initialisers (``torch.nn.init``), as nanoGPT's
``_init_weights`` calls them: ``normal_``, ``uniform_``, ``constant_``, ``ones_``, ``zeros_``,
``xavier_uniform_`` and ``xavier_normal_``.

Each fills an eager tensor (a parameter, a buffer, ``miniflow.tensor(...)``) in place and returns
it, as PyTorch's do under ``no_grad``: the values are copied into the tensor's memory, where a
compiled graph that binds the parameter sees them at its next call (as
``Module.load_state_dict`` writes them). Random values come from miniflow's generator
(``miniflow.manual_seed``), drawn in float64 and rounded once to the tensor's dtype: the same
distribution as PyTorch's, not its numbers.
"""
from __future__ import annotations

import math

import numpy as np

from ..random import generator as global_generator
from ..runtime.backend import get_backend
from ..tensor import Tensor

__all__ = ["uniform_", "normal_", "constant_", "ones_", "zeros_", "xavier_uniform_",
           "xavier_normal_"]


def _target(fn: str, tensor, random: bool = False) -> Tensor:
    """``tensor`` checked as something to fill in place."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"nn.init.{fn}: expected a miniflow Tensor (a parameter such as "
                        f"module.weight), got {type(tensor).__name__}")
    if tensor.is_lazy:
        raise RuntimeError(f"nn.init.{fn}: cannot fill a lazy tensor inside nn.Graph.build "
                           f"(it holds no data while the graph is traced); initialise the "
                           f"module's parameters in __init__ or before the graph's first call")
    if random and not tensor.is_floating_point():
        raise RuntimeError(f"nn.init.{fn}: a random fill needs a floating tensor, got "
                           f"{tensor.dtype.name} (PyTorch: not implemented for 'Long')")
    return tensor


def _random(fn: str, tensor, generator, draw) -> Tensor:
    """Fill ``tensor`` with ``draw(miniflow's generator, shape)``."""
    _target(fn, tensor, random=True)
    if generator is not None:
        raise TypeError(f"nn.init.{fn}: generator={generator!r} is not supported: miniflow "
                        f"draws from its one generator; seed it with miniflow.manual_seed")
    return _fill(tensor, draw(global_generator(), tensor.shape))


def _fill(tensor: Tensor, values) -> Tensor:
    """Copy ``values`` (broadcast to the tensor's shape) into ``tensor`` in place."""
    arr = np.broadcast_to(np.asarray(values, np.float64), tensor.shape).astype(tensor.dtype.np)
    get_backend().copy_in(tensor._data, np.asarray(arr, order="C"))
    written = getattr(tensor, "written", None)   # a Parameter: its half copies are stale now
    if written is not None:
        written()
    return tensor


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator=None) -> Tensor:
    """Fill ``tensor`` (floating, any shape) with values drawn from U(a, b); returns it.

    Raises:
        TypeError: not a Tensor; a ``generator``. RuntimeError: a lazy tensor (inside
            ``build``) or an int64 one.
    """
    return _random("uniform_", tensor, generator, lambda g, shape: g.uniform(a, b, shape))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator=None) -> Tensor:
    """Fill ``tensor`` (floating, any shape) with values drawn from N(mean, std**2); returns it.

    Raises:
        TypeError: not a Tensor; a ``generator``. RuntimeError: a lazy tensor (inside
            ``build``) or an int64 one.
    """
    return _random("normal_", tensor, generator, lambda g, shape: g.normal(mean, std, shape))


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill ``tensor`` (any dtype and shape) with ``val``; returns it.

    Raises:
        TypeError: not a Tensor. RuntimeError: a lazy tensor (inside ``build``).
    """
    _target("constant_", tensor)
    return _fill(tensor, val)


def ones_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with 1; returns it (errors as :func:`constant_`)."""
    _target("ones_", tensor)
    return _fill(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with 0; returns it (errors as :func:`constant_`)."""
    _target("zeros_", tensor)
    return _fill(tensor, 0.0)


def _fans(fn: str, tensor: Tensor) -> tuple:
    """PyTorch's ``_calculate_fan_in_and_fan_out``: ``[out, in, *kernel]`` gives
    ``(in * kernel size, out * kernel size)``."""
    if tensor.ndim < 2:
        raise ValueError(f"nn.init.{fn}: Fan in and fan out can not be computed for tensor with "
                         f"fewer than 2 dimensions (got shape {list(tensor.shape)})")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    """Fill ``tensor`` (floating, at least 2-D: ``[fan_out, fan_in, *kernel]``) from U(-a, a),
    ``a = gain * sqrt(6 / (fan_in + fan_out))`` (Glorot and Bengio, 2010); returns it.

    Raises:
        ValueError: fewer than 2 dimensions (PyTorch's message). Otherwise as :func:`uniform_`.
    """
    _target("xavier_uniform_", tensor, random=True)
    fan_in, fan_out = _fans("xavier_uniform_", tensor)
    a = gain * math.sqrt(6.0 / float(fan_in + fan_out))
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    """Fill ``tensor`` (floating, at least 2-D) from N(0, std**2),
    ``std = gain * sqrt(2 / (fan_in + fan_out))``; returns it.

    Raises:
        ValueError: fewer than 2 dimensions (PyTorch's message). Otherwise as :func:`normal_`.
    """
    _target("xavier_normal_", tensor, random=True)
    fan_in, fan_out = _fans("xavier_normal_", tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)
