"""Shared pieces of the benchmarks: thread and core pinning, the machine description, median timing
(wall and CPU time), results.

Benchmarks run on shared machines: timings are medians of repeated rounds, and the machine's load
average is recorded before and after so a noisy run shows. A round records the process's CPU time
and the calling thread's next to the wall time: CPU time below wall time means the process waited
(other load on its core), CPU time of other threads means a thread pool (or a framework's worker
thread) did part of the work.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import getpass
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
"""Where results go (git-ignored)."""

ISAS = {
    "native": ({}, ""),
    "avx2": ({"NUMBA_CPU_NAME": "haswell", "OPENBLAS_CORETYPE": "Haswell",
              "XLA_FLAGS": "--xla_cpu_max_isa=AVX2", "ATEN_CPU_CAPABILITY": "avx2",
              "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, "+avx2"),
    "avx512": ({"NUMBA_CPU_NAME": "skylake-avx512", "OPENBLAS_CORETYPE": "SkylakeX",
                "XLA_FLAGS": "--xla_cpu_max_isa=AVX512", "ATEN_CPU_CAPABILITY": "avx512",
                "MKL_ENABLE_INSTRUCTIONS": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
               "+avx512f"),
}
"""``--isa`` -> (the environment that makes every framework run as on that CPU: Numba's target
CPU, OpenBLAS's kernels, XLA's and ATen's instruction sets, and the two libraries inside PyTorch
that pick their own (``ATEN_CPU_CAPABILITY`` does not reach them): oneMKL's float32 GEMM
(``MKL_ENABLE_INSTRUCTIONS``) and oneDNN's half-type matmuls (``ONEDNN_MAX_CPU_ISA``; PyTorch
asks oneDNN's effective ISA whether it has bfloat16 / float16 support). Without them, on a
Sapphire Rapids host, "AVX2" PyTorch ran float32 ``mm`` at 144 GFLOP/s (AVX2's FMA peak there:
120) and bfloat16 on AMX; with them 87 GFLOP/s and ATen's own half-type GEMM, as on an AVX2 CPU.
The host feature each needs second)."""
ISA_VARIABLE = "MINIFLOW_BENCH_ISA"
"""Set in the re-executed child: the ``--isa`` it runs as."""


def positive_int(text: str) -> int:
    """An argparse ``type``: an int >= 1 (a usage error otherwise, not a traceback later)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def positive_ints(text: str) -> list:
    """An argparse ``type``: a comma-separated list of ints >= 1 (``--batches 1,16,256``)."""
    return [positive_int(part) for part in text.split(",")]


def check_cores(parser, core: int, threads: int) -> None:
    """A usage error (``parser.error``) unless this process may run ``threads`` threads on
    ``core`` and the highest others (:func:`cores_for`)."""
    try:
        cores_for(core, threads)
    except ValueError as e:
        parser.error(str(e).replace("cores_for: ", f"--threads {threads}: "))


def add_isa_argument(parser) -> None:
    """``--isa native|avx2|avx512`` (:data:`ISAS`, :func:`run_as_isa`) on a benchmark's parser."""
    parser.add_argument("--isa", choices=tuple(ISAS), default="native",
                        help="run every framework as on an AVX2 or AVX-512 CPU (a child process "
                        "with NUMBA_CPU_NAME, OPENBLAS_CORETYPE, XLA_FLAGS, ATEN_CPU_CAPABILITY)")


def run_as_isa(isa: str, script: str, argv: list) -> bool:
    """Re-execute ``script`` with ``argv`` in a child process whose environment is
    :data:`ISAS`'s for ``isa`` (set in the child only: NumPy, Numba, PyTorch and XLA read them when
    they start) and exit with its status; returns False, doing nothing, where this process is that
    child or ``isa`` is ``"native"``.

    The child gets caches of its own (:func:`isa_cache_dirs`): Numba's (and with it the tuner's
    file) and inductor's.

    Raises:
        SystemExit: the host CPU lacks the ISA (its code would stop at the first instruction),
            or after the child ran.
    """
    if isa == "native" or os.environ.get(ISA_VARIABLE) == isa:
        return False
    import llvmlite.binding as llvm
    env, needs = ISAS[isa]
    if needs not in llvm.get_host_cpu_features().flatten().split(","):
        raise SystemExit(f"--isa {isa}: this CPU has no {needs[1:]}; choose --isa native")
    caches = isa_cache_dirs(isa)
    child = {**os.environ, **env, **caches, ISA_VARIABLE: isa}
    child.pop("NUMBA_CPU_FEATURES", None)
    print(f"--isa {isa}: re-running as {' '.join(f'{k}={v}' for k, v in env.items())}; "
          f"caches {' '.join(f'{k}={v}' for k, v in caches.items())}", flush=True)
    raise SystemExit(subprocess.run([sys.executable, script, *argv], env=child).returncode)


def isa_cache_dirs(isa: str) -> dict:
    """``{"NUMBA_CACHE_DIR": ..., "TORCHINDUCTOR_CACHE_DIR": ...}`` for a process running as
    ``isa``: a folder ``isa-<isa>`` inside this process's (or the library's default) cache folder,
    so that builds for different ISAs never share a cache.

    Inductor needs it for correct results, not only for tidiness: its FX graph cache key (torch
    2.13) leaves out the vector ISA that ``ATEN_CPU_CAPABILITY`` selects, so a graph generated for
    AVX-512 (16-lane loops) and cached by a native run is found again under
    ``ATEN_CPU_CAPABILITY=avx2`` and compiled with AVX2's 8-lane ``Vectorized``: it computes
    another result (``relu(3 x - 1).sum()`` over 100 floats: 32.87 for 65.67; the MLP's first
    loss 8.4e35 for 2.33). Numba's cache key holds the target CPU already; its own folder keeps
    the builds (and the tuner's files) apart.
    """
    from numba.misc.appdirs import AppDirs

    numba_root = os.environ.get("NUMBA_CACHE_DIR") or \
        AppDirs(appname="numba", appauthor=False).user_cache_dir
    inductor_root = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or \
        os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    return {"NUMBA_CACHE_DIR": os.path.join(os.path.abspath(numba_root), f"isa-{isa}"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(os.path.abspath(inductor_root),
                                                    f"isa-{isa}")}


def isa_line() -> str:
    """The ISA this process runs as (``--isa``), the CPU the kernels were compiled for and the
    BLAS in use with its core type (``miniflow info``'s, from threadpoolctl: what OpenBLAS chose,
    not what ``OPENBLAS_CORETYPE`` asked for, which OpenBLAS may not know)."""
    from miniflow.kernels.cpu import target, tune
    blas = "; ".join(tune.machine()["blas"]) or "none loaded"
    return f"--isa {os.environ.get(ISA_VARIABLE, 'native')}; kernels for {target.describe()}; " \
           f"BLAS {blas} (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')})"


def pin_threads(n: int, frameworks=("miniflow", "torch")) -> str:
    """Use ``n`` threads in every pool: Numba's (``"miniflow"`` in ``frameworks``), the BLAS and
    OpenMP libraries loaded so far (NumPy's OpenBLAS; PyTorch's, when it is imported first) and
    PyTorch's intra-op pool (``"torch"`` in ``frameworks``, where it is installed); PyTorch's
    inter-op pool gets 1. A framework left out of ``frameworks`` is not imported (a process that
    measures another framework's memory). Returns a one-line description of the pools."""
    from threadpoolctl import threadpool_info, threadpool_limits

    parts = []
    if "miniflow" in frameworks:
        import numba

        import miniflow.kernels.cpu  # noqa: F401  (first: it picks Numba's threading layer)

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        parts.append(f"numba {numba.get_num_threads()} (layer: {numba.config.THREADING_LAYER})")
    threadpool_limits(n)
    torch = None
    if "torch" in frameworks:
        try:
            import torch
        except ImportError:
            pass
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


@contextlib.contextmanager
def threads_restored(frameworks=("miniflow", "torch")):
    """A block after which the thread pools :func:`pin_threads` ``frameworks`` sets have their
    counts back: Numba's (``"miniflow"``; its kernels are imported first, as ``pin_threads``
    does, so Numba's threading layer is miniflow's), the BLAS and OpenMP libraries loaded before
    the block (threadpoolctl restores them, as its ``threadpool_limits`` context does) and
    PyTorch's intra-op pool (``"torch"``, when it is imported before the block). A benchmark's
    ``main()`` is called in-process too (its test): without this the caller's pools stayed
    pinned for the rest of the process."""
    from threadpoolctl import threadpool_limits

    numba = torch = None
    if "miniflow" in frameworks:
        import numba

        import miniflow.kernels.cpu  # noqa: F401  (first: it picks Numba's threading layer)
    if "torch" in frameworks:
        torch = sys.modules.get("torch")
    before = (numba.get_num_threads() if numba else None,
              torch.get_num_threads() if torch else None)
    with threadpool_limits(None):       # changes nothing; restores the counts at the end
        try:
            yield
        finally:
            if numba is not None:
                numba.set_num_threads(before[0])
            if torch is not None:
                torch.set_num_threads(before[1])


def default_core() -> int:
    """The highest-numbered core this process may run on (``os.sched_getaffinity``)."""
    return max(os.sched_getaffinity(0))


def _cores(core) -> set:
    """``core`` (one core's number, or several) as a set of cores."""
    return {core} if isinstance(core, int) else set(core)


def pin_core(core) -> int:
    """Pin every thread of this process to ``core`` (a core's number, or a set of cores); returns
    how many threads were pinned.

    ``os.sched_setaffinity(0, ...)`` on Linux sets the calling thread's mask only (threads started
    later inherit their creator's mask), so the threads already running, e.g. the BLAS pool
    started when NumPy was imported, are pinned one by one through ``/proc/self/task``.

    Raises:
        ValueError: ``core`` is not one of the cores this process may use.
    """
    allowed, cores = os.sched_getaffinity(0), _cores(core)
    if not cores or not cores <= allowed:
        raise ValueError(f"pin_core: core {core} is not available to this process; choose one "
                         f"of {sorted(allowed)}")
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:      # the thread ended meanwhile
            pass
    return len(tids)


def threads_off_core(core) -> list:
    """Ids of this process's threads that may run on a core other than ``core`` (a core's
    number, or a set of cores)."""
    off, cores = [], _cores(core)
    for t in os.listdir("/proc/self/task"):
        try:
            if os.sched_getaffinity(int(t)) != cores:
                off.append(int(t))
        except ProcessLookupError:
            pass
    return off


def xla_flags(threads: int) -> str:
    """XLA's CPU thread settings for ``threads`` threads (read when JAX starts; alone they did not
    keep JAX on one core, hence :func:`pin_core`)."""
    if threads == 1:
        return "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    return f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={threads}"


def cores_for(core: int, threads: int) -> set:
    """``threads`` cores: ``core`` and the highest-numbered others this process may use.

    Raises:
        ValueError: fewer cores are available.
    """
    allowed = sorted(os.sched_getaffinity(0), reverse=True)
    if core not in allowed or threads > len(allowed):
        raise ValueError(f"cores_for: {threads} threads need {threads} cores including core "
                         f"{core}; this process may use {sorted(allowed)}")
    return {core} | set([c for c in allowed if c != core][:threads - 1])


def start_on_one_core(core: int, threads: int = 1,
                      frameworks=("miniflow", "torch", "jax")) -> tuple:
    """Pin this process to ``core`` (with ``threads`` > 1: to :func:`cores_for` ``threads``
    cores) and start the frameworks of ``frameworks`` with every pool on ``threads`` threads:
    Numba (miniflow's), BLAS/OpenMP (threadpoolctl), PyTorch intra-op (inter-op: 1; when
    installed), XLA (:func:`xla_flags`, set before JAX is imported, when installed). The others
    are not imported (a process that measures one framework's memory).

    Returns ``(description, missing)``: the pools as one line, and ``{"torch" | "jax": reason}``
    for the frameworks that are not installed.

    Raises:
        ValueError: ``core`` (or enough cores) is not available (:func:`pin_core`).
        RuntimeError: a thread is still not pinned after the frameworks started.
    """
    cores = cores_for(core, threads)
    pin_core(cores)
    flags = xla_flags(threads)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()
    missing = {}
    if "torch" in frameworks:
        try:
            import torch  # noqa: F401  (before pin_threads, so its pools are pinned too)
        except ImportError:
            missing["torch"] = "PyTorch is not installed (pip install -e '.[bench]')"
    description = pin_threads(threads, frameworks)
    if "jax" in frameworks:
        try:
            import jax
            description += f", jax {jax.__version__} on {jax.devices()[0]} " \
                           f"(XLA_FLAGS={flags!r})"
        except ImportError:
            missing["jax"] = "JAX is not installed (pip install -e '.[bench]')"
    pin_core(cores)             # the threads the frameworks started
    off = threads_off_core(cores)
    if off:
        raise RuntimeError(f"start_on_one_core: threads {off} are not pinned to cores "
                           f"{sorted(cores)}")
    return description, missing


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

    from miniflow.experiments.machine import cpu_model_name

    cpu = cpu_model_name()
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


def cpu_round(fn, steps: int) -> tuple:
    """``(wall, process CPU, this thread's CPU)`` seconds for ``steps`` calls of ``fn``
    (``perf_counter``, ``process_time``, ``thread_time``)."""
    w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - w0, time.process_time() - c0, time.thread_time() - t0)


def median_time(fn, steps: int, repeats: int) -> float:
    """Median over ``repeats`` rounds of the time per call, each round ``steps`` calls."""
    return statistics.median(round_time(fn, steps) for _ in range(repeats)) / steps


def save_json(name: str, data: dict) -> Path:
    """Write ``data`` to ``results/<name>.json``; returns the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    return path
