"""Shared pieces of the benchmarks: thread pinning, the machine description, median timing, results.

Benchmarks run on shared machines: timings are medians of repeated rounds, and the machine's load
average is recorded before and after so a noisy run shows.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
"""Where results go (git-ignored)."""


def pin_threads(n: int) -> str:
    """Use ``n`` threads in every pool: Numba's, the BLAS and OpenMP libraries loaded so far
    (NumPy's OpenBLAS; PyTorch's, when it is imported first) and PyTorch's intra-op pool; PyTorch's
    inter-op pool gets 1. Returns a one-line description of the pools."""
    import numba
    from threadpoolctl import threadpool_info, threadpool_limits

    import miniflow.kernels.cpu  # noqa: F401  (first: it picks Numba's threading layer)

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    threadpool_limits(n)
    parts = [f"numba {numba.get_num_threads()} (layer: {numba.config.THREADING_LAYER})"]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(n)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:        # only settable before PyTorch's first parallel work
            pass
        parts.append(f"torch {torch.get_num_threads()} "
                     f"(inter-op {torch.get_num_interop_threads()})")
    for info in threadpool_info():
        parts.append(f"{info['internal_api']} {info['num_threads']} "
                     f"({os.path.basename(info['filepath'])})")
    return ", ".join(parts)


def load_average() -> float:
    """The 1-minute load average (0 where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def machine() -> dict:
    """CPU model, core count, memory and library versions."""
    import numba
    import numpy

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError, AttributeError):
        mem = float("nan")
    info = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": cpu,
            "cores": os.cpu_count(), "memory_gib": round(mem, 1),
            "python": platform.python_version(), "numpy": numpy.__version__,
            "numba": numba.__version__}
    try:
        import torch
        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def describe(info: dict) -> str:
    """:func:`machine` as one line."""
    libs = ", ".join(f"{k} {info[k]}" for k in ("python", "numpy", "numba", "torch") if k in info)
    return (f"{info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB; {libs}; "
            f"{info['date']}")


def round_time(fn, steps: int) -> float:
    """Seconds for ``steps`` calls of ``fn``."""
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return time.perf_counter() - t0


def median_time(fn, steps: int, repeats: int) -> float:
    """Median over ``repeats`` rounds of the time per call, each round ``steps`` calls."""
    return statistics.median(round_time(fn, steps) for _ in range(repeats)) / steps


def save_json(name: str, data: dict) -> Path:
    """Write ``data`` to ``results/<name>.json``; returns the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    return path
