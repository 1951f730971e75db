"""Argument checks: is a value a real number, an integer, a bool, in a range; the one copy of the
checks that constructors, setters and ``load_state_dict`` methods run on their arguments.

Every check takes ``owner`` (who checks: a class or function name, ``"SGD"``, ``"softplus"``)
and ``name`` (the argument's name) and raises with the message ``"<owner>: <name> must be ...,
got <value!r>"`` (with an empty ``owner``: ``"<name> must be ..."``); it returns the value,
normalised (a Python ``float``, ``int`` or ``bool``) unless it says otherwise. A ``bool`` is
never a number here (``True`` is not a learning rate), nor is ``numpy.bool_``. NumPy's numbers
(``np.float32``, ``np.int64``) are numbers. Where a caller words its message its own way, it
tests with :func:`is_real` / :func:`is_integer` and raises itself.

Layer 0: imports nothing from miniflow, so every layer may use it.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["is_real", "is_integer", "real_number", "real", "integer", "positive_integer",
           "boolean"]


def is_real(value) -> bool:
    """Whether ``value`` is a real number (``numbers.Real``: int, float, Fraction, NumPy's
    numbers) and not a bool. NaN and inf are real numbers."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_integer(value) -> bool:
    """Whether ``value`` is an integer (``numbers.Integral``: int, NumPy's integers) and not a
    bool (``numpy.bool_`` is not ``numbers.Integral`` either)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _subject(owner: str | None, name: str) -> str:
    """``"<owner>: <name>"``, or ``name`` alone when ``owner`` is empty."""
    return f"{owner}: {name}" if owner else name


def real_number(owner: str | None, name: str, value):
    """``value`` unchanged, checked to be a real number (:func:`is_real`); any real passes, NaN
    and inf included.

    Raises:
        TypeError: it is not (a string, a bool, None ...): ``"<owner>: <name> must be a real
            number, got <value!r>"``.
    """
    if not is_real(value):
        raise TypeError(f"{_subject(owner, name)} must be a real number, got {value!r}")
    return value


def real(owner: str | None, name: str, value, low: float = -math.inf, high: float = math.inf,
         *, low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a float, checked to be a finite real number in ``[low, high]`` (``low_open``
    / ``high_open`` leave the bound out: ``(low, high]``, ``[low, high)``).

    Raises:
        TypeError: not a real number, as :func:`real_number`.
        ValueError: NaN, inf or outside the range: ``"<owner>: <name> must be finite and in
            [<low>, <high>], got <value!r>"`` (the brackets as the bounds; an infinite ``high``
            always with ``)``).
    """
    real_number(owner, name, value)
    v = float(value)
    if not (math.isfinite(v) and (v > low if low_open else v >= low)
            and (v < high if high_open else v <= high)):
        bounds = ("(" if low_open else "[") + f"{low:g}, {high:g}" + \
            (")" if high_open or high == math.inf else "]")
        raise ValueError(f"{_subject(owner, name)} must be finite and in {bounds}, "
                         f"got {value!r}")
    return v


def integer(owner: str | None, name: str, value, low: int) -> int:
    """``value`` as an int, checked to be an integer (:func:`is_integer`) ``>= low``.

    Raises:
        ValueError: it is not (a bool, a float, a string, too small ...): ``"<owner>: <name>
            must be an integer >= <low>, got <value!r>"``.
    """
    if not is_integer(value) or value < low:
        raise ValueError(f"{_subject(owner, name)} must be an integer >= {low}, got {value!r}")
    return int(value)


def positive_integer(owner: str | None, name: str, value) -> int:
    """``value`` as an int, checked to be an integer (:func:`is_integer`) ``> 0``: a size.

    Raises:
        ValueError: it is not: ``"<owner>: <name> must be a positive integer, got
            <value!r>"``.
    """
    if not is_integer(value) or value <= 0:
        raise ValueError(f"{_subject(owner, name)} must be a positive integer, got {value!r}")
    return int(value)


def boolean(owner: str | None, name: str, value, *, numpy: bool = False) -> bool:
    """``value`` as a bool, checked to be ``True`` or ``False`` (with ``numpy``, a
    ``numpy.bool_`` too: a flag read back from an array or a saved state).

    Raises:
        TypeError: it is not (0, 1, None, a string ...): ``"<owner>: <name> must be True or
            False, got <value!r>"``.
    """
    if not isinstance(value, (bool, np.bool_) if numpy else bool):
        raise TypeError(f"{_subject(owner, name)} must be True or False, got {value!r}")
    return bool(value)
