"""Backend selection and the backend protocol.

A backend provides ``kernels`` (op type -> kernel builder, see ``miniflow.kernels.cpu``) and four
memory functions: ``empty(shape, np_dtype)``, ``from_numpy(array)`` (a copy in backend memory),
``to_numpy(array)`` (a host copy) and ``copy_in(dst, src)`` (host array into a backend buffer).

Selection: ``miniflow.set_backend("cpu" | "cuda")`` or the environment variable ``MINIFLOW_BACKEND``
(read on first use). The default is ``"cpu"`` until a CUDA backend is registered.
"""
from __future__ import annotations

import os

import numpy as np

__all__ = ["Backend", "CpuBackend", "get_backend", "set_backend", "BACKENDS"]


class Backend:
    """The backend protocol; subclasses fill ``name`` and ``kernels``."""

    name = "?"

    @property
    def kernels(self) -> dict:
        raise NotImplementedError

    def empty(self, shape, np_dtype):
        raise NotImplementedError

    def from_numpy(self, array: np.ndarray):
        raise NotImplementedError

    def to_numpy(self, array) -> np.ndarray:
        raise NotImplementedError

    def copy_in(self, dst, src: np.ndarray) -> None:
        raise NotImplementedError


class CpuBackend(Backend):
    """NumPy arrays in host memory; Numba CPU kernels (``miniflow.kernels.cpu``)."""

    name = "cpu"

    @property
    def kernels(self) -> dict:
        from ..kernels.cpu import KERNELS
        return KERNELS

    def empty(self, shape, np_dtype):
        return np.empty(shape, np_dtype)

    def from_numpy(self, array):
        return np.array(array, copy=True, order="C")

    def to_numpy(self, array):
        return np.array(array, copy=True)

    def copy_in(self, dst, src):
        np.copyto(dst, src, casting="no")


BACKENDS: dict = {"cpu": CpuBackend}
_current: list = []


def set_backend(name: str) -> Backend:
    """Select the backend for graphs compiled and eager ops run from now on.

    Raises:
        ValueError: unknown backend name, listing the known ones.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}")
    backend = BACKENDS[name]()
    _current[:] = [backend]
    return backend


def get_backend() -> Backend:
    """The current backend (from ``MINIFLOW_BACKEND`` on first use, else the default)."""
    if not _current:
        set_backend(os.environ.get("MINIFLOW_BACKEND", "cpu"))
    return _current[0]
