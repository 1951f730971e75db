"""The one-line "compiling kernels (first run only)" notice of a cold start.

Kernels compile (or load from Numba's disk cache) the first time a plan runs. Compiling a graph's
kernels takes seconds, loading them a fraction of one, so the notice is printed, to stderr and once
per process, only when Numba actually compiles: it listens for Numba's ``numba:compile`` event,
which fires for a compilation and not for a cache hit (``numba/core/dispatcher.py``). It is written
through ``tqdm.external_write_mode``, so a progress bar (``miniflow train``) is cleared first and
redrawn below it.
"""
from __future__ import annotations

import contextlib
import sys

from numba.core import event

__all__ = ["NOTICE", "compile_notice"]

NOTICE = "miniflow: compiling kernels (first run only; later runs load them from Numba's cache)"

_SHOWN = [False]


class _Listener(event.Listener):
    """Prints :data:`NOTICE` at the first compilation it hears of."""

    def on_start(self, ev) -> None:
        if not _SHOWN[0]:
            _SHOWN[0] = True
            from tqdm import tqdm
            with tqdm.external_write_mode(file=sys.stderr):
                print(NOTICE, file=sys.stderr, flush=True)

    def on_end(self, ev) -> None:
        pass


@contextlib.contextmanager
def compile_notice():
    """Inside the block, the first Numba compilation prints :data:`NOTICE` (once per process)."""
    if _SHOWN[0]:
        yield
        return
    with event.install_listener("numba:compile", _Listener()):
        yield
