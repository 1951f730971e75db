"""The one-line "compiling kernels (first run only)" notice of a cold start.

Kernels compile (or load from Numba's disk cache) the first time a plan runs. Compiling a graph's
kernels takes seconds, loading them a fraction of one, so the notice is printed, to stderr and once
per process, only when Numba actually compiles: it listens for Numba's ``numba:compile`` event,
which fires for a compilation and not for a cache hit (``numba/core/dispatcher.py``), and, once
numba-cuda is imported, for numba-cuda's ``numba-cuda:run_pass`` event (numba-cuda has an event
module of its own, ``numba.cuda.core.event``, and fires no ``numba:compile`` for kernels: its
compiler pipeline fires ``numba-cuda:run_pass`` for every pass it runs, which it does only when
it compiles, a kernel or a device function, never when it loads one from the cache). It is written
through ``tqdm.external_write_mode``, so a progress bar (``miniflow train``) is cleared first and
redrawn below it. In a data-parallel world (``mpiexec -n N``, after ``miniflow.distributed.init``)
rank 0 alone prints it, as it alone prints everything else of a run: every rank compiles at the
same time, and N copies of the line say nothing more than one.

When Numba cannot cache where it was asked to (``miniflow.kernels.common.cache``), the same single
line says so: it names the unwritable ``NUMBA_CACHE_DIR`` and where Numba caches instead, or, with
no writable folder at all, that kernels compile in every run and what to do.
"""
from __future__ import annotations

import contextlib
import sys

from numba.core import event

from ..kernels.common.cache import CACHE

__all__ = ["NOTICE", "Heard", "notice_text", "compile_notice"]

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


def _show(ev=None) -> None:
    """Print :func:`notice_text` unless it was printed already, or this process is a rank other
    than 0 of a data-parallel world (rank 0 prints it for the job)."""
    if not _SHOWN[0]:
        _SHOWN[0] = True
        from .. import distributed
        if distributed.is_initialized() and distributed.rank() != 0:
            return
        from tqdm import tqdm
        with tqdm.external_write_mode(file=sys.stderr):
            print(notice_text(), file=sys.stderr, flush=True)


class Heard:
    """What a :func:`compile_notice` block heard: ``compiled`` is True once Numba (or numba-cuda)
    compiled something inside it."""

    compiled = False


def _listener(events, heard: Heard):
    """A listener of Numba's (or numba-cuda's) ``events`` module that marks ``heard`` and shows
    the notice at the first event it hears of."""
    def on_start(self, ev):
        heard.compiled = True
        _show()
    cls = type("_NoticeListener", (events.Listener,),
               {"on_start": on_start, "on_end": lambda self, ev: None})
    return cls()


@contextlib.contextmanager
def compile_notice():
    """Inside the block, the first Numba compilation (CPU or, once numba-cuda is imported, CUDA)
    prints :func:`notice_text` (once per process). Yields a :class:`Heard`, which tells after the
    block whether anything compiled in it."""
    heard = Heard()
    with contextlib.ExitStack() as stack:
        stack.enter_context(event.install_listener("numba:compile", _listener(event, heard)))
        cuda_events = sys.modules.get("numba.cuda.core.event")
        if cuda_events is not None:
            stack.enter_context(cuda_events.install_listener("numba-cuda:run_pass",
                                                             _listener(cuda_events, heard)))
        yield heard
