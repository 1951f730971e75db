"""Tests of benchmarks/speed.py: every framework computes miniflow's training step, and the check
notices one that does not."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import speed  # noqa: E402

FRAMEWORKS = ["miniflow", "NumPy"]
for _name, _module in (("JAX jit", "jax"), ("PyTorch", "torch")):
    try:
        __import__(_module)
        FRAMEWORKS.append(_name)
    except ImportError:
        pass


@pytest.fixture(scope="module")
def data():
    return speed.digits()


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_frameworks_compute_miniflows_step(data, dtype):
    lines = speed.check(["mlp"], [dtype], [8], data, FRAMEWORKS, steps=4)
    assert len(lines) == len(FRAMEWORKS)


def _other_labels(sizes, weights, x, y, dtype):
    return speed.numpy_step(sizes, weights, x, np.roll(y, 1), dtype)


def test_check_fails_on_a_different_step(data, monkeypatch):
    monkeypatch.setitem(speed.BUILDERS, "NumPy", _other_labels)
    with pytest.raises(AssertionError, match="NumPy does not compute miniflow's step"):
        speed.check(["mlp"], ["fp32"], [8], data, ["miniflow", "NumPy"], steps=2)


def test_timing_leaves_out_a_framework_that_computes_another_step(data, monkeypatch, capsys):
    monkeypatch.setitem(speed.BUILDERS, "JAX jit", speed.numpy_step)      # agrees with miniflow
    monkeypatch.setitem(speed.BUILDERS, "NumPy", _other_labels)
    res = speed.time_case("mlp", "fp32", 8, data, ["miniflow", "JAX jit", "NumPy"], 1, 1)
    first, other = res["losses"]["miniflow"], res["losses"]["NumPy"]
    assert abs(other - first) > 1e-3
    assert res["dropped"] == {"NumPy": f"first loss {other:.6g}, miniflow's {first:.6g}"}
    assert set(res["step_s"]) == {"miniflow", "JAX jit"}
    assert "NumPy mlp fp32 batch 8: dropped, it computes another step" in capsys.readouterr().out
    row = speed.table([{"model": "mlp", "dtype": "fp32", "batch": 8, **res}]).splitlines()[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3 + speed.FRAMEWORKS.index("NumPy")] == f"dropped: {res['dropped']['NumPy']}"
    assert cells[-1] == "-"                                            # no NumPy / miniflow ratio


def test_timing_stops_when_no_framework_agrees_with_miniflow(data, monkeypatch):
    monkeypatch.setitem(speed.BUILDERS, "NumPy", _other_labels)
    with pytest.raises(AssertionError, match="no framework computes miniflow's step: NumPy"):
        speed.time_case("mlp", "fp32", 8, data, ["miniflow", "NumPy"], 1, 1)


def test_next_scale_follows_grad_scaler():
    interval = speed.SCALER["growth_interval"]
    scale, tracker = speed.next_scale(np, np.bool_(True), np.float32(8), 3)
    assert (float(scale), int(tracker)) == (8.0, 4)
    scale, tracker = speed.next_scale(np, np.bool_(True), np.float32(8), interval - 1)
    assert (float(scale), int(tracker)) == (16.0, 0)
    scale, tracker = speed.next_scale(np, np.bool_(False), np.float32(8), 5)
    assert (float(scale), int(tracker)) == (4.0, 0)
    scale, tracker = speed.next_scale(np, np.bool_(False), np.float32(1.5), 5)
    assert (float(scale), int(tracker)) == (speed.SCALER["min_scale"], 0)


def test_pin_core_pins_every_thread():
    import os
    import threading

    import harness

    allowed = os.sched_getaffinity(0)
    core = harness.default_core()
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()                                   # a thread started before pinning
    try:
        assert harness.pin_core(core) >= 2
        assert harness.threads_off_core(core) == []
        assert os.sched_getaffinity(worker.native_id) == {core}
    finally:
        stop.set()
        worker.join()
        for tid in os.listdir("/proc/self/task"):    # give the test process its cores back
            try:
                os.sched_setaffinity(int(tid), allowed)
            except ProcessLookupError:   # a thread that ended meanwhile (the joined worker
                pass                     # can still be listed while it exits)


def test_pin_core_rejects_an_unavailable_core():
    import harness

    with pytest.raises(ValueError, match="pin_core: core 100000 is not available"):
        harness.pin_core(100000)


def test_isa_runs_the_benchmark_again_in_a_child_with_that_cpus_environment(tmp_path, capfd,
                                                                             monkeypatch):
    """``--isa avx2``: the benchmark re-executes itself with ``harness.ISAS``'s variables in the
    child only; there miniflow's kernels compile for ``haswell`` (8-lane vectors, the 6 x 16
    tile), the child runs the benchmark itself rather than again, and its Numba and inductor caches
    are folders of their own (``harness.isa_cache_dirs``)."""
    import os

    import llvmlite.binding as llvm

    import harness

    if "+avx2" not in llvm.get_host_cpu_features().flatten().split(","):
        pytest.skip("the host has no AVX2")
    script = tmp_path / "bench.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path[:0] = [{str(Path(harness.__file__).parent)!r}, {str(Path.cwd())!r}]\n"
        "import harness\n"
        "assert not harness.run_as_isa('avx2', __file__, sys.argv[1:])\n"
        "from miniflow.kernels.cpu import target\n"
        "print('child', sys.argv[1:], os.environ['OPENBLAS_CORETYPE'], os.environ['XLA_FLAGS'],"
        " os.environ['ATEN_CPU_CAPABILITY'], os.environ['MKL_ENABLE_INSTRUCTIONS'],"
        " os.environ['ONEDNN_MAX_CPU_ISA'], target.ISA.name, target.ISA.lanes, target.cpu()[1])\n"
        "print('caches', os.environ['NUMBA_CACHE_DIR'], os.environ['TORCHINDUCTOR_CACHE_DIR'])\n")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    before = dict(os.environ)
    with pytest.raises(SystemExit) as done:
        harness.run_as_isa("avx2", str(script), ["--quick"])
    assert done.value.code == 0
    out = capfd.readouterr().out
    assert "child ['--quick'] Haswell --xla_cpu_max_isa=AVX2 avx2 AVX2 AVX2 avx2 8 haswell" in out, out
    assert f"caches {tmp_path}/numba/isa-avx2 {tmp_path}/inductor/isa-avx2" in out, out
    assert dict(os.environ) == before
    assert harness.run_as_isa("native", str(script), []) is False


def test_the_isa_line_names_the_blas_core_type_in_use_not_the_variable(monkeypatch):
    """``OPENBLAS_CORETYPE=Bogus``: the results' ISA line said ``OPENBLAS_CORETYPE=Bogus`` where
    OpenBLAS ran its default kernels, and a native run said ``(auto)``. It names the core type
    threadpoolctl reads from the loaded BLAS (``miniflow info``'s), the variable beside it."""
    import harness
    from miniflow.kernels.cpu import tune

    monkeypatch.setenv("OPENBLAS_CORETYPE", "Bogus")
    monkeypatch.setattr(tune, "machine", lambda: {"blas": ["openblas 0.3 SkylakeX"]})
    assert harness.isa_line().endswith("; BLAS openblas 0.3 SkylakeX (OPENBLAS_CORETYPE=Bogus)")


def test_profile_times_every_node_once_and_names_its_kernels(data):
    res = speed.profile("mlp", "bf16", 8, data, steps=2)
    nodes = res["nodes"]
    assert len({i for _, i, _, _ in nodes}) == len(nodes)
    ops = {label.split("(")[0] for _, _, label, _ in nodes}
    assert {"matmul", "multi_tensor_sgd_update_with_cast"} <= ops      # AMP's fused update
    assert any("cast_kernel" in kernels for *_, kernels in nodes)       # bf16 matmul widens
    assert [n[0] for n in nodes] == sorted((n[0] for n in nodes), reverse=True)
    lines = speed.profile_lines("mlp", "bf16", 8, res, top=3)
    assert len(lines) == 4 and lines[0].startswith("mlp AMP bf16 batch 8: ")


@pytest.mark.parametrize("args,error", [
    (["--batches", "x"], "argument --batches: expected an int >= 1, got 'x'"),
    (["--batches", "16,-4"], "argument --batches: expected an int >= 1, got '-4'"),
    (["--threads", "0"], "argument --threads: expected an int >= 1, got '0'"),
    (["--gpt-batch", "0"], "argument --gpt-batch: expected an int >= 1, got '0'"),
    (["--threads", "999"], "--threads 999: 999 threads need 999 cores including core"),
])
def test_bad_numbers_are_usage_errors_before_anything_runs(args, error, capsys):
    """A new user's findings: ``--batches -4`` timed 252 rows labelled batch -4, other values
    ended in tracebacks (an empty batch, Numba's thread count, a median of nothing)."""
    with pytest.raises(SystemExit) as e:
        speed.main(args)
    assert e.value.code == 2 and error in capsys.readouterr().err
