"""BLAS products split over Numba's pool (``kernels.cpu.split_gemm``, issue 23 item 6): the bits
of NumPy's one-thread ``np.dot`` / ``np.matmul`` for every shape and layout, NumPy's own paths
left to NumPy, the blocks, BLAS's thread count restored, and a training step on two Numba
threads bit for bit the one-thread step."""
from unittest import mock

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import miniflow as mf
from miniflow.kernels.cpu import common as cpu_common, matmul as cpu_matmul, split_gemm
from miniflow.kernels.cpu.common import numpy_blas, use_parallel

pytestmark = pytest.mark.skipif(cpu_common.blas_gemm() is None,
                                reason="NumPy's BLAS is not OpenBLAS: nothing is split")

SHAPES = [(256, 1024, 1024), (1024, 256, 1024), (1024, 256, 64), (64, 576, 3136),
          (2048, 512, 98), (512, 4608, 49), (2, 2048, 1000), (1000, 2, 2048), (300, 700, 500),
          (65, 4000, 130), (130, 3000, 70), (64, 147, 12544)]
"""``(m, k, n)``: the wide MLP's and ResNet-50's products (convolutions as im2col GEMMs, the
classifier at batch 2) and odd sizes whose blocks end inside a register tile."""


def _operands(m, k, n, ta, tb, dtype, rng):
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    return (a.T if ta else a), (b.T if tb else b)


def _one_thread(fn, *args):
    with threadpool_limits(1, user_api="blas"):
        return fn(*args)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("mkn", SHAPES, ids=str)
def test_split_products_are_numpy_s_bits(mkn, ta, tb, dtype):
    a, b = _operands(*mkn, ta, tb, dtype, np.random.default_rng(0))
    out = np.full((mkn[0], mkn[2]), np.nan, dtype)
    step = split_gemm.gemm_step(a, b, out, 2)
    if step is None:                # too small to split: np.dot's own call
        assert np.prod(mkn) < 2 * split_gemm.MIN_BLOCK_WORK
        return
    fn, args = step
    fn(*args)
    ref = _one_thread(np.dot, a, b)
    assert out.tobytes() == ref.tobytes()


@pytest.mark.parametrize("s,m,k,n", [(16, 64, 64, 784), (64, 64, 32, 64), (16, 256, 256, 196)])
@pytest.mark.parametrize("transposed", [False, True])
def test_split_stacks_are_numpy_s_bits(s, m, k, n, transposed):
    """Winograd's 16 products and the GPT's attention products (``np.matmul`` over stacks), a
    transposed ``b`` read in place."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((s, m, k)).astype(np.float32)
    b = (rng.standard_normal((s, n, k)).astype(np.float32).transpose(0, 2, 1) if transposed
         else rng.standard_normal((s, k, n)).astype(np.float32))
    out = np.empty((s, m, n), np.float32)
    fn, args = split_gemm.gemm_step(a, b, out, 2)
    fn(*args)
    assert out.tobytes() == _one_thread(np.matmul, a, b).tobytes()


def test_split_four_dimensional_stacks_and_broadcasting():
    """``[batch, heads, T, T] @ [batch, heads, T, D]`` (a GPT's attention) split by member; a
    broadcast stack is left to ``np.matmul``."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((16, 4, 64, 64)).astype(np.float32)
    b = rng.standard_normal((16, 4, 64, 32)).astype(np.float32)
    out = np.empty((16, 4, 64, 32), np.float32)
    fn, args = split_gemm.gemm_step(a, b, out, 2)
    fn(*args)
    assert out.tobytes() == _one_thread(np.matmul, a, b).tobytes()
    assert split_gemm.gemm_step(a, b[:1], out, 2) is None


def test_numpy_s_other_paths_are_left_to_numpy():
    """None where NumPy calls something else than one ``gemm`` (``gemv``, ``syrk``, a copy of
    an operand BLAS cannot read), for mixed or other dtypes and products too small to split."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2048, 2048)).astype(np.float32)
    out = np.empty((2048, 2048), np.float32)
    assert split_gemm.gemm_step(x[:, :1].T, x[:1], out[:1, :1][:0], 2) is None   # empty
    assert split_gemm.gemm_step(x[:1], x, out[:1], 2) is None                      # gemv
    assert split_gemm.gemm_step(x, x[:, :1], out[:, :1], 2) is None                 # gemv
    assert split_gemm.gemm_step(x, x.T, out, 2) is None                             # syrk
    assert split_gemm.gemm_step(x[::2, ::2], x[:1024, :1024], out[:1024, :1024], 2) is None
    assert split_gemm.gemm_step(x, x.astype(np.float64), out, 2) is None
    assert split_gemm.gemm_step(x.astype(np.float16), x.astype(np.float16),
                                out.astype(np.float16), 2) is None
    small = x[:64, :64]
    assert split_gemm.gemm_step(small, small.copy(), out[:64, :64], 2) is None
    assert split_gemm.gemm_step(x, x.copy(), out.T, 2) is None      # out's rows not unit stride
    with mock.patch.object(split_gemm, "blas_gemm", lambda: None):
        assert split_gemm.gemm_step(x, x.copy(), out, 2) is None


@pytest.mark.parametrize("m,n,k,parts", [(256, 1024, 1024, 2), (100, 3000, 700, 3),
                                         (2, 1000, 2048, 2), (4096, 64, 64, 8), (70, 70, 70, 2),
                                         (1000, 1000, 1000, 16)])
def test_blocks_cover_out_in_aligned_blocks_of_enough_work(m, n, k, parts):
    axis, cuts = split_gemm.blocks(m, n, k, parts)
    length, per = (m, n)[axis], k * (n, m)[axis]
    assert (m >= n) == (axis == 0)
    assert cuts[0] == 0 and cuts[-1] == length and len(cuts) - 1 <= parts
    assert all(c % split_gemm.ALIGN == 0 for c in cuts[1:-1])
    assert all(hi > lo for lo, hi in zip(cuts, cuts[1:]))
    if len(cuts) > 2:
        assert min(hi - lo for lo, hi in zip(cuts, cuts[1:])) * per >= split_gemm.MIN_BLOCK_WORK


def test_blas_threads_are_held_at_one_and_restored():
    a, b = _operands(512, 512, 512, False, False, np.float32, np.random.default_rng(3))
    out = np.empty((512, 512), np.float32)
    with threadpool_limits(2, user_api="blas"):
        libs = numpy_blas()
        if max(lib.num_threads for lib in libs) < 2:
            pytest.skip("NumPy's BLAS has one thread here")
        fn, args = split_gemm.gemm_step(a, b, out, 2)
        seen = []
        kernel = fn.kernel
        fn.kernel = lambda *xs: (seen.append([lib.num_threads for lib in libs]), kernel(*xs))
        fn(*args)
        assert seen == [[1] * len(libs)]
        assert max(lib.num_threads for lib in libs) == 2
    assert out.tobytes() == _one_thread(np.dot, a, b).tobytes()


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="Numba has one thread")
def test_two_thread_training_steps_are_the_one_thread_steps(monkeypatch):
    """An MLP whose products are split and whose elementwise kernels and update run parallel
    on two Numba threads (BLAS held at one) trains bit for bit as on one thread."""
    from miniflow.experiments.mlp import TrainGraph, mlp
    monkeypatch.setenv("MINIFLOW_MATMUL", "blas")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((256, 64)).astype(np.float32)
    y = rng.integers(0, 10, 256).astype(np.int64)
    before = numba.get_num_threads()
    losses, kinds = {}, {}
    for threads in (1, 2):
        numba.set_num_threads(threads)
        try:
            mf.manual_seed(0)
            model = mlp((64, 512, 512, 10))
            graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
            losses[threads] = [float(graph(x, y)) for _ in range(3)]
            plan = next(reversed(graph.plans.values()))
            kinds[threads] = {type(fn).__name__ for fn, _ in plan.steps}
            assert use_parallel(1 << 20) is (threads > 1)
        finally:
            numba.set_num_threads(before)
    assert "SplitGemm" in kinds[2] and "SplitGemm" not in kinds[1]
    assert losses[1] == losses[2]


def test_pool_step_keeps_blas_off_its_threads_where_nothing_splits():
    """Where the plan runs on Numba's pool, a product that is not split runs on one BLAS
    thread (BLAS's spinning threads would take the cores of Numba's), never threaded."""
    a = np.ones((64, 64), np.float32)
    out = np.empty((64, 64), np.float32)
    with threadpool_limits(2, user_api="blas"), \
            mock.patch.object(cpu_matmul, "one_pool", lambda: True):
        fn, args = cpu_matmul._pool_step(np.dot, a, a.copy(), out)
        if max(lib.num_threads for lib in numpy_blas()) > 1:
            assert isinstance(fn, cpu_matmul.OneThreadBlas)
    with mock.patch.object(cpu_matmul, "one_pool", lambda: False):
        assert cpu_matmul._pool_step(np.dot, a, a, out) is None
