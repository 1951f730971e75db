"""Where Numba's disk cache keeps miniflow's kernels, decided once at import: :data:`CACHE`.

Numba caches a ``cache=True`` function defined in a file F in the first writable folder of
(``numba/core/caching.py``, the ``_CacheLocator`` classes; numba-cuda's CUDA cache keeps the same
order):

1. ``$NUMBA_CACHE_DIR/<F's folder name>_<sha1 of its path>``, when ``NUMBA_CACHE_DIR`` is set;
2. ``__pycache__`` next to F;
3. Numba's user-wide cache folder, ``numba/<...>`` in ``$XDG_CACHE_HOME`` (default ``~/.cache``).

An unwritable ``NUMBA_CACHE_DIR`` is thus silently passed over. When no folder is writable
(read-only site-packages, home and cache directory), decorating a ``cache=True`` function raises
``RuntimeError: cannot cache function``. The compiled kernels live in the backend packages
(:data:`BACKENDS`: ``kernels/cpu/*.py``, ``kernels/cuda/*.py``; ``kernels/common`` holds plain
functions that are compiled into them), so each backend folder has a cache folder of its own.
miniflow therefore asks Numba's own locators once, here, for a function of each backend folder,
and compiles every kernel with ``cache=False`` unless each has an answer: kernels still run,
compiled again in every process, and the compile notice (``miniflow.runtime.notice``) says so once.

Generated fused-kernel sources (``codegen``) need a folder of their own, since Numba caches a
function only when its source file exists: ``$NUMBA_CACHE_DIR/miniflow_generated`` when Numba
caches in ``NUMBA_CACHE_DIR``, else ``miniflow/generated`` in the user's cache folder
(``$XDG_CACHE_HOME``, default ``~/.cache``). When that folder is not writable either, caching is off
for every kernel and generated sources compile from memory.

Several processes may compile into one cache at once (``pytest -n 2``, ``mpiexec -n 2``): while
caching is on, every save to Numba's cache is made under a lock (``cache_lock``).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numba
from numba.core.caching import CompileResultCacheImpl
from numba.misc.appdirs import AppDirs

from . import cache_key, cache_lock

__all__ = ["KernelCache", "CACHE", "BACKENDS", "locate"]

KERNELS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The ``miniflow/kernels`` folder."""
BACKENDS = ("cpu", "cuda")
"""The kernel packages whose modules hold ``cache=True`` kernels (folders of ``KERNELS_DIR``)."""


@dataclass(frozen=True)
class KernelCache:
    """Numba's disk cache as miniflow's kernels use it.

    Attributes:
        paths: backend package (:data:`BACKENDS`) -> the folder Numba keeps the compiled kernels of
            its modules in (``kernels/cpu/*.py`` ...); None when caching is off.
        generated: the folder generated kernel sources are written to; None when they compile from
            memory (caching off).
        how: how ``paths`` were chosen, or why caching is off (a phrase, for ``miniflow info``).
        problem: why Numba does not cache where the user asked (an unwritable
            ``NUMBA_CACHE_DIR``), or why caching is off (a phrase, for the compile notice); None
            when all is as configured.
    """

    paths: dict | None
    generated: str | None
    how: str
    problem: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether kernels are compiled with ``cache=True``."""
        return self.paths is not None

    def folders(self) -> str:
        """The cache folders, ``"cpu: A, cuda: B"`` (empty when caching is off)."""
        return ", ".join(f"{name}: {path}" for name, path in (self.paths or {}).items())

    def describe(self) -> str:
        """One line for ``miniflow info``: the folders and how they were chosen, or
        ``off (why)``."""
        return f"{self.folders()} ({self.how})" if self.enabled else f"off ({self.how})"


def _probe_in(folder: str):
    """A function that stands for every kernel of ``folder`` when Numba's locators are asked
    (never called): its code says it was defined in the folder's ``__init__.py``."""
    def _probe():
        """Stands for the kernels of a backend folder."""
    _probe.__code__ = _probe.__code__.replace(co_filename=os.path.join(folder, "__init__.py"))
    _probe.__qualname__ = "_probe"                     # as Numba's error messages name it
    return _probe


def _unwritable(folder: str) -> str | None:
    """Why ``folder`` cannot be created or written to (the OSError's message); None if it can
    (Numba's own test: ``makedirs``, then a temporary file in it)."""
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        return f"{e.strerror or e}"
    return None


def _user_cache_root() -> str:
    """The user's cache folder: ``$XDG_CACHE_HOME``, default ``~/.cache``."""
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def _cache_path(folder: str):
    """``(path, None)``: where Numba caches the kernels of ``folder`` (creating it, as Numba does
    when it decorates a ``cache=True`` function), or ``(None, why)`` when it cannot."""
    asked = numba.config.CACHE_DIR
    try:
        return os.path.abspath(CompileResultCacheImpl(_probe_in(folder)).locator
                               .get_cache_path()), None
    except RuntimeError as e:       # no writable folder (or bad NUMBA_CACHE_LOCATOR_CLASSES)
        tried = ([f"NUMBA_CACHE_DIR={asked}"] if asked else []) + [
            os.path.join(folder, "__pycache__"),
            AppDirs(appname="numba", appauthor=False).user_cache_dir]
        return None, (f"{', '.join(tried[:-1])} and {tried[-1]} are not writable"
                      if not numba.config.CACHE_LOCATOR_CLASSES else str(e))


def locate() -> KernelCache:
    """Ask Numba's locators where the kernels of each backend folder are cached; pick the
    generated-sources folder."""
    asked = numba.config.CACHE_DIR
    paths = {}
    for name in BACKENDS:
        folder = os.path.join(KERNELS_DIR, name)
        path, why = _cache_path(folder)
        if path is None:
            return KernelCache(None, None, f"Numba finds no writable cache folder: {why}",
                               f"Numba finds no writable cache folder ({why})")
        paths[name] = path
    in_asked = [asked and p.startswith(os.path.abspath(asked) + os.sep) for p in paths.values()]
    if all(in_asked):
        how, problem = "in NUMBA_CACHE_DIR", None
        generated = os.path.join(os.path.abspath(asked), "miniflow_generated")
    else:
        problem = f"NUMBA_CACHE_DIR={asked} is not writable" if asked else None
        how = problem or "NUMBA_CACHE_DIR is not set"
        elsewhere = [os.path.join(KERNELS_DIR, name, "__pycache__") for name, path in paths.items()
                     if path != os.path.join(KERNELS_DIR, name, "__pycache__")]
        if not elsewhere:
            how = f"next to the sources; {how}"
        else:
            how = (f"Numba's user-wide cache; {how} and {' and '.join(elsewhere)} "
                   f"{'is' if len(elsewhere) == 1 else 'are'} not writable")
        generated = os.path.join(_user_cache_root(), "miniflow", "generated")
    why = _unwritable(generated)
    if why is not None:
        what = f"the generated kernel sources cannot be written to {generated}: {why}"
        return KernelCache(None, None, what, what)
    return KernelCache(paths, generated, how, problem)


CACHE = locate()
"""Numba's disk cache for this process (decided at import)."""
if CACHE.enabled:
    cache_lock.install()    # several processes may write the cache at once (cache_lock's docstring)
    cache_key.install()     # a kernel's key covers the miniflow sources compiled into it
