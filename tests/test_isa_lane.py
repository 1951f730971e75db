"""The ISA lane: the matmul, convolution and half-type kernel tests compiled for other CPUs than
this one, each in its own process (``NUMBA_CPU_NAME`` must be set before Numba compiles
anything, and with its own ``NUMBA_CACHE_DIR``), as ``tests/test_cuda_simulator_lane.py`` runs
the simulator:

* ``haswell``: AVX2, FMA and F16C (8-lane vectors, the 6 x 16 register tile, ``vcvtph2ps``);
* ``generic``: the x86-64 baseline, SSE2 only (4-lane vectors, no FMA instruction, the integer
  float16 conversions of ``fp16``'s fallback path).

Each build runs :data:`SELECTION` (their oracles: NumPy float64, exhaustive float16 / bfloat16
tables) and then ``tests/isa_cases.py``, whose outputs must match this process's build: bit for
bit where both builds made a case with the same kernels and each of them computes every element
in a fixed order of IEEE operations (:data:`EXACT`: the register tile's fused multiply-adds in
order of ``p``, the transposes, the casts, BLAS), else within two units in the last place of the
output type plus float32 rounding over the sums' length (``4 eps sqrt(k)`` of the output's
largest magnitude: sums that cancel keep their absolute error), for the loops LLVM vectorizes
with reassociated sums (``dot_block_kernel``, ``rows_times_kernel``) and where a build takes
another path for lack of a feature (AVX512-BF16, F16C).
"""
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import isa_cases
from miniflow.kernels.cpu.common import pinned_threads
from mpi_harness import child_env

ROOT = Path(__file__).resolve().parent.parent
CPUS = ("haswell", "generic")
SELECTION = ["tests/test_simd.py",
             *(f"tests/test_packed_gemm.py::test_{name}" for name in (    # the per-ISA tile's
                 "the_bits_are_the_register_tiles", "it_counts_what_is_not_finite_once_rounded",
                 "the_product_is_within_the_float32_bound_of_the_exact_product",
                 "subnormal_bfloat16_operands_are_kept")),
             "tests/test_kernels_cpu.py::test_matmul",
             "tests/test_kernels_cpu.py::test_cast_bit_exact", "tests/test_fp16.py",
             "tests/test_bf16.py", "tests/test_conv.py::test_kernels_match_the_reference",
             "-k", "not float64 and not per-sample and not trains_like and not imported_by"]
"""The tests each build runs (pytest arguments): the kernels' tests; not the float64 ones, nor the
bfloat16 AMP training run (the kernels it runs are tested here one by one; it alone took 9.6 of
the haswell build's 51 s, compiling the whole step for that CPU) or the check of what imports
``ml_dtypes`` (no kernel compiled for a CPU at all)."""
EXACT = {"outer_block_kernel", "packed_kernel", "transpose_kernel", "cast_kernel",
         "cast_count_kernel", "dot", "im2col_kernel", "copyto"}
"""Kernels whose every output element is the same sequence of IEEE operations on any CPU."""
F32_EPS = float(np.finfo(np.float32).eps)
"""The compute type's (float32 sums for every half and float32 case)."""
TIMEOUT_S = 1200
"""A hang becomes a failure well inside CI's 90 minutes."""


def _env(cpu: str) -> dict:
    """The build's environment: its CPU and cache, one thread per pool (``child_env``). The lane
    checks numerics, which no thread count changes (the parallel variants still compile and run,
    on one thread), and shares the 2 cores with the other test process: the haswell build beside
    one busy core took 131.8 s wall and 125.4 CPU s with 2 threads per pool, 75.0 and 71.0 with
    one (Intel Xeon, Sapphire Rapids class: threads waiting for a core)."""
    env = {k: v for k, v in child_env().items()
           if k not in ("MINIFLOW_BACKEND", "NUMBA_CPU_FEATURES", "MINIFLOW_FP16_FALLBACK")}
    cache = Path(os.environ.get("NUMBA_CACHE_DIR") or Path(tempfile.gettempdir()) / "miniflow-isa")
    env.update(NUMBA_CPU_NAME=cpu, NUMBA_CACHE_DIR=str(cache / f"isa-{cpu}"))
    return env


@functools.cache
def _this_build() -> dict:
    """``isa_cases.run()`` in this process (the native build), once for both lanes, on one thread
    per pool as the lanes' builds run (:func:`_env`): the same kernels, to the same bits, as at
    the machine's threads (checked: all 38 cases, 2 threads against 1), and the serial variants
    compile in a fraction of the parallel ones' time. A cold cache took 44.5 s of CPU at 2
    threads, 18.5 s at 1 (Intel Xeon, Sapphire Rapids class; an ``outer_block_kernel``
    signature compiles in 1.0 s serial, 3.4 s parallel)."""
    with pinned_threads(1):
        return isa_cases.run()


def _assert_same_results(theirs, ours: dict, cpu: str) -> None:
    """Every case of ``theirs`` (the npz of another build) against this build's :func:`run`."""
    for name, (outs, kernels, k) in ours.items():
        other = [str(x) for x in theirs[f"{name}/kernels"]]
        exact = other == kernels and set(kernels) <= EXACT
        for i, want in enumerate(outs):
            got = theirs[f"{name}/{i}"]
            if want.dtype == ml_dtypes.bfloat16:
                got = got.view(ml_dtypes.bfloat16)
            where = f"{name}, output {i}: {cpu} made it with {other}, this build with {kernels}"
            if exact or np.issubdtype(want.dtype, np.integer):      # also the count of non-finite
                np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), where)
                continue
            wide = want.astype(np.float64)
            ulp = float(ml_dtypes.finfo(want.dtype).eps)       # of the output type
            scale = float(np.max(np.abs(wide), initial=1.0, where=np.isfinite(wide)))
            np.testing.assert_allclose(got.astype(np.float64), wide, rtol=2 * ulp,
                                       atol=4 * F32_EPS * np.sqrt(k) * scale, err_msg=where)


@pytest.mark.slow
@pytest.mark.parametrize("cpu", CPUS)
def test_kernels_compiled_for_another_cpu_pass_and_match_this_build(cpu, tmp_path,
                                                                   record_property):
    env = _env(cpu)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        *SELECTION], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    lines = r.stdout.strip().splitlines() or [""]
    assert r.returncode == 0, f"{cpu} lane failed (exit {r.returncode}):\n" \
                              f"{r.stdout[-8000:]}\n{r.stderr[-4000:]}"
    out = tmp_path / "cases.npz"
    c = subprocess.run([sys.executable, str(ROOT / "tests" / "isa_cases.py"), str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert c.returncode == 0, f"isa_cases.py under {cpu} failed:\n{c.stderr[-4000:]}"
    with np.load(out) as theirs:
        _assert_same_results(theirs, _this_build(), cpu)
    record_property("lane_summary", f"ISA lane {cpu} (own process, "
                    f"{time.perf_counter() - t0:.0f} s): {lines[-1].strip('= ')}; "
                    f"tests/isa_cases.py matches this build")


def test_the_lane_compares_what_it_says():
    """A case whose bits differ fails the exact comparison; within tolerance passes the other."""
    ours = {"case": ([np.array([1.0, 2.0], np.float32)], ["outer_block_kernel"], 10),
            "loose": ([np.array([1.0, 2.0], np.float32)], ["dot_block_kernel"], 10)}
    theirs = {"case/kernels": np.array(["outer_block_kernel"]), "case/0": np.float32([1.0, 2.0]),
              "loose/kernels": np.array(["dot_block_kernel"]),
              "loose/0": np.float32([1.0, 2.0]) * np.float32(1 + 2 ** -22)}
    _assert_same_results(theirs, ours, "test")
    theirs["case/0"] = np.nextafter(np.float32([1.0, 2.0]), np.float32(3))
    with pytest.raises(AssertionError, match="case, output 0"):
        _assert_same_results(theirs, ours, "test")
