"""The CPU an experiment ran on, for its report: results of the kernels depend on it.

A CPU's vector width and fused multiply-adds decide how LLVM compiles every Numba kernel (the
order and rounding of its sums), and ``NUMBA_CPU_NAME`` compiles for another target again, so a
study's accuracies differ in the last digit from one CPU to another.
"""
from __future__ import annotations

import platform

import numba

__all__ = ["cpu_model_name", "cpu_description"]


def cpu_model_name() -> str:
    """``/proc/cpuinfo``'s first ``model name`` (what ``lscpu`` prints), else
    ``platform.processor()`` or the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def cpu_description() -> str:
    """``"AMD EPYC (LLVM target znver5)"``: the CPU's model name and the target Numba compiles
    the kernels for (``NUMBA_CPU_NAME`` when set, else LLVM's name of the host CPU)."""
    import llvmlite.binding as llvm
    target = numba.config.CPU_NAME or llvm.get_host_cpu_name()
    return f"{cpu_model_name()} (LLVM target {target})"
