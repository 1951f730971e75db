"""The optional extras: features that need a package the core install does not pull.

Each extra of ``pyproject.toml`` (``onnx``, ``netron``, ``tensorboard``, ``notebook``) names the
packages its feature imports. :func:`require` imports one of them when the feature is used, or
raises :class:`MissingExtraError` with one sentence naming the extra to install, so a learner
never meets a bare ``ModuleNotFoundError`` from deep inside miniflow.
"""
from __future__ import annotations

import importlib

__all__ = ["MissingExtraError", "require", "missing"]


class MissingExtraError(ImportError):
    """A feature's optional package is not installed; the message names the extra."""


def require(module: str, extra: str, feature: str):
    """Import and return ``module`` (e.g. ``"onnx"``) for ``feature`` (e.g.
    ``"miniflow.onnx.export"``).

    Raises:
        MissingExtraError: ``module`` cannot be imported; the message says which extra of
            miniflow installs it (``pip install -e ".[onnx]"`` in a checkout).
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise missing(module, extra, feature) from e


def missing(package: str, extra: str, feature: str) -> MissingExtraError:
    """The error saying, in one sentence, that ``feature`` needs ``package`` and which extra
    installs it (for a package that is not a Python module, e.g. a shared library's wheel)."""
    return MissingExtraError(
        f"{feature} needs the {package!r} package, which is not installed: install "
        f"miniflow's {extra} extra (pip install -e \".[{extra}]\" in a checkout, "
        f"pip install \"miniflow[{extra}]\" otherwise).")
