"""The packed GEMM (``kernels/cpu/packed_gemm.py``, matmul's ``packed`` candidate): against a
NumPy float64 oracle with the float32 error bound, bit for bit against the register tile's
fused multiply-adds (``outer_block_kernel``), run to run and serial against parallel, the
non-finite count, subnormal bfloat16 operands, the candidate in the tuner's dict, and AMP
bfloat16 training on it (``MINIFLOW_MATMUL=packed``): bit-identical run to run."""
import ml_dtypes
import numpy as np
import pytest

from miniflow.dtype import bfloat16, float16, float32
from miniflow.ir import Node, Value
from miniflow.kernels.cpu import fp16, matmul as cpu_matmul
from miniflow.kernels.cpu.common import kview
from miniflow.kernels.cpu.packed_gemm import KC, MR, NR, TAIL, packed_kernel
from miniflow.ops import get_op

U32 = 2.0 ** -24
"""float32's unit roundoff."""
UNIT = {np.dtype(np.float32): U32, np.dtype(np.float16): 2.0 ** -11,
        np.dtype(ml_dtypes.bfloat16): 2.0 ** -8}
"""Each out type's unit roundoff (half its epsilon): the one rounding of the stored result."""
TYPES = [np.float32, ml_dtypes.bfloat16] + ([np.float16] if fp16.PATH == "intrinsic" else [])
"""The types the kernel's vectors load (float16 on F16C's path only)."""
SHAPES = [(1, 1, 1), (MR + 1, 7, NR + 5), (2 * MR - 1, KC + 37, 3 * NR + 17), (MR, KC, NR),
          (3, 2, 70), (40, 3 * KC, 64)]
"""Rows past the last block of ``MR``, columns past the last panel and past the last vector,
``k`` past the last block of ``KC``, and whole blocks."""


def _operands(m, k, n, dt, ta, tb, seed=0):
    """``(a, b)`` as the kernel reads them (``.T`` views where transposed) and their float64."""
    r = np.random.default_rng(seed)
    a = r.uniform(-1, 1, (k, m) if ta else (m, k)).astype(dt)
    b = r.uniform(-1, 1, (n, k) if tb else (k, n)).astype(dt)
    a, b = (a.T if ta else a), (b.T if tb else b)
    return a, b, a.astype(np.float64), b.astype(np.float64)


def _product(a, b, out_dt, parallel=False, counted=False):
    out = np.full((a.shape[0], b.shape[1]), np.nan, out_dt)
    count = np.full(1, -1, np.int64)
    a, b, bits = kview(a), kview(b), kview(out)
    packed_kernel(parallel, a.dtype, b.dtype, bits.dtype)(a, b, bits, count, counted)
    return out, count[0]


def _bound(a64, b64, out_dt):
    """Per element: the float32 sum's error bound ``k u |a| |b|`` (Higham, "Accuracy and
    Stability of Numerical Algorithms", 2002, eq. 3.5; ``k`` fused multiply-adds, each one
    rounding) plus the one rounding into out (``u_out`` times the exact value)."""
    k = a64.shape[1]
    exact = a64 @ b64
    return exact, 1.01 * (k * U32 / (1 - k * U32) * (np.abs(a64) @ np.abs(b64))
                          + UNIT[np.dtype(out_dt)] * np.abs(exact))


@pytest.mark.parametrize("dt", TYPES)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_product_is_within_the_float32_bound_of_the_exact_product(shape, ta, tb, dt):
    a, b, a64, b64 = _operands(*shape, dt, ta, tb)
    for out_dt in {np.float32, dt}:
        out, _ = _product(a, b, out_dt)
        exact, bound = _bound(a64, b64, out_dt)
        err = np.abs(out.astype(np.float64) - exact)
        assert np.all(err <= bound), (shape, out_dt, float((err - bound).max()))


@pytest.mark.parametrize("dt", TYPES)
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("shape", [(MR + 1, 7, NR + 5), (2 * MR - 1, KC + 37, 3 * NR + 17),
                                   (2 * MR + TAIL, KC + 37, NR + 5)])
def test_the_bits_are_the_register_tiles(shape, ta, dt):
    """Each element is the register tile's chain of fused multiply-adds in order of ``p``
    (``outer_block_kernel``'s ``"rows"`` layout, its scalar columns ``fma_scalar``), whatever the
    blocks (the last one by the ``TAIL``-row tile where it fits) and however ``a`` is stored:
    the same bits, in out's type (``outer_block_kernel`` reads a contiguous copy of ``a``: one
    specialization of it per type)."""
    a, b, _, _ = _operands(*shape, dt, ta, False, seed=3)
    out, _ = _product(a, b, dt)
    want = np.full(out.shape, np.nan, dt)
    cpu_matmul.outer_block_kernel(False, False, "rows")(
        kview(np.ascontiguousarray(a)), kview(b), kview(want), np.zeros(1, np.int64))
    np.testing.assert_array_equal(kview(out), kview(want))


def test_serial_parallel_and_repeated_runs_give_the_same_bits():
    a, b, _, _ = _operands(3 * MR + 2, KC + 9, 5 * NR + 3, ml_dtypes.bfloat16, True, True, 4)
    first, _ = _product(a, b, ml_dtypes.bfloat16)
    for parallel in (False, True, False):
        again, _ = _product(a, b, ml_dtypes.bfloat16, parallel)
        np.testing.assert_array_equal(kview(again), kview(first))


@pytest.mark.parametrize("dt", TYPES)
def test_it_counts_what_is_not_finite_once_rounded(dt):
    """Serial into float32 and into ``dt``; the parallel variant (the count summed over the
    threads' panels, the same ``_put`` for every kind) into bfloat16, the variant the test above
    compiles."""
    a, b, _, _ = _operands(MR + 3, 9, NR + 21, dt, False, False, 5)
    a[0, 0], a[5, 2] = np.inf, np.nan
    big = {np.dtype(np.float16): 300.0}.get(np.dtype(dt), 3e38)     # 9 products of big * big
    a[7, :], b[:, -1] = big, big
    runs = [(out_dt, False) for out_dt in {np.float32, dt}]
    for out_dt, parallel in runs + [(dt, True)] * (dt is ml_dtypes.bfloat16):
        out, count = _product(a, b, out_dt, parallel, counted=True)
        assert count == np.count_nonzero(~np.isfinite(out.astype(np.float32))) > 3, count


def test_subnormal_bfloat16_operands_are_kept():
    """bfloat16 subnormals (below 2^-126) widen exactly and take part in the sums (where
    ``vdpbf16ps`` reads them as zero: ``simd``'s module docstring)."""
    tiny = np.float32(2.0 ** -130)
    a = np.full((MR + 1, 2), tiny).astype(ml_dtypes.bfloat16)
    b = np.array([[1.0] * 20, [2.0 ** 10] * 20], ml_dtypes.bfloat16)
    out, _ = _product(a, b, np.float32)
    np.testing.assert_array_equal(out, np.float32(tiny + tiny * 2 ** 10))
    assert float(out[0, 0]) == 1025 * 2.0 ** -130


def test_empty_products():
    for m, k, n in [(0, 5, 4), (5, 0, 4), (5, 4, 0)]:
        a, b, _, _ = _operands(m, k, n, np.float32, False, False)
        out, count = _product(a, b, np.float32, counted=True)
        np.testing.assert_array_equal(out, np.zeros((m, n), np.float32))
        assert count == 0


def _node(a, b, out_dt, ta, tb):
    m, n = (a.shape[1] if ta else a.shape[0]), (b.shape[0] if tb else b.shape[1])
    return Node(get_op("matmul"), [Value("a", a.shape, a.dtype), Value("b", b.shape, b.dtype)],
                [Value("o", (m, n), out_dt)], {"transpose_a": ta, "transpose_b": tb})


@pytest.mark.parametrize("ta,tb", [(False, True), (True, False)])
def test_the_tuner_candidate_runs_one_packed_step(ta, tb):
    a, b, a64, b64 = _operands(19, 70, 40, ml_dtypes.bfloat16, ta, tb, 6)
    a, b = (a.T if ta else a), (b.T if tb else b)               # as stored
    out = np.full((19, 40), np.nan, ml_dtypes.bfloat16)
    steps = cpu_matmul.packed_steps(_node(a, b, bfloat16, ta, tb), [a, b], [out])
    assert cpu_matmul.CANDIDATES["packed"] is cpu_matmul.packed_steps and len(steps) == 1
    for fn, args in steps:
        fn(*args)
    exact, bound = _bound(a64, b64, ml_dtypes.bfloat16)
    assert np.all(np.abs(out.astype(np.float64) - exact) <= bound)


def test_the_candidate_does_not_take_float64():
    a = np.ones((4, 3))
    assert cpu_matmul.packed_steps(_node(a, a.T.copy(), float32, False, False), [a, a.T.copy()],
                                   [np.empty((4, 4))]) is None
    h = np.ones((4, 4), np.float16)
    takes = cpu_matmul.packed_steps(_node(h, h, float16, False, False), [h, h], [h.copy()])
    assert (takes is not None) == (fp16.PATH == "intrinsic")


def _losses(monkeypatch, how):
    """Six steps of the digits MLP in AMP bfloat16 (SGD with momentum), every product by
    ``MINIFLOW_MATMUL=how``."""
    import miniflow as mf
    from miniflow.experiments.mlp import TrainGraph, mlp
    monkeypatch.setenv("MINIFLOW_MATMUL", how)
    mf.manual_seed(0)
    model = mlp((64, 128, 10))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    graph.config.enable_amp(dtype=mf.bfloat16)
    r = np.random.default_rng(0)
    x, y = r.random((32, 64), dtype=np.float32), r.integers(0, 10, 32)
    return np.array([float(graph(x, y).numpy()) for _ in range(6)])


def test_amp_bfloat16_training_on_it_is_deterministic_and_trains_like_the_rules(monkeypatch):
    packed = _losses(monkeypatch, "packed")
    np.testing.assert_array_equal(_losses(monkeypatch, "packed"), packed)
    rules = _losses(monkeypatch, "numba")
    assert packed[-1] < packed[0]
    np.testing.assert_allclose(packed, rules, rtol=2e-3)
