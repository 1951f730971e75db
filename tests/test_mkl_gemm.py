"""oneMKL's half-type products (``kernels.cpu.mkl_gemm``, the ``amx`` extra): results against a
float64 oracle of the same rounded inputs for every transpose, ragged shapes and every out
dtype, whole or in blocks of out's rows (each block rounded, and counted, on its own); the tuner
keeps each candidate only where it measures faster, caches it, and gives the same
bits from the cache; ``MINIFLOW_MATMUL=numba`` / ``blas`` never call it; the gates (target
feature, the extra) and the one-sentence error naming the extra.

The oneMKL tests run only where the CPU Numba compiles for has AMX-BF16 and the ``mkl`` wheel is
installed (each skip says which is missing); the gate and error tests run everywhere."""
import json

import numpy as np
import pytest

from miniflow.dtype import bfloat16, float16, float32, int64
from miniflow.extras import MissingExtraError
from miniflow.ir import Node, Value
from miniflow.kernels.cpu import builder_for, matmul, mkl_gemm, target, tune
from miniflow.ops import get_op
from test_tune import FakeTimer, _matmul, _tuner

AMX = mkl_gemm._target_has(("amx-bf16",))
needs_mkl = pytest.mark.skipif(
    not (AMX and mkl_gemm.available()),
    reason=("the target CPU has no AMX-BF16" if not AMX
            else "oneMKL is not installed (pip install 'miniflow[amx]')"))


SHAPES = [(1, 64, 128), (3, 5, 7), (17, 33, 65), (64, 1024, 1024), (1024, 16, 1024),
          (255, 129, 1000)]


@needs_mkl
@pytest.mark.parametrize("dt", [bfloat16, float16], ids=lambda d: d.short)
@pytest.mark.parametrize("out_dt", ["same", "float32"])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_mkl_products_agree_with_the_float64_oracle(monkeypatch, m, k, n, ta, tb, dt, out_dt):
    """Accumulated in float32, rounded once into out: within float32 summation error of the
    oracle for a float32 out, within one rounding of out's type for a half out."""
    if not mkl_gemm._target_has(mkl_gemm.FUNCTIONS[np.dtype(dt.np)][1]):
        pytest.skip(f"the target CPU has no feature oneMKL's {dt.name} product is offered on")
    monkeypatch.setenv("MINIFLOW_MATMUL", "mkl")
    out_dt = dt if out_dt == "same" else float32
    steps, out, ref = _matmul(m, k, n, dt, ta, tb, seed=m + k + n, out_dt=out_dt)
    assert tune._kernels(steps).startswith(mkl_gemm.FUNCTIONS[np.dtype(dt.np)][0])
    eps = np.finfo(np.float32).eps if out_dt is float32 else float(
        np.finfo(out_dt.np).eps) / 2
    scale = np.abs(ref) + 1e-30
    summed = 2 * k * np.finfo(np.float32).eps * (np.abs(ref).max() + 1)
    assert np.all(np.abs(out.astype(np.float64) - ref) <= eps * scale + summed)


@needs_mkl
@pytest.mark.parametrize("dt", [bfloat16, float16], ids=lambda d: d.short)
def test_a_counted_product_counts_the_non_finite_elements_of_out(monkeypatch, dt):
    monkeypatch.setenv("MINIFLOW_MATMUL", "mkl")
    if not mkl_gemm._target_has(mkl_gemm.FUNCTIONS[np.dtype(dt.np)][1]):
        pytest.skip(f"the target CPU has no feature oneMKL's {dt.name} product is offered on")
    steps, out, ref = _matmul(40, 70, 130, dt, counted=True)
    assert tune._kernels(steps) == (mkl_gemm.FUNCTIONS[np.dtype(dt.np)][0]
                                    + " + cast_count_kernel")
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-2, atol=1e-2)
    big = {bfloat16: 3e37, float16: 2000.0}[dt]     # a row whose products overflow out's type
    r = np.random.default_rng(0)
    a, b = (r.uniform(1, 2, s).astype(dt.np) for s in ((4, 64), (64, 128)))
    a[1] = big
    node = Node(get_op("matmul"), [Value("a", a.shape, dt), Value("b", b.shape, dt)],
                [Value("o", (4, 128), dt), Value("c", (1,), int64)], {"count_not_finite": True})
    outs = [np.zeros((4, 128), dt.np), np.zeros(1, np.int64)]
    for fn, args in matmul.mkl_steps(node, [a, b], outs):
        fn(*args)
    assert outs[1][0] == 128 and np.isinf(outs[0][1].astype(np.float32)).all()


@needs_mkl
def test_the_tuner_keeps_mkl_only_where_it_measures_faster_and_caches_it(tmp_path, monkeypatch):
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=2e-3, mkl=1e-3, blas=3e-3))
    steps, out1, _ = _matmul(64, 256, 512, bfloat16, tb=True)
    assert tune._kernels(steps).startswith("cblas_gemm_bf16bf16f32")
    assert {"numba", "mkl", "blas"} == set(t.timer.calls)
    [(key, name)] = json.loads((tmp_path / "tuning.json").read_text())["choices"].items()
    assert name == "mkl" and " amx | " in key
    again = _tuner(tmp_path, monkeypatch, FakeTimer())      # a new process: from the file
    steps2, out2, _ = _matmul(64, 256, 512, bfloat16, tb=True)
    assert again.timer.calls == [] and tune._kernels(steps2) == tune._kernels(steps)
    np.testing.assert_array_equal(out1.view(np.uint16), out2.view(np.uint16))
    slower = _tuner(tmp_path / "slow", monkeypatch, FakeTimer(numba=1e-3, mkl=2e-3, blas=3e-3))
    assert "cblas" not in tune._kernels(_matmul(64, 256, 512, bfloat16, tb=True)[0])
    assert slower.timer.calls.count("mkl") >= tune.MIN_ROUNDS
    before = len(slower.timer.calls)
    _matmul(64, 256, 512, dt=float32, tb=True)          # float32: numba and blas only
    assert set(slower.timer.calls[before:]) == {"numba", "blas"}


@needs_mkl
@pytest.mark.parametrize("value,builder", [("numba", matmul.numba_steps),
                                           ("blas", matmul.blas_steps)])
def test_forced_numba_or_blas_gives_the_bits_of_the_steps_without_mkl(monkeypatch, value,
                                                                       builder):
    monkeypatch.setenv("MINIFLOW_MATMUL", value)
    steps, out, _ = _matmul(64, 1024, 256, bfloat16, ta=True)
    assert "cblas" not in tune._kernels(steps)
    node = Node(get_op("matmul"), [Value("a", (1024, 64), bfloat16),
                                   Value("b", (1024, 256), bfloat16)],
                [Value("o", (64, 256), bfloat16)], {"transpose_a": True})
    r = np.random.default_rng(0)          # _matmul's operands
    a = r.uniform(-1, 1, (1024, 64)).astype(bfloat16.np)
    b = r.uniform(-1, 1, (1024, 256)).astype(bfloat16.np)
    direct = [np.zeros((64, 256), bfloat16.np)]
    for fn, args in builder(node, [a, b], direct):
        fn(*args)
    np.testing.assert_array_equal(out.view(np.uint16), direct[0].view(np.uint16))


def test_forcing_mkl_without_it_names_the_extra_in_one_sentence(monkeypatch):
    monkeypatch.setattr(mkl_gemm, "library", lambda: None)
    monkeypatch.setenv("MINIFLOW_MATMUL", "mkl")
    with pytest.raises(MissingExtraError, match=r"needs the 'mkl' package, which is not "
                                                r"installed: install miniflow's amx extra") as e:
        _matmul(16, 64, 128, bfloat16)
    assert e.value.args[0].count(". ") == 0 and e.value.args[0].endswith(".")
    assert "not installed (pip install 'miniflow[amx]'" in mkl_gemm.describe()
    _matmul(16, 64, 128, dt=float32)        # a float32 product: nothing to force, the rules


@pytest.mark.parametrize("why", ["no mkl", "haswell target", "float32"])
def test_mkl_is_not_a_candidate_without_the_extra_the_feature_or_a_half_type(monkeypatch, why):
    """Then the candidates, the class key and so the bits are those of a machine without it."""
    if why == "no mkl":
        monkeypatch.setattr(mkl_gemm, "library", lambda: None)
    if why == "haswell target":     # NUMBA_CPU_NAME=haswell: LLVM's own features, none listed
        monkeypatch.setattr(target, "cpu", lambda: ("x86_64-unknown-linux-gnu", "haswell", ""))
    dt = float32 if why == "float32" else bfloat16
    a, b, out = np.zeros((16, 64), dt.np), np.zeros((64, 128), dt.np), np.zeros((16, 128), dt.np)
    for how in ("auto", "numba", "blas"):
        monkeypatch.setenv("MINIFLOW_MATMUL", how)
        assert not mkl_gemm.offered(a, b, out)


def test_only_half_operands_into_a_float32_or_half_out_are_taken():
    h, f = np.zeros((4, 8), np.float16), np.zeros((8, 16), np.float16)
    assert mkl_gemm.takes(h, f, np.zeros((4, 16), np.float32))
    assert mkl_gemm.takes(h, f, np.zeros((4, 16), bfloat16.np))
    assert not mkl_gemm.takes(h, f, np.zeros((4, 16), np.float64))      # float32 written
    assert not mkl_gemm.takes(h, f.astype(bfloat16.np), np.zeros((4, 16), np.float32))
    assert not mkl_gemm.takes(h.astype(np.float32), f.astype(np.float32),
                              np.zeros((4, 16), np.float32))
    assert not mkl_gemm.takes(h[:, :0], f[:0], np.zeros((4, 16), np.float32))


@pytest.mark.parametrize("shape,strides,expect", [
    ((3, 5), (10, 2), (mkl_gemm._NO_TRANS, 5)),         # C-contiguous
    ((3, 5), (2, 6), (mkl_gemm._TRANS, 3)),             # a .T view of a C-contiguous (5, 3)
    ((1, 5), (2, 2), (mkl_gemm._TRANS, 1)),             # x.T of a (5, 1): columns of stride 1
    ((3, 5), (20, 4), None),                            # every other column: no unit stride
])
def test_operands_are_passed_by_their_unit_stride(shape, strides, expect):
    x = np.lib.stride_tricks.as_strided(np.zeros(64, np.float16), shape, strides)
    assert mkl_gemm._operand(x) == expect


@needs_mkl
@pytest.mark.parametrize("dt", [bfloat16, float16], ids=lambda d: d.short)
@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("m,k,n,block_bytes", [(1024, 256, 1024, mkl_gemm.BLOCK_BYTES),
                                               (37, 33, 65, 5 * 65 * 4), (40, 70, 130, 1)])
def test_blocked_mkl_products_agree_with_the_float64_oracle(monkeypatch, m, k, n, block_bytes,
                                                            ta, tb, counted, dt):
    """Blocks of out's rows (the last one ragged; one row a block): each rounded once into the
    half out, and the non-finite elements of all blocks counted."""
    if not mkl_gemm._target_has(mkl_gemm.FUNCTIONS[np.dtype(dt.np)][1]):
        pytest.skip(f"the target CPU has no feature oneMKL's {dt.name} product is offered on")
    monkeypatch.setattr(mkl_gemm, "BLOCK_BYTES", block_bytes)
    r = np.random.default_rng(m + k + n)
    a = r.uniform(-1, 1, (k, m) if ta else (m, k)).astype(dt.np)
    b = r.uniform(0.5, 1, (n, k) if tb else (k, n)).astype(dt.np)
    big = {bfloat16: 3e37, float16: 60000.0}[dt]      # rows 0 and m - 1 overflow out's type
    op_a = a.T if ta else a
    op_a[0], op_a[-1] = big, -big
    node = Node(get_op("matmul"), [Value("a", a.shape, dt), Value("b", b.shape, dt)],
                [Value("o", (m, n), dt)] + ([Value("c", (1,), int64)] if counted else []),
                {"transpose_a": ta, "transpose_b": tb, "count_not_finite": counted})
    outs = [np.full((m, n), -7, dt.np)] + ([np.full(1, -1, np.int64)] if counted else [])
    steps = matmul.mkl_blocked_steps(node, [a, b], outs)
    blocks = -(-m // mkl_gemm.block_rows(n))
    assert tune._kernels(steps).count("cblas_gemm") == blocks > 1
    for fn, args in steps:
        fn(*args)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = (a64.T if ta else a64) @ (b64.T if tb else b64)
    got = outs[0].astype(np.float64)
    finite = np.isfinite(got)
    assert not finite[[0, -1]].any() and finite[1:-1].all()
    summed = 2 * k * np.finfo(np.float32).eps * (np.abs(ref[finite]).max() + 1)
    eps = float(np.finfo(dt.np).eps) / 2
    assert np.all(np.abs(got[finite] - ref[finite]) <= eps * np.abs(ref[finite]) + summed)
    if counted:
        assert outs[1][0] == np.count_nonzero(~finite)


def test_blocks_only_where_a_rounded_out_has_more_than_one_block():
    """A float32 out is written by oneMKL itself (nothing to round); one block is mkl_steps."""
    a, b = np.zeros((256, 64), np.float16), np.zeros((64, 1024), np.float16)
    rows = mkl_gemm.block_rows(1024)

    def node(m, out_dt):
        return Node(get_op("matmul"), [Value("a", (m, 64), float16), Value("b", b.shape, float16)],
                    [Value("o", (m, 1024), out_dt)], {})
    assert rows == 128 and mkl_gemm.block_rows(1 << 20) == 1
    assert matmul.mkl_blocked_steps(node(256, float32), [a, b],
                                    [np.zeros((256, 1024), np.float32)]) is None
    assert matmul.mkl_blocked_steps(node(rows, float16), [a[:rows], b],
                                    [np.zeros((rows, 1024), np.float16)]) is None


FOUR = {"numba": matmul.numba_steps, "blas": matmul.blas_steps, "mkl": matmul.mkl_steps,
        "mkl blocked": matmul.mkl_blocked_steps}
"""The candidates of a half product but one-thread BLAS (which has its own test)."""


@needs_mkl
def test_the_tuner_measures_the_blocked_candidate_and_keeps_it_where_faster(tmp_path,
                                                                             monkeypatch):
    t = _tuner(tmp_path, monkeypatch, FakeTimer(numba=3e-3, blas=3e-3, mkl=2e-3,
                                                **{"mkl blocked": 1e-3}))
    monkeypatch.setattr(matmul, "CANDIDATES", FOUR)
    steps, out, ref = _matmul(1024, 64, 1024, bfloat16, ta=True)
    assert tune._kernels(steps).count("cblas_gemm_bf16bf16f32") == 8
    assert {"numba", "blas", "mkl", "mkl blocked"} == set(t.timer.calls)
    assert list(t.choices.values()) == ["mkl blocked"]
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-2, atol=1e-2)
    again = _tuner(tmp_path, monkeypatch, FakeTimer())      # a new process: from the file
    monkeypatch.setattr(matmul, "CANDIDATES", FOUR)
    steps2, out2, _ = _matmul(1024, 64, 1024, bfloat16, ta=True)
    assert again.timer.calls == [] and tune._kernels(steps2) == tune._kernels(steps)
    np.testing.assert_array_equal(out.view(np.uint16), out2.view(np.uint16))
