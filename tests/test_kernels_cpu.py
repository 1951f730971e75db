"""CPU kernels against NumPy float64: one table row per (op, case), run for f16, f32 and f64.

Each case builds a bare ``Node`` of the op's definition (no inference: the output specs are given),
allocates outputs filled with a sentinel, runs the builder's steps and compares with a float64 NumPy
reference computed from the same (rounded) inputs.
"""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import miniflow as mf

from miniflow.dtype import bfloat16, float16, float32, float64, int64
from miniflow.ir import Node, Value
from miniflow.kernels.cpu import builder_for
from miniflow.kernels.cpu.common import PARALLEL_MIN_SIZE
from miniflow.ops import get_op
from miniflow.ir import Graph as IRGraph
from miniflow.ops import emitter
from miniflow.runtime.backend import get_backend
from miniflow.runtime.plan import Plan
from miniflow.testing import check_grad

from op_cases import Case, assert_bit_exact, run_cpu, run_cpu_placed

FLOATS = [float16, float32, float64]
TOL = {float16: 2e-3, float32: 2e-5, float64: 1e-12}
SENTINEL = -777.0


def run(op, ins, out_specs, attrs=None):
    """Build ``op``'s steps for ``ins`` -> outputs of ``out_specs`` [(shape, DType)], run them."""
    ins = [np.ascontiguousarray(a) for a in ins]
    node = Node(get_op(op), [Value(f"i{k}", a.shape, a.dtype) for k, a in enumerate(ins)],
                [Value(f"o{k}", s, d) for k, (s, d) in enumerate(out_specs)], dict(attrs or {}))
    outs = [np.full(s, SENTINEL, d.np) for s, d in out_specs]
    for fn, args in builder_for(node.op)(node, ins, outs):
        fn(*args)
    return outs


def rand(rng, shape, dt, lo=-2.0, hi=2.0):
    """Uniform values rounded to ``dt``."""
    return rng.uniform(lo, hi, shape).astype(dt.np)


def check(out, ref, dt):
    """``out`` (dtype dt) close to the float64 ``ref`` at dt's tolerance; nan where ref is nan."""
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape and out.dtype == dt.np
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=TOL[dt], atol=TOL[dt])


def f64(*arrays):
    return [np.asarray(a, np.float64) for a in arrays]


# ----------------------------------------------------------------------------- elementwise table
def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


UNARY = {
    "negative": (np.negative, (-2, 2)),
    "exp": (np.exp, (-3, 3)),
    "log": (np.log, (0.1, 4)),
    "relu": (lambda x: np.maximum(x, 0.0), (-2, 2)),
    "tanh": (np.tanh, (-3, 3)),
    "sigmoid": (_sigmoid, (-8, 8)),
    "identity": (lambda x: x, (-2, 2)),
}
SHAPES = [(3, 4), (2, 1, 5), (0, 3), (), (1,)]


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, dt):
    rng = np.random.default_rng(0)
    ref_fn, (lo, hi) = UNARY[op]
    for shape in SHAPES:
        x = rand(rng, shape, dt, lo, hi)
        (out,) = run(op, [x], [(shape, dt)])
        check(out, ref_fn(*f64(x)), dt)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("op,ref_fn", [("scalar_add", np.add), ("scalar_mul", np.multiply)])
def test_scalar_ops(op, ref_fn, dt):
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        x = rand(rng, shape, dt)
        (out,) = run(op, [x], [(shape, dt)], {"scalar": 2.5})
        check(out, ref_fn(*f64(x), 2.5), dt)


BROADCAST_SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (5,)),
                    ((2, 3, 4), ()), ((0, 3), (3,)), ((4, 1), (1, 5)), ((2, 3, 4), (2, 1, 4)),
                    ((1, 1), (1, 1))]
BINARY = {"broadcast_add": np.add, "broadcast_sub": np.subtract, "broadcast_mul": np.multiply,
          "broadcast_div": np.divide}


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_broadcast_binary(op, dt):
    rng = np.random.default_rng(2)
    for xs, ys in BROADCAST_SHAPES:
        x, y = rand(rng, xs, dt), rand(rng, ys, dt, 0.5, 2.0)
        shape = np.broadcast_shapes(xs, ys)
        (out,) = run(op, [x, y], [(shape, dt)])
        check(out, BINARY[op](*f64(x, y)), dt)
        (out,) = run(op, [y, x], [(shape, dt)])       # broadcast operand first
        check(out, BINARY[op](*f64(y, x)), dt)


GRADS = {
    "relu_grad": (lambda y, dy: np.where(y > 0, dy, 0.0), (0.0, 2.0)),
    "tanh_grad": (lambda y, dy: dy * (1 - y * y), (-1.0, 1.0)),
    "sigmoid_grad": (lambda y, dy: dy * y * (1 - y), (0.0, 1.0)),
}


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("op", sorted(GRADS))
def test_activation_grads(op, dt):
    rng = np.random.default_rng(3)
    ref_fn, (lo, hi) = GRADS[op]
    y, dy = rand(rng, (4, 6), dt, lo, hi), rand(rng, (4, 6), dt)
    if op == "relu_grad":
        y[0, :3] = 0.0
    (out,) = run(op, [y, dy], [((4, 6), dt)])
    check(out, ref_fn(*f64(y, dy)), dt)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("shape,axis", [((2, 3, 4), 1), ((2, 3, 4), 2), ((5, 3), 0), ((3,), 0)])
def test_bias_add(shape, axis, dt):
    rng = np.random.default_rng(4)
    a, b = rand(rng, shape, dt), rand(rng, (shape[axis],), dt)
    bshape = [1] * len(shape)
    bshape[axis] = shape[axis]
    (out,) = run("bias_add", [a, b], [(shape, dt)], {"axis": axis})
    check(out, f64(a)[0] + f64(b)[0].reshape(bshape), dt)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_add_n(n, dt):
    rng = np.random.default_rng(5)
    xs = [rand(rng, (3, 5), dt) for _ in range(n)]
    (out,) = run("add_n", xs, [((3, 5), dt)])
    check(out, np.sum(f64(*xs), axis=0), dt)


CAST_DTYPES = [float16, float32, float64, int64]


@pytest.mark.parametrize("src", CAST_DTYPES, ids=lambda d: d.short)
@pytest.mark.parametrize("dst", FLOATS, ids=lambda d: d.short)
def test_cast_bit_exact(src, dst):
    rng = np.random.default_rng(6)
    x = rng.standard_normal(2000) * np.exp2(rng.uniform(-30, 20, 2000))
    x = np.concatenate([x, [65504, 65519.99, 65520, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 1e6,
                            np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0]])
    if src is int64:
        x = np.concatenate([np.arange(-3000, 3000), [2**24 + 1, 65519, 65520, -(2**40)]])
    with np.errstate(over="ignore", invalid="ignore"):
        x = x.astype(src.np)
        expect = x.astype(dst.np)
    (out,) = run("cast", [x], [(x.shape, dst)], {"dtype": dst})
    nan = np.isnan(expect)
    assert np.isnan(out[nan]).all() and np.array_equal(np.signbit(out[nan]), np.signbit(expect[nan]))
    assert np.array_equal(out[~nan].view(f"u{dst.itemsize}"), expect[~nan].view(f"u{dst.itemsize}"))


# ----------------------------------------------------------------------------- reductions, rows
REDUCE_CASES = [((2, 3, 4), (0, 2)), ((2, 3, 4), (1,)), ((2, 3, 4), (0, 1, 2)), ((2, 3, 4), ()),
                ((4, 1, 5, 6), (1, 2)), ((3, 0, 2), (1,)), ((3, 0, 2), (0,)), ((1,), (0,)),
                ((), ()), ((2, 3, 4, 5), (0, 2)), ((2, 3, 4, 5), (1, 3)), ((5, 7), (0,))]


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_sum(keepdims, dt):
    rng = np.random.default_rng(7)
    for shape, axis in REDUCE_CASES:
        x = rand(rng, shape, dt)
        ref = np.sum(f64(x)[0], axis=axis, keepdims=keepdims)
        (out,) = run("reduce_sum", [x], [(ref.shape, dt)], {"axis": axis, "keepdims": keepdims})
        check(out, ref, dt)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("op,ref_fn", [("softmax", _softmax), ("log_softmax", _log_softmax)])
def test_softmax(op, ref_fn, dt):
    rng = np.random.default_rng(8)
    for shape, scale in [((4, 7), 1.0), ((2, 3, 5), 30.0), ((1, 1), 1.0), ((0, 4), 1.0)]:
        x = rand(rng, shape, dt, -scale, scale)
        (out,) = run(op, [x], [(shape, dt)])
        check(out, ref_fn(f64(x)[0]), dt)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
def test_softmax_grads(dt):
    rng = np.random.default_rng(9)
    x = rng.uniform(-2, 2, (4, 6))
    y, ly, dy = _softmax(x).astype(dt.np), _log_softmax(x).astype(dt.np), rand(rng, (4, 6), dt)
    (out,) = run("softmax_grad", [y, dy], [((4, 6), dt)])
    yy, dd = f64(y, dy)
    check(out, yy * (dd - (dd * yy).sum(-1, keepdims=True)), dt)
    (out,) = run("log_softmax_grad", [ly, dy], [((4, 6), dt)])
    ll = f64(ly)[0]
    check(out, dd - np.exp(ll) * dd.sum(-1, keepdims=True), dt)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
def test_sparse_softmax_cross_entropy(dt):
    rng = np.random.default_rng(10)
    pred, label = rand(rng, (5, 7), dt, -4, 4), rng.integers(0, 7, 5)
    prob, loss = run("sparse_softmax_cross_entropy", [pred, label], [((5, 7), dt), ((5,), dt)])
    p = f64(pred)[0]
    check(prob, _softmax(p), dt)
    check(loss, -_log_softmax(p)[np.arange(5), label], dt)
    dy = rand(rng, (5,), dt)
    (dx,) = run("sparse_softmax_cross_entropy_grad", [dy, label, prob], [((5, 7), dt)])
    ref = f64(prob)[0] - np.eye(7)[label]
    check(dx, f64(dy)[0][:, None] * ref, dt)


@pytest.mark.parametrize("dt", FLOATS + [bfloat16], ids=lambda d: d.short)
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "sparse_softmax_cross_entropy"])
def test_softmax_bits_do_not_depend_on_where_the_scratch_lies(op, dt):
    """The row ops' exponentials go through a scratch row; with it at every 16-byte step from
    just past the logits to 512 bytes beyond their end, the bits are those of buffers allocated
    apart. Before the scratch's guard (``reduce._rows_scratch``) the last rows took LLVM's
    scalar loop whenever the scratch lay within a vector step of them, and their sums differed
    in the last bit."""
    rng = np.random.default_rng(12)
    for rows, cols in [(29, 10), (7, 64), (3, 33)]:
        x = rand(rng, (rows, cols), dt, -4, 4)
        ins = [x] if op != "sparse_softmax_cross_entropy" else [x, rng.integers(0, cols, rows)]
        case = Case(op, ins)
        want = run_cpu(case)
        count = len(ins) + len(want)
        order = list(range(1, count)) + [0]                  # the logits last, then the scratch
        for gap in range(0, x.nbytes + 512, 16):
            got = run_cpu_placed(case, order, [0] * count + [gap])
            for k, (g, w) in enumerate(zip(got, want)):
                assert_bit_exact(g, w, f"{op} {dt.short} {rows}x{cols}, result {k}, gap {gap}")


@pytest.mark.parametrize("bad", [-1, 7])
def test_sparse_softmax_cross_entropy_label_out_of_range(bad):
    pred, label = np.zeros((3, 7), np.float32), np.array([0, bad, 2])
    with pytest.raises(ValueError, match=r"label out of range \[0, num_classes\)"):
        run("sparse_softmax_cross_entropy", [pred, label], [((3, 7), float32), ((3,), float32)])


def _top_k_rows(rng, rows, n, dt):
    """Rows of small integers (many ties) with NaN, inf, -inf and -0.0 sprinkled in."""
    x = rng.integers(-3, 4, (rows, n)).astype(np.float64)
    u = rng.random(x.shape)
    for k, v in enumerate([np.nan, np.inf, -np.inf, -0.0]):
        x[(u >= 0.05 * k) & (u < 0.05 * (k + 1))] = v
    return x.astype(dt.np)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("n", [5, 16, 17, 33, 100, 4100])
def test_top_k_inserts_or_merge_sorts_in_the_references_order(n, dt):
    """``top_k`` inserts for ``k`` up to ``TOP_K_INSERTION_MAX`` and merge-sorts the row above
    it: both give ``top_k_reference``'s indices exactly (NaN first when largest, last when not,
    equal values and the two zeros in index order), for k 1, the threshold, one past it, half
    and all of the row (4100 columns and 17 rows: the parallel loop, given two Numba threads)."""
    from miniflow.kernels.common.indexing import TOP_K_INSERTION_MAX as T
    from miniflow.ops.reduce_max import top_k_reference
    x = _top_k_rows(np.random.default_rng(n), 17 if n > 4096 else 3, n, dt)
    assert (x.size >= PARALLEL_MIN_SIZE) == (n > 4096)
    for k in sorted({1, min(T, n), min(T + 1, n), n // 2 or 1, n}):
        for largest in (True, False):
            attrs = {"k": k, "largest": largest}
            (got,) = run_cpu(Case("top_k", [x], attrs))
            np.testing.assert_array_equal(got, top_k_reference([x], attrs)[0], f"k {k} {attrs}")


@pytest.mark.parametrize("dt", [float32, float64], ids=lambda d: d.short)
def test_top_k_and_its_sort_match_torch(dt):
    """The indices of a stable ``torch.sort`` (descending when largest: NaN first, as PyTorch's
    sort and topk put it) cut to k, and ``torch.topk``'s values, on rows of 4100 with ties."""
    torch = pytest.importorskip("torch")
    x = _top_k_rows(np.random.default_rng(7), 4, 4100, dt)
    for k in (1, 8, 17, 4100):
        for largest in (True, False):
            (got,) = run_cpu(Case("top_k", [x], {"k": k, "largest": largest}))
            t = torch.from_numpy(x)
            want = torch.sort(t, stable=True, dim=-1, descending=largest).indices[:, :k]
            np.testing.assert_array_equal(got, want.numpy(), f"k {k} largest {largest}")
            np.testing.assert_array_equal(np.take_along_axis(x, got, -1),
                                          torch.topk(t, k, largest=largest).values.numpy())


def test_top_k_of_a_whole_row_is_n_log_n():
    """A sort (``Tensor.sort`` inside ``build`` is ``top_k`` of the whole row) compares ``O(n log
    n)`` times, its worst case: the insertion of every element into the sorted row before it
    (the kernel for every k, once) made ``n (n - 1) / 2`` comparisons of a row in ascending
    order, 8.4 million for 4096, where this makes under ``n log2 n`` (the body run as Python,
    its comparison counted), and the CPU builder launches it for every k above
    ``TOP_K_INSERTION_MAX``."""
    from miniflow.kernels.common import indexing
    from miniflow.kernels.cpu.indexing import top_k_sort_kernel
    n, count = 4096, [0]
    before = indexing.top_k_before

    def counted(v, w, largest):
        count[0] += 1
        return before(v, w, largest)

    v, out = np.arange(n, dtype=np.float32), np.empty(n, np.int64)
    a, b = np.empty(n, np.int64), np.empty(n, np.int64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(indexing, "top_k_before", counted)
        indexing.top_k_sort(v, a, b, out, 0, 0, n, n, True)
    np.testing.assert_array_equal(out, np.arange(n)[::-1])
    assert count[0] < n * 12, count[0]
    x = v.reshape(1, n)
    node = Node(get_op("top_k"), [Value("x", x.shape, float32)], [Value("i", (1, 17), int64)],
                {"k": 17, "largest": True})
    (fn, _), = builder_for(node.op)(node, [x], [np.empty((1, 17), np.int64)])
    assert fn is top_k_sort_kernel(False)


# ----------------------------------------------------------------------------- matmul, movement
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul(ta, tb, dt):
    rng = np.random.default_rng(11)
    for m, k, n in [(3, 4, 5), (1, 1, 1), (2, 0, 3), (16, 33, 8)]:
        a = rand(rng, (k, m) if ta else (m, k), dt)
        b = rand(rng, (n, k) if tb else (k, n), dt)
        (out,) = run("matmul", [a, b], [((m, n), dt)], {"transpose_a": ta, "transpose_b": tb})
        aa, bb = f64(a, b)
        ref = (aa.T if ta else aa) @ (bb.T if tb else bb)
        if dt is float16:      # fp32 accumulation, one rounding to fp16
            ref = ((aa.T if ta else aa).astype(np.float32) @ (bb.T if tb else bb).astype(np.float32))
        check(out, ref, dt)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
def test_data_movement(dt):
    rng = np.random.default_rng(12)
    x = rand(rng, (2, 3, 4), dt)
    (out,) = run("reshape", [x], [((6, 4), dt)], {"shape": (6, 4)})
    assert np.array_equal(out, x.reshape(6, 4))
    (out,) = run("transpose", [x], [((4, 2, 3), dt)], {"perm": (2, 0, 1)})
    assert np.array_equal(out, x.transpose(2, 0, 1))
    (out,) = run("ones_like", [x], [(x.shape, dt)])
    assert np.array_equal(out, np.ones_like(x))
    (out,) = run("constant", [], [((2, 3), dt)], {"value": 0.1, "shape": (2, 3), "dtype": dt})
    assert np.array_equal(out, np.full((2, 3), 0.1, dt.np))
    like = np.zeros((2, 3, 4), dt.np)
    for xs, axes in [((3, 4), (0,)), ((2, 1, 4), (1,)), ((2, 3), (2,)), ((), (0, 1, 2))]:
        x = rand(rng, xs, dt)
        (out,) = run("broadcast_like", [x, like], [(like.shape, dt)], {"broadcast_axes": axes})
        expect = x.reshape([1 if d in axes else like.shape[d] for d in range(3)])
        assert np.array_equal(out, np.broadcast_to(expect, like.shape))


# ----------------------------------------------------------------------------- special values
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
def test_nan_propagates(dt):
    x = np.array([[1.0, np.nan, -2.0], [0.5, 1.0, -1.0]], dt.np)
    for op in ["relu", "exp", "tanh", "sigmoid", "negative", "log"]:
        (out,) = run(op, [x], [(x.shape, dt)])
        assert np.isnan(out[0, 1]), op
    for op in ["softmax", "log_softmax"]:
        (out,) = run(op, [x], [(x.shape, dt)])
        assert np.isnan(out[0]).all() and not np.isnan(out[1]).any(), op
    (out,) = run("reduce_sum", [x], [((2,), dt)], {"axis": (1,), "keepdims": False})
    assert np.isnan(out[0]) and not np.isnan(out[1])
    (out,) = run("broadcast_add", [x, np.ones(3, dt.np)], [(x.shape, dt)])
    assert np.isnan(out[0, 1]) and np.isfinite(np.delete(out.ravel(), 1)).all()


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
def test_relu_gives_positive_zero(dt):
    x = np.array([-3.0, -0.0, 0.0, -np.inf, 2.0], dt.np)
    (out,) = run("relu", [x], [(x.shape, dt)])
    assert np.array_equal(out, [0, 0, 0, 0, 2]) and not np.signbit(out[:4]).any()


def test_fp16_overflow_and_exact_scalar():
    x = np.array([60000.0, 30000.0, -60000.0], np.float16)
    (out,) = run("scalar_mul", [x], [(x.shape, float16)], {"scalar": 2.0})
    assert np.array_equal(out, np.array([np.inf, 60000.0, -np.inf], np.float16))
    (out,) = run("constant", [], [((1,), float16)], {"value": 65536.0, "shape": (1,), "dtype": float16})
    assert np.isinf(out[0])


def test_sigmoid_stable_for_large_inputs():
    x = np.array([-1000.0, -100.0, 100.0, 1000.0, -np.inf, np.inf])
    with np.errstate(all="raise"):
        (out,) = run("sigmoid", [x], [(x.shape, float64)])
    np.testing.assert_allclose(out, [0.0, _sigmoid(-100.0), 1.0, 1.0, 0.0, 1.0], rtol=1e-15, atol=0)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.short)
@pytest.mark.parametrize("x_shape,s_shape", [((3, 4), (1,)), ((2, 3), ()), ((4,), (1, 1)),
                                             ((), (1, 1)), ((2, 1, 3), (1, 1, 1))])
def test_scalar_mul_by_tensor_with_any_one_element_scalar(x_shape, s_shape, dt):
    rng = np.random.default_rng(3)
    x, s = rand(rng, x_shape, dt), rand(rng, s_shape, dt, 0.5, 2.0)
    (out,) = run("scalar_mul_by_tensor", [x, s], [(x_shape, dt)])
    check(out, f64(x)[0] * f64(s)[0].reshape(()), dt)


def test_division_by_zero_is_ieee():
    x, y = np.array([1.0, -1.0, 0.0], np.float32), np.zeros(3, np.float32)
    (out,) = run("broadcast_div", [x, y], [((3,), float32)])
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])


@pytest.mark.parametrize("dt", [float16, float32], ids=lambda d: d.short)
def test_parallel_path(dt):
    rng = np.random.default_rng(13)
    n = PARALLEL_MIN_SIZE + 17
    x, y = rand(rng, (n,), dt), rand(rng, (n // 1,), dt)
    (out,) = run("broadcast_mul", [x, y], [((n,), dt)])
    check(out, np.multiply(*f64(x, y)), dt)
    xb = rand(rng, (n // 17 + 1, 17), dt)
    (out,) = run("bias_add", [xb, y[:17]], [(xb.shape, dt)], {"axis": 1})
    check(out, f64(xb)[0] + f64(y[:17])[0], dt)
    (out,) = run("reduce_sum", [xb], [((17,), dt)], {"axis": (0,), "keepdims": False})
    np.testing.assert_allclose(out, f64(xb)[0].sum(0), rtol=1e-2, atol=0.5)
    (out,) = run("softmax", [xb], [(xb.shape, dt)])
    check(out, _softmax(f64(xb)[0]), dt)


# ----------------------------------------------------------------------------- hypothesis: shapes
_dims = st.lists(st.integers(0, 3), min_size=0, max_size=4)


@settings(max_examples=60, deadline=None)
@given(_dims, st.data())
def test_broadcast_and_reduce_random_shapes(shape, data):
    """broadcast_sub of random broadcast-compatible shapes, then reduce_sum over random axes."""
    y_shape = tuple(data.draw(st.sampled_from([1, n])) for n in shape[data.draw(st.integers(0, len(shape))):])
    rng = np.random.default_rng(len(shape))
    x, y = rng.standard_normal(shape), rng.standard_normal(y_shape)
    out_shape = np.broadcast_shapes(x.shape, y.shape)
    (out,) = run("broadcast_sub", [y, x], [(out_shape, float64)])
    np.testing.assert_allclose(out, y - x, rtol=1e-15)
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, max(len(shape) - 1, 0)))) if shape else ()))
    keep = data.draw(st.booleans())
    ref = np.sum(x, axis=axes, keepdims=keep)
    (got,) = run("reduce_sum", [x], [(ref.shape, float64)], {"axis": axes, "keepdims": keep})
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- optimizer updates
def _torch_sgd(p, g, buf, steps, lr, mu, wd):
    for _ in range(steps):
        d = g + wd * p
        if mu:
            buf[...] = mu * buf + d
            d = buf
        p = p - lr * d
    return p, buf


@pytest.mark.parametrize("dt", [float32, float64], ids=lambda d: d.short)
@pytest.mark.parametrize("mu,wd", [(0.0, 0.0), (0.9, 0.0), (0.9, 0.01), (0.0, 0.1)])
def test_sgd_update(mu, wd, dt):
    rng = np.random.default_rng(14)
    p, g = rand(rng, (3, 4), dt), rand(rng, (3, 4), dt)
    buf = np.zeros_like(p)
    lr = np.array([0.1])
    ins = [p.copy(), g, lr, np.zeros(1, np.int64)] + ([buf.copy()] if mu else [])
    attrs = {"momentum": mu, "weight_decay": wd}
    node = Node(get_op("sgd_update"), [Value(f"i{k}", a.shape, a.dtype) for k, a in enumerate(ins)],
                [], attrs)
    steps = builder_for(node.op)(node, ins, [])
    for _ in range(2):
        for fn, args in steps:
            fn(*args)
    lr[0] = 0.05                                       # read when the kernel runs: same steps
    for fn, args in steps:
        fn(*args)
    p2, buf2 = _torch_sgd(*f64(p, g, buf), 2, 0.1, mu, wd)
    ref_p, ref_buf = _torch_sgd(p2, f64(g)[0], buf2, 1, 0.05, mu, wd)
    check(ins[0], ref_p, dt)
    if mu:
        check(ins[4], ref_buf, dt)
    ins[3][0] = 1                                      # skip_if
    before = [a.copy() for a in ins]
    for fn, args in steps:
        fn(*args)
    assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(ins, before))


@pytest.mark.parametrize("dt", [float32, float64], ids=lambda d: d.short)
def test_sgd_update_with_dampening_counts_its_steps_and_takes_the_first_undamped(dt):
    """``sgd_update`` {dampening}: at step 0 the buffer is the gradient, then ``mu * buf + (1 -
    dampening) * g`` (PyTorch's); the step count counts the steps taken, not a skipped one.
    Without the step input, or with nesterov, the op is refused."""
    rng = np.random.default_rng(15)
    p, g = rand(rng, (3, 4), dt), rand(rng, (3, 4), dt)
    ins = [p.copy(), g, np.array([0.1]), np.zeros(1, np.int64), rand(rng, (3, 4), dt),
           np.zeros(1, np.int64)]
    attrs = {"momentum": 0.9, "dampening": 0.3, "weight_decay": 0.01}
    node = Node(get_op("sgd_update"), [Value(f"i{k}", a.shape, a.dtype) for k, a in enumerate(ins)],
                [], attrs)
    steps = builder_for(node.op)(node, ins, [])
    want_p, g64 = f64(p, g)
    buf = None                                         # PyTorch's: no buffer before step 1
    for _ in range(3):
        for fn, args in steps:
            fn(*args)
        d = g64 + 0.01 * want_p
        buf = d if buf is None else 0.9 * buf + 0.7 * d
        want_p = want_p - 0.1 * buf
    check(ins[0], want_p, dt)
    check(ins[4], buf, dt)
    assert ins[5][0] == 3
    ins[3][0] = 1                                      # skip_if: no step, no count
    before = [a.copy() for a in ins]
    for fn, args in steps:
        fn(*args)
    assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(ins, before))
    vals = [Value(f"i{k}", a.shape, a.dtype) for k, a in enumerate(ins)]
    vals[0].kind = "variable"
    with pytest.raises(ValueError, match="sgd_update: expects 6 inputs, got 5"):
        get_op("sgd_update").infer(vals[:5], get_op("sgd_update").normalize(vals[:5], dict(attrs)))
    with pytest.raises(ValueError, match=r"nesterov=True needs momentum > 0 and dampening 0, got "
                                         r"momentum 0.9, dampening 0.3"):
        get_op("sgd_update").normalize(vals, dict(attrs, nesterov=True))


@pytest.mark.parametrize("dt", [float32, float64], ids=lambda d: d.short)
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_adam_update(wd, dt):
    rng = np.random.default_rng(15)
    p, g = rand(rng, (5, 3), dt), rand(rng, (5, 3), dt)
    lr = np.array([1e-2])
    ins = [p.copy(), g, lr, np.zeros(1, np.int64), np.zeros_like(p), np.zeros_like(p),
           np.zeros(1, np.int64)]
    a = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": wd}
    node = Node(get_op("adam_update"),
                [Value(f"i{k}", x.shape, x.dtype) for k, x in enumerate(ins)], [], a)
    steps = builder_for(node.op)(node, ins, [])
    rp, rg = f64(p, g)
    m, v = np.zeros_like(rp), np.zeros_like(rp)
    for t, lr_t in zip(range(1, 4), (1e-2, 3e-3, 2e-2)):   # a new lr every step, same steps
        lr[0] = lr_t
        for fn, args in steps:
            fn(*args)
        d = rg + wd * rp
        m, v = 0.9 * m + 0.1 * d, 0.999 * v + 0.001 * d * d
        rp = rp - lr_t / (1 - 0.9**t) * m / (np.sqrt(v) / np.sqrt(1 - 0.999**t) + 1e-8)
    assert ins[6][0] == 3
    check(ins[0], rp, dt)
    check(ins[4], m, dt)
    check(ins[5], v, dt)
    ins[3][0] = 5
    before = [x.copy() for x in ins]
    for fn, args in steps:
        fn(*args)
    assert all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(ins, before))


def test_sgd_momentum_without_buffer_is_an_error():
    ins = [np.zeros(3, np.float32), np.zeros(3, np.float32), np.array([0.1]),
           np.zeros(1, np.int64)]
    node = Node(get_op("sgd_update"), [Value(f"i{k}", a.shape, a.dtype) for k, a in enumerate(ins)],
                [], {"momentum": 0.9, "weight_decay": 0.0})
    with pytest.raises(ValueError, match="momentum_buf"):
        builder_for(node.op)(node, ins, [])


# ----------------------------------------------------------------------------- on-disk cache
_CACHE_SCRIPT = textwrap.dedent("""
    import numpy as np
    from miniflow.dtype import float32
    from miniflow.ir import Node, Value
    from miniflow.kernels.cpu import builder_for
    from miniflow.ops import get_op
    x = np.linspace(-2, 2, 11, dtype=np.float32)
    hits = 0
    for op, ref in [("negative", -x), ("exp", np.exp(x)), ("relu", np.maximum(x, 0)),
                    ("tanh", np.tanh(x)), ("broadcast_add", x + x), ("broadcast_mul", x * x)]:
        ins = [x] if op.startswith(("neg", "exp", "relu", "tanh")) else [x, x]
        node = Node(get_op(op), [Value("a", x.shape, float32) for _ in ins],
                    [Value("o", x.shape, float32)])
        out = np.empty_like(x)
        ((fn, args),) = builder_for(node.op)(node, ins, [out])
        fn(*args)
        np.testing.assert_allclose(out, ref, rtol=1e-6)
        hits += sum(fn.stats.cache_hits.values())
    print("HITS", hits)
""")


def test_cache_keeps_scalar_functions_apart(tmp_path):
    """Kernels from one factory with different scalar functions get separate cache entries."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", _CACHE_SCRIPT], env=env, capture_output=True,
                           text=True) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert "HITS 0" in runs[0].stdout and "HITS 6" in runs[1].stdout


README = Path(__file__).resolve().parent.parent / "README.md"
_COUNTED = textwrap.dedent("""
    import collections, sys
    from numba.core import event
    compiled = collections.Counter()

    class Count(event.Listener):
        def on_start(self, ev):
            compiled[ev.data["dispatcher"].py_func.__qualname__] += 1

        def on_end(self, ev):
            pass

    event.register("numba:compile", Count())
    exec(compile(open(sys.argv[1]).read(), "README.md", "exec"), {})
    print("COMPILED", sum(compiled.values()), dict(compiled))
""")


@pytest.mark.slow
def test_a_second_process_loads_every_kernel_of_the_readme_example_from_the_cache(tmp_path):
    """The README's TrainStep example ("What it looks like") run twice in fresh processes sharing
    a ``NUMBA_CACHE_DIR``: the first compiles its kernels and prints the compile notice once, the
    second compiles nothing (no ``numba:compile`` event, which Numba fires for a compilation and
    not for a cache hit: ``numba/core/dispatcher.py``) and prints no notice. A kernel closing over
    something that pickles differently in every process (an ``@intrinsic``, a Dispatcher) gets a
    new cache key each run and fails this (issue 22, item 18: the matmul register tile did)."""
    section = README.read_text().split("## What it looks like", 1)[1].split("\n## ", 1)[0]
    (tmp_path / "example.py").write_text(re.findall(r"```python\n(.*?)```", section, re.S)[0])
    env = {k: v for k, v in os.environ.items() if k != "MINIFLOW_BACKEND"}
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "cache")
    runs = [subprocess.run([sys.executable, "-c", _COUNTED, str(tmp_path / "example.py")],
                           env=env, capture_output=True, text=True, timeout=600) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    first, second = (int(r.stdout.rsplit("COMPILED ", 1)[1].split()[0]) for r in runs)
    assert first > 10, runs[0].stdout[-2000:]
    assert "first run only" in runs[0].stderr
    assert second == 0, f"compiled again with a warm cache: {runs[1].stdout.rsplit('COMPILED', 1)[1]}"
    assert "compiling kernels" not in runs[1].stderr, runs[1].stderr
    assert runs[0].stdout.split("COMPILED")[0] == runs[1].stdout.split("COMPILED")[0]


@pytest.mark.parametrize("dt", [float32, float64], ids=lambda d: d.short)
def test_the_learning_rate_input_is_rounded_once_to_the_compute_type(dt):
    """``lr[0]`` (float64) becomes the model's compute type once, as the lr attribute it replaced
    did (a Python float): the update is bit for bit ``p - lr_c * g`` in that type, so training
    with a constant lr gives the bits it gave when the lr was an attribute."""
    rng = np.random.default_rng(16)
    p, g = rand(rng, (64,), dt), rand(rng, (64,), dt)
    lr = 0.1 + 1e-9  # not representable in float32: the rounding shows
    ins = [p.copy(), g, np.array([lr]), np.zeros(1, np.int64)]
    node = Node(get_op("sgd_update"), [Value(f"i{k}", a.shape, a.dtype) for k, a in enumerate(ins)],
                [], {"momentum": 0.0, "weight_decay": 0.0})
    for fn, args in builder_for(node.op)(node, ins, []):
        fn(*args)
    want = p - dt.np.type(lr) * g
    assert np.array_equal(ins[0].view(np.uint8), want.view(np.uint8))


# ------------------------------------------------------------------------------ 4. scalar shapes
@pytest.mark.parametrize("x_shape,s_shape", [((3, 2), (1,)), ((3, 2), ()), ((4,), (1, 1)),
                                             ((), (1, 1)), ((2, 1, 3), (1, 1, 1))])
def test_scalar_mul_by_tensor_takes_any_one_element_scalar(x_shape, s_shape):
    r = np.random.default_rng(0)
    x = r.uniform(-2, 2, x_shape).astype(np.float32)
    s = r.uniform(0.5, 2, s_shape).astype(np.float32)
    g = IRGraph()
    out = emitter(g)("scalar_mul_by_tensor", g.add_input("x", x_shape, mf.float32),
                     g.add_input("s", s_shape, mf.float32))
    assert out.shape == x_shape
    g.set_outputs([out])
    g.verify()
    (got,) = Plan(g, get_backend()).run([x, s])
    np.testing.assert_allclose(got, x.astype(np.float64) * float(s.reshape(())), rtol=1e-6)
    r64 = np.random.default_rng(1)  # both gradients (dx and dscalar) against finite differences
    check_grad("scalar_mul_by_tensor", [r64.uniform(-1, 1, x_shape),
                                        r64.uniform(0.5, 2, s_shape)], {})


def test_scalar_mul_by_tensor_refuses_a_scalar_of_several_elements():
    g = IRGraph()
    x = g.add_input("x", (3,), mf.float32)
    with pytest.raises(ValueError, match=r"scalar_mul_by_tensor: scalar %s \(f32\[1,2\]\) must "
                                         r"have exactly one element .*it has 2"):
        emitter(g)("scalar_mul_by_tensor", x, g.add_input("s", (1, 2), mf.float32))
