"""The CPU kernel paths issue 8 added for speed: skinny matmuls and column sums agree with NumPy,
and the serial/parallel choice follows the size (and the BLAS thread count)."""
import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import miniflow as mf
from miniflow.dtype import bfloat16, float16, float32, float64
from miniflow.ir import Node, Value
from miniflow.kernels.cpu import builder_for, matmul as cpu_matmul
from miniflow.kernels.cpu import common as cpu_common, reduce as cpu_reduce
from miniflow.kernels.cpu.common import (PARALLEL_MIN_SIZE, blas_libraries, one_pool,
                                         pinned_threads, use_parallel)
from miniflow.kernels.cpu.simd import HAS_BF16_DOT
from miniflow.ops import get_op



def _run(op, ins, out_specs, attrs=None):
    """``(steps, outputs)`` of ``op``'s CPU builder on ``ins``, after running the steps."""
    node = Node(get_op(op), [Value(f"i{k}", a.shape, a.dtype) for k, a in enumerate(ins)],
                [Value(f"o{k}", s, d) for k, (s, d) in enumerate(out_specs)], dict(attrs or {}))
    outs = [np.full(s, -777.0, d.np) for s, d in out_specs]
    steps = builder_for(node.op)(node, ins, outs)
    for fn, args in steps:
        fn(*args)
    return steps, outs


# ------------------------------------------------------------------------------ matmul paths
@pytest.fixture
def one_thread():
    """Numba and BLAS on one thread for the test (``pinned_threads``), then back.

    The path tests below check which kernels a product takes and what it computes; the thread
    count changes neither (the parallel variants' bits are the serial ones':
    :func:`test_parallel_kernels_compute_the_serial_bits`, whose cases include the register
    tile's). At the machine's threads they compiled every parallel variant they reached, each
    about 3.5x as long as the serial one (an ``outer_block_kernel`` signature 3.4 s against
    1.0 s): 72 s of the compile time of a fresh-clone CI run (Intel Xeon, 2 cores)."""
    with pinned_threads(1):
        yield


def _matmul(a, b, ta=False, tb=False):
    dt = mf.dtype.as_dtype(a.dtype)
    m = a.shape[1] if ta else a.shape[0]
    n = b.shape[0] if tb else b.shape[1]
    steps, (out,) = _run("matmul", [a, b], [((m, n), dt)], {"transpose_a": ta, "transpose_b": tb})
    ref = (a.astype(np.float64).T if ta else a) @ (b.astype(np.float64).T if tb else b)
    return steps, out, ref


def _assert_only_small_operands_widened(steps, made_by, kernel, shape, ta, tb, paired):
    """Before the product's loop only casts of operands of at most ``WIDEN_MAX`` elements or
    used ``WIDEN_REUSE`` times (``a`` [m, k] when ``n`` is that big, ``b`` [k, n] when ``m`` is),
    and transposed copies of the operands stored transposed (a strided ``dy.T`` of ``BIG``
    elements, or read for ``COPY_A_MIN_COLS`` whole tiles' columns of out from ``COPY_MIN_WORK``
    multiply-adds, or for the ``vdot_pairs`` tile (``paired``) from ``PAIRS_COPY_MIN_COLS``
    columns of out; ``W`` of a forward ``dot_block_kernel`` does not take)."""
    m, k, n = shape
    reused = {m * k} if n >= cpu_matmul.WIDEN_REUSE else set()
    reused |= {k * n} if m >= cpu_matmul.WIDEN_REUSE else set()
    first = made_by.index(kernel)
    before = list(zip(steps[:first], made_by[:first]))
    assert set(made_by[:first]) <= {"cast_kernel", "transpose_kernel"}, made_by
    assert all(args[0].size <= cpu_matmul.WIDEN_MAX or args[0].size in reused
               for (fn, args), name in before if name == "cast_kernel"), made_by
    wide = (n >= cpu_matmul.COPY_A_MIN_COLS and n % cpu_matmul.OUTER_MIN_COLS == 0
            and m * k * n >= cpu_matmul.COPY_MIN_WORK)
    stored_transposed = {(k, m)} if ta and (k * m >= cpu_matmul.BIG or (
        n >= cpu_matmul.PAIRS_COPY_MIN_COLS if paired else wide)) else set()
    stored_transposed |= {(n, k)} if tb else set()
    assert all(args[0].shape in stored_transposed
               for (fn, args), name in before if name == "transpose_kernel"), made_by


def _bf16_kernel(kernel, shape, ta, tb):
    """The kernel a bfloat16 matmul takes where the CPU has AVX512-BF16 (``kernel`` elsewhere):
    ``vdot_pairs`` tiles also on a big strided ``dy.T``, and from ``PACK_MIN_ROWS`` rows ``B``
    packed in pairs first (``W`` of ``x @ W.T`` transposed as 32-bit words, a ``B`` stored
    ``[k, n]`` interleaved)."""
    m, k, n = shape
    outer = m >= cpu_matmul.OUTER_MIN_ROWS and n >= cpu_matmul.OUTER_MIN_COLS
    if HAS_BF16_DOT and tb and not ta and k % 32 == 0 and (not outer or (
            cpu_matmul.DOT_PAIRS_K_PER_ROW * m <= k and m <= cpu_matmul.DOT_MAX_ROWS)):
        return "dot_pairs_kernel"       # x @ W.T at a small batch (or a narrow W)
    if not HAS_BF16_DOT or k % 2 or not outer:
        return kernel
    if ta and tb:       # both stored transposed: no vdot_pairs tile, BLAS on widened copies
        return "dot"
    if tb:              # W.T packed from PACK_MIN_ROWS rows (OUTER_MIN_ROWS where k % 32 == 0)
        if m >= (cpu_matmul.OUTER_MIN_ROWS if k % 32 == 0 else cpu_matmul.PACK_MIN_ROWS):
            return "swapped_pairs_kernel" if m == cpu_matmul.SWAP_ROWS else "transpose_kernel"
        return "dot" if kernel == "outer_block_kernel" else kernel
    return "interleave_pairs_kernel" if m >= cpu_matmul.PACK_MIN_ROWS else "outer_block_kernel"


@pytest.mark.parametrize("dt", [float16, bfloat16, float32, float64], ids=lambda d: d.short)
@pytest.mark.parametrize("shape,ta,tb,kernel", [
    ((3, 300, 1000), False, True, "dot_block_kernel"),      # forward at batch 3: x @ W.T
    ((16, 300, 1000), False, True, "dot_block_kernel"),     # ... at batch 16
    ((7, 301, 1001), False, True, "dot_block_kernel"),      # rows and columns past the blocks
    ((3, 1000, 300), False, False, "rows_times_kernel"),    # input gradient at batch 3: dy @ W
    ((16, 1000, 300), False, False, "outer_block_kernel"),  # ... at batch 16
    ((1000, 2, 1100), True, False, "outer_block_kernel"),   # weight gradient: dy.T @ x
    ((1001, 13, 1100), True, False, "outer_block_kernel"),  # ... past the blocks of 4 and 64
    ((64, 1, 128), True, False, "outer_block_kernel"),      # an outer product (batch 1)
    ((1024, 300, 256), True, False, "outer_block_kernel"),  # a big strided dy.T: copied first
    ((1024, 16, 256), True, False, "outer_block_kernel"),   # ... read for 256 columns: copied
    ((1024, 300, 200), True, False, "dot"),          # ... past whole tiles: BLAS packs it
    ((1024, 300, 256), True, True, "outer_block_kernel"),   # both copied
    ((64, 32, 16), False, True, "dot"),              # small: BLAS
    ((8, 32, 128), False, True, "dot"),              # ... few rows
    ((300, 300, 1024), False, True, "outer_block_kernel"),  # too many rows: W.T copied first
    ((19, 64, 128), False, True, "outer_block_kernel"),     # a short k: W.T copied first
    ((300, 300, 1000), False, True, "dot"),          # past whole tiles: BLAS
    ((64, 300, 1000), False, True, "dot_block_kernel"),     # the forward at batch 64
    ((16, 1024, 256), False, True, "dot_block_kernel"),     # bfloat16: vdot_pairs' dot products
    ((7, 96, 10), False, True, "dot_block_kernel"),         # ... past their blocks of four
    ((300, 64, 10), False, True, "dot"),             # bfloat16: a narrow W at any batch
])
def test_matmul_takes_the_fast_path_and_agrees_with_numpy(shape, ta, tb, kernel, dt,
                                                           one_thread):
    m, k, n = shape
    if dt is bfloat16:
        kernel = _bf16_kernel(kernel, shape, ta, tb)
    r = np.random.default_rng(0)
    a = r.uniform(-1, 1, (k, m) if ta else (m, k)).astype(dt.np)
    b = r.uniform(-1, 1, (n, k) if tb else (k, n)).astype(dt.np)
    steps, out, ref = _matmul(a, b, ta, tb)
    made_by = [fn.py_func.__qualname__.split(".")[0] if hasattr(fn, "py_func")
               else fn.__name__.split()[0] for fn, _ in steps]
    if kernel == "outer_block_kernel" and dt is float64:    # float32 vectors: float64 is BLAS's
        kernel = "dot"
    assert kernel in made_by, made_by
    if kernel != "dot":              # the loops read a big half operand as it is: no widened copy
        _assert_only_small_operands_widened(steps, made_by, kernel, shape, ta, tb,
                                            dt is bfloat16 and HAS_BF16_DOT and k % 2 == 0)
    if kernel in ("outer_block_kernel", "interleave_pairs_kernel") or (
            kernel == "transpose_kernel" and dt is bfloat16):
        layout = "rows" if kernel == "outer_block_kernel" else "packed"    # packed: vdpbf16ps
        if layout == "rows" and dt is bfloat16 and k % 2 == 0 and HAS_BF16_DOT:
            layout = "pairs"
        kernels = {cpu_matmul.outer_block_kernel(par, False, layout) for par in (False, True)}
        assert steps[-1][0] in kernels
    if kernel == "swapped_pairs_kernel":
        assert [fn for fn, _ in steps] == [cpu_matmul.swapped_pairs_kernel(False, False)]
    tol = {float16: 2e-2, bfloat16: 2e-2, float32: 1e-4, float64: 1e-12}[dt] * np.sqrt(k)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)


@pytest.mark.skipif(not HAS_BF16_DOT, reason="the CPU has no AVX512-BF16 (vdot_pairs)")
@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("k,n", [(1024, 1024), (300, 1001), (64, 70), (2, 64)])
def test_a_bfloat16_forward_at_the_tile_width_is_computed_transposed_to_the_packed_bits(
        k, n, parallel, counted):
    """``x @ W.T`` in bfloat16 with ``SWAP_ROWS`` rows is computed as ``out.T = W @ x.T``
    (:func:`swapped_pairs_kernel`: ``W`` read where it is stored, only ``x`` packed), with the
    bits of the tile on ``W`` packed in pairs, and the same count of non-finite elements (rows
    of 3e38 overflow; where an overflowing product meets the other sign, the packed tile's
    scalar columns, one rounding per product, and ``vdot_pairs`` may give infinities of other
    signs: only the finite elements are compared there). Serial and parallel (rows of ``W``
    split across the threads, blocks of four, the last part shorter)."""
    from miniflow.dtype import bfloat16 as bf
    m = cpu_matmul.SWAP_ROWS
    r = np.random.default_rng(7)
    x, w = r.uniform(-1, 1, (m, k)), r.uniform(-1, 1, (n, k))
    if counted:
        x[::7] = 3e38
    x, w = x.astype(bf.np).view(np.int16), w.astype(bf.np).view(np.int16)
    want, want_count = np.empty((m, n), np.int16), np.zeros(1, np.int64)
    packed = np.empty((k // 2, n), np.float32)
    cpu_matmul.transpose_kernel(False)(w.view(np.float32), packed)
    cpu_matmul.outer_block_kernel(False, counted, "packed")(x, packed.view(np.int16), want,
                                                            want_count)
    out, count = np.full((m, n), -1, np.int16), np.zeros(1, np.int64)
    words, out_t = np.empty((k // 2, m), np.float32), np.empty((n, m), np.int16)
    cpu_matmul.swapped_pairs_kernel(parallel, counted)(x.view(np.float32), w, out, words, out_t,
                                                       count)
    finite = np.isfinite(want.view(bf.np).astype(np.float32))
    np.testing.assert_array_equal(np.where(finite, out, 0), np.where(finite, want, 0))
    assert np.isfinite(out.view(bf.np).astype(np.float32)).tolist() == finite.tolist()
    assert count[0] == want_count[0] == ((~finite).sum() if counted else 0)
    assert count[0] > 0 or not counted


@pytest.mark.parametrize("dt", [float16, bfloat16, float32], ids=lambda d: d.short)
@pytest.mark.parametrize("shape,copied", [
    ((1024, 16, 256), True),        # the wide MLP's weight gradient at batch 16, 256 columns
    ((256, 16, 128), True),         # 128 columns, 2^19 multiply-adds
    ((1024, 16, 64), False),        # 64 columns: the AVX-512 tile reads dy.T once
    ((10, 64, 128), False),         # below COPY_MIN_WORK: the copy's call costs more
])
def test_a_small_strided_dy_T_read_across_many_columns_is_copied_first(shape, copied, dt,
                                                                        one_thread):
    """``dy.T @ x`` with ``dy`` smaller than ``BIG``: from ``COPY_A_MIN_COLS`` columns of out
    (and ``COPY_MIN_WORK`` multiply-adds) ``dy.T`` is copied contiguous in float32 before the
    register tile (its elements are ``k`` rows of ``dy`` apart, the same L1 set at 1024
    features), else read in place (widened first where it is a half type); the same result."""
    m, k, n = shape
    if dt is bfloat16 and HAS_BF16_DOT:
        pytest.skip("bfloat16 takes the vdot_pairs tile here (its own copy rule)")
    r = np.random.default_rng(3)
    a, b = r.uniform(-1, 1, (k, m)).astype(dt.np), r.uniform(-1, 1, (k, n)).astype(dt.np)
    steps, out, ref = _matmul(a, b, ta=True)
    copies = [args for fn, args in steps[:-1] if fn is cpu_matmul.transpose_kernel(False)]
    assert len(copies) == copied and all(src.shape == (k, m) for src, _ in copies), steps
    assert steps[-1][0] is cpu_matmul.outer_block_kernel(False, False, "rows")
    tol = {float16: 2e-2, bfloat16: 2e-2, float32: 1e-4}[dt] * np.sqrt(k)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("strided", ["transposed", "every other column"])
def test_matmul_refuses_an_out_with_strided_rows_rather_than_writing_it_wrong(strided):
    """Builders get C-contiguous outs (the ``Backend`` contract); one whose rows are strided
    does not reach the register tile, which stores whole rows: BLAS refuses it."""
    r = np.random.default_rng(5)
    a, b = (r.uniform(-1, 1, (64, 64)).astype(np.float32) for _ in range(2))
    out = (np.zeros((64, 64), np.float32).T if strided == "transposed"
           else np.zeros((64, 128), np.float32)[:, ::2])
    node = Node(get_op("matmul"), [Value("a", a.shape, float32), Value("b", b.shape, float32)],
                [Value("o", (64, 64), float32)], {})
    with pytest.raises(ValueError, match="output array is not acceptable"):
        for fn, args in builder_for(node.op)(node, [a, b], [out]):
            fn(*args)


@pytest.mark.parametrize("dt", [float16, bfloat16, float32], ids=lambda d: d.short)
@pytest.mark.parametrize("shape,ta,tb,kernel", [
    ((1001, 13, 1100), True, False, "outer_block_kernel"),  # a weight gradient, past the blocks
    ((16, 300, 200), False, False, "outer_block_kernel"),   # an input gradient
    ((1024, 300, 256), True, False, "outer_block_kernel"),  # a big strided dy.T copied first
    ((1024, 300, 200), True, False, "dot"),          # BLAS (bfloat16: vdot_pairs), then counted
    ((300, 300, 1024), False, True, "outer_block_kernel"),  # a forward, W.T copied first
    ((100, 300, 200), False, True, "dot"),           # a forward (bfloat16: W packed in pairs)
    ((16, 320, 200), False, True, "dot"),            # (bfloat16: vdot_pairs' dot products)
])
def test_counting_matmul_counts_the_non_finite_elements_it_writes(shape, ta, tb, kernel, dt,
                                                                one_thread):
    """``count_not_finite``: ``outs[1]`` is the number of inf/NaN elements of out as rounded to
    out's dtype (float16 overflows from 65520: rows of 300s make products of 90000)."""
    m, k, n = shape
    if dt is bfloat16:
        kernel = _bf16_kernel(kernel, shape, ta, tb)
    r = np.random.default_rng(3)
    a = r.uniform(-1, 1, (k, m) if ta else (m, k))
    b = r.uniform(-1, 1, (k, n))
    rows = (slice(None), slice(0, m, 7)) if ta else (slice(0, m, 7), slice(None))
    a[rows] = 300.0
    b[:, ::5] = 300.0
    a[(2, 3) if ta else (3, 2)], b[4, 9] = np.inf, np.nan
    a, b = a.astype(dt.np), b.astype(dt.np)
    steps, (out, count) = _run("matmul", [a, np.ascontiguousarray(b.T) if tb else b],
                               [((m, n), dt), ((1,), mf.dtype.int64)],
                               {"transpose_a": ta, "transpose_b": tb, "count_not_finite": True})
    made_by = [fn.py_func.__qualname__.split(".")[0] if hasattr(fn, "py_func")
               else fn.__name__.split()[0] for fn, _ in steps]
    assert (made_by[-2] == kernel) if kernel == "dot" else (kernel in made_by), made_by
    if kernel != "dot":
        _assert_only_small_operands_widened(steps, made_by, kernel, shape, ta, tb,
                                            dt is bfloat16 and HAS_BF16_DOT and k % 2 == 0)
    bad = int(np.count_nonzero(~np.isfinite(out.astype(np.float64))))
    assert count[0] == bad and bad >= (m * n // 35 if dt is float16 else m + n - 1), (count, bad)
    ref = (a.astype(np.float64).T if ta else a.astype(np.float64)) @ b.astype(np.float64)
    ok = np.isfinite(ref) & (np.abs(ref) < 6e4)
    tol = {float16: 2e-2, bfloat16: 2e-2, float32: 1e-4}[dt] * np.sqrt(k) * 300 ** 2
    np.testing.assert_allclose(out.astype(np.float64)[ok], ref[ok], rtol=1e-2, atol=tol)


def test_dot_block_reads_a_transposed_weight_in_place():
    a = np.ones((3, 300), np.float32)
    w = np.ones((1000, 300), np.float32)
    fn, args = cpu_matmul._product_step(a, w.T, np.empty((3, 1000), np.float32))
    assert fn is cpu_matmul.dot_block_kernel(use_parallel(w.size))
    assert args[1].flags.c_contiguous and np.shares_memory(args[1], w)
    np.testing.assert_array_equal(args[1], w)


# ------------------------------------------------------------------------------ reductions
@pytest.mark.parametrize("dt", [float16, float32, float64], ids=lambda d: d.short)
@pytest.mark.parametrize("shape,axis", [((300, 700), (0,)), ((3, 50, 9), (1,)), ((2, 300), (1,)),
                                        ((PARALLEL_MIN_SIZE // 64 + 1, 64), (0,))])
def test_sums_add_in_blocks_in_order_then_in_float64(shape, axis, dt):
    """Each sum adds ``SUM_BLOCK`` terms at a time in the order r = 0, 1, ... in the compute
    type, and the block sums in float64, rounded once: the same bits as that NumPy loop, whether
    the columns kernel (inner > 1) or the row kernel runs."""
    x = np.random.default_rng(1).uniform(-2, 2, shape).astype(dt.np)
    out_shape = tuple(s for i, s in enumerate(shape) if i not in axis)
    _, (out,) = _run("reduce_sum", [x], [(out_shape, dt)], {"axis": axis, "keepdims": False})
    ct = np.float64 if dt is float64 else np.float32
    moved = np.moveaxis(x, axis[0], 0).astype(ct)
    total = np.zeros(out_shape, np.float64)
    for r0 in range(0, len(moved), cpu_reduce.SUM_BLOCK):
        acc = np.zeros(out_shape, ct)
        for row in moved[r0:r0 + cpu_reduce.SUM_BLOCK]:
            acc += row
        total += acc
    np.testing.assert_array_equal(out, total.astype(dt.np))


@pytest.mark.parametrize("axis", [(0,), (1,)])
def test_a_long_float32_sum_keeps_float32_precision(axis):
    """A million terms of 0.1: one float32 accumulator drifted to a mean of 0.10099 (2**22 terms:
    0.0960, and 2**24 ones summed to 16777216 for good); in blocks with a float64 total the mean
    is 0.1 to float32's precision, as NumPy's pairwise and PyTorch's cascade sums."""
    shape = (2 ** 20, 2) if axis == (0,) else (2, 2 ** 20)
    x = np.full(shape, 0.1, np.float32)
    out_shape = (2,)
    _, (out,) = _run("reduce_sum", [x], [(out_shape, float32)], {"axis": axis, "keepdims": False})
    np.testing.assert_allclose(out / 2 ** 20, 0.1, rtol=2e-6)


def test_small_products_run_blas_on_one_thread():
    a, b = np.ones((64, 64), np.float32), np.ones((128, 64), np.float32).T     # x @ W.T
    with threadpool_limits(2, user_api="blas"):
        fn, _ = cpu_matmul._product_step(a, b, np.empty((64, 128), np.float32))
        libs = blas_libraries()
        if not any(lib.num_threads > 1 for lib in libs):
            pytest.skip("BLAS runs one thread here")
        assert isinstance(fn, cpu_matmul.OneThreadBlas)
        before = [lib.num_threads for lib in libs]
        out = np.empty((64, 128), np.float32)
        fn(a, b, out)
        assert [lib.num_threads for lib in libs] == before
    np.testing.assert_array_equal(out, a @ b)
    with threadpool_limits(1, user_api="blas"):      # the one pool wraps it still (a later run
        fn = cpu_matmul._product_step(a, b, out)[0]     # may find BLAS on more threads)
        assert isinstance(fn, cpu_matmul.OneThreadBlas) if one_pool() else fn is np.dot


def _parallel(steps) -> bool:
    return any(getattr(fn, "targetoptions", {}).get("parallel", False) for fn, _ in steps)


def test_parallel_kernels_from_the_threshold_with_one_pool_or_one_blas_thread(monkeypatch):
    small = np.ones((8, 16), np.float32)
    big = np.ones((PARALLEL_MIN_SIZE // 16, 16), np.float32)
    more = numba.get_num_threads() > 1
    pooled = one_pool()     # the products split across Numba's threads
    with threadpool_limits(1, user_api="blas"):
        assert not _parallel(_run("relu", [small], [(small.shape, float32)])[0])
        assert _parallel(_run("relu", [big], [(big.shape, float32)])[0]) is more
    with threadpool_limits(2, user_api="blas"):
        if any(lib.num_threads > 1 for lib in blas_libraries()):
            assert _parallel(_run("relu", [big], [(big.shape, float32)])[0]) is pooled
            monkeypatch.setattr(cpu_common, "cblas_gemm", lambda: None)    # a BLAS without CBLAS
            assert not one_pool()
            assert not _parallel(_run("relu", [big], [(big.shape, float32)])[0])


_PARALLEL_CASES = [
    ("broadcast_mul", [(300, 301), (301,)], {}),
    ("bias_add", [(300, 301), (301,)], {"axis": 1}),
    ("fused_elementwise", [(300, 301), (300, 1)], {"expr": "y0 = relu(sub(x0, x1)); y1 = exp(y0)"}),
    ("reduce_sum", [(300, 301)], {"axis": (0,), "keepdims": False}),
    ("reduce_sum", [(300, 301)], {"axis": (1,), "keepdims": False}),
    ("softmax", [(300, 301)], {}),
    ("softmax_grad", [(300, 301), (300, 301)], {}),
    ("layer_norm", [(300, 301), (301,), (301,)], {"begin_norm_axis": 1, "begin_params_axis": 1}),
    ("tril", [(4, 130, 131)], {"diagonal": 1}),
    ("matmul", [(3, 300), (1000, 300)], {"transpose_b": True}),
    ("matmul", [(3, 1000), (1000, 300)], {}),
    ("matmul", [(2, 1000), (2, 300)], {"transpose_a": True}),
    ("matmul", [(300, 300), (1024, 300)], {"transpose_b": True}),     # the tile, a in rows
    ("matmul", [(13, 1001), (13, 1100)], {"transpose_a": True, "count_not_finite": True}),
]


@pytest.fixture
def two_numba_threads():
    """Numba on two threads for the test, whatever this process was left with, then back."""
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    yield
    numba.set_num_threads(before)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                    reason="Numba's pool has one thread (NUMBA_NUM_THREADS): no parallel kernels")
@pytest.mark.parametrize("dt", [float16, float32], ids=lambda d: d.short)
@pytest.mark.parametrize("op,shapes,attrs", _PARALLEL_CASES, ids=lambda c: str(c)[:40])
def test_parallel_kernels_compute_the_serial_bits(op, shapes, attrs, dt, two_numba_threads):
    r = np.random.default_rng(2)
    ins = [r.uniform(-2, 2, s).astype(dt.np) for s in shapes]
    node_ins = [Value(f"i{k}", a.shape, dt) for k, a in enumerate(ins)]
    opdef = mf.ops.get_op(op)
    attrs = opdef.normalize_attrs(node_ins, attrs)
    specs = opdef.infer(node_ins, attrs)
    results = {}
    with threadpool_limits(1, user_api="blas"):
        for threads in (2, 1):      # Numba on two threads: parallel kernels; on one, serial ones
            numba.set_num_threads(threads)
            steps, outs = _run(op, ins, specs, attrs)
            results[_parallel(steps)] = outs
    if len(results) < 2:
        pytest.skip(f"only {'parallel' if True in results else 'serial'} kernels ran here")
    for a, b in zip(results[True], results[False]):
        np.testing.assert_array_equal(a, b)


def _batch_matmul_steps(a, b, out, ta, tb):
    node = Node(get_op("batch_matmul"), [Value("a", a.shape, bfloat16),
                                         Value("b", b.shape, bfloat16)],
                [Value("out", out.shape, bfloat16)], {"transpose_a": ta, "transpose_b": tb})
    return builder_for(node.op)(node, [a, b], [out])


@pytest.mark.skipif(not HAS_BF16_DOT, reason="the target CPU has no AVX512-BF16")
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("shape,ta,tb", [
    ((4, 64, 32, 64), False, True),       # the GPT's attention: scores q @ k^T
    ((4, 64, 64, 32), False, False),      # ... att @ v
    ((4, 64, 64, 32), True, False),       # ... dv = att^T @ dy
    ((3, 37, 18, 50), False, False),      # rows past the blocks of 4, columns past 32
    ((3, 37, 18, 50), True, True),
    ((2, 5, 6, 40), False, True),
])
def test_bfloat16_batch_matmul_takes_the_paired_tile_per_matrix(shape, ta, tb, parallel,
                                                                 monkeypatch):
    """bfloat16 ``batch_matmul`` where the CPU has ``vdot_pairs``, by the rule
    (``MINIFLOW_MATMUL=numba``; the tuner's ``numba`` candidate): one :func:`batch_pairs_kernel`
    over the stack (the GPT's 64 heads of 64 x 64 x 32: 110 us, 372 widened for BLAS), each
    matrix the bits of :func:`outer_block_kernel` on it alone (``"pairs"`` in place, or
    ``"packed"`` after packing ``b``'s stored transpose), at one thread or split over the stack;
    ``MINIFLOW_MATMUL=blas`` widens for BLAS."""
    monkeypatch.setenv("MINIFLOW_MATMUL", "numba")
    z, m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.uniform(-2, 2, (z, k, m) if ta else (z, m, k)).astype(bfloat16.np)
    b = rng.uniform(-2, 2, (z, n, k) if tb else (z, k, n)).astype(bfloat16.np)
    out = np.empty((z, m, n), bfloat16.np)
    steps = _batch_matmul_steps(a, b, out, ta, tb)
    assert [fn.py_func.__qualname__.split(".")[0] for fn, _ in steps] == ["batch_pairs_kernel"]
    (_, args), = steps
    cpu_matmul.batch_pairs_kernel(parallel, tb)(*args)
    count = np.zeros(1, np.int64)
    for i in range(z):
        ai = (a[i].T if ta else a[i]).view(np.int16)
        want = np.empty((m, n), np.int16)
        if tb:
            packed = np.ascontiguousarray(b[i].view(np.int16).view(np.float32).T).view(np.int16)
            cpu_matmul.outer_block_kernel(False, False, "packed")(ai, packed, want, count)
        else:
            cpu_matmul.outer_block_kernel(False, False, "pairs")(ai, b[i].view(np.int16), want,
                                                                  count)
        np.testing.assert_array_equal(out[i].view(np.int16), want)
    exact = np.matmul(np.swapaxes(a, 1, 2) if ta else a,
                      np.swapaxes(b, 1, 2) if tb else b, dtype=np.float64)
    assert np.abs(out.astype(np.float64) - exact).max() <= 2.0 ** -8 * np.abs(exact).max()
    monkeypatch.setenv("MINIFLOW_MATMUL", "blas")
    widened = _batch_matmul_steps(a, b, np.empty_like(out), ta, tb)
    assert not any(fn is cpu_matmul.batch_pairs_kernel(p, tb) for fn, _ in widened
                   for p in (False, True))


@pytest.mark.skipif(not HAS_BF16_DOT, reason="the target CPU has no AVX512-BF16")
@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize("out_dt", [bfloat16, float32], ids=lambda d: d.short)
@pytest.mark.parametrize("m,k,n", [(16, 1024, 64), (7, 96, 10), (1, 32, 3), (3, 64, 9), (4, 32, 4)])
def test_paired_dot_products_sum_their_lanes_in_one_order(m, k, n, out_dt, counted):
    """:func:`dot_pairs_kernel` (bfloat16 ``x @ W.T``, ``k`` a multiple of 32): every element
    the same bits whether it falls in a block of 4 x 4, in the rows past the blocks, or runs
    alone (four by one, one by four: :func:`_dots4`), serial or parallel; within float32
    rounding of the float64 product (exact products, sums over 16 lanes then the fold tree),
    rounded once into out; counted: the elements not finite in out's type."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, (m, k)).astype(bfloat16.np)
    w = rng.uniform(-2, 2, (n, k)).astype(bfloat16.np)
    if m > 1:
        x[0, 0], w[:, 0] = 3e38, 2.0                # bfloat16 overflows in row 0 of out
    bits = lambda a: a.view(np.int16) if a.dtype.itemsize == 2 else a     # noqa: E731
    runs = {}
    for parallel in (False, True):
        out, count = np.full((m, n), -7, out_dt.np), np.zeros(1, np.int64)
        cpu_matmul.dot_pairs_kernel(parallel, counted)(bits(x), bits(w), bits(out), count)
        runs[parallel] = out, count[0]
    np.testing.assert_array_equal(bits(runs[True][0]), bits(runs[False][0]))
    out, count = runs[False]
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    wide = np.empty((m, n), np.float32)             # the float32 sums, rounded once into out
    cpu_matmul.dot_pairs_kernel(False, False)(bits(x), bits(w), wide, np.zeros(1, np.int64))
    finite = np.isfinite(wide)
    bound = (k // 16 + 4) * 2.0 ** -24 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(
        np.float64)).T)                             # two roundings a step, then four folds
    assert (np.abs(wide - exact) <= bound)[finite].all() and finite[1 if m > 1 else 0:].all()
    np.testing.assert_array_equal(bits(out), bits(wide.astype(out_dt.np)))
    single = np.empty((1, 1), np.float32)           # a product alone: the block's bits
    cpu_matmul.dot_pairs_kernel(False, False)(bits(x[-1:]), bits(w[-1:]), single,
                                              np.zeros(1, np.int64))
    assert single[0, 0] == wide[-1, -1]
    assert count == (np.count_nonzero(~np.isfinite(out.astype(np.float64))) if counted else 0)
    assert not counted or m == 1 or count >= n      # row 0 overflows


def test_bfloat16_batch_matmul_without_the_paired_tile_widens_for_blas(monkeypatch):
    monkeypatch.setattr(cpu_matmul, "HAS_BF16_DOT", False)
    a = np.ones((2, 8, 4), bfloat16.np)
    out = np.empty((2, 8, 32), bfloat16.np)
    steps = _batch_matmul_steps(a, np.ones((2, 4, 32), bfloat16.np), out, False, False)
    assert not any(fn is cpu_matmul.batch_pairs_kernel(p, False) for fn, _ in steps
                   for p in (False, True))
    for fn, args in steps:
        fn(*args)
    assert (out.astype(np.float32) == 4).all()
