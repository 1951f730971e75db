"""The fused AMP update (``passes/fuse_model_update_cast.py``, the multi-tensor updates with cast):
bit-identical to the unfused graph in weights, optimizer state, half copies, scaler state and
losses; a skipped step changes nothing; the copies follow weights written from outside."""
import numpy as np
import pytest

import miniflow as mf
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.passes.fuse_model_update_cast import copy_name, count_commutes

SIZES = (64, 48, 32, 10)
R = np.random.default_rng(0)
X = R.random((16, 64), dtype=np.float32) * 4
Y = R.integers(0, 10, 16)


def _optimizer(kind, params, clip=None, groups=False):
    extra = {} if clip is None else {"clip_grad_max_norm": clip}
    if groups:  # nanoGPT's split: biases at their own lr, without decay (and with amsgrad)
        params = list(params)
        params = [{"params": [p for p in params if len(p.shape) > 1]},
                  {"params": [p for p in params if len(p.shape) == 1], "lr": 0.03,
                   "weight_decay": 0.0, **({"amsgrad": True} if kind == "adam" else {})}]
    if kind == "adadelta":
        return mf.optim.Adadelta(params, weight_decay=0.01, **extra)
    if kind in ("adam", "amsgrad"):
        return mf.optim.Adam(params, lr=1e-2, weight_decay=0.01, amsgrad=kind == "amsgrad",
                             **extra)
    return mf.optim.SGD(params, lr=0.1, momentum=0.0 if kind == "plain" else 0.9,
                        dampening=0.3 if kind == "dampening" else 0.0, weight_decay=0.01,
                        nesterov=kind == "nesterov", **extra)


def _scaler(kind):
    if kind == "dynamic":
        return mf.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=3)
    return mf.amp.StaticGradScaler(512.0) if kind == "static" else None


def _graph(fused, dtype, opt="momentum", scaler="dynamic", clip=None, micro=1, ddp=False,
           groups=False, sizes=SIZES):
    mf.manual_seed(0)
    model = mlp(sizes)
    optimizer = _optimizer(opt, model.parameters(), clip, groups)
    g = TrainGraph(model, optimizer)
    g.config.enable_amp(dtype=dtype)
    g.config.enable_fused_model_update_cast(fused)
    if micro > 1:
        g.config.set_gradient_accumulation_steps(micro)
    if ddp:
        g.config.enable_data_parallel()                 # all_reduce nodes, one rank here
    s = _scaler(scaler)
    if s is not None:
        g.set_grad_scaler(s)
    return g, model, optimizer, s


def _state(model, optimizer, scaler):
    out = {f"p.{k}": v for k, v in model.state_dict().items()}
    for i, st in optimizer.state_dict()["state"].items():
        out.update({f"s.{i}.{k}": v for k, v in st.items()})
    if scaler is not None:
        out["scale"] = np.float32(scaler.scale)
    return out


def _assert_same_bits(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert np.array_equal(x.view(f"u{x.dtype.itemsize}"), y.view(f"u{y.dtype.itemsize}")), k


def _train(g, steps, x=X, y=Y):
    return [np.asarray(g(x, y).numpy()).tobytes() for _ in range(steps)]


@pytest.mark.parametrize("dtype", [mf.float16, mf.bfloat16], ids=lambda d: d.short)
@pytest.mark.parametrize("opt,scaler", [("momentum", "dynamic"), ("plain", "static"),
                                        ("adam", "dynamic"), ("momentum", "none"),
                                        ("nesterov", "dynamic"), ("amsgrad", "dynamic"),
                                        ("adam", "none"), ("adadelta", "dynamic"),
                                        ("adadelta", "static"), ("dampening", "dynamic")])
def test_fused_training_is_bit_identical_to_unfused(dtype, opt, scaler):
    fused, fm, fo, fs = _graph(True, dtype, opt, scaler)
    plain, pm, po, ps = _graph(False, dtype, opt, scaler)
    assert _train(fused, 7) == _train(plain, 7)
    _assert_same_bits(_state(fm, fo, fs), _state(pm, po, ps))
    ops = [n.op.name for n in fused.ir.nodes]
    assert any(op.startswith("multi_tensor_") for op in ops)
    assert not any(op.startswith("multi_tensor_") for op in (n.op.name for n in plain.ir.nodes))
    for name, p in fm.named_parameters():                 # each copy is its weight, rounded
        copy = fused.ir.variable_data.get(copy_name(f"model.{name}", dtype))
        if copy is not None:
            np.testing.assert_array_equal(copy, p.numpy().astype(dtype.np))


DEEP = (64,) + (16,) * 9 + (10,)
"""An MLP of 10 layers: 20 parameters, three packs of the CPU's multi-tensor kernels."""


@pytest.mark.parametrize("opt", ["momentum", "adam"])
def test_more_tensors_than_a_pack_train_to_the_unfused_bits_and_compile_few_tuple_lengths(opt):
    """A fused update over several packs of tensors (``kernels.cpu.common.tensor_packs``) trains
    to the unfused graph's bits, and every tuple the CPU's multi-tensor update and counting
    kernels were compiled for holds a power of two of views up to ``TENSOR_PACK``: at most four
    compilations per dtype whatever the model (a tuple's length is part of Numba's signature;
    before packs, each parameter count compiled the kernels again)."""
    from numba.core import types
    from miniflow.kernels.cpu import loss_scale, update
    from miniflow.kernels.cpu.common import TENSOR_PACK
    fused, fm, fo, fs = _graph(True, mf.float16, opt, "dynamic", sizes=DEEP)
    plain, pm, po, ps = _graph(False, mf.float16, opt, "dynamic", sizes=DEEP)
    assert _train(fused, 4) == _train(plain, 4)
    _assert_same_bits(_state(fm, fo, fs), _state(pm, po, ps))
    multi = (update.multi_sgd_kernel(True, False, False, False) if opt == "momentum"
             else update.multi_adam_kernel(False, False))
    for kernel in (multi, loss_scale.count_into_kernel, loss_scale.copy_counts_kernel):
        lengths = {t.count for sig in kernel.signatures for t in sig
                   if isinstance(t, types.UniTuple) and isinstance(t.dtype, types.Array)}
        assert lengths <= {1, 2, 4, TENSOR_PACK}, (kernel, lengths)
    assert multi.signatures, "the fused update ran the serial multi-tensor kernel"


def test_tensor_packs_cover_every_tensor_once_and_a_pack_has_a_power_of_two_length():
    """``tensor_packs`` cuts ``n`` tensors into consecutive runs of at most ``TENSOR_PACK``;
    ``pack`` pads a run to the power of two at or above its length with its first view and
    refuses an empty or too long one, naming the sizes."""
    from miniflow.kernels.cpu.common import TENSOR_PACK, pack, tensor_packs
    for n in (0, 1, TENSOR_PACK, TENSOR_PACK + 1, 3 * TENSOR_PACK - 1):
        parts = tensor_packs(n)
        assert [k for part in parts for k in part] == list(range(n))
        assert all(0 < len(part) <= TENSOR_PACK for part in parts)
    views = [np.arange(k, dtype=np.float32) for k in (3, 1, 4, 1, 5)]
    for n, length in ((1, 1), (2, 2), (3, 4), (4, 4), (5, TENSOR_PACK)):
        packed = pack(views[:n])
        assert len(packed) == length and packed[:n] == tuple(views[:n])
        assert all(v is views[0] for v in packed[n:])
    for bad in ([], views * TENSOR_PACK):
        with pytest.raises(ValueError, match=f"pack: {len(bad)} views; a pack holds 1 to "
                                             f"{TENSOR_PACK}"):
            pack(bad)


def test_the_fused_ir_reads_the_copies_and_counts_in_the_matmuls():
    g, *_ = _graph(True, mf.float16)
    g(X, Y)
    ir = g.ir
    casts = [n for n in ir.nodes if n.op.name == "cast" and n.inputs[0].kind == "variable"]
    assert casts == []                                    # no weight is cast per step
    weights = [n for n in ir.nodes if n.op.name == "matmul" and n.inputs[1].kind == "variable"]
    assert weights and all(n.inputs[1].name.endswith(".float16_copy") for n in weights)
    counted = [n for n in ir.nodes if n.attrs.get("count_not_finite")]
    assert len(counted) == len(SIZES) - 1                 # every weight gradient's matmul
    (count,) = [n for n in ir.nodes if n.op.name == "multi_count_not_finite"]
    assert set(count.attrs["precounted"]) == {k for k, v in enumerate(count.inputs)
                                              if v.producer in counted}
    assert all(n.op.name != "scalar_mul_by_tensor" or n.inputs[0].shape == (10,)
               for n in ir.nodes if n.outputs and n.outputs[0].shape)  # only the f32 bias left
    fused = [n for n in ir.nodes if n.op.name == "multi_tensor_sgd_update_with_cast"]
    assert len(fused) == 1 and fused[0].inputs[1] is count.outputs[1]   # skip_if: the total


@pytest.mark.parametrize("dtype", [mf.float16, mf.bfloat16], ids=lambda d: d.short)
@pytest.mark.parametrize("opt", ["momentum", "nesterov", "adam", "adadelta"])
def test_two_param_groups_fuse_apart_bit_identical_to_unfused(dtype, opt):
    """One multi-tensor update per group (its attributes and learning-rate variable), the same
    bits as the unfused updates; group 1 clips alone."""
    fused, fm, fo, fs = _graph(True, dtype, opt, groups=True)
    plain, pm, po, ps = _graph(False, dtype, opt, groups=True)
    fo.param_groups[1]["clip_grad_max_norm"] = po.param_groups[1]["clip_grad_max_norm"] = 0.5
    assert _train(fused, 6) == _train(plain, 6)
    _assert_same_bits(_state(fm, fo, fs), _state(pm, po, ps))
    kind = opt if opt in ("adam", "adadelta") else "sgd"
    updates = [n for n in fused.ir.nodes if n.op.name == f"multi_tensor_{kind}_update_with_cast"]
    assert sorted(n.inputs[0].name for n in updates) == ["optimizer0.group1.learning_rate",
                                                         "optimizer0.learning_rate"]
    assert [n.op.name for n in fused.ir.nodes].count("clip_grad_norm") == 1
    fo.param_groups[1]["lr"] = po.param_groups[1]["lr"] = 0.001   # read at the next call
    assert _train(fused, 2) == _train(plain, 2) and fused.compile_count == 1
    _assert_same_bits(_state(fm, fo, fs), _state(pm, po, ps))


@pytest.mark.parametrize("opt", ["momentum", "adam", "adadelta"])
def test_a_skipped_step_changes_no_weight_state_or_copy(opt):
    """A scale of 2^60 overflows every float16 gradient: the step is skipped, as unfused."""
    fused, fm, fo, fs = _graph(True, mf.float16, opt)
    plain, pm, po, ps = _graph(False, mf.float16, opt)
    _train(fused, 2), _train(plain, 2)
    before = _state(fm, fo, fs)
    copies = {k: np.array(v) for k, v in fused.ir.variable_data.items() if k.endswith("_copy")}
    for s in (fs, ps):
        s.load_state_dict({**s.state_dict(), "scale": 2.0 ** 60})
    assert _train(fused, 1) == _train(plain, 1)
    after = _state(fm, fo, fs)
    assert fs.scale == ps.scale == 2.0 ** 59               # backed off, as unfused
    del before["scale"], after["scale"]
    _assert_same_bits(after, before)
    for k, v in copies.items():
        np.testing.assert_array_equal(fused.ir.variable_data[k], v)
    assert fo.num_skipped_steps == po.num_skipped_steps == 1 and fs.found_inf and ps.found_inf
    counts = [g._plans[next(iter(g._plans))] for g in (fused, plain)]
    counts = [p.backend.to_numpy(p.buffers[p.graph.results["nonfinite_counts"]])
              for p in counts]
    np.testing.assert_array_equal(counts[0], counts[1])     # the same counts per parameter
    assert counts[0].sum() > 0


def test_copies_follow_weights_loaded_from_outside():
    """load_state_dict writes the master weights: the next step refreshes the copies first."""
    fused, fm, fo, fs = _graph(True, mf.float16)
    plain, pm, po, ps = _graph(False, mf.float16)
    _train(fused, 2), _train(plain, 2)
    other = {k: v * 0.5 for k, v in fm.state_dict().items()}
    fm.load_state_dict(other)
    pm.load_state_dict(other)
    assert _train(fused, 2) == _train(plain, 2)
    _assert_same_bits(_state(fm, fo, fs), _state(pm, po, ps))


def test_copies_follow_another_graph_that_trains_the_same_model():
    """A second, unfused graph trains the model between the fused graph's steps."""
    fused, fm, fo, fs = _graph(True, mf.float16)
    other = TrainGraph(fm, mf.optim.SGD(fm.parameters(), lr=0.05))
    plain, pm, po, ps = _graph(False, mf.float16)
    other_plain = TrainGraph(pm, mf.optim.SGD(pm.parameters(), lr=0.05))
    for g, o in ((fused, other), (plain, other_plain)):
        for _ in range(2):
            g(X, Y)
            o(X[::-1].copy(), Y[::-1].copy())
    assert _train(fused, 1) == _train(plain, 1)
    _assert_same_bits(_state(fm, fo, fs), _state(pm, po, ps))


def test_clipping_keeps_the_unscaling_and_fuses_the_copies():
    fused, fm, fo, fs = _graph(True, mf.float16, clip=0.5)
    plain, pm, po, ps = _graph(False, mf.float16, clip=0.5)
    assert _train(fused, 5) == _train(plain, 5)
    _assert_same_bits(_state(fm, fo, fs), _state(pm, po, ps))
    ops = [n.op.name for n in fused.ir.nodes]
    assert "clip_grad_norm" in ops and "multi_tensor_sgd_update_with_cast" in ops
    assert not any(n.attrs.get("count_not_finite") for n in fused.ir.nodes)


def test_gradient_accumulation_with_the_fused_update():
    fused, fm, fo, fs = _graph(True, mf.float16, micro=2)
    plain, pm, po, ps = _graph(False, mf.float16, micro=2)
    assert _train(fused, 4) == _train(plain, 4)
    _assert_same_bits(_state(fm, fo, fs), _state(pm, po, ps))
    assert "multi_tensor_sgd_update_with_cast" in [n.op.name for n in fused.ir.nodes]


def test_data_parallel_with_the_fused_update():
    fused, fm, fo, fs = _graph(True, mf.float16, ddp=True)
    plain, pm, po, ps = _graph(False, mf.float16, ddp=True)
    assert _train(fused, 4) == _train(plain, 4)
    _assert_same_bits(_state(fm, fo, fs), _state(pm, po, ps))
    ops = [n.op.name for n in fused.ir.nodes]
    assert "all_reduce" in ops and "multi_tensor_sgd_update_with_cast" in ops


def test_count_commutes_only_where_unscaling_cannot_overflow():
    assert count_commutes(mf.float16, None)
    assert count_commutes(mf.float16, mf.amp.GradScaler())             # min_scale 1
    assert count_commutes(mf.bfloat16, mf.amp.GradScaler())
    assert count_commutes(mf.float16, mf.amp.StaticGradScaler(1e-30))  # 65504 / 1e-30: finite
    assert not count_commutes(mf.float16, mf.amp.StaticGradScaler(1e-35))
    assert not count_commutes(mf.bfloat16, mf.amp.StaticGradScaler(0.5))
    assert not count_commutes(mf.float32, mf.amp.GradScaler(init_scale=4.0, min_scale=0.25))


def test_a_bfloat16_gradient_under_a_scale_below_one_keeps_the_unscaled_count():
    fused, fm, fo, fs = _graph(True, mf.bfloat16, scaler="none")
    fused.set_grad_scaler(mf.amp.StaticGradScaler(0.5))
    plain, pm, po, ps = _graph(False, mf.bfloat16, scaler="none")
    plain.set_grad_scaler(mf.amp.StaticGradScaler(0.5))
    assert _train(fused, 3) == _train(plain, 3)
    _assert_same_bits(_state(fm, fo, None), _state(pm, po, None))
    (count,) = [n for n in fused.ir.nodes if n.op.name == "multi_count_not_finite"]
    assert all(v.dtype is mf.float32 for v in count.inputs)   # the unscaled gradients


def test_enable_fused_model_update_cast_takes_a_bool():
    with pytest.raises(TypeError, match="enable_fused_model_update_cast: mode must be True or "
                                        "False, got 'yes'"):
        mf.nn.GraphConfig().enable_fused_model_update_cast("yes")
