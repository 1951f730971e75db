"""Dimension arguments: a ``dim`` made non-negative for a number of dimensions, with PyTorch's
errors (the shape, reduction and join methods all take one)."""
from __future__ import annotations

import numbers


def _dim(fn: str, dim, ndim: int) -> int:
    """``dim`` in ``[0, ndim)`` (a negative one counts from the end; a 0-d tensor takes 0 and
    -1, as in torch).

    Raises:
        TypeError: not an int (a bool included). IndexError: out of range (PyTorch's message).
    """
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{fn}: dim must be an int, got {dim!r}")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"{fn}: Dimension out of range (expected to be in range of "
                         f"[{-max(ndim, 1)}, {max(ndim, 1) - 1}], but got {dim})")
    return int(dim) % max(ndim, 1)
