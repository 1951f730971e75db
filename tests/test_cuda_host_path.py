"""The cuda backend's host side without a GPU: the runtime's checks over the stubbed driver
(``tests/stub_checks.py``, in a process of its own), ``benchmarks/cuda_host_overhead.py`` as a
smoke test (one step of each workload: the report's fields, packed launches passing numba-cuda's
bytes, no allocation and no wait per step), and what needs no driver at all: the CUDA graph
decision and the cuBLAS GEMM layout.

What only a real GPU can check (``benchmarks/gpu_check.py``): that the driver accepts the packed
launches and the captured graph, that the cuBLAS GEMM runs, and the kernels' speed.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cuda_cases import ptx_unavailable
from stub_checks import CHECKS

ROOT = Path(__file__).resolve().parent.parent
REASON = ptx_unavailable()
needs_nvvm = pytest.mark.skipif(REASON is not None, reason=str(REASON))


def _env(tmp_path=None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MINIFLOW_BACKEND", "NUMBA_ENABLE_CUDASIM")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="module")
def stub_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("stub") / "report.json"
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "stub_checks.py"), str(out)],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"stub_checks.py failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.mark.slow
@needs_nvvm
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_cuda_runtime_over_the_stubbed_driver(stub_report, name):
    assert name in stub_report, f"{name} did not run"
    assert stub_report[name] is None, stub_report[name]


@pytest.mark.slow
@needs_nvvm
def test_host_overhead_benchmark_smoke(tmp_path):
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "benchmarks/cuda_host_overhead.py", "--smoke", "--json",
                        str(out)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    report = json.loads(out.read_text())
    assert report["steps"] == 1 and report["numba_cuda"] and report["cuda_bindings"]
    assert set(report["workloads"]) == {f"{m} {d} {o}" for m in ("digits", "wide")
                                        for d in ("fp32", "amp") for o in ("sgd", "adam")}
    for name, w in report["workloads"].items():
        packed, graph, dispatcher = w["packed"], w["graph"], w["dispatcher"]
        for r_ in (packed, graph, dispatcher):
            for field in ("host_us_median", "host_us_mean", "launches", "graph_launches",
                          "h2d", "d2h", "d2d", "copies", "syncs", "allocs", "frees", "steps"):
                assert r_[field] >= 0, (name, field)
        assert packed["launches"] == packed["kernel_steps"] > 0, name
        assert packed["allocs"] == packed["syncs"] == 0, (name, packed["counts"])
        assert packed["h2d"] == 2 and packed["d2d"] == 1, (name, packed["counts"])
        assert packed["d2h"] == (2 if "amp" in name else 0), (name, packed["counts"])
        assert graph["graph_launches"] == 1 and graph["launches"] == 0, name
        assert dispatcher["launches"] == packed["launches"], name
        assert w["packing"]["mismatches"] == [] and w["packing"]["launches"] > 0, name
        assert w["packing"]["graph_kernels_match"], name
        if "amp" in name:          # the GPU behind: no wait unless the loop reads the scaler
            assert w["behind"]["syncs"] == 0 and w["behind"]["d2h"] == 2, (name, w["behind"])
            assert w["behind_reads"]["syncs"] == 1, (name, w["behind_reads"])
    assert "same bytes" in r.stdout


def test_cuda_graph_decision():
    """Which plans may become one CUDA graph (``runtime.cuda.graph_capture_reason``)."""
    from miniflow.kernels.cuda.launch import Launch
    from miniflow.runtime import cuda as runtime

    class Kernel:
        def __getitem__(self, config):
            return lambda *args: None
    launch = Launch(Kernel(), 1, 32, "k")

    def host(*args):
        pass

    class Gemm:
        capturable = True
        __name__ = "cublas_gemm"

    assert runtime.graph_capture_reason([(launch, ()), (Gemm(), ())]) is None
    assert runtime.graph_capture_reason([(launch, ()), (host, ())]) == \
        "host steps (host) cannot be captured"
    assert runtime.graph_capture_reason([]) == "the plan has no steps"
    runtime.GRAPHS[0] = False
    try:
        assert runtime.graph_capture_reason([(launch, ())]) == "CUDA graphs are turned off"
    finally:
        runtime.GRAPHS[0] = True


def _column_major(buf, rows, cols, ld):
    """The column-major ``rows x cols`` matrix with leading dimension ``ld`` in flat ``buf``."""
    return buf[:ld * cols].reshape(cols, ld)[:, :rows].T


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("m,n,k", [(5, 3, 7), (1, 9, 2), (13, 1, 1)])
def test_cublas_layout_computes_the_row_major_product(ta, tb, m, n, k):
    """``cublas.gemm_layout`` run through a NumPy emulation of column-major GEMM
    (``C = op1(X) op2(Y)``, cuBLAS's definition) gives ``op(a) @ op(b)`` in row-major ``out``."""
    from miniflow.kernels.cuda.cublas import OP_N, gemm_layout
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (k, m) if ta else (m, k))
    b = rng.uniform(-1, 1, (n, k) if tb else (k, n))
    op1, op2, rows, cols, inner, ld1, ld2, ldc = gemm_layout(ta, tb, m, n, k)

    def operand(buf, op, r, c, ld):              # op(X) is r x c
        return _column_major(buf, r, c, ld) if op == OP_N else _column_major(buf, c, r, ld).T
    x = operand(b.ravel(), op1, rows, inner, ld1)
    y = operand(a.ravel(), op2, inner, cols, ld2)
    out = np.zeros(m * n)
    out.reshape(cols, ldc)[:, :rows] = (x @ y).T             # C written column-major
    want = (a.T if ta else a) @ (b.T if tb else b)
    np.testing.assert_allclose(out.reshape(m, n), want, rtol=1e-12)


def test_cublas_is_not_used_for_host_stand_ins_or_without_the_binding():
    """The PTX lane builds plans on host arrays: the register-tiled kernel must be what it
    compiles; without CuPy (here) the kernel runs too."""
    from miniflow.kernels.cuda import cublas
    a = np.zeros((2, 3), np.float32)
    assert not cublas.available(a, a, a)
    import importlib.util
    if importlib.util.find_spec("cupy") is None:
        assert cublas._binding() is None


def test_a_block_over_1024_threads_is_refused_when_the_step_is_built():
    from miniflow.kernels.cuda.launch import Launch

    class Kernel:
        def __getitem__(self, config):
            return lambda *args: None
    assert Launch(Kernel(), (2, 2), (32, 32), "ok").block == (32, 32)
    with pytest.raises(ValueError, match=r"conv: a block of \(64, 64\) is 4096 threads, more "
                                         r"than CUDA's 1024 per block"):
        Launch(Kernel(), (2, 2), (64, 64), "conv")
