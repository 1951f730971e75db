"""The plain IR: named results that every pass treats alike, ``uses``/``users``, insertion
points, print-time numbering, op definitions on nodes, the compile driver's context, and the
printer (every value it prints is declared, small constants shown, the README's IR sample is the
real output of the code beside it)."""
import io
import re
import warnings
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

import miniflow as mf
from miniflow.compiler import driver
from miniflow import nn
from miniflow.ir import Graph, evaluate, grad_name
from miniflow.ops import emitter, get_op
from miniflow.passes.auto_mixed_precision import AmpState
from miniflow.passes.autograd import AutogradState
from miniflow.passes.dead_code_elimination import dead_code_elimination
from miniflow.passes.fuse_elementwise import fuse_elementwise
from miniflow.amp import GradScaler, StaticGradScaler
from miniflow.experiments.mlp import EvalGraph, TrainGraph
from miniflow.passes.loss_scale import LossScaleOverflowWarning

from graph_cases import Step, small_mlp, xy

README = Path(__file__).resolve().parent.parent / "README.md"

f32 = mf.float32


def _chain():
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (2, 3), f32)
    a = emit("relu", x)
    b = emit("exp", a)
    c = emit("broadcast_add", a, b)
    return g, emit, x, a, b, c


def test_a_node_holds_its_op_definition_and_emit_refuses_a_name():
    g, _, x, a, _, _ = _chain()
    assert a.producer.op is get_op("relu") and a.producer.op.name == "relu"
    with pytest.raises(TypeError, match=r"Graph.emit takes an OpDef, got the name 'relu': use "
                                         r"miniflow.ops.get_op\('relu'\)"):
        g.emit("relu", x)


def test_uses_and_users_list_the_readers_in_graph_order():
    g, _, x, a, b, c = _chain()
    assert g.uses(a) == [b.producer, c.producer]
    assert g.uses(c) == [] and g.uses(x) == [a.producer]
    users = g.users()
    assert users[a] == g.uses(a) and users[x] == g.uses(x) and c not in users


def test_insertion_points_put_nodes_after_or_before_a_node_in_emit_order():
    g, emit, x, a, b, c = _chain()
    with g.inserting_after(a.producer):
        n1 = emit("negative", a)
        n2 = emit("tanh", n1)
    with g.inserting_before(c.producer):
        n3 = emit("identity", b)
        n4 = emit("identity", n3)
    n5 = emit("sigmoid", c)                     # outside a block: appended
    order = [n.outputs[0] for n in g.nodes]
    assert order == [a, n1, n2, b, n3, n4, c, n5]
    g.verify()


def test_the_printer_numbers_values_in_order_and_declares_constants():
    g, emit, x, a, b, c = _chain()
    k = g.add_constant(np.full((2, 3), 2.0, np.float32))
    g.set_outputs([emit("broadcast_mul", c, k)])
    with g.inserting_before(a.producer):        # defined first now: it is %0
        first = emit("negative", x)
    text = str(g)
    assert re.findall(r"^  %(\d+):", text, re.M) == ["0", "1", "2", "3", "4"]
    assert "    %c0: f32[2,3],  # constant [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]" in text
    assert "%4: f32[2,3] = broadcast_mul(%3, %c0)" in text and "return (%4)" in text
    assert g.names()[first] == "0" and first.name != "0"  # names are given when printing


def test_results_are_kept_pinned_and_rewired_alike():
    g, emit, x, a, b, c = _chain()
    g.results["custom"] = b                    # any named result, not only outputs
    g.set_outputs([c])
    dead = emit("tanh", a)
    dead_code_elimination(g)
    assert dead.producer not in g.nodes and b.producer in g.nodes
    fused = fuse_elementwise(g)
    (node,) = fused.nodes
    assert b in node.outputs and c in node.outputs   # every result is an output of its fused node
    fresh = emitter(fused)("identity", b)
    fused.replace_uses(b, fresh)
    assert fused.results["custom"] is fresh
    assert "# results: custom=%" in str(fused)


def test_fusion_keeps_the_float64_reference_result():
    """evaluate() of a fused graph equals evaluate() of the unfused one: the fused reference
    interprets its expression with the same float64 functions (and rounds only at casts)."""
    g, emit, x, a, b, c = _chain()
    g.set_outputs([emit("scalar_mul", emit("cast", c, dtype=mf.float16), scalar=0.5)])
    arrays = [np.random.default_rng(0).uniform(-3, 3, (2, 3)).astype(np.float32)]
    want = evaluate(g, arrays)["output0"]
    fused = fuse_elementwise(g)
    assert [n.op.name for n in fused.nodes] == ["fused_elementwise"]
    np.testing.assert_array_equal(evaluate(fused, arrays)["output0"], want)


def test_training_results_and_the_compile_context():
    mf.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))

    class Step(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.1))

        def build(self, x):
            loss = self.model(x).sum()
            loss.backward()
            return loss

    step = Step()
    with pytest.raises(RuntimeError, match="nothing is compiled yet; call the graph once"):
        step.compile_context
    step(np.ones((4, 3), np.float32))
    ir, ctx = step.ir, step.compile_context
    assert set(ir.results) == {"output0", "loss", grad_name("model.0.weight"),
                               grad_name("model.0.bias")}
    assert ir.outputs == [ir.loss] and ir.grads["model.0.bias"] is ir.results["grad:model.0.bias"]
    assert ctx.state[AutogradState].initial_grad.producer.op.name == "ones_like"
    assert ctx.state.get(AmpState) is None
    assert next(iter(step.plans.values())).context is ctx
    assert nn.Graph is driver.Graph and nn.GraphConfig is driver.GraphConfig  # the re-export


# ------------------------------------------------------------------------------ 4. IR printer
_DECLARED = re.compile(r"^\s+%([\w.]+): ", re.M)  # header lines: inputs, variables, constants


def _undeclared(text: str) -> set:
    declared = set(_DECLARED.findall(text))
    for line in text.splitlines():
        if " = " in line and not line.startswith("    %"):  # node outputs: the left-hand side
            declared.update(re.findall(r"%([\w.]+):", line.split(" = ")[0]))
    return set(re.findall(r"%([\w.]+)", text)) - declared


def _graphs():
    x, y = xy()
    model = small_mlp()
    yield "sgd", Step(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)), (x, y)
    model = small_mlp()
    yield "eval", EvalGraph(model), (x,)
    for policy in ("legacy", "cast_back", "fp32"):
        for scaler in (GradScaler(), StaticGradScaler(1024.0)):
            model = small_mlp()
            yield (f"{policy}-{type(scaler).__name__}",
                   Step(model, mf.optim.Adam(model.parameters()), scaler, policy), (x, y))
    model = small_mlp()
    yield "train", TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1)), (x, y)


def test_the_ir_printer_declares_every_value_it_uses():
    for label, g, inputs in _graphs():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LossScaleOverflowWarning)  # legacy/cast_back at 2^16
            g(*inputs)
        text = str(g.ir)
        assert not _undeclared(text), (label, _undeclared(text), text)
        if label == "sgd":
            assert re.search(r"^    %c\d+: i64\[1\],  # constant \[0\]$", text, re.M), text


def test_the_printer_shows_small_constant_values_and_summarises_large_ones():
    g = Graph()
    x = g.add_input("x", (2, 16), mf.float32)  # small: [2,1], broadcast over the columns
    small = g.add_constant(np.array([[0.5], [2.0]], np.float32))
    large = g.add_constant(np.zeros((2, 16), np.float32))
    emit = emitter(g)
    g.set_outputs([emit("broadcast_add", emit("broadcast_mul", x, small), large)])
    text, names = str(g), g.names()
    assert f"    %{names[small]}: f32[2,1],  # constant [[0.5], [2.0]]" in text
    assert f"    %{names[large]}: f32[2,16],  # constant (32 elements)" in text
    assert not _undeclared(text)


def test_the_readme_ir_sample_is_the_real_output_of_the_code_beside_it():
    section = README.read_text().split("## What it looks like", 1)[1].split("\n## ", 1)[0]
    code, printed = re.findall(r"```(?:python)?\n(.*?)```", section, re.S)[:2]
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    real = out.getvalue().splitlines()
    shown = printed.rstrip("\n").splitlines()
    assert any(ln.strip() == "..." for ln in shown) and len(shown) > 10
    position = 0
    for line in shown:  # every line shown is a real line, in the real order
        if line.strip() == "...":
            continue
        assert line in real[position:], f"README line not in the real output (in order): {line!r}"
        position = real.index(line, position) + 1
    assert not _undeclared("\n".join(real))
