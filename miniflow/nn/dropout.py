"""``nn.Dropout`` and ``nn.functional.dropout`` (PyTorch's names, arguments and defaults: ``p=0.5``,
identity in eval mode), on OneFlow's ``dropout`` op (``miniflow.ops.dropout``), and the random
stream its masks come from.

The stream is one int64 ``[seed, offset]`` tensor for the whole process (:func:`dropout_state`;
one per backend, each starting from the stream's last state), like PyTorch's CUDA generator: every ``nn.Dropout`` holds it as a non-persistent buffer (so a
compiled graph binds it as a variable its dropout nodes advance in place, and it is in no
``state_dict``: PyTorch's state dicts load as they are). It is registered with
``miniflow.random``: ``miniflow.manual_seed(n)`` restarts it at ``[n, 0]`` (masks reproducible), and
``miniflow.random.RngState`` saves and restores it with the global generator, so a training run
resumed from a checkpoint draws the masks the uninterrupted run drew.
"""
from __future__ import annotations

import numpy as np

from ..checks import is_real
from ..random import register_stream
from ..runtime.backend import get_backend
from ..tensor import Tensor, apply
from ..trace import current_tracer
from .module import Module

__all__ = ["Dropout", "dropout", "dropout_state", "STREAM_VARIABLE"]

_MASK63 = (1 << 63) - 1
STREAM_VARIABLE = "dropout.rng_state"
"""The stream's graph variable where no ``nn.Dropout`` of the graph holds it as its buffer."""
_HOST: list = []
"""The stream's ``[seed, offset]`` as last set or read on the host (the start of every backend's
copy)."""
_STATES: dict = {}
"""Backend name -> ``(backend, Tensor)``: the stream on each backend it was used on."""


def dropout_state() -> Tensor:
    """The process's dropout stream on the current backend: an eager int64 ``[seed, offset]``
    Tensor (created on first use, from the stream's last state; seeded from fresh OS entropy
    unless ``miniflow.manual_seed`` was called since import)."""
    backend = get_backend()
    entry = _STATES.get(backend.name)
    if entry is None or not backend.owns(entry[1]._data):
        if not _HOST:
            seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0]) & _MASK63
            _HOST.append(np.array([seed, 0], np.int64))
        entry = _STATES[backend.name] = (backend, Tensor(backend.from_numpy(_HOST[0].copy())))
    return entry[1]


def _get() -> list:
    return [int(v) for v in dropout_state().numpy()]


def _put(values) -> None:
    if len(values) != 2:
        raise ValueError(f"dropout stream state must be [seed, offset], got {values!r}")
    host = np.array(values, np.int64)
    _HOST[:] = [host]
    for backend, t in _STATES.values():
        backend.copy_in(t._data, host)


def _stream_seed(seed: int) -> int:
    """The dropout stream's int64 seed for ``manual_seed(seed)``: the seed itself below 2^63,
    else 63 bits of a hash of all of it (masking made 2^63 the seed of 0, and every seed the
    same as its low 63 bits)."""
    if seed <= _MASK63:
        return seed
    return int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0]) & _MASK63


register_stream("dropout", _get, _put, lambda seed: _put([_stream_seed(seed), 0]))


def _check_p(fn: str, p) -> float:
    if not is_real(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{fn}: dropout probability has to be between 0 and 1, but got {p!r}")
    return float(p)


def dropout(input: Tensor, p: float = 0.5, training: bool = True,
            inplace: bool = False) -> Tensor:
    """Zero each element of ``input`` with probability ``p`` and scale the rest by
    ``1 / (1 - p)`` (op ``dropout``; the mask from :func:`dropout_state`'s stream, which it
    advances); ``input`` itself when not ``training`` or ``p == 0``. ``input``: any float
    tensor; same shape and dtype out.
    ``inplace`` is accepted for PyTorch's signature; the result is always a new tensor.

    Inside ``nn.Graph.build`` the stream is a graph variable the op advances in place: an
    ``nn.Dropout``'s buffer ``rng_state`` (``model.drop.rng_state``), or, in a model without
    one (``F.dropout(x, self.p, self.training)`` in a custom module, as PyTorch code calls it),
    :data:`STREAM_VARIABLE`; both are the one stream, so the masks are those eager calls draw.

    Raises:
        ValueError: ``p`` outside [0, 1] (PyTorch's message).
    """
    p = _check_p("dropout", p)
    if not training or p == 0.0:
        return input
    state = dropout_state()
    tr = current_tracer()
    if tr is not None:
        tr.bind_state(state, STREAM_VARIABLE)
    return apply("dropout", [input, state], rate=p)[0]


class Dropout(Module):
    """During training, zero each element with probability ``p`` and scale the others by
    ``1 / (1 - p)``; in eval mode, the identity (``torch.nn.Dropout``). Holds the process's
    dropout stream (:func:`dropout_state`) as the non-persistent buffer ``rng_state``."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        self.p, self.inplace = _check_p("Dropout", p), bool(inplace)
        self.register_buffer("rng_state", dropout_state(), persistent=False)

    def forward(self, x):
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"
