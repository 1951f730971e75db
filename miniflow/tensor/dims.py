"""Dimension arguments: a ``dim`` made non-negative for a number of dimensions, with PyTorch's
errors (the shape, reduction and join methods all take one)."""
from __future__ import annotations

import numbers


def _wrap_dim(op: str, dim, ndim: int) -> int:
    """``dim`` in ``[0, ndim)`` (a negative one counts from the end; a 0-d tensor takes 0 and
    -1, as in torch).

    Raises:
        TypeError: not an int. IndexError: out of range, with the range.
    """
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{op}: a dim must be an int, got {dim!r}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{op}: dim {dim} is out of range for a tensor of {ndim} dims "
                         f"(expected a dim in [{-n}, {n - 1}])")
    return int(dim) % n if ndim else 0


def _dim(fn: str, dim, ndim: int) -> int:
    """``dim`` made non-negative for ``ndim`` dimensions; IndexError as PyTorch's."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{fn}: dim must be an int, got {dim!r}")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"{fn}: Dimension out of range (expected to be in range of "
                         f"[{-max(ndim, 1)}, {max(ndim, 1) - 1}], but got {dim})")
    return int(dim) % max(ndim, 1)
