"""Every CUDA kernel against the CPU kernel and against the op's float64 reference
(``miniflow.ir.evaluate``, as ``tests/test_registry.py`` checks the CPU kernels), on every
registered sample of every op plus the extra cases of ``tests/cuda_cases.py`` (under the
simulator less the samples whose CUDA path another one runs, ``SIMULATOR_REPEATS``); results agree
within a tolerance per dtype (the GPU may fuse multiply-adds and sums in another order), casts
bit for bit."""
import numpy as np
import pytest
from numba import config

import miniflow as mf
from miniflow.kernels import cpu, cuda
from miniflow.kernels.cuda.launch import GPU, current, use_config
from miniflow.dtype import bfloat16
from miniflow.ops import all_ops
from miniflow.runtime.backend import CudaBackend

from cuda_cases import (Case, all_cases, fused_pair_cases, fused_pair_nodes, host_buffers,
                        make_node, results, simulated)
from op_cases import (assert_bit_exact, assert_close, assert_matches_reference, late_op,
                      run_cpu)

TOL = {np.dtype(np.float16): (2e-3, 1e-3), bfloat16.np: (1.6e-2, 8e-3),
       np.dtype(np.float32): (2e-5, 2e-6),
       np.dtype(np.float64): (1e-12, 1e-13)}
"""CUDA against CPU: ``(rtol, atol)`` per dtype (tighter than against the float64 reference)."""
BACKEND = CudaBackend()


def run_cuda(case: Case) -> list:
    node = make_node(case)
    ins, outs = host_buffers(case, node)
    d_ins = [BACKEND.from_numpy(a) for a in ins]
    d_outs = [BACKEND.from_numpy(a) for a in outs]
    for fn, args in cuda.builder_for(node.op)(node, d_ins, d_outs):
        fn(*args)
    return results(case, node, [BACKEND.to_numpy(a) for a in d_ins],
                   [BACKEND.to_numpy(a) for a in d_outs])


def test_every_op_has_a_cuda_kernel_and_samples():
    """An op with a CPU kernel must have a CUDA kernel and samples (so both lanes cover it)."""
    with_cpu = {name: op for name, op in all_ops().items() if cpu.builder_for(op) is not None}
    missing = sorted(name for name, op in with_cpu.items() if cuda.builder_for(op) is None)
    assert not missing, f"ops with a CPU kernel but no CUDA kernel: {missing}; add a builder to " \
                        f"miniflow/kernels/cuda/"
    no_samples = sorted(name for name, d in with_cpu.items() if not (d.samples and d.samples()))
    assert not no_samples, f"ops without samples: {no_samples}; register samples= in miniflow/ops"


CASES = simulated(all_cases(current())) if config.ENABLE_CUDASIM else all_cases(current())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cuda_kernel_matches_cpu_and_the_float64_reference(case):
    want, got = run_cpu(case), run_cuda(case)
    for k, (g, w) in enumerate(zip(got, want)):
        what = f"{case.id} result {k}: cuda against cpu"
        if case.op == "cast":
            assert_bit_exact(g, w, what)
        else:
            assert_close(g, w, what, TOL)
    assert_matches_reference(case, got)


@pytest.mark.parametrize("case", [
    Case("matmul", [np.random.default_rng(0).uniform(-1, 1, (17, 18)).astype(np.float16),
                    np.random.default_rng(1).uniform(-1, 1, (5, 18)).astype(np.float16)],
         {"transpose_b": True}, "gpu-tile"),
    Case("matmul", [np.random.default_rng(4).uniform(-1, 1, (17, 65)).astype(np.float32),
                    np.random.default_rng(5).uniform(-1, 1, (3, 17)).astype(np.float32)],
         {"transpose_a": True, "transpose_b": True}, "gpu-tile-transposed"),
    Case("log_softmax", [np.random.default_rng(2).uniform(-9, 9, (2, 131)).astype(np.float32)],
         {}, "gpu-row-block"),
    Case("reduce_sum", [np.random.default_rng(3).uniform(-1, 1, (130, 2)).astype(np.float32)],
         {"axis": (0,)}, "gpu-row-block"),
], ids=lambda c: c.id)
def test_gpu_sized_launch(case):
    """The kernels with the GPU preset's matmul tile (64, 4 x 4 per thread) and row block (128),
    as a real GPU runs them."""
    with use_config(GPU):
        got = run_cuda(case)
    for g, w in zip(got, run_cpu(case)):
        assert_close(g, w, case.id, TOL)
    assert_matches_reference(case, got)


def test_labels_out_of_range_give_nan():
    """The CPU kernel raises; a CUDA kernel cannot, so the row's loss and gradient are NaN."""
    pred = np.zeros((3, 4), np.float32)
    label = np.array([0, 4, -1])
    prob, loss = run_cuda(Case("sparse_softmax_cross_entropy", [pred, label]))
    assert loss[0] == pytest.approx(np.log(4)) and np.isnan(loss[1:]).all()
    (dx,) = run_cuda(Case("sparse_softmax_cross_entropy_grad",
                          [np.ones(3, np.float32), label, prob]))
    assert np.isfinite(dx[0]).all() and np.isnan(dx[1:]).all()



def test_dim_gather_indices_out_of_range_give_nan_and_repeats_add_up():
    """``dim_gather``: the CPU kernel raises IndexError; a CUDA kernel cannot, so an element
    whose index is outside ``[0, n)`` (negative too) is NaN. ``dim_scatter_add_like`` (its
    gradient) sums repeated indices and drops out-of-range ones, as ``np.add.at``."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[0, 3, 4], [-1, 1, 1], [2, 2, 2]], np.int64)
    (out,) = run_cuda(Case("dim_gather", [x, idx], {"dim": 1}))
    assert np.isnan(out[0, 2]) and np.isnan(out[1, 0])
    np.testing.assert_array_equal(out[[0, 0, 1, 1, 2, 2, 2], [0, 1, 1, 2, 0, 1, 2]],
                                  [0, 3, 5, 5, 10, 10, 10])
    src = np.ones((3, 3), np.float16)
    (dx,) = run_cuda(Case("dim_scatter_add_like", [np.zeros((3, 4), np.float16), idx, src],
                          {"dim": 1}))
    want = np.zeros((3, 4))
    keep = (idx >= 0) & (idx < 4)
    np.add.at(want, (np.nonzero(keep)[0], idx[keep]), 1.0)
    np.testing.assert_array_equal(dx, want)


def test_dim_scatters_write_the_last_repeat_and_drop_indices_out_of_range():
    """``dim_scatter_update`` writes the last of repeated places in index order (as the CPU
    kernel); an index outside ``[0, n)`` matches no element on CUDA: that element of src is
    dropped (the CPU kernel raises IndexError). ``dim_scatter_update_scalar`` and
    ``dim_scatter_add`` the same, from the input."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[3, 3, 9], [-1, 0, 0], [2, 1, 2]], np.int64)
    src = np.arange(100, 109, dtype=np.float32).reshape(3, 3)
    (out,) = run_cuda(Case("dim_scatter_update", [x, idx, src], {"dim": 1}))
    np.testing.assert_array_equal(out, [[0, 1, 2, 101], [105, 5, 6, 7], [8, 107, 108, 11]])
    (out,) = run_cuda(Case("dim_scatter_update_scalar", [x, idx], {"dim": 1, "src_scalar": -1.0}))
    np.testing.assert_array_equal(out, [[0, 1, 2, -1], [-1, 5, 6, 7], [8, -1, -1, 11]])
    (out,) = run_cuda(Case("dim_scatter_add", [x, idx, src], {"dim": 1}))
    np.testing.assert_array_equal(out, [[0, 1, 2, 204], [213, 5, 6, 7], [8, 116, 224, 11]])


@pytest.mark.parametrize("dt", [np.float32, np.float16, bfloat16.np, np.float64],
                         ids=["f32", "f16", "bf16", "f64"])
def test_dim_scatters_go_by_index_columns_in_index_order(dt):
    """The ``dim_scatter`` ops run one thread per column of index along ``dim`` (every dim of a
    3-d out, index shorter than out off ``dim`` and longer along it, every place hit several
    times): ``dim_scatter_add_like`` is ``np.add.at`` of float64 within the dtype's rounding and
    the CPU kernel's bits (index order, in float32 for the half types, rounded once), as are
    ``dim_scatter_add`` and ``dim_scatter_update`` (the last repeat wins); an empty index leaves
    zeros, or the input."""
    r = np.random.default_rng(5)
    for dim in range(3):
        ishape = [3, 4, 2]
        ishape[dim] = 9
        idx = r.integers(0, (4, 5, 3)[dim], ishape)
        src = r.uniform(-1, 1, ishape).astype(dt)
        x = r.uniform(-1, 1, (4, 5, 3)).astype(dt)
        case = Case("dim_scatter_add_like", [np.zeros_like(x), idx, src], {"dim": dim})
        (got,) = run_cuda(case)
        want = np.zeros((4, 5, 3))
        at = [np.arange(s).reshape([-1 if d == k else 1 for k in range(3)]) for d, s in
              enumerate(ishape)]
        at[dim] = idx
        np.add.at(want, tuple(at), src.astype(np.float64))
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=TOL[np.dtype(dt)][0],
                                   atol=TOL[np.dtype(dt)][1] * 10)
        for op, ins in [("dim_scatter_add_like", case.inputs), ("dim_scatter_add", [x, idx, src]),
                        ("dim_scatter_update", [x, idx, src])]:
            (got,) = run_cuda(Case(op, ins, {"dim": dim}))
            assert_bit_exact(got, run_cpu(Case(op, ins, {"dim": dim}))[0], f"{op} dim {dim}")
    empty, none = np.zeros((3, 0), np.int64), np.zeros((3, 0), dt)
    (got,) = run_cuda(Case("dim_scatter_add_like", [x[:, :, 0], empty, none], {"dim": 1}))
    assert_bit_exact(got, np.zeros_like(x[:, :, 0]), "empty index")
    (got,) = run_cuda(Case("dim_scatter_add", [x[:, :, 0], empty, none], {"dim": 1}))
    assert_bit_exact(got, x[:, :, 0], "empty index")


def test_an_elementwise_op_registered_late_runs_on_both_backends():
    """Elementwise kernels are derived when a plan is built, so an op registered after both kernel
    packages were imported runs through ``nn.Graph`` on both backends at once."""
    with late_op() as (op, check):
        assert "test_cube" not in cuda.KERNELS and cuda.builder_for(op) is not None
        check()
        mf.set_backend("cuda")
        try:
            plan = check()
        finally:
            mf.set_backend("cpu")
    assert "map[throwaway_cube] f32" in plan.describe()          # the CUDA launch of the derived kernel


FUSED = fused_pair_cases(current())


@pytest.mark.parametrize("pair", FUSED, ids=[f"{c.id}+{op}" for c, op, _ in FUSED])
def test_fused_pair_is_bit_identical_to_its_two_kernels(pair):
    """``reduce_sum`` then a map as one kernel (the mean loss) gives the bits of the two
    kernels run one after the other."""
    case, consumer, attrs = pair
    producer, node = fused_pair_nodes(case, consumer, attrs)
    x = BACKEND.from_numpy(case.inputs[0])
    mid = BACKEND.empty(producer.outputs[0].shape, producer.outputs[0].dtype.np)
    want = BACKEND.empty(node.outputs[0].shape, node.outputs[0].dtype.np)
    got = BACKEND.empty(node.outputs[0].shape, node.outputs[0].dtype.np)
    for fn, args in (cuda.builder_for(producer.op)(producer, [x], [mid])
                     + cuda.builder_for(node.op)(node, [mid], [want])):
        fn(*args)
    steps = cuda.fused_builder(producer.op, node.op)(producer, node, [x], [got])
    assert len(steps) == 1
    for fn, args in steps:
        fn(*args)
    assert_bit_exact(BACKEND.to_numpy(got), BACKEND.to_numpy(want), f"{case.id} + {consumer}")


def _update_group(op: str, sizes, skip: int, seed: int = 0):
    """``op`` nodes (``sgd_update`` with momentum and weight decay, ``adam_update`` or
    ``adadelta_update``) over parameters of ``sizes``, sharing one lr and skip_if: ``(nodes,
    host input lists)``."""
    from miniflow.dtype import float32, float64, int64
    from miniflow.ir import Graph
    from miniflow.ops import emitter
    g = Graph()
    emit = emitter(g)
    rng = np.random.default_rng(seed)
    lr, skip_if = g.add_variable("lr", (1,), float64), g.add_variable("skip", (1,), int64)
    lr_data, skip_data = np.array([0.05]), np.array([skip], np.int64)
    nodes, ins = [], []
    for k, n in enumerate(sizes):
        state = [g.add_variable(f"{name}{k}", (n,), float32) for name in ("p", "g", "a", "b")]
        data = [rng.uniform(-1, 1, n).astype(np.float32) for _ in range(3)]
        data.append(rng.uniform(0, 1, n).astype(np.float32))
        if op == "sgd_update":
            emit(op, *state[:2], lr, skip_if, state[2], momentum=0.9, weight_decay=0.01)
            ins.append([data[0], data[1], lr_data, skip_data, data[2]])
        else:
            step = g.add_variable(f"t{k}", (1,), int64)
            hyper = (dict(beta1=0.9, beta2=0.99, eps=1e-8) if op == "adam_update"
                     else dict(rho=0.9, eps=1e-6, maximize=True))
            if op == "adadelta_update":
                data[2] = np.abs(data[2])               # square_avg >= 0
            emit(op, *state[:2], lr, skip_if, state[2], state[3], step, weight_decay=0.01,
                 **hyper)
            ins.append([data[0], data[1], lr_data, skip_data, data[2], data[3],
                        np.array([k], np.int64)])
        nodes.append(g.nodes[-1])
    return nodes, ins


@pytest.mark.parametrize("op", ["sgd_update", "adam_update", "adadelta_update"])
@pytest.mark.parametrize("skip", [0, 1])
def test_multi_tensor_update_is_the_single_updates_bit_for_bit(op, skip, monkeypatch):
    """One launch over parameters of odd sizes (the grid-stride loop over their concatenation
    starts each tensor at another thread; more elements than threads) gives the bits of one
    launch per parameter and agrees with the CPU kernels; a large group is split into launches
    of at most ``MAX_ARRAYS`` arrays; ``skip_if`` changes nothing."""
    from miniflow.kernels.cuda import launch
    sizes = [5, 70, 1, 3 * current().block * current().max_blocks + 7]
    nodes, ins = _update_group(op, sizes, skip)
    group = [[BACKEND.from_numpy(a) for a in arrays] for arrays in ins]
    single = [[BACKEND.from_numpy(a) for a in arrays] for arrays in ins]
    cpu_ins = [[a.copy() for a in arrays] for arrays in ins]
    monkeypatch.setattr(launch, "MAX_ARRAYS", 11)    # 3 sgd / 2 adam or adadelta parameters
    steps = cuda.group_builder(nodes[0].op).build(nodes, group, [[] for _ in nodes])
    per_launch = 3 if op == "sgd_update" else 2
    launches = -(-len(sizes) // per_launch) * (1 if op == "sgd_update" else 2)
    assert len(steps) == launches, [fn.__name__ for fn, _ in steps]
    for fn, args in steps:
        fn(*args)
    for node, arrays, cpu_arrays in zip(nodes, single, cpu_ins):
        for fn, args in cuda.builder_for(node.op)(node, arrays, []):
            fn(*args)
        for fn, args in cpu.builder_for(node.op)(node, cpu_arrays, []):
            fn(*args)
    for k, node in enumerate(nodes):
        for i in node.op.written(node.attrs, len(node.inputs)):
            got, want = BACKEND.to_numpy(group[k][i]), BACKEND.to_numpy(single[k][i])
            assert_bit_exact(got, want, f"{op} parameter {k} input {i}")
            assert_close(got, cpu_ins[k][i], f"{op} vs cpu, {k}/{i}", TOL)
            if skip:
                assert_bit_exact(got, ins[k][i], f"{op} skipped, {k}/{i}")


@pytest.mark.parametrize("kind", ["sgd", "adam", "adadelta"])
@pytest.mark.parametrize("half", [np.float16, bfloat16.np])
def test_multi_tensor_update_with_cast_splits_into_launches_as_the_cpu(kind, half, monkeypatch):
    """The fused AMP update (``multi_tensor_*_update_with_cast``) over more tensors than one
    launch takes runs as several launches of the multi-tensor kernel (SGD: 4 arrays a tensor,
    Adam and Adadelta: 6, plus one counter launch each) and agrees with the CPU kernel; every
    copy is its new model rounded to the half dtype, bit for bit."""
    from miniflow.kernels.cuda import launch
    rng = np.random.default_rng(3)
    sizes = [5, 70, 1, 2 * current().block * current().max_blocks + 3, 9]
    models = [rng.uniform(-1, 1, n).astype(np.float32) for n in sizes]
    diffs = [(rng.uniform(-1, 1, n) * 8).astype(half) for n in sizes]
    copies = [m.astype(half) for m in models]
    fixed = [np.array([{"sgd": 0.1, "adam": 0.01, "adadelta": 1.0}[kind]]),
             np.array([0], np.int64), np.array([0.125], np.float32)]
    if kind != "sgd":
        state = ([rng.uniform(-0.1 if kind == "adam" else 0, 0.1, n).astype(np.float32)
                  for n in sizes]
                 + [rng.uniform(0, 0.1, n).astype(np.float32) for n in sizes]
                 + [np.array([k], np.int64) for k in range(len(sizes))])
        case = Case(f"multi_tensor_{kind}_update_with_cast",
                    fixed + models + diffs + copies + state, {"weight_decay": 0.01})
    else:
        state = [rng.uniform(-1, 1, n).astype(np.float32) for n in sizes]
        case = Case("multi_tensor_sgd_update_with_cast", fixed + models + diffs + copies + state,
                    {"momentum": 0.9, "weight_decay": 0.01})
    monkeypatch.setattr(launch, "MAX_ARRAYS", 12)         # 3 sgd / 2 adam, adadelta tensors
    node = make_node(case)
    ins, outs = host_buffers(case, node)
    d_ins = [BACKEND.from_numpy(a) for a in ins]
    steps = cuda.builder_for(node.op)(node, d_ins, [])
    assert len(steps) == (2 if kind == "sgd" else 2 * 3), [fn.__name__ for fn, _ in steps]
    for fn, args in steps:
        fn(*args)
    got = results(case, node, [BACKEND.to_numpy(a) for a in d_ins], [])
    want = run_cpu(case)
    n = len(sizes)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"{case.op} written input {k}", TOL)
    for k in range(n):                                    # the copies follow the models
        assert_bit_exact(got[n + k], got[k].astype(half), f"{case.op} copy {k}")


@pytest.mark.parametrize("expr", ["mul(f32(x0), x1)",
                                  "t0 = f32(x0); y0 = f16(mul(t0, x1)); y1 = sigmoid(t0)"])
def test_multi_tensor_fused_kernel_is_the_single_kernels_bit_for_bit(expr, monkeypatch):
    """One-dimensional ``fused_elementwise`` nodes of one expression sharing their one-element
    input (AMP's cast and unscale of every gradient) as one launch give the bits of one launch
    each, over tensors of odd sizes (more elements than threads), split into launches of at
    most ``MAX_ARRAYS`` arrays."""
    from miniflow.dtype import float16, float32
    from miniflow.ir import Graph
    from miniflow.kernels.cuda import launch
    from miniflow.ops import emitter
    from miniflow.runtime.plan import grouped_nodes
    g = Graph()
    emit = emitter(g)
    scale = g.add_input("s", (1,), float32)
    sizes = [(5,), (7, 10), (2,), (3 * current().block * current().max_blocks + 7,)]
    xs = [g.add_input(f"x{k}", shape, float16) for k, shape in enumerate(sizes)]
    for x in xs:
        emit("fused_elementwise", x, scale, expr=expr)
    nodes = list(g.nodes)
    assert grouped_nodes(g, BACKEND, set()) == {3: [0, 1, 2, 3]}
    rng = np.random.default_rng(0)
    host = [rng.uniform(-3, 3, v.shape).astype(np.float16) for v in xs]
    s = BACKEND.from_numpy(np.array([0.37], np.float32))
    ins = [[BACKEND.from_numpy(h), s] for h in host]
    outs = [[BACKEND.empty(v.shape, v.dtype.np) for v in n.outputs] for n in nodes]
    want = [[BACKEND.empty(v.shape, v.dtype.np) for v in n.outputs] for n in nodes]
    monkeypatch.setattr(launch, "MAX_ARRAYS", 2 * (1 + len(nodes[0].outputs)))  # 2 a launch
    steps = cuda.group_builder(nodes[0].op).build(nodes, ins, outs)
    assert [fn.__name__ for fn, _ in steps] == [f"fused[{expr}] x2"] * 2
    for fn, args in steps:
        fn(*args)
    for node, i, w in zip(nodes, ins, want):
        for fn, args in cuda.builder_for(node.op)(node, i, w):
            fn(*args)
    for k, (o, w) in enumerate(zip(outs, want)):
        for a, b in zip(o, w):
            assert_bit_exact(BACKEND.to_numpy(a), BACKEND.to_numpy(b), f"tensor {k}")
