"""One GEMM split across Numba's threads, each part one call of NumPy's BLAS on one thread
(``kernels.cpu.blas_split``): every layout and both splits give the bits of one ``np.dot`` on
one BLAS thread (the oracle: the same BLAS, unsplit) where the BLAS keeps them
(``blas_split.keeps_bits``: OpenBLAS's SkylakeX kernels; its Haswell kernels sum some elements
of a block in another order), else that product to float32 / float64 rounding, the same bits
from call to call; the matmul builder takes it for big products at more than one Numba thread,
and it refuses what it cannot compute."""
import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from miniflow.dtype import float16, float32
from miniflow.ir import Node, Value
from miniflow.kernels.cpu import blas_split, builder_for, matmul, tune
from miniflow.kernels.cpu.common import cblas_gemm, numpy_blas, one_pool
from miniflow.ops import get_op

pytestmark = pytest.mark.skipif(cblas_gemm() is None,
                                reason="NumPy's BLAS exports no CBLAS GEMM")


@pytest.fixture
def two_threads():
    """Numba on two threads, BLAS on one, both set back after (skips with one Numba thread)."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread (NUMBA_NUM_THREADS)")
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    with threadpool_limits(1, user_api="blas"):
        yield
    numba.set_num_threads(before)


def assert_one_calls_result(out, a, b, matmul=np.dot):
    """``out`` is ``matmul(a, b)`` bit for bit where the BLAS keeps one call's bits in a split
    (``blas_split.keeps_bits``), else to the rounding of a sum of ``k`` products (4 eps sqrt(k)
    of the largest magnitude, as the ISA lane's loose comparison)."""
    want = matmul(a, b)
    if blas_split.keeps_bits():
        np.testing.assert_array_equal(out, want)
        return
    eps = float(np.finfo(want.dtype).eps)
    scale = float(np.max(np.abs(want), initial=1.0))
    np.testing.assert_allclose(out, want, rtol=0, atol=4 * eps * np.sqrt(a.shape[-1]) * scale)


def test_keeps_bits_tells_whether_a_split_gives_one_calls_bits():
    """The probe's answer against a split computed here (columns, past whole blocks): True
    only if that split gives one call's bits, and with OpenBLAS's SkylakeX kernels it does."""
    a, b = _operands(129, 130, 131, False, False, np.float32, seed=9)
    out = np.empty((1, 129, 131), np.float32)
    with threadpool_limits(1, user_api="blas"):
        blas_split.split_gemm_kernel("s")(a[None], b[None], out, 111, 130, 111, 131, 131, 2,
                                          129, 130, 131)
        same = np.array_equal(out[0].view(np.uint8), np.dot(a, b).view(np.uint8))
    assert blas_split.keeps_bits() <= same
    cores = {getattr(lib, "architecture", None) for lib in numpy_blas()}
    if cores == {"SkylakeX"}:
        assert blas_split.keeps_bits()


def _operands(m, k, n, ta, tb, dtype, seed=0):
    r = np.random.default_rng(seed)
    a = r.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = r.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    return (a.T if ta else a), (b.T if tb else b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("shape", [(256, 300, 1000),   # columns: 500 per part
                                   (300, 33, 100),     # rows: too few columns to split
                                   (7, 5, 3), (1, 1, 1), (129, 130, 131)])
def test_the_split_gives_one_calls_bits(two_threads, shape, ta, tb, dtype):
    a, b = _operands(*shape, ta, tb, dtype)
    out = np.full((shape[0], shape[2]), np.nan, dtype)
    fn, args = blas_split.split_step(a, b, out)
    assert fn.__name__ == "dot split 2 ways"
    fn(*args)
    assert_one_calls_result(out, a, b)
    again = np.full_like(args[2], np.nan)             # out as the step holds it (a stack)
    fn(*args[:2], again, *args[3:])
    np.testing.assert_array_equal(again, args[2])     # the same bits from call to call


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("count", [1, 2, 3, 16])       # fewer matrices than threads: each split
def test_a_stack_gives_matmuls_bits(two_threads, count, ta, tb):
    r = np.random.default_rng(count)
    m, k, n = 64, 48, 200
    a = r.standard_normal((count, k, m) if ta else (count, m, k)).astype(np.float32)
    b = r.standard_normal((count, n, k) if tb else (count, k, n)).astype(np.float32)
    a, b = (a.swapaxes(1, 2) if ta else a), (b.swapaxes(1, 2) if tb else b)
    out = np.full((count, m, n), np.nan, np.float32)
    fn, args = blas_split.split_step(a, b, out)
    assert fn.__name__ == "matmul split 2 ways"
    fn(*args)
    if count >= 2:                  # runs of whole matrices: each one call
        np.testing.assert_array_equal(out, np.matmul(a, b))
    else:
        assert_one_calls_result(out, a, b, np.matmul)
    assert count == 1 or blas_split.split_step(a[:1], b, out) is None    # broadcasting


@pytest.mark.parametrize("tb", [False, True])
def test_a_4d_stack_of_attention_heads_gives_matmuls_bits(two_threads, tb):
    """``[B, H, T, D] @ [B, H, D, T]`` (the GPT's scores; ``k`` stored ``[B, H, T, D]`` when
    ``tb``): the leading dimensions merge into one stack of ``B * H`` matrices, split in runs of
    whole matrices, each one call as ``np.matmul`` makes."""
    r = np.random.default_rng(4)
    q = r.standard_normal((16, 4, 64, 32)).astype(np.float32)
    k = r.standard_normal((16, 4, 64, 32) if tb else (16, 4, 32, 64)).astype(np.float32)
    k = k.swapaxes(-1, -2) if tb else k
    out = np.full((16, 4, 64, 64), np.nan, np.float32)
    fn, args = blas_split.split_step(q, k, out)
    assert fn.__name__ == "matmul split 2 ways" and args[0].shape == (64, 64, 32)
    fn(*args)
    np.testing.assert_array_equal(out, np.matmul(q, k))
    assert np.shares_memory(args[2], out)


def test_stacked_merges_leading_dimensions_as_a_view_or_refuses():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    for v in (x, x.swapaxes(-1, -2), x[:, 1:2], x[None], x[:, :, :2], x[0]):
        s = blas_split.stacked(v)
        assert s.shape == (int(np.prod(v.shape[:-2])), *v.shape[-2:]) and np.shares_memory(s, x)
        np.testing.assert_array_equal(s, v.reshape(s.shape))
    assert blas_split.stacked(x.transpose(1, 0, 2, 3)) is None
    assert blas_split.stacked(x[:, ::2]) is None                 # H's stride 2 matrices
    assert blas_split.stacked(x[:1, ::2]).shape == (2, 4, 5)     # B of one: any H stride


def test_a_strided_out_is_written_in_place_and_nothing_beside_it(two_threads):
    a, b = _operands(10, 8, 200, False, False, np.float32)
    big = np.zeros((10, 240), np.float32)
    fn, args = blas_split.split_step(a, b, big[:, 5:205])
    fn(*args)
    assert_one_calls_result(big[:, 5:205], a, b)
    assert not big[:, :5].any() and not big[:, 205:].any()


def test_what_it_cannot_compute_is_refused(two_threads):
    a, b = _operands(8, 8, 8, False, False, np.float32)
    out = np.zeros((8, 8), np.float32)
    assert blas_split.split_step(a.astype(np.float16), b.astype(np.float16),
                                 out.astype(np.float16)) is None            # not float32 / 64
    assert blas_split.split_step(a, b.astype(np.float64), out) is None      # mixed dtypes
    heads = np.zeros((2, 8, 3, 8), np.float32).transpose(0, 2, 1, 3)      # [B, H, T, D] of [B, T, H, D]
    assert blas_split.split_step(heads, np.zeros((2, 3, 8, 8), np.float32),
                                 np.zeros((2, 3, 8, 8), np.float32)) is None  # B and H do not merge
    assert blas_split.split_step(a[:, ::2], b[::2], out) is None            # no unit stride
    assert blas_split.split_step(a, b, out.T) is None                       # out's columns
    assert blas_split.split_step(a[:, :0], b[:0], out) is None              # empty
    numba.set_num_threads(1)
    assert not one_pool() and blas_split.split_step(a, b, out) is None


@pytest.mark.parametrize("dt", [float32, float16])
def test_the_builder_splits_a_big_product_at_two_threads(two_threads, monkeypatch, dt):
    monkeypatch.setenv(tune.ENV, "blas")    # the library call, no measuring
    m, k, n = 64, 512, 1024                 # 2^25 multiply-adds: past ONE_THREAD_BELOW
    a, wt = _operands(m, k, n, False, True, dt.np)       # wt: W.T, a view of W [n, k]
    node = Node(get_op("matmul"), [Value("a", (m, k), dt), Value("w", (n, k), dt)],
                [Value("o", (m, n), dt)], {"transpose_a": False, "transpose_b": True})
    out = np.empty((m, n), dt.np)
    steps = builder_for(node.op)(node, [a, wt.T], [out])
    assert "dot split 2 ways" in tune._kernels(steps)
    for fn, args in steps:
        fn(*args)
    if dt is float32:
        assert_one_calls_result(out, a, wt)
    elif blas_split.keeps_bits():
        np.testing.assert_array_equal(out, np.dot(a.astype(np.float32),
                                                  wt.astype(np.float32)).astype(dt.np))
    else:                           # float16 out: one rounding of the float32 product
        np.testing.assert_allclose(out.astype(np.float64), a.astype(np.float64) @ wt.astype(
            np.float64), rtol=2e-3, atol=2e-3 * np.sqrt(k))


def _blas_threads() -> list:
    return [lib.num_threads for lib in numpy_blas()]


@pytest.mark.parametrize("built, run", [(1, 2), (2, 1)])
def test_a_step_keeps_the_callers_blas_threads_and_runs_blas_on_one(monkeypatch, built, run):
    """A plan built at one BLAS thread count and run at another (a ``threadpool_limits`` block
    around either): the split step still calls BLAS on one thread (wrapped whatever the count
    was when built), and gives back the count in force at the call, not the one at the build."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread (NUMBA_NUM_THREADS)")
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        monkeypatch.setenv(tune.ENV, "blas")
        a, b = _operands(64, 512, 1024, False, False, np.float32)
        out = np.empty((64, 1024), np.float32)
        with threadpool_limits(built, user_api="blas"):
            fn, args = matmul._blas_step(a, b, out)
        assert isinstance(fn, matmul.OneThreadBlas) and fn.fn.__name__ == "dot split 2 ways"
        seen = []
        inner = fn.fn
        monkeypatch.setattr(fn, "fn", lambda *x: (seen.append(_blas_threads()), inner(*x)))
        with threadpool_limits(run, user_api="blas"):
            in_force = _blas_threads()
            fn(*args)
            assert _blas_threads() == in_force
        assert seen == [[1] * len(in_force)]
        assert_one_calls_result(out, a, b)
    finally:
        numba.set_num_threads(before)
