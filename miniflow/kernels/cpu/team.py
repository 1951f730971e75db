"""How many of Numba's threads a plan's run uses: all of them, or fewer while other processes keep
this process's cores busy.

Why: a parallel kernel's threads meet when it ends, so a step of a few hundred parallel kernels
waits a few hundred times for its slowest thread, and a thread whose core another process holds
runs only when the scheduler gives it a turn there (milliseconds later). Measured on 2 cores (AMD
Zen 4, 2026-12-07) with other processes on the second: ``miniflow train --model gpt --amp fp16``
(1500 steps) ran at about 0.85 steps a second on Numba's 2 threads, against 18.5 on one thread
(1:43 for the whole run on one thread; the 2-thread run was stopped after 293 steps at 4:41).
PyTorch's OpenMP threads and OpenBLAS's pool meet the same walls (``benchmarks/README.md``).

So the cpu backend runs each plan (:meth:`Team.begin`, :meth:`Team.end`) on as many threads as
the cores this process may run on (``os.sched_getaffinity``) that other processes leave free
(:func:`team_size`, at least one), all of them unless those processes kept more than
``BUSY_SLACK`` of a core busy while this one ran: at the end of a run, at most every
``INTERVAL_S``, it looks at how busy those cores were since it last looked (Linux's
``/proc/stat``: every process's time on them, the time the hypervisor gave other guests
included, less this process's own; a window of at least ``MIN_WINDOW_S``, ``/proc/stat``
counting in 10 ms ticks). The window starts again at the first run after a pause of more than
``GAP_S``: what other processes did while this one waited (a data loader, a benchmark's other
frameworks taking their turns: ``benchmarks/gpt_step.py`` had miniflow's rounds on one thread
of two) says nothing of what they do while it runs (a process that pauses that long after every
short run thus keeps all its threads). Numba's count is set back after each run, so a plan
built later is built for all of them (the kernels' parallel variants, the tuner's classes).
Nothing is printed: the bits are the same, and a process's stderr stays what it was on an idle
machine (:attr:`Team.others` and :attr:`Team.limit` say what the last look saw).

The same bits on any number of threads: a parallel kernel's iterations (rows, elements, panels,
the products' ``blas_split`` parts) are fixed when the plan is built, and each is computed whole
by one thread in one order, whichever thread and however many run them
(``tests/test_plan_threads.py`` trains with the team changing at every step against a run on all
threads). Without ``/proc/stat`` (not Linux) every run uses all of Numba's threads.
"""
from __future__ import annotations

import math
import os
import time

import numba


__all__ = ["INTERVAL_S", "MIN_WINDOW_S", "GAP_S", "BUSY_SLACK", "cores", "snapshot",
           "others_between", "free_cores", "team_size", "Team", "TEAM", "begin", "end"]

INTERVAL_S = 0.2
"""Seconds between two looks at how busy the cores are (a look reads ``/proc/stat``: 22 us on 2
cores)."""
MIN_WINDOW_S = 0.05
"""Seconds a window that starts after a pause lasts at least before it is judged (5 of
``/proc/stat``'s ticks)."""
GAP_S = 0.05
"""Seconds between the end of a run and the start of the next after which the window starts
again (what other processes did in the pause is not judged)."""
BUSY_SLACK = 0.25
"""Cores' worth of other processes' time below which a core counts as free (a shell, a monitor)."""


def cores() -> list:
    """The CPUs this process may run on (all of them where the OS does not say)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def snapshot(cores: list):
    """``(busy seconds of every process on cores, this process's CPU seconds, wall seconds)``
    (``/proc/stat``'s per-CPU user, nice, system, irq, softirq and steal); None without it."""
    wanted = {f"cpu{c}" for c in cores}
    busy = 0
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if not line.startswith("cpu"):
                    break
                fields = line.split()
                if fields[0] in wanted:
                    busy += sum(int(fields[k]) for k in (1, 2, 3, 6, 7, 8) if k < len(fields))
    except (OSError, ValueError):
        return None
    t = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), t.user + t.system, time.perf_counter()


def others_between(before, after) -> float | None:
    """Cores' worth of time other processes used on the cores between two :func:`snapshot` looks
    (busy time less this process's own, over the wall time between them; e.g. 1.0: one core
    kept busy throughout); None where either is None or no time passed."""
    if before is None or after is None or after[2] <= before[2]:
        return None
    used = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, used / (after[2] - before[2]))


def free_cores(cores: int, others: float) -> int:
    """The ``cores`` that other processes, keeping ``others`` cores' worth busy, leave free
    (``others`` rounded up past :data:`BUSY_SLACK`; 0 when they keep every one busy)."""
    return max(0, cores - max(0, math.ceil(others - BUSY_SLACK)))


def team_size(wanted: int, cores: int, others: float) -> int:
    """Threads for a run: ``wanted``, at most the :func:`free_cores`, at least one. E.g. 2 cores,
    2 wanted: others 0.2 -> 2, 0.3 or 1.0 -> 1."""
    return max(1, min(wanted, free_cores(cores, others)))


class Team:
    """The threads of this process's plan runs (module docstring).

    Args:
        snapshot: ``snapshot(cores) -> (busy, own, wall)`` seconds or None (:func:`snapshot`;
            tests pass their own).
    """

    def __init__(self, snapshot=snapshot):
        self.cores = cores()
        self._snapshot = snapshot
        self._last = snapshot(self.cores)
        self._next = time.perf_counter() + INTERVAL_S
        self.others = 0.0
        """Cores' worth of time other processes used on this process's cores in the last look."""
        self.limit = numba.config.NUMBA_NUM_THREADS
        """The most threads a run uses now (:func:`team_size` of Numba's most)."""
        self.ended = time.perf_counter()
        """When the last run ended (:func:`end`; ``time.perf_counter`` seconds)."""

    def _look(self, now: float) -> None:
        """Update :attr:`others` and :attr:`limit` from the window since the last look."""
        self._next = now + INTERVAL_S
        last, self._last = self._last, self._snapshot(self.cores)
        others = others_between(last, self._last)
        if others is None:
            return
        self.others = others
        self.limit = team_size(numba.config.NUMBA_NUM_THREADS, len(self.cores), self.others)

    def begin(self) -> int:
        """Before a run: Numba's thread count to set back after it (:meth:`end`), or 0 where the
        run uses the count in force (no other process holds the cores it needs)."""
        now = time.perf_counter()
        if now - self.ended > GAP_S:        # after a pause: a new window, judged from its end
            self._last, self._next = self._snapshot(self.cores), now + MIN_WINDOW_S
        if self.limit >= numba.config.NUMBA_NUM_THREADS:
            return 0
        before = numba.get_num_threads()
        if before <= self.limit:
            return 0
        numba.set_num_threads(self.limit)
        return before

    def end(self, before: int) -> None:
        """After a run: set Numba's thread count back to ``before`` (0: nothing was changed);
        look at the cores where ``INTERVAL_S`` has passed since the last look."""
        if before:
            numba.set_num_threads(before)
        self.ended = now = time.perf_counter()
        if now >= self._next:
            self._look(now)


TEAM: Team | None = None
"""This process's team (made at the first run of a cpu plan; tests put their own here)."""


def begin() -> int:
    """:meth:`Team.begin` of this process's team (made at the first call)."""
    global TEAM
    if TEAM is None:
        TEAM = Team()
    return TEAM.begin()


def end(before: int) -> None:
    """:meth:`Team.end` of this process's team."""
    TEAM.end(before)
