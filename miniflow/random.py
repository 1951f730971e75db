"""The global random generator: ``miniflow.manual_seed(n)`` makes initialisation and batching
reproducible (one NumPy ``Generator``, like ``torch.manual_seed``)."""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["manual_seed", "generator"]

_GEN = [np.random.default_rng()]


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed the global generator with ``numpy.random.default_rng(seed)``; returns it.

    ``seed`` is an integer >= 0 of any size (a Python or NumPy integer): NumPy's ``SeedSequence``
    takes no negative seeds, so unlike ``torch.manual_seed`` negative values are refused.

    Raises:
        TypeError: ``seed`` is not an integer (a bool, float, string ...), naming it.
        ValueError: ``seed`` is negative, naming it.
    """
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"manual_seed: the seed must be an integer >= 0, got {seed!r} "
                        f"({type(seed).__name__})")
    if seed < 0:
        raise ValueError(f"manual_seed: the seed must be an integer >= 0 (NumPy's default_rng "
                         f"takes no negative seeds), got {seed}")
    _GEN[0] = np.random.default_rng(int(seed))
    return _GEN[0]


def generator() -> np.random.Generator:
    """The global generator (used by parameter init and data batching)."""
    return _GEN[0]
