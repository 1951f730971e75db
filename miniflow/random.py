"""The global random generator: ``miniflow.manual_seed(n)`` makes initialisation and batching
reproducible (one NumPy ``Generator``, like ``torch.manual_seed``)."""
from __future__ import annotations

import numpy as np

__all__ = ["manual_seed", "generator"]

_GEN = [np.random.default_rng()]


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed the global generator; returns it."""
    _GEN[0] = np.random.default_rng(int(seed))
    return _GEN[0]


def generator() -> np.random.Generator:
    """The global generator (used by parameter init and data batching)."""
    return _GEN[0]
