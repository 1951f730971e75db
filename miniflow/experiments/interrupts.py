"""Ctrl-C and SIGTERM in the CLI's jobs: one mechanism for every subcommand.

SIGTERM (``kill``, ``timeout``, a batch system's or ``docker stop``'s first signal) ends a Python
process at once by default, with no line and exit status -15. Inside :class:`interrupt_signals`
it is handled as Ctrl-C is: an :class:`Interrupted` (a ``KeyboardInterrupt``) is raised, at once
or, with ``defer=True``, where the loop checks ``requested`` (between two training steps, where
the state is whole and can be saved). :func:`interrupted_exit` prints the one line a subcommand
ends with (after ``'SIGTERM: '`` for that signal) and returns the exit code, 128 + the signal's
number: 130 for Ctrl-C, 143 for SIGTERM (the shell's convention); :func:`quiet_on_closed_stdout`
ends a command whose reader closed stdout (``| head -1``) as SIGPIPE would, quietly, 141.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["Interrupted", "interrupt_signals", "interrupted_exit", "quiet_on_closed_stdout"]


class Interrupted(KeyboardInterrupt):
    """A ``KeyboardInterrupt`` that knows its signal, ``signum`` (``signal.SIGINT``: Ctrl-C, or
    ``signal.SIGTERM``); code that catches ``KeyboardInterrupt`` still catches it."""

    signum = signal.SIGINT


SIGNALS = ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))
"""The signals :class:`interrupt_signals` handles, each with Python's default handler."""


class interrupt_signals:
    """While active (in the main thread), SIGINT and SIGTERM whose handler is Python's default
    (or an enclosing block's) raise :class:`Interrupted` carrying the signal. With ``defer``, a
    first signal only sets ``requested`` (and ``signum``), for the loop to stop where it can,
    and a second one raises at once; an :class:`Interrupted` leaving the block then carries the
    first signal. Another handler (the user's) is left alone; the previous ones come back at
    the end."""

    def __init__(self, defer: bool = False):
        self.defer = defer

    def __enter__(self):
        self.requested, self.signum, self._previous = False, signal.SIGINT, {}
        if threading.current_thread() is threading.main_thread():
            for sig, default in SIGNALS:
                current = signal.getsignal(sig)
                if current is default or isinstance(getattr(current, "__self__", None),
                                                    interrupt_signals):
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if not self.requested:
            self.signum = signal.Signals(signum)
        if self.requested or not self.defer:
            e = Interrupted()
            e.signum = self.signum
            raise e
        self.requested = True

    def __exit__(self, exc_type, exc, tb):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        if self.requested and isinstance(exc, Interrupted):
            exc.signum = self.signum
        return False


def interrupted_exit(command: str, e: KeyboardInterrupt, message: str | None = None,
                     report: bool = True) -> int:
    """The end of ``miniflow COMMAND`` after ``e``: when ``report`` (rank 0), one line on stderr,
    ``message`` (default ``str(e)``) after ``'SIGTERM: '`` for that signal; returns the exit
    code, 128 + the signal's number (a plain ``KeyboardInterrupt``: SIGINT, 130)."""
    signum = getattr(e, "signum", signal.SIGINT)
    if report:
        name = "" if signum == signal.SIGINT else f"{signal.Signals(signum).name}: "
        print(f"miniflow {command}: {name}{message or e}", file=sys.stderr)
    return 128 + int(signum)


def quiet_on_closed_stdout(fn, *args) -> int:
    """``fn(*args)``, a command's body returning its exit code, then stdout flushed (here, not
    at exit). When the reader closed stdout (``miniflow info | head -1``): no traceback and no
    line, as a command that SIGPIPE ends; stdout goes to ``os.devnull``, so that Python's last
    flush at exit does not fail again (Python's ``signal`` documentation, "Note on SIGPIPE"),
    and the exit code is 141 (128 + SIGPIPE, as the shell reports such a command)."""
    try:
        code = fn(*args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
