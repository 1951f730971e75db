"""miniflow's environment variables (``MINIFLOW_*``): what each one accepts, read in one place.

:data:`VARIABLES` lists them; :func:`read` is how a module reads one, :func:`check` reads them
all. ``import miniflow`` checks them: a bad value stops the process there with one line on
stderr naming the variable, its value and the accepted values, and exit code 2, as the command
line's usage errors (a script, a lesson, ``python -m miniflow ...``; in a notebook, a
``SystemExit``). A variable changed inside the process after the import is read again where it
is used, and a bad value is then an :class:`EnvironmentValueError` with the same line.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Callable

__all__ = ["EnvironmentValueError", "Variable", "VARIABLES", "MATMUL_MODES", "read", "check",
           "check_or_exit"]


class EnvironmentValueError(ValueError):
    """A ``MINIFLOW_*`` variable holds a value it does not accept; the message is one line
    naming the variable, the value and the accepted values."""


@dataclass(frozen=True)
class Variable:
    """One variable: ``accepted`` (the values, in words), ``parse`` (the value, stripped and
    not empty, to the setting; ``ValueError`` when it is no accepted value) and ``meaning``
    (what the values do, and what unset means)."""

    accepted: str
    parse: Callable[[str], object]
    meaning: str


def _choice(*values: str) -> Callable[[str], str]:
    """A parser of one of ``values``, in any case."""
    def parse(text: str) -> str:
        if text.lower() not in values:
            raise ValueError(text)
        return text.lower()
    return parse


def _seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise ValueError(text)
    return value


MATMUL_MODES = ("auto", "numba", "blas", "packed", "mkl")
"""The values of ``MINIFLOW_MATMUL`` (``kernels.cpu.tune``)."""

VARIABLES = {
    "MINIFLOW_BACKEND": Variable(
        "one of cpu, cuda (any case)", _choice("cpu", "cuda"),
        "the backend graphs and eager ops run on; unset, cuda when a GPU is usable, else cpu"),
    "MINIFLOW_MATMUL": Variable(
        f"one of {', '.join(MATMUL_MODES)}", _choice(*MATMUL_MODES),
        "auto (unset) measures which kernel is faster on this machine, numba uses the Numba "
        "kernels where the built-in rules do, blas calls BLAS, packed the packed Numba GEMM, "
        "mkl calls oneMKL for the half-type products (the amx extra)"),
    "MINIFLOW_CUBLAS": Variable(
        "0 or 1", _choice("0", "1"),
        "0 keeps the cuda backend's matmul off cuBLAS; 1 (unset) lets it use cuBLAS"),
    "MINIFLOW_FP16_FALLBACK": Variable(
        "0 or 1", _choice("0", "1"),
        "1 converts float16 on the CPU with the portable fallback, not the CPU's instructions; "
        "0 (unset) uses them where the CPU has them"),
    "MINIFLOW_DIST_TIMEOUT": Variable(
        "a positive number of seconds", _seconds,
        "how long a collective of a data-parallel run waits for the other ranks; unset, 600"),
}
"""Every ``MINIFLOW_*`` variable miniflow reads as a setting."""


def read(name: str, default=None):
    """The setting of variable ``name`` (:data:`VARIABLES`): its value parsed, or ``default``
    when it is unset or blank.

    Raises:
        EnvironmentValueError: the value is none the variable accepts (one line: the variable,
            the value, the accepted values and what they do).
    """
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    v = VARIABLES[name]
    try:
        return v.parse(raw.strip())
    except ValueError:
        raise EnvironmentValueError(f"miniflow: {name}={raw!r} is not {v.accepted}: "
                                    f"{v.meaning}") from None


def check() -> None:
    """Read every variable of :data:`VARIABLES`.

    Raises:
        EnvironmentValueError: the first one with a bad value (see :func:`read`)."""
    for name in VARIABLES:
        read(name)


def check_or_exit() -> None:
    """:func:`check`; a bad value is its one line on stderr and ``SystemExit(2)``."""
    try:
        check()
    except EnvironmentValueError as e:
        print(e, file=sys.stderr)
        raise SystemExit(2) from None
