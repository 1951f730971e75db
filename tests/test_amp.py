"""The AMP pass: lists, coloring (golden IR printouts, forward and backward), casts, identities,
report, DOT export and bad input.

Golden files live in ``tests/golden/amp/<name>.txt`` and are compared exactly. Each holds the IR after
autograd, the AMP report, and the IR after auto_mixed_precision and after prune_amp_identity, for a
small hand-built graph. After an intended change, regenerate them and review the diff:

    MINIFLOW_UPDATE_GOLDEN=1 python -m pytest tests/test_amp.py
"""
import inspect
import os
from pathlib import Path

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.amp import AmpLists, amp_report
from miniflow.amp.lists import BLACK, CLEAR, GRAY, UNLISTED, WHITE
from miniflow.ir import Graph
from miniflow.ops import OP_REGISTRY
from miniflow.passes.auto_mixed_precision import AmpConfig, AmpState, auto_mixed_precision
from miniflow.passes.autograd import AutogradState, autograd
from miniflow.passes.pipeline import CompileContext, CompileSettings, passes_for, run_passes
from miniflow.passes.prune_amp_identity import prune_amp_identity
from miniflow.ops import emitter

GOLDEN = Path(__file__).parent / "golden" / "amp"
UPDATE = os.environ.get("MINIFLOW_UPDATE_GOLDEN") == "1"
f16, f32 = mf.float16, mf.float32


# ------------------------------------------------------------------------------ helpers
def _amp(graph, trainable=(), lists=None):
    """Run autograd -> auto_mixed_precision -> prune_amp_identity; returns (ctx, golden text)."""
    ctx = CompileContext(CompileSettings(trainable=trainable, amp=AmpConfig(lists or AmpLists())))
    run_passes(graph, ctx, [("autograd", autograd)])
    before = str(graph)
    run_passes(graph, ctx, [("auto_mixed_precision", auto_mixed_precision)])
    after = str(graph)
    run_passes(graph, ctx, [("prune_amp_identity", prune_amp_identity)])
    report = amp_report(ctx.state[AmpState], graph)
    text = (f"# after autograd\n{before}\n\n# AMP report\n{report}\n\n"
            f"# after auto_mixed_precision\n{after}\n\n# after prune_amp_identity\n{graph}\n")
    return ctx, text


def _golden(name, text):
    path = GOLDEN / f"{name}.txt"
    header = f"# golden: {name}; regenerate: MINIFLOW_UPDATE_GOLDEN=1 pytest tests/test_amp.py\n"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + text)
        return
    assert path.exists(), f"{path} is missing; run MINIFLOW_UPDATE_GOLDEN=1 pytest tests/test_amp.py"
    assert header + text == path.read_text(), (
        f"IR differs from {path}; if the change is intended, regenerate with "
        f"MINIFLOW_UPDATE_GOLDEN=1 and review the diff. Got:\n{text}")


def _colors(ctx) -> dict:
    """``"op %out"`` -> color, for every node the AMP pass saw."""
    names = ctx.state[AmpState].names  # as the graph printed after the AMP pass names the values
    return {f"{d.node.op.name} %{names[d.node.outputs[0]]}": d.color
            for d in ctx.state[AmpState].decisions}


def _by_op(graph, op):
    return [n for n in graph.nodes if n.op.name == op]


def _producer(graph, v):
    return next((n for n in graph.nodes if v in n.outputs), None)


def _mlp_graph(*, black_before_sum=False):
    """x -> matmul(w) -> relu [-> black_identity] -> reduce_sum, returned as the loss."""
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (4, 3), f32)
    w = g.add_variable("w", (3, 2), f32)
    r = emit("relu", emit("matmul", x, w))
    if black_before_sum:
        r = emit("amp_black_identity", r)
    s = emit("reduce_sum", r)
    g.set_outputs([s])
    g.results["loss"] = s
    return g


# ------------------------------------------------------------------------------ lists
def test_every_op_type_is_in_exactly_one_list_or_documented_unlisted():
    lists = {"white": WHITE, "black": BLACK, "gray": GRAY, "clear": CLEAR}
    seen = {}
    for category, ops in lists.items():
        for op in ops:
            assert op in OP_REGISTRY, f"{op} in the {category} list is not a registered op type"
            assert op not in seen, f"{op} is in the {seen[op]} and the {category} list"
            seen[op] = category
    for op, reason in UNLISTED.items():
        assert op in OP_REGISTRY and op not in seen and reason, op
    missing = sorted(set(OP_REGISTRY) - set(seen) - set(UNLISTED))
    assert not missing, (f"op types in no AMP list and not documented in miniflow.amp.lists."
                         f"UNLISTED: {missing}")


def test_lists_follow_oneflow_after_pr_9126():
    lists = AmpLists()
    assert lists.ops("white") == ("amp_white_identity", "batch_matmul", "conv2d",
                                  "conv_bias_grad", "conv_data_grad", "conv_filter_grad",
                                  "matmul")
    assert lists.ops("black") == ("amp_black_identity",)
    assert {op: lists.category(op) for op in (
        "normalization", "normalization_grad", "avg_pool_2d", "avg_pool_2d_grad", "max_pool_2d",
        "max_pool_2d_grad", "relu", "reshape", "adaptive_avg_pool2d", "flatten")} == {
        "normalization": "gray", "normalization_grad": "gray", "avg_pool_2d": "gray",
        "avg_pool_2d_grad": "gray", "max_pool_2d": "clear", "max_pool_2d_grad": "clear",
        "relu": "clear", "reshape": "clear", "adaptive_avg_pool2d": None, "flatten": None}
    assert lists.category("sigmoid_grad") == "gray" and lists.category("sigmoid") is None
    assert lists.category("ones_like") == "clear" and lists.category("cast") is None
    assert {op: lists.category(op) for op in (
        "softmax", "softmax_grad", "layer_norm", "layer_norm_grad", "layer_norm_param_grad")} == {
        "softmax": "gray", "softmax_grad": "gray", "layer_norm": "gray",
        "layer_norm_grad": "gray", "layer_norm_param_grad": "gray"}


def test_lists_add_moves_remove_unlists_and_copies_are_independent():
    base = AmpLists()
    mine = base.with_changes(add={"black": "tanh"}, remove={"clear": ["identity"]})
    assert mine.category("tanh") == "black" and mine.category("identity") is None
    assert base.category("tanh") == "gray" and base == AmpLists()
    assert mine.copy() == mine and mine.copy() is not mine


def test_unknown_or_conflicting_op_type_names_are_rejected():
    with pytest.raises(ValueError, match=r"unknown op type\(s\) 'matmull'"):
        AmpLists(white=["matmull"])
    with pytest.raises(ValueError, match="'relu' is in both the gray and the clear list"):
        AmpLists(gray=GRAY + ("relu",))
    with pytest.raises(ValueError, match="cannot remove 'tanh' from the white list: it is in the "
                                         "gray list"):
        AmpLists().remove("white", "tanh")
    with pytest.raises(ValueError, match="unknown list 'grey'"):
        AmpLists().add("grey", "tanh")
    cfg = nn.GraphConfig()
    with pytest.raises(ValueError, match="'softmaks', 'tahn'"):
        cfg.enable_amp(black_add=["softmaks", "tahn"])
    with pytest.raises(ValueError, match="'tanh' is added to both the white and the black list"):
        cfg.enable_amp(white_add=["tanh"], black_add=["tanh"])


# ------------------------------------------------------------------------------ golden coloring
def test_matmul_relu_sum_loss_is_all_fp16_forward_and_backward():
    g = _mlp_graph()
    ctx, text = _amp(g, trainable=["w"])
    _golden("matmul_relu_sum", text)
    assert set(_colors(ctx).values()) == {"white"}  # the loss turns white via ones_like + matmul
    for n in g.nodes:
        if n.op.name != "cast":
            assert all(v.dtype is f16 for v in n.outputs), n.format()
    assert g.loss.dtype is f16 and g.grads["w"].dtype is f16
    assert ctx.state[AutogradState].initial_grad.dtype is f16
    out = _producer(g, g.outputs[0])  # graph outputs are read by an unlisted node: cast back
    assert out.op.name == "cast" and g.outputs[0].dtype is f32 and out.inputs[0] is g.loss
    assert g.variables["w"].dtype is f32


def test_black_identity_before_sum_keeps_sum_and_its_gradient_fp32():
    g = _mlp_graph(black_before_sum=True)
    ctx, text = _amp(g, trainable=["w"])
    _golden("black_identity_before_sum", text)
    colors = _colors(ctx)
    assert colors["reduce_sum %6"] == "black" and colors["broadcast_like %8"] == "black"
    (total,) = _by_op(g, "reduce_sum")
    (grad,) = _by_op(g, "broadcast_like")
    assert total.outputs[0].dtype is f32 and grad.outputs[0].dtype is f32
    h2f = _producer(g, total.inputs[0])  # relu's f16 output, cast up right before the sum
    assert h2f.op.name == "cast" and h2f.attrs["dtype"] is f32 and h2f.inputs[0].dtype is f16
    assert not [n for n in g.nodes if n.op.name.startswith("amp_")]  # pruned ...
    assert _by_op(g, "relu")[0].outputs[0].dtype is f16  # ... while their effect stays


def _gray_chain(white_identity):
    """Inference: x -> matmul(w) -> tanh -> scalar_mul [-> white_identity], returned."""
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (4, 3), f32)
    w = g.add_variable("w", (3, 2), f32)
    y = emit("scalar_mul", emit("tanh", emit("matmul", x, w)), scalar=2.0)
    if white_identity:
        y = emit("amp_white_identity", y)
    g.set_outputs([y])
    return g


def test_white_identity_pulls_a_gray_chain_to_fp16():
    plain = _gray_chain(white_identity=False)
    ctx, _ = _amp(plain)
    assert _colors(ctx) == {"matmul %2": "white", "tanh %4": "gray", "scalar_mul %5": "gray"}
    pulled = _gray_chain(white_identity=True)
    ctx, text = _amp(pulled)
    _golden("white_identity_gray_chain", text)
    assert _colors(ctx) == {"matmul %2": "white", "tanh %3": "white", "scalar_mul %4": "white",
                            "amp_white_identity %5": "white"}
    assert [n.outputs[0].dtype for n in pulled.nodes
            if n.op.name in ("tanh", "scalar_mul")] == [f16, f16]
    assert not _by_op(pulled, "amp_white_identity") and pulled.outputs[0].dtype is f32


def _black_gray_clear_gray(black_identity):
    """matmul -> [black_identity ->] tanh -> reshape -> scalar_mul -> matmul -> reduce_sum loss."""
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (4, 3), f32)
    w1 = g.add_variable("w1", (3, 2), f32)
    w2 = g.add_variable("w2", (2, 5), f32)
    h = emit("matmul", x, w1)
    if black_identity:
        h = emit("amp_black_identity", h)
    h = emit("scalar_mul", emit("reshape", emit("tanh", h), shape=(4, 2)), scalar=0.5)
    s = emit("reduce_sum", emit("matmul", h, w2))
    g.set_outputs([s])
    g.results["loss"] = s
    return g


def test_black_gray_clear_gray_stays_fp32():
    ctx, _ = _amp(_black_gray_clear_gray(black_identity=False), trainable=["w1", "w2"])
    assert {_colors(ctx)[k] for k in ("tanh %3", "reshape %4", "scalar_mul %5")} == {"white"}
    g = _black_gray_clear_gray(black_identity=True)
    ctx, text = _amp(g, trainable=["w1", "w2"])
    _golden("black_gray_clear_gray", text)
    colors = _colors(ctx)
    assert [colors[k] for k in ("tanh %5", "reshape %6", "scalar_mul %7")] == ["black"] * 3
    for op in ("tanh", "reshape", "scalar_mul", "tanh_grad"):
        assert all(n.outputs[0].dtype is f32 for n in _by_op(g, op)), op
    assert all(n.outputs[0].dtype is f16 for n in _by_op(g, "matmul"))


def _matmul_tanh_matmul():
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (4, 3), f32)
    w1 = g.add_variable("w1", (3, 2), f32)
    w2 = g.add_variable("w2", (2, 5), f32)
    s = emit("reduce_sum", emit("matmul", emit("tanh", emit("matmul", x, w1)), w2))
    g.set_outputs([s])
    g.results["loss"] = s
    return g


def test_user_added_black_op_type_is_honored():
    ctx, _ = _amp(_matmul_tanh_matmul(), trainable=["w1", "w2"])
    assert _colors(ctx)["tanh %3"] == "white"
    g = _matmul_tanh_matmul()
    ctx, text = _amp(g, trainable=["w1", "w2"], lists=AmpLists().add("black", "tanh"))
    _golden("user_black_tanh", text)
    # tanh_grad reads tanh's output, so black spreads into the backward pass too
    assert _colors(ctx)["tanh %4"] == "black" and _colors(ctx)["tanh_grad %14"] == "black"
    (tanh,) = _by_op(g, "tanh")
    assert tanh.outputs[0].dtype is f32 and _producer(g, tanh.inputs[0]).op.name == "cast"


def _conv_bn_relu_pool(training=True):
    """x -> conv2d(w) -> normalization(moving stats, gamma, beta) -> relu -> max_pool_2d ->
    conv2d(w2) -> reduce_sum, the loss: a ResNet block's layers between two convolutions."""
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (2, 3, 6, 6), f32)
    w = g.add_variable("w", (4, 3, 3, 3), f32)
    stats = [g.add_variable(n, (4,), f32) for n in ("mean", "var", "gamma", "beta")]
    w2 = g.add_variable("w2", (2, 4, 1, 1), f32)
    h = emit("conv2d", x, w, padding_before=1)
    h = emit("normalization", h, *stats, training=training)
    h = emit("max_pool_2d", emit("relu", h[0] if training else h), kernel_size=2)[0]
    s = emit("reduce_sum", emit("conv2d", h, w2))
    g.set_outputs([s])
    g.results["loss"] = s
    return g


def test_conv_bn_relu_pool_runs_in_fp16_with_fp32_statistics():
    """OneFlow's coloring of a CNN block: conv2d and its gradients white, batch norm (gray
    between white nodes) white with its moving statistics, gamma and beta left float32 (no-cast
    inputs, explained by amp_report), relu and max pool (clear) white, indices int64."""
    g = _conv_bn_relu_pool()
    ctx, text = _amp(g, trainable=["w", "gamma", "beta", "w2"])
    _golden("conv_bn_relu_pool", text)
    colors = {k.split()[0]: c for k, c in _colors(ctx).items()}
    for op in ("conv2d", "normalization", "relu", "max_pool_2d", "conv_data_grad",
               "conv_filter_grad", "max_pool_2d_grad", "relu_grad", "normalization_grad"):
        assert colors[op] == "white", op
    (bn,) = _by_op(g, "normalization")
    assert [v.dtype for v in bn.inputs] == [f16, f32, f32, f32, f32]
    assert [v.dtype for v in bn.outputs] == [f16, f32, f32]      # y; mean, inv_variance
    assert bn.written == [g.variables["mean"], g.variables["var"]]   # the variables themselves
    (bn_grad,) = _by_op(g, "normalization_grad")
    assert [v.dtype for v in bn_grad.inputs] == [f16, f16, f32, f32, f32]
    assert [v.dtype for v in bn_grad.outputs] == [f32, f32, f16]
    assert _by_op(g, "max_pool_2d")[0].outputs[1].dtype is mf.int64
    casts = [c.inputs[0] for c in _by_op(g, "cast")]
    assert not {g.variables[n] for n in ("mean", "var", "gamma", "beta")} & set(casts)
    report = str(amp_report(ctx.state[AmpState]))
    for name in ("moving_mean", "moving_variance", "gamma", "beta"):
        assert f"({name}, input" in report
    assert "normalization_grad" in report.split("no-cast inputs")[1]


def test_eval_bn_reads_its_statistics_without_casts_and_writes_nothing():
    g = _conv_bn_relu_pool(training=False)
    ctx, _ = _amp(g, trainable=["w", "gamma", "beta", "w2"])
    (bn,) = _by_op(g, "normalization")
    assert [v.dtype for v in bn.inputs] == [f16, f32, f32, f32, f32] and bn.written == []
    assert _colors(ctx)[f"normalization %{ctx.state[AmpState].names[bn.outputs[0]]}"] == "white"


# ------------------------------------------------------------------------------ rules in isolation
def _forward(*ops, returned=True):
    """x -> matmul(w) -> ops... ; the last value is returned (or left unread)."""
    g = Graph()
    emit = emitter(g)
    v = emit("matmul", g.add_input("x", (4, 3), f32), g.add_variable("w", (3, 3), f32))
    for op in ops:
        v = emit(op, v) if op != "matmul" else emit(op, v, g.variables["w"])
    g.set_outputs([v] if returned else [])
    return g


def test_a_returned_value_is_not_a_sink_but_an_unread_one_is():
    ctx, _ = _amp(_forward("tanh", returned=True))
    assert _colors(ctx)["tanh %4"] == "gray"
    ctx, _ = _amp(_forward("tanh", returned=False))
    assert _colors(ctx)["tanh %3"] == "white"


def test_unlisted_ops_run_fp32_and_do_not_pass_white_through():
    g = _forward("exp", "tanh", "matmul")
    ctx, _ = _amp(g)
    colors = [d.color for d in ctx.state[AmpState].decisions]
    assert colors == ["white", "unlisted", "gray", "white"]
    (exp,) = _by_op(g, "exp")
    assert exp.outputs[0].dtype is f32 and _producer(g, exp.inputs[0]).attrs["dtype"] is f32


def test_a_black_sink_with_a_white_producer_turns_white_as_in_oneflow():
    g = Graph()
    emit = emitter(g)
    a = emit("matmul", g.add_input("x", (4, 3), f32), g.add_variable("w", (3, 3), f32))
    b = emit("amp_black_identity", g.add_input("y", (4, 3), f32))
    emit("broadcast_add", a, b)  # unread: a sink, black-propagated, white producer
    ctx, _ = _amp(g)
    (add,) = ctx.state[AmpState].decisions[2:]
    assert add.color == "white" and "also black-propagated" in add.reason
    assert add.node.outputs[0].dtype is f16


def test_one_cast_per_value_and_dtype_shared_by_all_readers():
    g = _forward("matmul", "matmul")  # w read by three white matmuls
    ctx, _ = _amp(g)
    casts = [(id(n.inputs[0]), n.attrs["dtype"].name) for n in _by_op(g, "cast")]
    assert len(casts) == len(set(casts)) == 3  # x and w to f16, the output back to f32
    assert len({id(n.inputs[1]) for n in _by_op(g, "matmul")}) == 1


def test_only_float32_values_are_cast():
    g = Graph()
    emit = emitter(g)
    logits = emit("matmul", g.add_input("x", (4, 3), f32), g.add_variable("w", (3, 5), f32))
    _, loss = emit("sparse_softmax_cross_entropy", logits, g.add_input("y", (4,), mf.int64))
    g.set_outputs([emit("reduce_sum", loss)])
    _amp(g)
    assert all(n.inputs[0].dtype is not mf.int64 for n in _by_op(g, "cast"))


def test_parameters_stay_fp32_and_fp16_grads_are_cast_once_before_the_update():
    mf.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))

    class Step(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.1))
            # without the "fp32" policy's identity on the initial gradient, every grad is fp16
            self.config.enable_amp(True, loss_scale_policy="legacy")
            self.config.enable_fused_model_update_cast(False)  # the optimizer pass's casts

        def build(self, x):
            loss = self.model(x).sum()
            loss.backward()
            return loss

    step = Step()
    step(np.ones((5, 3), np.float32))
    ir = step.ir
    assert all(v.dtype is f32 for k, v in ir.variables.items()
               if k != "optimizer0.learning_rate")  # the lr: f64[1], used as given
    updates = _by_op(ir, "sgd_update")
    assert len(updates) == 4
    for u in updates:
        cast = _producer(ir, u.inputs[1])
        assert cast.op.name == "cast" and cast.inputs[0] is ir.grads[u.inputs[0].name]
        assert cast.inputs[0].dtype is f16 and u.inputs[1].dtype is f32
    to_f32 = [n for n in _by_op(ir, "cast") if n.inputs[0] in ir.grads.values()]
    assert len(to_f32) == 4


# ------------------------------------------------------------------------------ identities
def test_identity_ops_are_identity_with_same_op_gradient_and_public_functions():
    assert mf.amp.white_identity is nn.functional.white_identity
    assert mf.amp.black_identity is nn.functional.black_identity
    x = np.array([1.5, -2.0, 65504.0], np.float32)
    np.testing.assert_array_equal(mf.amp.white_identity(mf.tensor(x)).numpy(), x)
    g = Graph()
    emit = emitter(g)
    w = g.add_variable("w", (3,), f32)
    s = emit("reduce_sum", emit("amp_black_identity", emit("amp_white_identity", w)))
    g.results["loss"] = s
    autograd(g, CompileContext(CompileSettings(trainable=["w"])))
    ops = [n.op.name for n in g.nodes]
    assert ops.count("amp_white_identity") == 2 and ops.count("amp_black_identity") == 2


def test_pruning_an_identity_rewires_readers_outputs_and_the_loss():
    g = Graph()
    emit = emitter(g)
    w = g.add_variable("w", (3,), f32)
    s = emit("reduce_sum", emit("broadcast_mul", w, w))
    loss = emit("amp_white_identity", s)
    g.set_outputs([loss])
    g.results["loss"] = loss
    ctx, _ = _amp(g, trainable=["w"])
    assert not _by_op(g, "amp_white_identity")
    f2h = _producer(g, g.loss)  # the white identity's input was cast to f16; the loss is that now
    assert f2h.op.name == "cast" and f2h.inputs == [s] and g.loss.dtype is f16
    assert _producer(g, g.outputs[0]).inputs == [g.loss] and g.outputs[0].dtype is f32
    assert ctx.state[AutogradState].initial_grad in _by_op(g, "ones_like")[0].outputs
    g.verify()


def test_identities_run_as_copies_without_amp_and_are_pruned_with_it():
    class Fn(nn.Graph):
        def build(self, x):
            return mf.amp.black_identity(mf.amp.white_identity(x * 2.0))

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    plain = Fn()
    np.testing.assert_array_equal(plain(x).numpy(), x * 2)
    assert "amp_white_identity" in plain.ir.count_ops()
    amp = Fn()
    amp.config.enable_amp(True)
    np.testing.assert_array_equal(amp(x).numpy(), x * 2)
    assert not any(op.startswith("amp_") for op in amp.ir.count_ops())


# ------------------------------------------------------------------------------ seeing it
def test_amp_report_counts_and_to_dot(tmp_path):
    g = _mlp_graph(black_before_sum=True)
    ctx, _ = _amp(g, trainable=["w"])
    rep = amp_report(ctx.state[AmpState], g)
    assert (rep.n_fp16, rep.n_fp32, rep.n_casts) == (4, 3, 4)
    assert [r.kept for r in rep.rows if r.op == "amp_black_identity"] == [False, False]
    assert "4 float16 nodes, 3 float32 nodes, 4 inserted casts" in str(rep)
    dot = g.to_dot(str(tmp_path / "amp.png"))
    assert (tmp_path / "amp.dot").read_text() == dot
    assert 'label="reduce_sum\\n%5: f32[]", fillcolor=black' in dot   # named as str(g) names them
    assert 'label="matmul\\n%2: f16[4,2]", fillcolor=white' in dot and "fillcolor=gold" in dot


def test_amp_report_names_bfloat16_when_amp_runs_in_it():
    """The header said "float16 nodes" under ``enable_amp(True, bfloat16)`` too."""
    class Fn(nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)
            self.config.enable_amp(True, mf.bfloat16)

        def build(self, x):
            return self.lin(x)

    g = Fn()
    g(np.ones((2, 4), np.float32))
    assert str(g.amp_report()).startswith("AMP: 1 bfloat16 nodes, ")


def test_graph_amp_report_needs_amp_and_a_compiled_plan():
    class Fn(nn.Graph):
        def build(self, x):
            return x * 2.0

    g = Fn()
    with pytest.raises(RuntimeError, match="enable AMP"):
        g.amp_report()
    g.config.enable_amp(True)
    g(np.ones(3, np.float32))
    assert g.amp_report().rows[0].color == "gray"


def test_amp_passes_run_only_when_enabled():
    names = [n for n, _ in passes_for(CompileContext())]
    assert "auto_mixed_precision" not in names and "prune_amp_identity" not in names
    names = [n for n, _ in passes_for(CompileContext(CompileSettings(amp=AmpConfig(AmpLists()))))]
    assert names.index("autograd") < names.index("auto_mixed_precision") \
        < names.index("prune_amp_identity") < names.index("optimizer")


# ------------------------------------------------------------------------------ bad input
def test_half_parameters_are_rejected_master_weights_stay_fp32():
    model = nn.Linear(3, 2, bias=False)
    model.weight = nn.Parameter(model.weight.numpy().astype(np.float16))

    class Fn(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.config.enable_amp(True)

        def build(self, x):
            return self.model(x.to(mf.float16))

    with pytest.raises(TypeError, match="'model.weight' is float16.*master weights must stay "
                                        "float32"):
        Fn()(np.ones((2, 3), np.float32))


@pytest.mark.parametrize("dtype", [mf.float32, "int64", np.float64])
def test_enable_amp_rejects_dtypes_other_than_the_half_types(dtype):
    with pytest.raises(TypeError, match="dtype must be a half type, miniflow.float16 or "
                                        "miniflow.bfloat16"):
        nn.GraphConfig().enable_amp(True, dtype=dtype)
    cfg = nn.GraphConfig()
    cfg.enable_amp(True, dtype="bfloat16")
    assert cfg.amp.dtype is mf.bfloat16
    cfg.enable_amp(True, dtype="float16")
    assert cfg.amp.dtype is f16
    cfg.enable_amp(False)
    assert cfg.amp is None


def _attention_graph(black_scores):
    """Inference: ``softmax(q @ k^T * 0.5) @ v`` over ``[2, 3, 4]`` q, k, v (two ``batch_matmul``
    around the gray ``softmax``), the scores pinned with ``amp_black_identity`` if asked."""
    g = Graph()
    emit = emitter(g)
    q, k, v = (g.add_input(n, (2, 3, 4), f32) for n in "qkv")
    scores = emit("batch_matmul", q, k, transpose_b=True)
    if black_scores:
        scores = emit("amp_black_identity", scores)
    p = emit("softmax", emit("scalar_mul", scores, scalar=0.5))
    g.set_outputs([emit("batch_matmul", p, v)])
    return g


def test_softmax_between_two_batch_matmuls_runs_in_float16_golden():
    """OneFlow's rule: softmax is gray, its producer (through the gray scalar_mul) is the white
    batch_matmul and its consumer is white: float16, scores and all."""
    g = _attention_graph(black_scores=False)
    ctx, text = _amp(g)
    _golden("attention_softmax_fp16", text)
    assert _colors(ctx)["softmax %4"] == "white"
    (softmax,) = _by_op(g, "softmax")
    assert softmax.inputs[0].dtype is f16 and softmax.outputs[0].dtype is f16


def test_amp_black_identity_on_the_scores_keeps_softmax_float32_golden():
    g = _attention_graph(black_scores=True)
    ctx, text = _amp(g)
    _golden("attention_softmax_black_scores", text)
    (softmax,) = _by_op(g, "softmax")
    assert softmax.inputs[0].dtype is f32 and softmax.outputs[0].dtype is f32
    first, second = _by_op(g, "batch_matmul")
    assert first.outputs[0].dtype is f16 and second.outputs[0].dtype is f16
    assert _producer(g, second.inputs[0]).op.name == "cast"    # f32 softmax cast down for it


def test_layer_norm_between_matmuls_is_float16_with_float32_statistics_golden():
    """layer_norm is gray: float16 between white matmuls; its mean and inv_variance stay float32
    and reach layer_norm_grad / layer_norm_param_grad uncast (no-cast inputs)."""
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (4, 3), f32)
    w1, w2 = g.add_variable("w1", (3, 6), f32), g.add_variable("w2", (6, 2), f32)
    gamma, beta = g.add_variable("gamma", (6,), f32), g.add_variable("beta", (6,), f32)
    y, _, _ = emit("layer_norm", emit("matmul", x, w1), gamma, beta, begin_norm_axis=1,
                   begin_params_axis=1)
    g.results["loss"] = emit("reduce_sum", emit("matmul", y, w2), axis=None)
    ctx, text = _amp(g, trainable=["w1", "w2", "gamma", "beta"])
    _golden("layer_norm_between_matmuls", text)
    (ln,) = _by_op(g, "layer_norm")
    assert ln.outputs[0].dtype is f16 and ln.outputs[1].dtype is f32 and ln.outputs[2].dtype is f32
    for op in ("layer_norm_grad", "layer_norm_param_grad"):
        (node,) = _by_op(g, op)
        assert node.inputs[2] is ln.outputs[1] and node.inputs[3] is ln.outputs[2], op
        assert node.inputs[0].dtype is f16


class _Upcast(nn.Graph):
    """``gelu(y.<convert>()) @ y`` of a Linear's output under AMP."""

    def __init__(self, convert):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.convert = convert
        self.config.enable_amp(True)

    def build(self, x):
        y = self.lin(x)
        return nn.functional.gelu(self.convert(y)) @ y


@pytest.mark.parametrize("convert", [lambda t: t.to(mf.float32), lambda t: t.float(),
                                     lambda t: t.to(mf.get_backend().name, mf.float32)],
                         ids=["to", "float", "to_device_dtype"])
def test_an_explicit_float32_conversion_in_build_keeps_float32_under_amp(convert):
    """``y.float()`` in ``forward`` (PyTorch code computes in float32 after it under autocast)
    was this float32-at-trace-time tensor itself, so under AMP gelu ran in float16 where
    ``y.to(float32)``, a ``cast`` node, kept float32; both are a cast now, and gelu is computed
    in float32 between the float16 product and the float16 one after it."""
    graph = _Upcast(convert)
    graph(np.ones((4, 4), np.float32))
    exprs = [n.attrs["expr"] for n in graph.ir.nodes if n.op.name == "fused_elementwise"]
    assert any("gelu(f32(" in e for e in exprs), exprs
    here = mf.get_backend().name
    for keep in (lambda t: t, lambda t: t.to(here), lambda t: t.to(device=here)):
        plain = _Upcast(keep)             # to(device) changes no dtype, under AMP neither
        plain(np.ones((4, 4), np.float32))
        assert not any("gelu(f32(" in n.attrs["expr"] for n in plain.ir.nodes
                       if n.op.name == "fused_elementwise")


def test_amp_autocast_says_amp_is_a_graph_pass():
    """nanoGPT's ``ctx = torch.amp.autocast(device_type=device_type, dtype=ptdtype)`` was a
    bare "has no attribute 'autocast'"; the error says how a graph turns AMP on."""
    with pytest.raises(AttributeError, match=r"'autocast': AMP is a graph pass.*enable_amp\(True"):
        mf.amp.autocast
    with pytest.raises(AttributeError, match=r"^module 'miniflow.amp' has no attribute 'nope'$"):
        mf.amp.nope


def test_nanogpts_grad_scaler_lines_run():
    """``GradScaler("cuda", enabled=False)`` on a CPU was a ValueError (the device is not this
    process's) though a disabled scaler keeps nothing anywhere, and
    ``miniflow.cuda.amp.GradScaler(enabled=...)`` (nanoGPT's ``torch.cuda.amp.GradScaler``) a bare
    AttributeError: both are PyTorch's; an enabled scaler on another device is still refused."""
    assert not mf.amp.GradScaler("cuda", enabled=False).is_enabled()
    with pytest.warns(FutureWarning, match=r"use miniflow.amp.GradScaler\(args...\) instead"):
        old = mf.cuda.amp.GradScaler(init_scale=8.0, enabled=True)
    assert old.is_enabled() and old.get_scale() == 8.0
    if mf.get_backend().name == "cpu":
        with pytest.raises(ValueError, match="device='cuda' is not this process's device"):
            mf.amp.GradScaler("cuda")


def test_grad_scaler_enabled_false_scales_nothing_as_pytorchs():
    """nanoGPT's ``GradScaler(enabled=(dtype == 'float16'))`` for bfloat16 or float32 was a
    ValueError ("leave it out"); a disabled scaler is PyTorch's: ``is_enabled()`` False,
    ``get_scale()`` 1.0, ``state_dict()`` ``{}``, ``load_state_dict`` ignores its argument, and
    a graph given it has no scaler (its steps those of a graph without one, bit for bit). A
    non-bool ``enabled`` is a TypeError."""
    assert mf.amp.GradScaler(enabled=True).scale == 2.0 ** 16
    off = mf.amp.GradScaler(enabled=np.bool_(False))
    assert (off.is_enabled(), off.get_scale(), off.state_dict()) == (False, 1.0, {})
    off.load_state_dict(mf.amp.GradScaler(init_scale=8.0).state_dict())
    assert off.state_dict() == {} and "enabled=False" in repr(off)
    assert mf.amp.GradScaler().is_enabled()
    with pytest.raises(TypeError, match=r"GradScaler: enabled must be True or False, got 0"):
        mf.amp.GradScaler(enabled=0)
    runs = []
    for scaler in (None, mf.amp.GradScaler(init_scale=2.0 ** 10, enabled=False)):
        mf.manual_seed(0)
        model = nn.Linear(8, 3)
        graph = _TrainStep(model, scaler)
        assert graph.grad_scaler is None
        x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
        losses = [float(graph(x)) for _ in range(3)]
        runs.append((losses, [p.numpy().copy() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)


class _TrainStep(nn.Graph):
    """SGD steps of ``model(x).square().mean()`` under AMP float16, with ``scaler`` if any."""

    def __init__(self, model, scaler):
        super().__init__()
        self.model = model
        self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.1))
        self.config.enable_amp(True)
        if scaler is not None:
            self.set_grad_scaler(scaler)

    def build(self, x):
        loss = self.model(x).square().mean()
        loss.backward()
        return loss


def test_grad_scaler_takes_torch_amp_grad_scalers_positional_order():
    """``GradScaler(65536.0, 2.0, 0.5, 2000, True)`` set min_scale=True (1.0) silently and
    ``GradScaler("cpu")`` (torch.amp's device first) was a scale error: the order is
    torch.amp.GradScaler's (device, init_scale, growth_factor, backoff_factor,
    growth_interval, enabled), miniflow's min_scale and max_consecutive_skips keyword-only; a
    number as the device says to give init_scale by keyword, another device names the
    backend."""
    backend = mf.get_backend().name
    scaler = mf.amp.GradScaler(backend, 2.0 ** 10, 4.0, 0.25, 7, True)
    assert (scaler.scale, scaler.growth_factor, scaler.backoff_factor, scaler.growth_interval,
            scaler.min_scale) == (2.0 ** 10, 4.0, 0.25, 7, 1.0)
    assert mf.amp.GradScaler(None, 8.0, min_scale=0.5).min_scale == 0.5
    with pytest.raises(TypeError, match=r"GradScaler: the first argument is the device, as "
                                        r"torch.amp.GradScaler's, got 65536.0; give the scale "
                                        r"by keyword: GradScaler\(init_scale=65536.0\)"):
        mf.amp.GradScaler(65536.0)
    with pytest.raises(ValueError, match=r"GradScaler: device='meta' is not this process's"):
        mf.amp.GradScaler("meta")
    assert not mf.amp.GradScaler(None, 2.0 ** 16, 2.0, 0.5, 2000, False).is_enabled()
    torch = pytest.importorskip("torch")
    names = list(inspect.signature(torch.amp.GradScaler).parameters)
    assert list(inspect.signature(mf.amp.GradScaler).parameters)[:len(names)] == names


class _TypeAs(nn.Graph):
    """``z.type_as(x @ y)`` (a white matmul's result), read by a white matmul and a gray op and
    returned; ``z.type_as(x)`` (an input, float32)."""

    def __init__(self, dtype=None):
        super().__init__()
        if dtype is not None:
            self.config.enable_amp(True, dtype)

    def build(self, x, y, z):
        c = z.type_as(x @ y)
        return c, c * 2.0, c @ y.T, z.type_as(x)


@pytest.mark.parametrize("dtype", [mf.float16, mf.bfloat16], ids=["fp16", "bf16"])
def test_type_as_follows_the_dtype_amp_gives_the_other_tensor(dtype):
    """``z.type_as(h)`` cast to h's traced dtype (float32) even where the AMP pass makes h
    half, as PyTorch's autocast does not: it is op cast_like (OneFlow's), whose dtype follows
    h's after the pass; z is rounded to the half type there (values against NumPy's and
    ml_dtypes' rounding), and read back in float32 by the float32 nodes and outputs."""
    r = np.random.default_rng(5)
    x, y = r.standard_normal((5, 4), np.float32), r.standard_normal((4, 3), np.float32)
    z = (r.standard_normal((5, 3)) * 100).astype(np.float32)
    g = _TypeAs(dtype)
    ir = g.lower(x, y, z, after="amp")               # before fusion, which takes cast_like in
    like = [n for n in ir.nodes if n.op.name == "cast_like"]
    assert [n.outputs[0].dtype for n in like] == [dtype, f32]
    matmul = [n for n in ir.nodes if n.op.name == "matmul"][1]
    assert matmul.inputs[0] is like[0].outputs[0]           # read in half, no cast between
    c, c2, cy, zx = g(x, y, z)
    rounded = z.astype(dtype.np).astype(np.float64)
    assert c.dtype is f32 and not np.array_equal(rounded, z)
    np.testing.assert_array_equal(c.numpy(), rounded)
    np.testing.assert_array_equal(c2.numpy(), rounded * 2)
    np.testing.assert_array_equal(zx.numpy(), z)
    report = str(g.amp_report())
    assert "cast_like" in report and "dtype follows its no-cast dtype_like" in report


def test_type_as_without_amp_is_cast_like_with_todays_values():
    r = np.random.default_rng(6)
    x, y = r.standard_normal((5, 4), np.float32), r.standard_normal((4, 3), np.float32)
    z = r.standard_normal((5, 3)).astype(np.float32)
    g = _TypeAs()
    assert [n.outputs[0].dtype for n in g.lower(x, y, z, after="trace").nodes
            if n.op.name == "cast_like"] == [f32, f32]
    c, c2, cy, zx = g(x, y, z)
    np.testing.assert_array_equal(c.numpy(), z)
    np.testing.assert_allclose(cy.numpy(), z @ y.T.astype(np.float64), rtol=1e-5, atol=1e-5)
    t = mf.tensor(z)                                         # eager: to(other.dtype) as before
    assert t.type_as(mf.tensor(x).half()).dtype is f16
    with pytest.raises(TypeError, match=r"type_as\(\): argument 'other' \(position 1\) must be "
                                        r"Tensor, not float"):
        t.type_as(1.0)


def test_type_as_under_amp_trains_its_gradient_cast_back_to_the_parameter():
    """The gradient of cast_like is cast back to x's dtype: a float32 parameter read as
    ``w.type_as(h)`` with h half takes SGD's step from it."""
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(np.full((5, 3), 0.5, np.float32))

        def forward(self, x, y):
            return (self.w.type_as(x @ y) * 3.0).sum()

    class Step(nn.Graph):
        def __init__(self, model):
            super().__init__()
            self.model = model
            self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.1))
            self.config.enable_amp(True)

        def build(self, x, y):
            loss = self.model(x, y)
            loss.backward()
            return loss

    model = Model()
    step = Step(model)
    x, y = np.ones((5, 4), np.float32), np.ones((4, 3), np.float32)
    assert float(step(x, y)) == pytest.approx(0.5 * 3 * 15)
    np.testing.assert_allclose(model.w.numpy(), 0.5 - 0.1 * 3.0, rtol=1e-6)
    assert [n.outputs[0].dtype for n in step.lower(x, y, after="amp").nodes
            if n.op.name == "cast_like"] == [f16]
