"""ONNX export (``miniflow.onnx``, the ``onnx`` extra) and ``miniflow ir --onnx``: onnxruntime runs
the exported eval graphs of the digits models and matches miniflow; every stage of a training
graph exports and passes ``onnx.checker.check_model(full_check=True)``.

Followed: PyTorch's ``test/onnx/test_models_onnxruntime.py`` (export a model, run it in
onnxruntime, compare with the framework's own output) and the ONNX operator docs
(onnx/docs/Operators.md) for the standard forms; onnxruntime is the independent oracle.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import miniflow
from miniflow import nn, optim
from miniflow.amp import GradScaler
from miniflow.experiments.mlp import EvalGraph, TrainGraph
from miniflow.experiments.train import make_model
from miniflow.extras import MissingExtraError
from miniflow.tensor import apply

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
mo = pytest.importorskip("miniflow.onnx")


def _x(model: str, n: int = 5, seed: int = 0) -> np.ndarray:
    shape = (n, 64) if model == "mlp" else (n, 1, 8, 8)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(path, feeds: dict) -> list:
    session = ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _f16_ulp(x: np.ndarray) -> float:
    """float16's spacing at the largest magnitude of ``x``: the unit of the AMP tolerance."""
    return float(np.spacing(np.float16(np.abs(x).max())))


def _with_bn_statistics(model):
    """``model`` in eval mode with batch norm statistics away from 0 and 1, as after training."""
    r = np.random.default_rng(7)
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    for k, v in state.items():
        if k.endswith("running_mean"):
            state[k] = r.normal(0.0, 0.2, v.shape).astype(v.dtype)
        elif k.endswith("running_var"):
            state[k] = r.uniform(0.5, 1.5, v.shape).astype(v.dtype)
    model.load_state_dict(state)
    return model.eval()


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
@pytest.mark.parametrize("name", ["mlp", "lenet", "resnet18"])
def test_eval_graph_runs_in_onnxruntime_and_matches_miniflow(name, amp, tmp_path):
    miniflow.manual_seed(0)
    model = _with_bn_statistics(make_model(name))
    graph = EvalGraph(model)
    if amp:
        graph.config.enable_amp(True)
    x = _x(name)
    want = graph(x).numpy()
    proto = mo.export(graph, x, tmp_path / "m.onnx")
    onnx.checker.check_model(onnx.load(tmp_path / "m.onnx"), full_check=True)
    assert {n.domain for n in proto.graph.node} == {""}
    inits = {i.name for i in proto.graph.initializer}
    assert set(dict(graph.named_parameters())) <= inits
    assert {f"model.{k}" for k in model.state_dict() if "num_batches" not in k} <= inits
    (got,) = _run(tmp_path / "m.onnx", {"x": x})
    if not amp:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert "Cast" not in {n.op_type for n in proto.graph.node}
        return
    casts = [n for n in proto.graph.node if n.op_type == "Cast"]
    half = {v.name for v in proto.graph.value_info
            if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
    compute = [n for n in proto.graph.node if n.op_type in ("Gemm", "Conv")]
    assert casts and compute and all(n.output[0] in half for n in compute)
    assert np.abs(got - want).max() <= 4 * _f16_ulp(want)


def test_a_bfloat16_amp_graph_exports_bfloat16_compute(tmp_path):
    graph = EvalGraph(make_model("mlp"))
    graph.config.enable_amp(True, dtype=miniflow.bfloat16)
    proto = mo.export(graph, _x("mlp"), tmp_path / "bf16.onnx")
    bf16 = {v.name for v in proto.graph.value_info
            if v.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16}
    gemms = [n for n in proto.graph.node if n.op_type == "Gemm"]
    assert len(gemms) == 2 and all(n.output[0] in bf16 for n in gemms)


def test_a_module_exports_in_eval_mode_with_its_state_dict_names(tmp_path):
    miniflow.manual_seed(1)
    model = _with_bn_statistics(make_model("lenet"))
    want = EvalGraph(model)(_x("lenet")).numpy()
    model.train()
    proto = mo.export(model, (_x("lenet"),), tmp_path / "lenet.onnx")
    assert model.training and all(m.training for m in model.modules())   # modes restored
    inits = {i.name for i in proto.graph.initializer}
    assert {k for k in model.state_dict() if "num_batches" not in k} == inits
    assert "BatchNormalization" in {n.op_type for n in proto.graph.node}
    (got,) = _run(tmp_path / "lenet.onnx", {proto.graph.input[0].name: _x("lenet")})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_list_is_one_input_and_a_tuple_several(tmp_path):
    """``example_inputs`` as ``torch.onnx.export``'s ``args``: a tuple holds the inputs, anything
    else is one input; a list is an array's data (it was unpacked into one input per row)."""
    miniflow.manual_seed(2)
    model = make_model("mlp").eval()
    x = _x("mlp")
    proto = mo.export(model, x.tolist(), tmp_path / "list.onnx")
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim] == list(x.shape)
    (got,) = _run(tmp_path / "list.onnx", {proto.graph.input[0].name: x})
    np.testing.assert_allclose(got, EvalGraph(model)(x).numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="positional argument"):
        mo.export(model, (x, x), tmp_path / "two.onnx")    # forward takes one
    assert not (tmp_path / "two.onnx").exists()


class _Zoo(nn.Module):
    """Ops outside the digits models: gelu, silu, sigmoid, tanh, exp, scalars, avg pools,
    softmax, transpose, reshape, sum."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=True)
        self.pool = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.adapt = nn.AdaptiveAvgPool2d(2)

    def forward(self, x):
        y = self.adapt(self.pool(nn.functional.gelu(self.conv(x))))    # [N, 4, 2, 2]
        z = nn.functional.silu(y).sigmoid() + y.tanh() * 0.3 - (y * 0.5).exp()
        z = z.reshape(z.shape[0], 16).transpose(1, 0).transpose(1, 0)
        return nn.functional.softmax(z, dim=-1), z.sum(axis=1)


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_activations_pools_and_scalars_match_at_both_gelu_forms(opset, amp, tmp_path):
    miniflow.manual_seed(2)
    graph = EvalGraph(_Zoo())
    if amp:
        graph.config.enable_amp(True)
    x = _x("lenet", 3, seed=5)
    want = [t.numpy() for t in graph(x)]
    proto = mo.export(graph, x, tmp_path / "zoo.onnx", opset=opset)
    types = {n.op_type for n in proto.graph.node}
    assert ("Gelu" in types) == (opset >= 20) and ("Erf" in types) == (opset < 20)
    got = _run(tmp_path / "zoo.onnx", {"x": x})
    for g, w in zip(got, want):
        if amp:
            assert g.dtype == w.dtype and np.abs(g - w).max() <= 4 * _f16_ulp(w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _export_one_activation_chain(model, amp: bool, path):
    """Export ``model`` (seeded: call it after ``manual_seed``) in an EvalGraph, float32 or
    AMP, on a ``[16, 4]`` input; check that onnxruntime matches miniflow (AMP: within 4 float16
    ulps); returns the ONNX model."""
    graph = EvalGraph(model)
    if amp:
        graph.config.enable_amp(True)
    x = np.random.default_rng(3).standard_normal((16, 4)).astype(np.float32) * 3
    want = graph(x).numpy()
    proto = mo.export(graph, x, path)
    (got,) = _run(path, {"x": x})
    if amp:
        assert got.dtype == want.dtype and np.abs(got - want).max() <= 4 * _f16_ulp(want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    return proto


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_softplus_exports_its_beta_and_threshold_as_a_composition(amp, tmp_path):
    """ONNX's Softplus has no beta or threshold: the export is Where(beta x > threshold, x,
    Softplus(beta x) / beta), exact for any attributes; onnxruntime matches miniflow on both
    sides of the threshold (beta 2, threshold 3: x = 1.5) and at the defaults."""
    miniflow.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Softplus(beta=2, threshold=3), nn.Linear(8, 3),
                          nn.Softplus())
    proto = _export_one_activation_chain(model, amp, tmp_path / "softplus.onnx")
    assert {"Softplus", "Where", "Greater"} <= {n.op_type for n in proto.graph.node}


class _Norms(nn.Module):
    """RMSNorm (scalar_pow, reduce_sum, rsqrt) and the elementwise math of a custom norm."""

    def __init__(self):
        super().__init__()
        self.a, self.norm, self.b = nn.Linear(4, 8), nn.RMSNorm(8), nn.Linear(8, 3)

    def forward(self, x):
        h = self.norm(self.a(x))
        return self.b(h.abs().sqrt() - h ** 3 * 0.1 + (h.square() + 1.0).pow(-0.5)
                      + h.clamp(-0.5, 0.5) + h.clamp(min=0.2))


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_rms_norm_abs_sqrt_pow_and_clamp_export_as_onnx_operators(amp, tmp_path):
    """``abs`` -> Abs, ``sqrt`` -> Sqrt, ``scalar_pow`` -> Pow (float16 computed in float32 and
    rounded once, as miniflow does), ``clip_by_scalar`` -> Clip (one bound inf); onnxruntime
    matches miniflow."""
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(_Norms(), amp, tmp_path / "norms.onnx")
    assert {"Abs", "Sqrt", "Pow", "Clip"} <= {n.op_type for n in proto.graph.node}


class _Expands(nn.Module):
    """Tensor.expand and repeat, and attention with a key and value of batch 1 (expanded)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)                                            # [16, 4]
        kv = h[:3].unsqueeze(0)                                  # [1, 3, 4]
        att = nn.functional.scaled_dot_product_attention(h.reshape(4, 4, 4), kv, kv)
        return (att.reshape(16, 4) + h[:1].expand(16, 4) + h.repeat(1, 2)[:, 2:6]
                + h.sum(1, keepdim=True).expand_as(h))


def test_expand_repeat_and_broadcast_attention_export_as_expand(tmp_path):
    """Op ``expand`` (``Tensor.expand``, ``repeat`` and the attention's broadcast key and
    value) exports as ``Expand`` to its ``expand_shape``; onnxruntime matches miniflow."""
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(_Expands(), False, tmp_path / "expand.onnx")
    assert "Expand" in {n.op_type for n in proto.graph.node}
    assert "ConstantOfShape" not in {n.op_type for n in proto.graph.node}   # no full-size like


def test_broadcast_like_of_a_tensor_with_its_axes_kept_exports_as_expand(tmp_path):
    """``broadcast_like`` of an x that keeps its broadcast axes as size 1 (a ``keepdims``
    gradient's form) exports as ``Expand`` without an ``Unsqueeze`` (it gave a rank one too
    high, refused by ONNX's checker); onnxruntime matches miniflow."""
    class KeptAxes(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            like = h * 0.0
            return h + apply("broadcast_like", [h.sum(1, keepdim=True), like],
                             broadcast_axes=(1,))
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(KeptAxes(), False, tmp_path / "kept.onnx")
    assert "Expand" in {n.op_type for n in proto.graph.node}
    assert "Unsqueeze" not in {n.op_type for n in proto.graph.node}


class _MaxMin(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.a(x).maximum(self.b(x)) + self.a(x).min(x[:1])


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_maximum_and_minimum_export_as_max_and_min(amp, tmp_path):
    """Ops ``broadcast_maximum`` / ``broadcast_minimum`` are ONNX's ``Max`` / ``Min``
    (broadcasting); onnxruntime matches miniflow."""
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(_MaxMin(), amp, tmp_path / "maxmin.onnx")
    assert {"Max", "Min"} <= {n.op_type for n in proto.graph.node}


class _SinCos(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        return h.sin() * 0.5 + h.cos()


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_sin_and_cos_export_as_sin_and_cos(amp, tmp_path):
    """Ops ``sin`` / ``cos`` (sinusoidal position encodings) are ONNX's ``Sin`` / ``Cos``, a
    half operand computed in float32 and rounded once, as miniflow's kernels; onnxruntime
    matches miniflow."""
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(_SinCos(), amp, tmp_path / "sincos.onnx")
    assert {"Sin", "Cos"} <= {n.op_type for n in proto.graph.node}


class _Steps(_SinCos):
    """floor, round and cumsum of a Linear's output."""

    def forward(self, x):
        h = self.a(x)
        return (h * 2.0).floor() + (h * 2.0).round() * 0.5 + h.cumsum(1) + h.cumsum(0) * 0.25


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_floor_round_and_cumsum_export_as_floor_round_and_cumsum(amp, tmp_path):
    """Ops ``floor``, ``round`` (halves to even: ONNX's ``Round`` too) and ``cumsum`` are
    ONNX's ``Floor``, ``Round`` and ``CumSum``; onnxruntime matches miniflow."""
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(_Steps(), amp, tmp_path / "steps.onnx")
    assert {"Floor", "Round", "CumSum"} <= {n.op_type for n in proto.graph.node}


class _TypeAs(nn.Module):
    """``z.type_as(h)`` of a product h: op cast_like, half under AMP."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = x @ x.T[:, :4]
        return self.a(x).type_as(h) * 0.5 + h


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_type_as_exports_as_cast_like(amp, tmp_path):
    """Op ``cast_like`` (``type_as`` inside a graph) is ONNX's ``CastLike`` (opset 15, miniflow's
    lowest) at the stages before fusion, which makes it a cast of its fused chain (``Cast`` in
    the inference export); onnxruntime matches miniflow, its input in float16 under AMP."""
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(_TypeAs(), amp, tmp_path / "type_as.onnx")
    assert "Cast" in {n.op_type for n in proto.graph.node}
    graph = EvalGraph(_TypeAs())
    graph.config.enable_amp(amp)
    staged = mo.export(graph, np.ones((16, 4), np.float32), tmp_path / "staged.onnx",
                       after="amp" if amp else "trace")
    assert "CastLike" in {n.op_type for n in staged.graph.node}


class _Ids(nn.Module):
    """int64 ids cloned, flipped, indexed, summed, reduced, sorted and negated."""

    def forward(self, ids):
        c = ids.clone().flip(1)
        return (c[:, [2, 0]], c.cumsum(1), ids.amax(1), ids.amin(0), ids.topk(2).values,
                ids.sort(1).values, -ids)


def test_int64_ops_export_and_onnxruntime_matches_exactly(tmp_path):
    """Ops identity, gather, cumsum, reduce_max, top_k and negative of an int64 input (which
    they took only as floating tensors) export as ONNX's Identity, Gather, CumSum, ReduceMax,
    TopK and Neg; onnxruntime gives miniflow's int64 values exactly, beyond 2**53, and
    -(-2**63) wraps in both."""
    ids = np.array([[5, -2 ** 62, 2 ** 62 + 1], [0, 3, -2 ** 63]], np.int64)
    proto = mo.export(_Ids(), ids, tmp_path / "ids.onnx")
    assert {"Identity", "Gather", "CumSum", "ReduceMax", "TopK", "Neg"} <= {
        n.op_type for n in proto.graph.node}
    got = _run(tmp_path / "ids.onnx", {"input0": ids})
    for g, w in zip(got, _Ids()(miniflow.tensor(ids)), strict=True):
        assert g.dtype == np.int64
        np.testing.assert_array_equal(g, w.numpy())


class _Cumprod(_SinCos):
    """cumprod of a Linear's output."""

    def forward(self, x):
        return self.a(x).cumprod(1)


def test_cumprod_export_is_refused_naming_the_op(tmp_path):
    """ONNX has no cumulative product: the export of op ``cumprod`` is refused, naming it and
    why (the stage export, ``after=``, writes it in the ai.miniflow domain)."""
    miniflow.manual_seed(0)
    x = np.ones((16, 4), np.float32)
    with pytest.raises(mo.OnnxExportError, match=r"\(cumprod\) has no standard ONNX form: ONNX "
                                                 r"has no cumulative-product operator"):
        mo.export(_Cumprod(), x, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


class _Rotary(nn.Module):
    """Rotary embeddings as LLaMA ports write them: halves joined with ``miniflow.cat``, pairs
    with ``miniflow.stack``."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)                                            # [16, 4]
        half = miniflow.cat((-h[:, 2:], h[:, :2]), dim=-1)
        pairs = miniflow.stack([h[:, 0::2], h[:, 1::2]], dim=-1).reshape(16, 4)
        return h * 0.5 + half * 0.25 + pairs


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_cat_and_stack_export_as_concat(amp, tmp_path):
    """Op ``cat`` (``miniflow.cat``, ``miniflow.stack``) had no converter: a model with rotary
    embeddings raised "node 4 (cat) has no standard ONNX form". It is ``Concat`` along its
    axis; onnxruntime matches miniflow."""
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(_Rotary(), amp, tmp_path / "rotary.onnx")
    assert "Concat" in {n.op_type for n in proto.graph.node}


class _Picks(nn.Module):
    """``Tensor.gather`` (op ``dim_gather``) along the last dimension and along the first, an
    argmax's index and a constant index with repeats."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)                                                # [16, 4]
        best = h.gather(1, h.argmax(1, keepdim=True))                # [16, 1]
        rows = h.gather(0, np.array([[3, 0, 3, 15]] * 2))            # [2, 4]
        return h * 0.5 + best + rows.sum(0, keepdim=True)


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_tensor_gather_exports_as_gather_elements(amp, tmp_path):
    """Op ``dim_gather`` (``Tensor.gather``, ``torch.gather``) is ``GatherElements`` with its
    ``dim`` as axis; onnxruntime matches miniflow."""
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(_Picks(), amp, tmp_path / "picks.onnx")
    axes = sorted(a.i for n in proto.graph.node if n.op_type == "GatherElements"
                  for a in n.attribute if a.name == "axis")
    assert axes == [0, 1]


class _Scatters(nn.Module):
    """``scatter`` of a tensor and of a number, ``scatter_add`` with repeated places and
    ``take_along_dim`` (``expand`` + ``dim_gather``) of a Linear's output."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)                                                # [16, 4]
        index = miniflow.tensor(np.array([[3, 0], [1, 2], [0, 3]]))
        y = h.scatter(1, index, h[:3, :2] * 2.0).scatter(0, index[:1], -1.5)
        y = y.scatter_add(0, miniflow.tensor(np.array([[15, 15, 0, 15]] * 2)), h[:2])
        return y + y.take_along_dim(index[:1, :1], 1)


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_scatter_and_scatter_add_export_as_scatter_elements(amp, tmp_path):
    """Ops ``dim_scatter_update`` (``_scalar``) and ``dim_scatter_add`` are ScatterElements with
    reduction none and add, axis = dim; onnxruntime matches miniflow. Below opset 16 (no
    reduction attribute) the add is refused naming the opset."""
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(_Scatters(), amp, tmp_path / "scatters.onnx")
    got = sorted(a.s.decode() for n in proto.graph.node if n.op_type == "ScatterElements"
                 for a in n.attribute if a.name == "reduction")
    assert got == ["add", "none", "none"]
    assert "GatherElements" in {n.op_type for n in proto.graph.node}
    with pytest.raises(mo.OnnxExportError, match="ScatterElements adds .* from opset 16"):
        mo.export(_Scatters(), np.zeros((16, 4), np.float32), tmp_path / "m.onnx", opset=15)


class _Top(nn.Module):
    """``Tensor.topk`` along the last dimension and the first (op ``top_k`` moved there), the
    largest and the smallest."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)                                                # [16, 4]
        v, i = h.topk(2, dim=1)
        low = h.topk(3, dim=0, largest=False).values                 # [3, 4]
        picks = v.sum(1, keepdim=True) + i.float().sum(1, keepdim=True)
        return h * 0.5 + picks + low.sum(0, keepdim=True)


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_topk_exports_as_onnx_topk(amp, tmp_path):
    """Op ``top_k`` (``Tensor.topk`` inside ``build``) is ``TopK`` on the last axis with its
    ``largest``; onnxruntime matches miniflow (random values: no ties)."""
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(_Top(), amp, tmp_path / "top.onnx")
    largest = sorted(a.i for n in proto.graph.node if n.op_type == "TopK"
                     for a in n.attribute if a.name == "largest")
    assert largest == [0, 1]


class _Assigned(nn.Module):
    """``h[key] = v`` of basic keys (op ``slice_update``): a strided column range from another
    layer, a row broadcast from a number, a single element."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        h = self.a(x)                                                # [16, 4]
        h[1:12:3, ::2] = self.b(x)[1:12:3]
        h[-1] = 0.5
        h[0, 3] = h[2, 1] * 2.0
        return h * 1.5


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_slice_update_exports_as_scatter_nd(amp, tmp_path):
    """Op ``slice_update`` (``x[key] = v`` in ``build``) is ``ScatterND`` with the slice's
    element indices as a constant (shapes are static); onnxruntime matches miniflow."""
    miniflow.manual_seed(0)
    proto = _export_one_activation_chain(_Assigned(), amp, tmp_path / "assigned.onnx")
    assert sum(n.op_type == "ScatterND" for n in proto.graph.node) == 3


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_leaky_relu_and_elu_export_as_onnx_operators_with_their_alpha(amp, tmp_path):
    """``leaky_relu`` -> ``LeakyRelu(alpha)`` and ``elu`` -> ``Elu(alpha)``, the node's ``alpha``
    an ONNX attribute (not an input), given and at the defaults (0.01, 1.0), and a slope of 0;
    onnxruntime matches miniflow (float16 computed in float32 and rounded once, as miniflow
    does)."""
    miniflow.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 8), nn.ELU(alpha=0.5),
                          nn.Linear(8, 8), nn.LeakyReLU(), nn.Linear(8, 8), nn.ELU(),
                          nn.Linear(8, 3), nn.LeakyReLU(0.0))
    proto = _export_one_activation_chain(model, amp, tmp_path / "act.onnx")
    alphas = {(n.op_type, round(a.f, 6)) for n in proto.graph.node for a in n.attribute
              if n.op_type in ("LeakyRelu", "Elu")}
    assert alphas == {("LeakyRelu", 0.2), ("LeakyRelu", 0.01), ("LeakyRelu", 0.0),
                      ("Elu", 0.5), ("Elu", 1.0)}


def _amp_training_graph(name: str):
    miniflow.manual_seed(0)
    model = make_model(name)
    graph = TrainGraph(model, optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                                        clip_grad_max_norm=5.0))
    graph.config.enable_amp(True)
    graph.set_grad_scaler(GradScaler())
    return graph, (_x(name, 8), np.arange(8) % 10)


def test_a_training_graph_with_layer_norm_exports_its_statistics_in_miniflow_s_domain(tmp_path):
    """Once autograd reads layer_norm's mean and inv_variance (its gradient does), the node is
    miniflow's, all three outputs; ONNX's LayerNormalization (Y only) was emitted, and the
    checker refused the graph (the statistics came from no node)."""
    class Train(nn.Graph):
        def __init__(self, m):
            super().__init__()
            self.m = m
            self.add_optimizer(optim.SGD(m.parameters(), lr=1e-3))

        def build(self, x):
            loss = self.m(x).sum()
            loss.backward()
            return loss

    graph, x = Train(nn.LayerNorm(4)), np.random.default_rng(0).random((2, 3, 4), np.float32)
    for stage in graph.stages(x):
        proto = mo.export(graph, [x], tmp_path / f"{stage}.onnx", after=stage)
        onnx.checker.check_model(onnx.load(tmp_path / f"{stage}.onnx"), full_check=True)
        (norm,) = [n for n in proto.graph.node if n.op_type in ("layer_norm",
                                                                "LayerNormalization")]
        if stage == "trace":            # no gradient yet: the standard form
            assert norm.op_type == "LayerNormalization" and len(norm.output) == 1
        else:
            assert norm.domain == mo.DOMAIN and len(norm.output) == 3


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_every_stage_of_an_amp_training_graph_exports_and_checks(name, tmp_path):
    graph, inputs = _amp_training_graph(name)
    stages = graph.stages(*inputs)
    assert stages[0] == "trace" and "auto_mixed_precision" in stages
    for stage in stages:
        path = tmp_path / f"{stage}.onnx"
        proto = mo.export(graph, inputs, path, after=stage)
        onnx.checker.check_model(onnx.load(path), full_check=True)
        ir = graph.lower(*inputs, after=stage)
        custom = [n for n in proto.graph.node if n.domain == mo.DOMAIN]
        assert [n.op_type for n in custom] == [n.op.name for n in ir.nodes
                                               if n.op.name in {c.op_type for c in custom}]
        assert {o.name for o in proto.graph.output} >= set(ir.results)
        for node in proto.graph.node:
            meta = {p.key: p.value for p in node.metadata_props}
            if "miniflow.result" in meta:   # names a result that is not a node's own output
                assert node.op_type == "Identity" and meta["miniflow.result"] in ir.results
                continue
            assert meta["miniflow.amp_color"] in node.doc_string
            assert meta["miniflow.op"] == ir.nodes[int(meta["miniflow.node"])].op.name
    final = mo.export(graph, inputs, tmp_path / "final.onnx", after=stages[-1])
    (update,) = [n for n in final.graph.node if n.op_type.startswith("multi_tensor_sgd")]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in update.attribute}
    assert attrs["momentum"] == pytest.approx(0.9) and attrs["model_copy_dtype"] == b"f16"
    assert any(o.endswith(".new") for o in update.output)   # the weights it writes


def test_amp_colors_are_in_the_nodes_after_the_amp_pass(tmp_path):
    graph, inputs = _amp_training_graph("mlp")
    proto = mo.export(graph, inputs, tmp_path / "amp.onnx", after="amp")
    ir = graph.lower(*inputs, after="amp")
    metas = {n.name: {p.key: p.value for p in n.metadata_props} for n in proto.graph.node}
    colors = {k: m["miniflow.amp_color"] for k, m in metas.items() if "miniflow.node" in m}
    for i, node in enumerate(ir.nodes):
        names = [k for k in colors if k.split(".")[0] == f"{node.op.name}_{i}"]
        assert names and all(colors[k] == node.meta["amp_color"] for k in names)
    assert {"white", "cast", "black"} <= set(colors.values())
    assert any(n.op_type == "amp_black_identity" and n.domain == mo.DOMAIN
               for n in proto.graph.node)
    assert {p.key: p.value for p in proto.metadata_props}["miniflow.stage"] == \
        "auto_mixed_precision"


class _Attention(nn.Module):
    """Self-attention through ``nn.MultiheadAttention``, and ``x^T y`` (``batch_matmul`` with
    ``transpose_a``) beside it."""

    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        xtx = apply("batch_matmul", [x, x], transpose_a=True, transpose_b=False)
        return self.mha(x, x, x, need_weights=False)[0], xtx


def test_a_gpt_and_attention_run_in_onnxruntime_and_match_miniflow(tmp_path):
    """``models.gpt`` (``gather``, ``layer_norm``, ``slice`` of the positions, ``batch_matmul``,
    the causal ``tril``) and ``nn.MultiheadAttention`` export with standard ops and match
    onnxruntime (they stopped at the first of those ops); LayerNormalization needs opset 17."""
    miniflow.manual_seed(0)
    gpt = miniflow.models.gpt(65, block_size=16, n_layer=2, n_head=2, n_embd=16).eval()
    ids = np.random.default_rng(0).integers(0, 65, (2, 16))
    attention = _Attention().eval()
    x = np.random.default_rng(1).standard_normal((2, 5, 16)).astype(np.float32)
    for model, inputs in ((gpt, ids), (attention, x)):
        want = EvalGraph(model)(inputs)
        want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
        proto = mo.export(model, inputs, tmp_path / "m.onnx")
        ops = {n.op_type for n in proto.graph.node}
        assert "LayerNormalization" in ops or model is attention
        assert {"MatMul", "Softmax"} <= ops and not any(n.domain for n in proto.graph.node)
        got = _run(tmp_path / "m.onnx", {"input0": inputs})
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    with pytest.raises(mo.OnnxExportError, match="LayerNormalization exists from opset 17"):
        mo.export(gpt, ids, tmp_path / "m15.onnx", opset=15)


@pytest.mark.parametrize("opset", [15, 16])
def test_layer_norm_below_opset_17_says_to_export_with_opset_17(opset, tmp_path):
    """ONNX's LayerNormalization exists from opset 17. Below it the error named the opset but
    its hint sent the user to ``after=`` stages ("No stage of this graph has standard ONNX ops
    only"); now it names the op and the opset asked and says to export with opset=17."""
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(mo.OnnxExportError) as e:
        mo.export(model, x, tmp_path / "m.onnx", opset=opset)
    assert (f"node 2 (layer_norm) has no standard ONNX form: ONNX's LayerNormalization exists "
            f"from opset 17, this export asked for opset {opset} (export with opset=17 or "
            f"later)") in str(e.value)
    assert str(e.value).endswith(f"\nExport with opset=17 or later (this graph has standard "
                                 f"ONNX ops only from opset 17; opset={opset} was asked).")
    assert "after=" not in str(e.value) and not (tmp_path / "m.onnx").exists()
    mo.export(model, x, tmp_path / "m.onnx", opset=17)


class _MaxArgmaxDetach(nn.Module):
    """``Tensor.max(dim)``, ``max()``, ``argmax`` and ``detach``: a classifier's inference code."""

    def forward(self, x):
        values, indices = x.detach().max(1, keepdim=True)
        return values + x.max() * 0.5, indices, x.argmax(-1), x.max(0).values


@pytest.mark.parametrize("opset", [15, 17, 18])
def test_max_argmax_and_detach_export_as_reducemax_argmax_identity(opset, tmp_path):
    """``x.max(dim)``, ``x.argmax(dim)`` and ``x.detach()`` had no converter: export raised
    "node 0 (reduce_max) has no standard ONNX form". ReduceMax (its axes an attribute before
    opset 18, an input from 18), ArgMax and Identity, checked in onnxruntime."""
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    model = _MaxArgmaxDetach()
    want = [t.numpy() for t in model(miniflow.tensor(x))]
    proto = mo.export(model, x, tmp_path / "m.onnx", opset=opset)
    onnx.checker.check_model(onnx.load(tmp_path / "m.onnx"), full_check=True)
    assert {"ReduceMax", "ArgMax", "Identity"} <= {n.op_type for n in proto.graph.node}
    got = _run(tmp_path / "m.onnx", {proto.graph.input[0].name: x})
    assert [g.dtype for g in got] == [w.dtype for w in want]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_an_op_without_onnx_form_names_the_op_and_the_stages(tmp_path):
    graph, inputs = _amp_training_graph("mlp")
    with pytest.raises(mo.OnnxExportError, match=r"node \d+ \(scalar_mul_by_tensor\) has no "
                       r"standard ONNX form(.|\n)*after='trace'(.|\n)*after='dead_code_elim"):
        mo.export(graph, inputs, tmp_path / "t.onnx")
    lenet, inputs = _amp_training_graph("lenet")   # training batch norm from the trace on
    with pytest.raises(mo.OnnxExportError, match=r"\(increment\)(.|\n)*No stage of this graph "
                       r"has standard ONNX ops only"):
        mo.export(lenet, inputs, tmp_path / "t.onnx")
    assert os.listdir(tmp_path) == []   # nothing half-written


def test_bad_opset_and_stage_are_refused(tmp_path):
    graph = EvalGraph(make_model("mlp"))
    with pytest.raises(mo.OnnxExportError, match="opset must be an integer from 15"):
        mo.export(graph, _x("mlp"), tmp_path / "m.onnx", opset=11)
    with pytest.raises(mo.OnnxExportError, match="after='amp' is no stage(.|\n)*only with AMP"):
        mo.export(graph, _x("mlp"), tmp_path / "m.onnx", after="amp")
    with pytest.raises(TypeError, match="nn.Graph or a Module"):
        mo.export("mlp", _x("mlp"), tmp_path / "m.onnx")


def test_the_file_is_written_as_a_checkpoint_is(tmp_path, capsys):
    """As ``miniflow.save``: through a symlink (the link stays), a replaced file's permission
    bits kept, a new file's from the umask (``mkstemp`` made every export 0600), a FIFO, a
    folder or a missing folder refused before tracing, naming the export; ``miniflow ir
    --onnx`` says so in one line (a traceback before, and ``--onnx /dev/null`` as root replaced
    the device with a file)."""
    from miniflow.cli import main
    model, x = nn.Sequential(nn.Linear(4, 2)), np.zeros((1, 4), np.float32)
    (tmp_path / "real").mkdir()
    os.symlink("real/target.onnx", tmp_path / "link.onnx")
    mo.export(model, x, tmp_path / "link.onnx")
    assert os.path.islink(tmp_path / "link.onnx") and onnx.load(tmp_path / "real" / "target.onnx")
    (tmp_path / "perm.onnx").write_bytes(b"old")
    os.chmod(tmp_path / "perm.onnx", 0o664)
    mo.export(model, x, tmp_path / "perm.onnx")
    assert os.stat(tmp_path / "perm.onnx").st_mode & 0o777 == 0o664
    umask = os.umask(0o022)
    try:
        mo.export(model, x, tmp_path / "new.onnx")
    finally:
        os.umask(umask)
    assert os.stat(tmp_path / "new.onnx").st_mode & 0o777 == 0o644
    mo.export(model, x, os.fsencode(tmp_path / "bytes.onnx"))    # as open() takes it
    assert onnx.load(tmp_path / "bytes.onnx")
    with pytest.raises(TypeError, match="miniflow.onnx.export: the path must be a str, bytes"):
        mo.export(model, x, 3)
    os.mkfifo(tmp_path / "fifo.onnx")
    for path, error, match in ((tmp_path / "fifo.onnx", OSError, "is a FIFO, not a regular file; "
                                "an ONNX export replaces a regular file"),
                               (tmp_path, IsADirectoryError, "is a folder; give a file name"),
                               (tmp_path / "no" / "m.onnx", FileNotFoundError,
                                "the folder .* does not exist; create it first")):
        with pytest.raises(error, match=f"miniflow.onnx.export: .*{match}"):
            mo.export(model, x, path)
        assert main(["ir", "--onnx", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("miniflow ir: miniflow.onnx.export: ") and "\n" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["bytes.onnx", "fifo.onnx", "link.onnx", "new.onnx",
                                            "perm.onnx", "real"]


def test_miniflow_onnx_needs_no_import_of_its_own():
    """``miniflow.onnx.export`` after ``import miniflow`` alone, as ``torch.onnx.export`` after
    ``import torch``: it was "module 'miniflow' has no attribute 'onnx'". Another missing name
    is still an AttributeError naming it."""
    code = ("import miniflow\n"
            "print(miniflow.onnx.export.__module__)\n"
            "try:\n    miniflow.onnxx\nexcept AttributeError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["miniflow.onnx.export", "module 'miniflow' has no attribute 'onnxx': "
                   "docs/differences.md lists the PyTorch names miniflow has and lacks"]


def test_without_the_onnx_extra_export_names_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)   # `import onnx` raises ImportError
    with pytest.raises(MissingExtraError, match=r'pip install -e "\.\[onnx\]"'):
        mo.export(make_model("mlp"), _x("mlp"), tmp_path / "m.onnx")


def test_cli_ir_prints_the_stage_and_writes_onnx(tmp_path, capsys):
    from miniflow.cli import main
    out = tmp_path / "out.onnx"
    assert main(["ir", "--model", "lenet", "--after", "amp", "--onnx", str(out)]) == 0
    text = capsys.readouterr().out
    assert "the IR after auto_mixed_precision" in text and "amp_black_identity" in text
    assert f"wrote {out}" in text
    proto = onnx.load(out)
    onnx.checker.check_model(proto, full_check=True)
    assert any(n.domain == mo.DOMAIN for n in proto.graph.node)
    assert main(["ir", "--model", "mlp", "--after", "bogus"]) == 2
    err = capsys.readouterr().err     # the float32 graph's stages, and AMP's under --amp
    assert "is no stage of this graph" in err and "with --amp also auto_mixed_precision" in err


def test_cli_ir_netron_serves_the_file_or_names_the_extra(tmp_path, monkeypatch, capsys):
    import types

    from miniflow.cli import main
    served = []
    fake = types.SimpleNamespace(start=served.append, wait=lambda: None, stop=lambda: None)
    monkeypatch.setitem(sys.modules, "netron", fake)
    out = str(tmp_path / "m.onnx")
    assert main(["ir", "--eval", "--onnx", out, "--netron"]) == 0 and served == [out]
    monkeypatch.setitem(sys.modules, "netron", None)
    missing = str(tmp_path / "never.onnx")
    assert main(["ir", "--eval", "--onnx", missing, "--netron"]) == 2
    assert 'pip install -e ".[netron]"' in capsys.readouterr().err
    assert not os.path.exists(missing)      # refused before the export wrote it
    with pytest.raises(SystemExit):
        main(["ir", "--netron"])


def test_accumulation_and_data_parallel_ops_export_in_the_miniflow_domain(tmp_path):
    miniflow.manual_seed(0)
    model = make_model("mlp")
    graph = TrainGraph(model, optim.Adam(model.parameters(), lr=1e-3))
    graph.config.set_gradient_accumulation_steps(2)
    graph.config.enable_data_parallel(True)   # a one-rank world keeps its all_reduce nodes
    inputs = (_x("mlp", 8), np.arange(8) % 10)
    proto = mo.export(graph, inputs, tmp_path / "acc.onnx", after="dead_code_elimination")
    custom = {n.op_type: n for n in proto.graph.node if n.domain == mo.DOMAIN}
    assert {"unpack", "acc", "pack", "all_reduce", "adam_update"} <= set(custom)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in custom["unpack"].attribute}
    assert attrs == {"unpack_num": 2}
    assert {a.name: onnx.helper.get_attribute_value(a)
            for a in custom["all_reduce"].attribute} == {"reduce": b"mean"}


@pytest.mark.parametrize("pool, size", [
    (nn.MaxPool2d(2, 2, padding=1, ceil_mode=True), 9),     # the ceil window would start in the pad
    (nn.AvgPool2d(2, stride=3, ceil_mode=True), 9),         # ... in the input's end (kernel < stride)
    (nn.AvgPool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False), 8),
    (nn.MaxPool2d(3, 2, ceil_mode=True), 8),                # a ceil window ONNX keeps too
])
def test_ceil_mode_pools_export_pytorchs_windows(pool, size, tmp_path):
    """PyTorch's ceil rule drops a last window that would start in the right padding; ONNX's
    shape inference keeps it, and the export stopped at the checker (an InferenceError, a new
    user's finding): such pools export with ceil_mode 0 and end padding, matching
    onnxruntime."""
    x = np.random.default_rng(0).standard_normal((1, 2, size, size)).astype(np.float32)
    want = EvalGraph(pool.eval())(x).numpy()
    mo.export(pool, x, tmp_path / "p.onnx")
    np.testing.assert_allclose(_run(tmp_path / "p.onnx", {"input0": x})[0], want, rtol=1e-6,
                               atol=1e-7)


def test_an_attention_mask_given_as_data_exports_as_where(tmp_path):
    """``masked_fill`` (a boolean ``attn_mask``) had no converter: ``Where`` of the constant
    mask, matching onnxruntime."""
    miniflow.manual_seed(0)

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            mask = np.triu(np.ones((5, 5), bool), 1)
            return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]

    model = Masked().eval()
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    proto = mo.export(model, x, tmp_path / "m.onnx")
    assert "Where" in {n.op_type for n in proto.graph.node}
    np.testing.assert_allclose(_run(tmp_path / "m.onnx", {"input0": x})[0],
                               EvalGraph(model)(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_bfloat16_convolution_names_the_opset_it_needs(tmp_path):
    """ONNX's Conv takes bfloat16 from opset 22: before, the checker's raw InferenceError."""
    class Eval(nn.Graph):
        def __init__(self, model):
            super().__init__()
            self.model = model
            self.config.enable_amp(True, dtype=miniflow.bfloat16)

        def build(self, x):
            return self.model(x)

    graph = Eval(nn.Sequential(nn.Conv2d(1, 2, 3)).eval())
    x = np.random.default_rng(0).random((2, 1, 8, 8)).astype(np.float32)
    with pytest.raises(mo.OnnxExportError, match=r"Conv takes bfloat16 from opset 22, this "
                       r"export is opset 17 \(export with opset=22\)(.|\n)*after='autograd' for "
                       r"the latest stage with standard ONNX ops only \(without what the later "
                       r"passes do: auto_mixed_precision, "):
        mo.export(graph, x, tmp_path / "c.onnx")
    assert not (tmp_path / "c.onnx").exists()
    mo.export(graph, x, tmp_path / "c.onnx", opset=22)
    onnx.checker.check_model(str(tmp_path / "c.onnx"), full_check=True)


def test_a_float16_batchnorm_with_float16_statistics_exports(tmp_path):
    """``nn.BatchNorm1d(C, dtype=float16)``: ONNX's BatchNormalization takes scale, bias, mean
    and var of x's own type as well (T1, T2 from opset 15); onnxruntime gives miniflow's bits."""
    bn = nn.BatchNorm1d(7, dtype=miniflow.float16)
    r = np.random.default_rng(3)
    bn.load_state_dict({"weight": r.uniform(0.5, 2, 7), "bias": r.standard_normal(7),
                        "running_mean": r.standard_normal(7), "running_var": r.uniform(0.5, 2, 7),
                        "num_batches_tracked": np.array(3)})
    bn.eval()
    x = r.standard_normal((4, 7)).astype(np.float16)
    proto = mo.export(bn, x, tmp_path / "bn.onnx")
    onnx.checker.check_model(str(tmp_path / "bn.onnx"), full_check=True)
    (got,) = _run(tmp_path / "bn.onnx", {proto.graph.input[0].name: x})
    want = EvalGraph(bn)(x).numpy()
    assert got.dtype == want.dtype == np.float16
    assert np.abs(got.astype(np.float32) - want.astype(np.float32)).max() <= _f16_ulp(want)


def test_torch_onnx_export_keywords_name_the_inputs_and_outputs_or_are_refused_clearly(tmp_path):
    """PyTorch's tutorial call, torch.onnx.export(model, x, path, opset_version=17,
    input_names=['input'], output_names=['output'], dynamic_axes={...}), was "export() got an
    unexpected keyword argument 'opset_version'". opset_version is opset; input_names and
    output_names name the file's first inputs and outputs (onnxruntime feeds them by those
    names); dynamic_axes and any other keyword are refused naming it and what to do instead."""
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    x = np.random.default_rng(0).random((2, 4), dtype=np.float32)
    path = tmp_path / "m.onnx"
    proto = mo.export(model, (x,), path, opset_version=17, input_names=["input"],
                      output_names=["logits"])
    assert proto.opset_import[0].version == 17
    assert [i.name for i in proto.graph.input] == ["input"]
    assert [o.name for o in proto.graph.output] == ["logits"]
    model.eval()
    np.testing.assert_allclose(_run(path, {"input": x})[0], model(miniflow.tensor(x)).numpy(),
                               rtol=1e-6, atol=1e-6)
    for kw, match in ((dict(opset=17, opset_version=17), "give the opset once"),
                      (dict(input_names=["a", "b"]), r"2 input_names for 1 input"),
                      (dict(output_names="logits"), r"output_names must be a list of str"),
                      (dict(input_names=["0.weight"]), r"'0.weight' is taken"),
                      (dict(dynamic_axes={"input": {0: "batch"}}),
                       r"dynamic_axes: .*fixed shapes.*export once per batch size"),
                      (dict(do_constant_folding=True), r"no keyword 'do_constant_folding'")):
        with pytest.raises(TypeError, match=match):
            mo.export(model, (x,), tmp_path / "bad.onnx", **kw)
    assert not (tmp_path / "bad.onnx").exists()
