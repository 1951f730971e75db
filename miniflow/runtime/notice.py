"""The one-line "compiling kernels (first run only)" notice of a cold start.

Kernels compile (or load from Numba's disk cache) the first time a plan runs. Compiling a graph's
kernels takes seconds, loading them a fraction of one, so the notice is printed, to stderr and once
per process, only when Numba actually compiles: it listens for Numba's ``numba:compile`` event,
which fires for a compilation and not for a cache hit (``numba/core/dispatcher.py``). It is written
through ``tqdm.external_write_mode``, so a progress bar (``miniflow train``) is cleared first and
redrawn below it.

When Numba cannot cache where it was asked to (``miniflow.kernels.common.cache``), the same single
line says so: it names the unwritable ``NUMBA_CACHE_DIR`` and where Numba caches instead, or, with
no writable folder at all, that kernels compile in every run and what to do.
"""
from __future__ import annotations

import contextlib
import sys

from numba.core import event

from ..kernels.common.cache import CACHE

__all__ = ["NOTICE", "notice_text", "compile_notice"]

NOTICE = "miniflow: compiling kernels (first run only; later runs load them from Numba's cache)"
"""The notice when Numba caches where it was asked to."""


def notice_text() -> str:
    """The notice for this process's cache (``kernels.common.cache.CACHE``): :data:`NOTICE`, with
    what went wrong when Numba does not cache where it was asked to, or cannot cache at all."""
    if not CACHE.enabled:
        return (f"miniflow: compiling kernels without Numba's disk cache, so every run compiles "
                f"them again: {CACHE.problem}; set NUMBA_CACHE_DIR to a writable folder to cache "
                f"them")
    if CACHE.problem:
        return f"{NOTICE}; {CACHE.problem}, so Numba caches them in {CACHE.folders()}"
    return NOTICE


_SHOWN = [False]


class _Listener(event.Listener):
    """Prints :func:`notice_text` at the first compilation it hears of."""

    def on_start(self, ev) -> None:
        if not _SHOWN[0]:
            _SHOWN[0] = True
            from tqdm import tqdm
            with tqdm.external_write_mode(file=sys.stderr):
                print(notice_text(), file=sys.stderr, flush=True)

    def on_end(self, ev) -> None:
        pass


@contextlib.contextmanager
def compile_notice():
    """Inside the block, the first Numba compilation prints :func:`notice_text` (once per
    process)."""
    if _SHOWN[0]:
        yield
        return
    with event.install_listener("numba:compile", _Listener()):
        yield
