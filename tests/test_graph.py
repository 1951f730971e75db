"""nn.Graph tracing, IR printing/verification, plan reuse, the flat hot path and eager mode
(Tensor methods against ``torch.Tensor``'s when torch is installed), freezing parameters
(``requires_grad``) and ``no_grad``, and threads: one graph called, compiled or traced from
several threads at once."""
import gc
import itertools
import re
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.ir import Graph, VerifyError, evaluate
from miniflow.ops import emitter, inference_calls
from miniflow.experiments.mlp import EvalGraph, TrainGraph, mlp
from miniflow.passes.autograd import AutogradState
from miniflow.amp import GradScaler

from graph_cases import Step, param_arrays, small_mlp, xy

try:
    import torch
except ImportError:   # torch is optional: its comparisons skip
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def _train_graph(seed=0, hidden=8):
    mf.manual_seed(seed)
    model = mlp((4, hidden, 3))
    return model, TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))


def _batch(n=5, seed=0):
    r = np.random.default_rng(seed)
    return r.random((n, 4), dtype=np.float32), r.integers(0, 3, n).astype(np.int64)


def test_ir_printer_one_line_per_node_with_types():
    _, g = _train_graph()
    g(*_batch())
    text = str(g.ir)
    assert re.search(r"%\d+: f32\[5,8\] = matmul\(%x, %model\.0\.weight\) \{transpose_a=False, "
                     r"transpose_b=True\}", text), text
    assert "ones_like(%" in text and "sgd_update(%model.0.weight" in text
    assert "%model.2.bias: f32[3],  # variable" in text
    assert re.search(r"^    %c\d+: i64\[1\],  # constant \[0\]$", text, re.M), text  # skip_if
    body = [ln for ln in text.splitlines() if ln.startswith("  ") and not ln.startswith("    ")]
    assert len([ln for ln in body if " = " in ln or "_update(" in ln]) == len(g.ir.nodes)


def test_verifier_names_the_node_and_prints_context():
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (2, 3), mf.float32)
    y = emit("relu", x)
    emit("exp", y)
    g.nodes[1].outputs[0].shape = (3, 2)
    with pytest.raises(VerifyError, match=r"node 1 \(exp\).*infers f32\[2,3\]") as e:
        g.verify()
    assert "--> " in str(e.value) and "relu(%x)" in str(e.value)
    g2 = Graph()
    emit2 = emitter(g2)
    a = g2.add_input("a", (2,), mf.float32)
    late = emit2("negative", a)
    emit2("exp", a)
    g2.nodes.reverse()  # use before definition
    g2.nodes[0].inputs = [late]
    with pytest.raises(VerifyError, match="used before it is defined"):
        g2.verify()


def test_verifier_names_values_as_the_printer_does():
    """Undefined values print as ``%?<tag>`` (a tag may equal another value's printed number), and
    an op's inference error names the node's inputs by their printed names, not their tags."""
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (3,), mf.float32)
    a = emit("relu", x)
    emit("exp", emit("negative", a))      # tags 1, 2, 3: printed %0, %1, %2
    del g.nodes[1]                         # drop negative without rewiring exp
    with pytest.raises(VerifyError, match=r"node 1 \(exp\): input %\?2 is defined nowhere in the "
                                          r"graph .*replace_uses") as e:
        g.verify()
    assert "--> %1: f32[3] = exp(%?2)" in str(e.value)
    g = Graph()
    emit = emitter(g)
    a = emit("relu", g.add_input("x", (3,), mf.float32))
    b = emit("relu", g.add_input("y", (4,), mf.float32))
    emit("broadcast_mul", a, a).producer.inputs = [a, b]
    with pytest.raises(VerifyError, match=r"shapes \[3\] of %0 and \[4\] of %1 cannot be "
                                          r"broadcast"):
        g.verify()


def test_plan_reused_for_same_signature_and_new_plan_for_new_shape():
    _, g = _train_graph()
    g(*_batch(5))
    g(*_batch(5, seed=1))
    assert g.compile_count == 1
    g(*_batch(7))
    assert g.compile_count == 2 and len(g.plans) == 2


def test_a_0d_input_stays_0d_whatever_came_before():
    """A 0-d array, 0-d Tensor or Python float is a 0-d graph input, as a 0-d tensor in PyTorch:
    the first input of a dtype once became shape [1] (``np.ascontiguousarray`` makes ndim >= 1),
    later ones of that dtype stayed 0-d."""
    class Scale(nn.Graph):
        def build(self, w, x):
            return (x * w).sum() * w

    x = np.ones((2, 3), np.float32)
    for w in (np.array(2.0, np.float32), mf.tensor(2.0), 2.0, np.float32(2.0),
              np.array(2.0, np.float32)):
        out = Scale()(w, x)
        assert out.shape == () and float(out.numpy()) == 24.0, (type(w), out.shape)
    with_1d = Scale()(np.array([2.0], np.float32), x)
    assert with_1d.shape == (1,)


def test_assigning_an_attribute_build_read_recompiles_and_others_do_not():
    """As ``torch.compile`` guards what a compiled function read: a new value of a graph
    attribute that ``build`` read is used at the next call (it was silently ignored); an equal
    one, one that build never read (a step counter), or one build assigns itself, recompiles
    nothing."""
    class Logits(nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin, self.temperature, self.step = nn.Linear(3, 2), 1.0, 0

        def build(self, x):
            self.traced_with = self.temperature
            return self.lin(x) / self.temperature

    x = np.ones((4, 3), np.float32)
    g = Logits()
    a = g(x).numpy()
    for _ in range(3):
        g.step += 1
        g(x)
    assert g.compile_count == 1 and type(g) is Logits
    g.temperature = 2.0
    np.testing.assert_allclose(g(x).numpy(), a / 2, rtol=1e-6)
    g.temperature = 2.0
    g(x)
    assert g.compile_count == 2 and g.traced_with == 2.0


def test_plan_cache_keeps_at_most_8_lru():
    _, g = _train_graph()
    for n in range(1, 11):
        g(*_batch(n))
    assert len(g.plans) == 8
    sizes = [k[0][0][0] for k in g.plans]
    assert sizes == list(range(3, 11))


def test_variables_shared_between_plans_and_modules():
    model, g = _train_graph()
    w0 = model[0].weight.numpy()
    g(*_batch(5))
    w1 = model[0].weight.numpy()
    assert not np.array_equal(w0, w1)
    g(*_batch(6))  # a second plan updates the same storage
    assert not np.array_equal(w1, model[0].weight.numpy())
    eager = model(mf.tensor(_batch(2)[0])).numpy()
    graph_out = EvalGraph(model)(_batch(2)[0]).numpy()
    np.testing.assert_array_equal(eager, graph_out)


def test_hot_path_runs_no_inference_and_allocates_no_node_buffers():
    _, g = _train_graph(hidden=64)
    x, y = _batch(32)
    g(x, y)
    calls = inference_calls()
    grown = []
    tracemalloc.start()
    for _ in range(3):      # tracemalloc counts every thread's allocations: pytest-xdist's
        base, _ = tracemalloc.get_traced_memory()   # message thread may add some to one window,
        tracemalloc.reset_peak()                    # a buffer of the step would be in all three
        for _ in range(20):
            g(x, y)
        grown.append(tracemalloc.get_traced_memory()[1] - base)
    tracemalloc.stop()
    assert inference_calls() == calls
    # a single per-node buffer here is 32*64*4 = 8 KiB; the steady-state step must stay far below
    assert min(grown) < 4096, grown


def test_print_ir_after_every_pass(capsys):
    _, g = _train_graph()
    g.config.debug(print_ir=True)
    g(*_batch())
    out = capsys.readouterr().out
    for name in ("trace", "autograd", "optimizer", "dead_code_elimination"):
        assert f"# IR after {name}" in out


def test_autograd_records_initial_grad_and_sums_fan_out():
    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.add_optimizer(mf.optim.SGD(self.lin.parameters(), lr=0.1))

        def build(self, x):
            h = self.lin(x)
            loss = (h * h + h).sum()  # h fans out twice
            loss.backward()
            return loss

    g = G()
    g(np.ones((2, 3), np.float32))
    ir, initial_grad = g.ir, g.compile_context.state[AutogradState].initial_grad
    assert initial_grad.producer.op.name == "ones_like"
    assert initial_grad.producer.inputs[0] is ir.loss
    assert ir.count_ops().get("add_n", 0) >= 1


def test_inference_graph_has_no_backward_or_updates():
    model, _ = _train_graph()
    e = EvalGraph(model)
    e(_batch()[0])
    ops = e.ir.count_ops()
    assert "ones_like" not in ops and "sgd_update" not in ops


def test_state_dict_round_trip_and_checks():
    model, _ = _train_graph()
    sd = model.state_dict()
    assert list(sd) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert sd["0.weight"].shape == (8, 4)
    sd["0.bias"][:] = 7
    model.load_state_dict(sd)
    assert (model[0].bias.numpy() == 7).all()
    with pytest.raises(KeyError, match="missing keys"):
        model.load_state_dict({"0.weight": sd["0.weight"]})
    bad = dict(sd)
    bad["0.weight"] = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="0.weight"):
        model.load_state_dict(bad)
    bad["0.weight"] = sd["0.weight"].astype(np.complex64)
    with pytest.raises(TypeError, match="0.weight"):
        model.load_state_dict(bad)


def test_eager_tensor_api():
    a = mf.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = mf.tensor([0.5, -1.0])
    assert a.dtype is mf.float32
    np.testing.assert_allclose((a + b).numpy(), [[1.5, 1.0], [3.5, 3.0]])
    np.testing.assert_allclose((a @ a).numpy(), np.array([[7, 10], [15, 22]]))
    np.testing.assert_allclose((2 - a).numpy(), 2 - a.numpy())
    np.testing.assert_allclose((1 / a).numpy(), 1 / a.numpy(), rtol=1e-6)
    np.testing.assert_allclose(a.mean(axis=0).numpy(), [2, 3])
    np.testing.assert_allclose((-a).T.numpy(), -a.numpy().T)
    assert a.to(mf.float16).dtype is mf.float16
    np.testing.assert_allclose(nn.functional.softmax(a, dim=0).numpy().sum(0), [1, 1], rtol=1e-6)
    assert a.reshape(4).shape == (4,)
    with pytest.raises(RuntimeError, match="inside nn.Graph.build"):
        a.sum().backward()


def test_lower_returns_any_stage_without_compiling():
    """``nn.Graph.lower``: the IR after a stage, as ``torch.fx``'s traced graph is read without
    running it; nothing is compiled or cached."""
    model = mlp((4, 3))
    g = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    x, y = np.zeros((2, 4), np.float32), np.zeros(2, np.int64)
    assert g.stages(x, y) == ["trace", "autograd", "gradient_accumulation", "loss_scale",
                              "optimizer", "fuse_elementwise", "dead_code_elimination"]
    assert "sgd_update" not in g.lower(x, y, after="autograd").count_ops()
    assert g.lower(x, y, after="trace").loss is not None
    assert "sgd_update" in g.lower(x, y).count_ops()
    assert g.compile_count == 0 and not g.plans
    with pytest.raises(ValueError, match=r"after='amp' is no stage(.|\n)*runs only with AMP"):
        g.lower(x, y, after="amp")
    g.config.enable_amp(True)
    amp = g.lower(x, y, after="amp")
    assert {n.meta.get("amp_color") for n in amp.nodes} >= {"white", "cast"}
    # the half weight copies of fuse_model_update_cast have values (the parameters rounded):
    # evaluate ran into "variable %...float16_copy has no value" before any call
    x = np.random.default_rng(0).uniform(-1, 1, (2, 4)).astype(np.float32)
    lowered = g.lower(x, y)
    copy = lowered.variable_data["model.0.weight.float16_copy"]
    np.testing.assert_array_equal(copy, model[0].weight.numpy().astype(np.float16))
    assert g.compile_count == 0
    want = evaluate(lowered, [x, y])["loss"]
    assert abs(float(g(x, y).numpy()) - want) < 1e-3
    assert copy is not g.ir.variable_data["model.0.weight.float16_copy"]   # its own array


def test_to_dot_draws_a_returned_input():
    """A new user's finding: a value no node makes (``build`` returning its input) was left out
    of ``to_dot``, the ``return`` node alone."""
    class Identity(nn.Graph):
        def build(self, x):
            return x

    g = Identity()
    g(np.ones(2, np.float32))
    dot = g.ir.to_dot()
    assert 'v0 [shape=ellipse, fillcolor=white, label="%x\\ninput"];' in dot
    assert 'v0 -> ret [label="f32[2]"];' in dot


# ------------------------------------------------------------------ requires_grad (freezing)
def _frozen_run(amp: bool, freeze, steps=10, exclude=False):
    """``steps`` SGD steps (momentum, weight decay) of the small MLP with the parameters named in
    ``freeze`` frozen (``exclude``: left out of the optimizer instead, PyTorch's equivalent)."""
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    named = dict(model.named_parameters())
    for n in freeze:
        named[n].requires_grad_(exclude)  # excluded parameters keep requires_grad=True
    params = [p for n, p in named.items() if not (exclude and n in freeze)]
    g = TrainGraph(model, mf.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.05))
    if amp:
        g.config.enable_amp(True)
    losses = [float(g(*_batch(seed=s)).numpy()) for s in range(steps)]
    return model, g, losses


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
def test_a_frozen_parameter_is_bit_identical_after_10_steps_while_the_others_train(amp):
    """``torch.Tensor.requires_grad`` (PyTorch's "Excluding subgraphs from backward" notes):
    a parameter with ``requires_grad=False`` gets no gradient and the optimizer skips it, even
    under momentum and weight decay; the rest trains exactly as with the parameter left out of
    the optimizer."""
    mf.manual_seed(0)
    start = mlp((4, 8, 3)).state_dict()
    frozen = ("0.weight", "2.bias")
    model, g, losses = _frozen_run(amp, frozen)
    end = model.state_dict()
    for n in frozen:
        np.testing.assert_array_equal(end[n], start[n], err_msg=n)
    for n in ("0.bias", "2.weight"):
        assert not np.array_equal(end[n], start[n]), n
    ir = str(g.ir)  # no update, so no momentum state, for the frozen ones
    assert [n for n in start if f"%model.{n}.momentum_buffer" in ir] == ["0.bias", "2.weight"]
    ref_model, _, ref_losses = _frozen_run(amp, frozen, exclude=True)
    assert losses == ref_losses
    for n, v in ref_model.state_dict().items():
        np.testing.assert_array_equal(end[n], v, err_msg=n)


class _Distill(nn.Graph):
    """A student fitted to a teacher's softmax computed under ``no_grad`` (both in the
    optimizer: only the student may change)."""

    def __init__(self, student, teacher):
        super().__init__()
        self.s, self.t = student, teacher
        self.add_optimizer(mf.optim.SGD([*student.parameters(), *teacher.parameters()], lr=0.1))

    def build(self, x):
        with mf.no_grad():
            target = self.t(x).softmax(-1) * 2.0
        loss = ((self.s(x) - target) ** 2).mean()
        loss.backward()
        return loss


def test_no_grad_inside_build_stops_gradients_as_torch_and_is_a_no_op_outside():
    """``torch.no_grad()`` in build: the teacher's parameters get no gradient (read through one
    ``detach`` each; the graph input needs none) and the student trains as PyTorch's over 3
    steps; batch norm's running statistics still move under it (a buffer is not detached: the
    op writes it in place); outside a build (eager, a decorator) it changes nothing."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    mf.manual_seed(0)
    student, teacher = nn.Linear(4, 3), nn.Linear(4, 3)
    teacher_start = teacher.state_dict()
    ts, tt = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    for mine, ref in ((student, ts), (teacher, tt)):
        ref.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in mine.state_dict().items()})
    opt = torch.optim.SGD([*ts.parameters(), *tt.parameters()], lr=0.1)
    step = _Distill(student, teacher)
    for _ in range(3):
        loss = step(x)
        with torch.no_grad():
            target = tt(torch.tensor(x)).softmax(-1) * 2.0
        ref = ((ts(torch.tensor(x)) - target) ** 2).mean()
        opt.zero_grad()
        ref.backward()
        opt.step()
        np.testing.assert_allclose(float(loss.numpy()), ref.item(), rtol=1e-6)
    np.testing.assert_allclose(student.weight.numpy(), ts.weight.detach().numpy(), atol=1e-6)
    for k, v in teacher.state_dict().items():
        np.testing.assert_array_equal(v, teacher_start[k], err_msg=k)
    assert [n.inputs[0].name for n in step.ir.nodes if n.op.name == "detach"] == \
        ["t.weight", "t.bias"]

    bn = nn.BatchNorm1d(4)          # training mode under no_grad: its statistics still move

    class Stats(nn.Graph):
        def __init__(self):
            super().__init__()
            self.bn = bn

        def build(self, a):
            with mf.no_grad():
                return self.bn(a)

    Stats()(x)
    ref_bn = torch.nn.BatchNorm1d(4)
    with torch.no_grad():
        ref_bn(torch.tensor(x))
    np.testing.assert_allclose(bn.running_mean.numpy(), ref_bn.running_mean.numpy(), atol=1e-7)
    np.testing.assert_allclose(bn.running_var.numpy(), ref_bn.running_var.numpy(), atol=1e-6)

    @mf.no_grad()
    def forward(a):
        return student(a)

    with mf.no_grad():
        eager = student(mf.tensor(x)).numpy()
    np.testing.assert_array_equal(forward(mf.tensor(x)).numpy(), eager)


class _Teacher(nn.Module):
    """A module whose forward is decorated with ``@no_grad`` without parentheses."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    @mf.no_grad
    def forward(self, x):
        return self.lin(x)


def test_no_grad_without_parentheses_decorates_as_torch():
    """``@torch.no_grad`` (no call) decorates a function as ``@torch.no_grad()`` does; it was
    "no_grad.__init__() takes 1 positional argument but 2 were given". Its forward takes no
    gradient in a build: the teacher's parameters stay as they were; something that is not
    callable is refused."""
    mf.manual_seed(0)
    student, teacher = nn.Linear(4, 3), _Teacher()
    start = teacher.state_dict()
    step = _Distill(student, teacher)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    step(x)
    for k, v in teacher.state_dict().items():
        np.testing.assert_array_equal(v, start[k], err_msg=k)
    assert not np.array_equal(student.weight.numpy(), nn.Linear(4, 3).weight.numpy())
    np.testing.assert_array_equal(teacher(mf.tensor(x)).numpy(), teacher.lin(mf.tensor(x)).numpy())
    with pytest.raises(TypeError, match="no_grad: expects a function to decorate, got int"):
        mf.no_grad(1)


def _grad_mode_loss(lib, student, teacher, x, variant, seen):
    """The distillation loss of :class:`_Distill` written with ``lib``'s grad-mode functions
    (``miniflow`` or ``torch``: the same names), ``variant`` choosing how the teacher's part is
    kept out of the gradient; ``seen`` collects ``lib.is_grad_enabled()`` along the way."""
    seen.append(lib.is_grad_enabled())
    if variant == "enable_grad inside no_grad":
        with lib.no_grad():
            target = teacher(x).softmax(-1)
            seen.append(lib.is_grad_enabled())
            with lib.enable_grad():
                out = student(x) * 1.0
                seen.append(lib.is_grad_enabled())
    elif variant == "set_grad_enabled as a function":
        out = student(x)
        lib.set_grad_enabled(False)
        seen.append(lib.is_grad_enabled())
        target = teacher(x).softmax(-1)
        lib.set_grad_enabled(True)
    else:                   # "set_grad_enabled(False)" / "(True)" as a context
        with lib.set_grad_enabled(variant.endswith("(True)")):
            seen.append(lib.is_grad_enabled())
            target = teacher(x).softmax(-1)
        out = student(x)
    seen.append(lib.is_grad_enabled())
    return ((out - target) ** 2).mean()


class _GradModeStep(nn.Graph):
    def __init__(self, student, teacher, variant):
        super().__init__()
        self.s, self.t, self.variant, self.seen = student, teacher, variant, []
        self.add_optimizer(mf.optim.SGD([*student.parameters(), *teacher.parameters()], lr=0.1))

    def build(self, x):
        loss = _grad_mode_loss(mf, self.s, self.t, x, self.variant, self.seen)
        loss.backward()
        return loss


@pytest.mark.parametrize("variant", ["enable_grad inside no_grad", "set_grad_enabled as a function",
                                     "set_grad_enabled(False)", "set_grad_enabled(True)"])
def test_enable_grad_and_set_grad_enabled_in_build_train_as_torch(variant):
    """``enable_grad`` inside ``no_grad``, ``set_grad_enabled`` as a function and as a context
    (``False``: the teacher gets no gradient and stays; ``True``: it trains) in a build: 3 SGD
    steps give PyTorch's weights, and ``is_grad_enabled()`` reads PyTorch's modes at each point
    (the build starts on even when the graph is called under ``no_grad``)."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    mf.manual_seed(0)
    student, teacher = nn.Linear(4, 3), nn.Linear(4, 3)
    ts, tt = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    for mine, ref in ((student, ts), (teacher, tt)):
        ref.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in mine.state_dict().items()})
    opt = torch.optim.SGD([*ts.parameters(), *tt.parameters()], lr=0.1)
    step, ref_seen = _GradModeStep(student, teacher, variant), []
    for i in range(3):
        with mf.no_grad():
            loss = step(x)
        ref = _grad_mode_loss(torch, ts, tt, torch.tensor(x), variant, ref_seen)
        opt.zero_grad()
        ref.backward()
        opt.step()
        np.testing.assert_allclose(float(loss.numpy()), ref.item(), rtol=1e-6)
    assert step.seen == ref_seen[:len(step.seen)] and step.seen     # traced once
    for mine, ref in ((student, ts), (teacher, tt)):
        for k, v in mine.state_dict().items():
            np.testing.assert_allclose(v, ref.state_dict()[k].numpy(), atol=1e-6, err_msg=k)
    trained = variant.endswith("(True)")
    assert (tt.weight.grad is not None) == trained
    assert mf.is_grad_enabled() and torch.is_grad_enabled()


def _modes(lib) -> list:
    """``lib.is_grad_enabled()`` through every form of the grad-mode functions outside a build:
    nesting, the function form, decorators with and without parentheses, recursion, another
    thread."""
    seen = [lib.is_grad_enabled()]

    @lib.no_grad
    def bare(depth):
        seen.append(("bare", lib.is_grad_enabled()))
        return bare(depth - 1) if depth else None

    @lib.enable_grad()
    def enabled():
        seen.append(("enabled", lib.is_grad_enabled()))

    @lib.set_grad_enabled(False)
    def disabled():
        seen.append(("disabled", lib.is_grad_enabled()))
        enabled()

    seen.append(("after decorating", lib.is_grad_enabled()))
    with lib.no_grad():
        seen.append(lib.is_grad_enabled())
        with lib.enable_grad():
            seen.append(lib.is_grad_enabled())
            with lib.set_grad_enabled(False):
                seen.append(lib.is_grad_enabled())
            seen.append(lib.is_grad_enabled())
        enabled()
        seen.append(lib.is_grad_enabled())
        thread = threading.Thread(target=lambda: seen.append(("thread", lib.is_grad_enabled())))
        thread.start()
        thread.join()
    bare(2)
    disabled()
    seen.append(lib.is_grad_enabled())
    lib.set_grad_enabled(False)
    seen.append(lib.is_grad_enabled())
    with lib.enable_grad():
        seen.append(lib.is_grad_enabled())
    seen.append(lib.is_grad_enabled())
    lib.set_grad_enabled(True)
    seen.append(lib.is_grad_enabled())
    return seen


def test_grad_mode_functions_read_and_nest_as_torch_outside_a_build():
    """``is_grad_enabled``, ``no_grad``, ``enable_grad`` and ``set_grad_enabled`` (function,
    context, decorator) give PyTorch's modes in the same sequence of calls (per thread: a new
    thread starts on); ``set_grad_enabled`` refuses a mode that is not a bool, as PyTorch."""
    torch = pytest.importorskip("torch")
    assert _modes(mf) == _modes(torch)
    for bad in (1, None, np.True_):
        with pytest.raises(TypeError, match=r"set_grad_enabled\(\): argument 'mode' \(position "
                                            r"1\) must be bool, not"):
            mf.set_grad_enabled(bad)
    assert mf.is_grad_enabled()
    with pytest.raises(TypeError, match="enable_grad: expects a function to decorate, got int"):
        mf.enable_grad(1)
    assert repr(mf.set_grad_enabled(True)) == "miniflow.set_grad_enabled(mode=True)"


def test_changing_requires_grad_recompiles_and_freezes_or_unfreezes():
    model, g = _train_graph()
    g(*_batch())
    assert g.compile_count == 1
    w = model[0].weight
    assert w.requires_grad_(False) is w and not w.requires_grad
    g(*_batch())
    assert g.compile_count == 2
    before = w.numpy()
    g(*_batch(seed=1))
    np.testing.assert_array_equal(w.numpy(), before)
    assert model.requires_grad_(True) is model and w.requires_grad
    g(*_batch(seed=1))
    assert g.compile_count == 3 and not np.array_equal(w.numpy(), before)
    w.requires_grad = True  # no change: no recompilation
    g(*_batch())
    assert g.compile_count == 3
    with pytest.raises(TypeError, match="requires_grad must be True or False, got 0"):
        w.requires_grad = 0
    with pytest.raises(TypeError, match="requires_grad_: requires_grad must be True or False"):
        model.requires_grad_("no")
    assert all(p.requires_grad for p in model.parameters())


def test_a_loss_that_depends_on_no_trainable_parameter_is_an_error_at_compile_time():
    """PyTorch: ``loss.backward()`` raises "element 0 of tensors does not require grad and does
    not have a grad_fn" when no parameter the loss depends on requires grad."""
    model, g = _train_graph()
    model.requires_grad_(False)
    before = model.state_dict()
    with pytest.raises(RuntimeError, match=r"TrainGraph.build: the loss depends on no trainable "
                                           r"parameter.*requires_grad_\(True\)"):
        g(*_batch())
    for n, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[n])
    model[2].bias.requires_grad_()
    g(*_batch())
    assert not np.array_equal(model[2].bias.numpy(), before["2.bias"])
    np.testing.assert_array_equal(model[0].weight.numpy(), before["0.weight"])


# ------------------------------------------------------------------ transpose, permute, sum, mean
@needs_torch
@pytest.mark.parametrize("shape", [(), (4,), (2, 3), (2, 3, 4)], ids=str)
def test_transpose_permute_sum_and_mean_match_torch(shape):
    """``torch.Tensor.transpose(dim0, dim1)`` swaps two dims, ``permute(*dims)`` reorders all;
    ``sum`` / ``mean`` take ``dim`` (int or tuple, negative counts from the end) and
    ``keepdim``, and NumPy's ``axis`` / ``keepdims`` too."""
    a = np.random.default_rng(0).standard_normal(shape)
    x, t = mf.tensor(a), torch.from_numpy(a)
    nd = len(shape)
    dims = list(range(-max(nd, 1), max(nd, 1)))
    for d0, d1 in itertools.product(dims, dims):
        np.testing.assert_array_equal(x.transpose(d0, d1).numpy(), t.transpose(d0, d1).numpy())
    for perm in itertools.permutations(range(nd)):
        want = t.permute(perm).numpy()
        for args in (perm, (perm,), [p - nd for p in perm]):
            np.testing.assert_array_equal(x.permute(*args).numpy(), want)
    np.testing.assert_array_equal(x.T.numpy(), t.permute(tuple(reversed(range(nd)))).numpy())
    reductions = [None] + ([0, -1, (0, nd - 1) if nd > 1 else (0,), [nd - 1]] if nd else [])
    for dim, keep in itertools.product(reductions, (False, True)):
        for name in ("sum", "mean"):
            want = getattr(t, name)(dim=dim, keepdim=keep).numpy()
            for got in (getattr(x, name)(dim=dim, keepdim=keep),
                        getattr(x, name)(axis=dim, keepdims=keep),
                        getattr(x, name)(dim, keep)):
                assert got.shape == want.shape, (name, dim, keep)
                np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_mean_of_a_half_tensor_accumulates_in_float32_eager_and_traced(half):
    """``torch.mean`` accumulates float16 / bfloat16 in float32 and rounds once: a float16 sum
    beyond 65504 (70000 ones) gave an inf mean; the mean is 1 (NumPy float64 oracle)."""
    dt = getattr(mf, half)
    a = np.ones((2, 70000), np.float32)
    a[1] = np.linspace(0, 2, 70000)
    a = a.astype(dt.np)

    class G(nn.Graph):
        def build(self, x):
            return x.mean(), x.mean(1), x.mean(dim=(0, 1), keepdim=True)

    want = [a.astype(np.float64).mean(axis=ax, keepdims=k).astype(dt.np)
            for ax, k in ((None, False), (1, False), ((0, 1), True))]
    x = mf.tensor(a)
    for got in (G()(a), (x.mean(), x.mean(1), x.mean(dim=(0, 1), keepdim=True))):
        for g, w in zip(got, want):
            assert g.dtype == dt and g.shape == w.shape
            np.testing.assert_allclose(g.numpy().astype(np.float64), w.astype(np.float64),
                                       rtol=2 ** -8)
    assert float(mf.tensor(np.ones(70000, dt.np)).mean().numpy()) == 1.0
    if torch is not None:
        t = torch.from_numpy(a.astype(np.float32)).to(getattr(torch, half))
        np.testing.assert_array_equal(x.mean(1).numpy().astype(np.float32),
                                      t.mean(1).float().numpy())


def test_mean_over_nonempty_dims_of_an_empty_batch_is_empty_and_of_an_empty_dim_nan():
    """``torch.mean`` of a (0, 3) tensor over dim 1 is empty, shape (0,): the count of each
    mean is the size of the reduced dims (3), not numel(in) / numel(out); over dim 0 it is the
    mean of nothing, NaN (miniflow refused it), eagerly and in build."""
    z = np.zeros((0, 3), np.float32)

    class G(nn.Graph):
        def build(self, x):
            return x.mean(1), x.mean(-1, keepdim=True)

    for got in (G()(z), (mf.tensor(z).mean(1), mf.tensor(z).mean(-1, keepdim=True))):
        assert [g.shape for g in got] == [np.mean(z, 1).shape, np.mean(z, -1, keepdims=True).shape]
    assert mf.tensor(np.zeros((2, 0, 3), np.float32)).mean((0, 2)).shape == (0,)
    class H(nn.Graph):
        def build(self, x):
            return x.mean(0), x.mean(), x.mean((0, 1), keepdim=True)

    for dim, want in ((0, np.full(3, np.nan)), (None, np.nan), ((0, 1), np.nan)):
        np.testing.assert_array_equal(mf.tensor(z).mean(dim).numpy(), want)
    for got, want in zip(H()(z), (np.full(3, np.nan), np.nan, np.full((1, 1), np.nan))):
        np.testing.assert_array_equal(got.numpy(), want)
    if torch is not None:
        assert torch.zeros(0, 3).mean(1).shape == (0,)
        assert torch.zeros(0, 3).mean(0).isnan().all()


@pytest.mark.parametrize("name", ["sum", "mean"])
@pytest.mark.parametrize("dim", [(), []], ids=["tuple", "list"])
def test_sum_and_mean_over_an_empty_dim_list_reduce_every_dim_as_torch(name, dim):
    """torch 2.x ``x.sum(())`` / ``x.mean([])`` reduce over every dim (as ``dim=None``); they
    returned the input unchanged. NumPy float64 oracle, torch's when installed."""
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    for keep in (False, True):
        got = getattr(mf.tensor(a), name)(dim, keep)
        want = getattr(np, name)(a, axis=None, keepdims=keep)
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-15)
        if torch is not None:
            np.testing.assert_allclose(
                getattr(torch.from_numpy(a), name)(dim, keepdim=keep).numpy(), want, rtol=1e-15)


def test_transpose_and_permute_trace_as_oneflow_transpose_with_perm():
    class G(nn.Graph):
        def build(self, x):
            return x.transpose(0, 1).sum(dim=1, keepdim=True), x.permute(2, 0, 1).mean(dim=0)

    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    g = G()
    a, b = g(x)
    np.testing.assert_allclose(a.numpy(), x.transpose(1, 0, 2).sum(1, keepdims=True))
    np.testing.assert_allclose(b.numpy(), x.transpose(2, 0, 1).mean(0), rtol=1e-6)
    ir = str(g.ir)
    assert "transpose(%x) {perm=(1,0,2)}" in ir and "transpose(%x) {perm=(2,0,1)}" in ir
    assert "axis=(1,), keepdims=True" in ir and "axis=(0,), keepdims=False" in ir


@pytest.mark.parametrize("call,error,match", [
    (lambda x: x.transpose(0, 2), IndexError,
     r"transpose: Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"),
    (lambda x: x.transpose((1, 0)), TypeError, r"swaps two dims.*use permute\(\*dims\)"),
    (lambda x: x.transpose(0, 1.0), TypeError, r"transpose: dim must be an int, got 1.0"),
    (lambda x: x.transpose(0, True), TypeError, r"transpose: dim must be an int, got True"),
    (lambda x: x.permute(0), ValueError, r"permute: dims \(0,\) must name each of the 2 dims"),
    (lambda x: x.permute(1, -1), ValueError, r"permute: dims \(1, -1\) must name each"),
    (lambda x: x.permute(0, 2), IndexError, r"permute: Dimension out of range"),
    (lambda x: x.sum(dim=0, axis=0), TypeError, r"sum: got both dim=0 and axis=0"),
    (lambda x: x.sum(True), TypeError, r"sum: dim must be an int, a sequence of ints or None, "
                                       r"got True"),
    (lambda x: x.mean(dim=(0, True)), TypeError, r"mean: dim must be an int, a sequence"),
    (lambda x: x.std(1.0), TypeError, r"std: dim must be an int"),
    (lambda x: x.mean(0, True, keepdims=True), TypeError, r"mean: got both keepdim and keepdims"),
])
def test_bad_dims_are_refused_naming_the_method(call, error, match):
    with pytest.raises(error, match=match):
        call(mf.tensor(np.zeros((2, 3), np.float32)))


@pytest.mark.parametrize("copy_it", ["copy", "deepcopy", "pickle"])
def test_a_graph_cannot_be_copied_and_says_to_copy_the_module(copy_it):
    """Issue 22 item 21: ``copy.copy`` / ``copy.deepcopy`` / ``pickle`` of an ``nn.Graph`` say
    what to do (before: ``cannot pickle '_thread.RLock'``); the module copies, as PyTorch's
    ``nn.Module`` does (``copy.deepcopy(model)``), and a new graph of the copy runs."""
    import copy
    import pickle
    model, graph = _train_graph()
    x, y = np.ones((2, 4), np.float32), np.array([0, 2])
    graph(x, y)
    how = {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": pickle.dumps}[copy_it]
    with pytest.raises(TypeError, match=r"an nn.Graph \(TrainGraph\) cannot be copied or "
                                        r"pickled; copy the module"):
        how(graph)
    twin = copy.deepcopy(model)
    assert np.array_equal(EvalGraph(twin)(x).numpy(), EvalGraph(model)(x).numpy())


@pytest.mark.parametrize("compare", [
    lambda x: x > 0, lambda x: x < 0, lambda x: x >= 0, lambda x: x <= 0, lambda x: x == 0,
    lambda x: x != 0, lambda x: 0 < x, lambda x: x == x * 2.0,
])
def test_comparing_a_lazy_tensor_in_build_says_it_has_no_value_yet(compare):
    """Issue 22 item 21: a comparison of a lazy tensor inside ``build`` cannot be decided at
    trace time (before: ``TypeError: '>' not supported``, or a silent ``False`` for ``==``):
    a RuntimeError saying so, as ``float()`` and ``bool()`` of a lazy tensor do (PyTorch's
    tracer, ``torch.jit.trace``, warns that such a result is fixed at trace time)."""
    class G(nn.Graph):
        def build(self, x):
            compare(x)
            return x
    with pytest.raises(RuntimeError, match=r"lazy tensor %\w+ has no value at trace time "
                                           r"inside nn.Graph.build: '[<>=!]+' cannot be decided"):
        G()(np.ones(3, np.float32))


def test_eager_tensors_compare_values_and_hash_by_identity():
    """As torch.Tensor: ``==`` / ``!=`` between two tensors compare values into an eager bool
    tensor (they were identity, a Python bool), tensors hash by identity (dicts and sets of
    tensors work), and against a number or an array an eager tensor gives a bool tensor too
    (nanoGPT's ``masked_fill(bias == 0, -inf)``). NumPy oracle."""
    a, b = mf.tensor([1.0, 2.0]), mf.tensor([1.0, 3.0])
    assert (a == a).dtype is mf.bool and (a == a).all() and (a != a).tolist() == [False, False]
    np.testing.assert_array_equal((a == b).numpy(), [True, False])
    np.testing.assert_array_equal((a != b).numpy(), [False, True])
    assert len({a, b}) == 2 and {a: 1, b: 2}[b] == 2 and a in {b, a} and a in [a, b]
    np.testing.assert_array_equal(a == 1.0, [True, False])
    np.testing.assert_array_equal(2.0 <= a, [False, True])
    np.testing.assert_array_equal(a < b, [False, True])
    np.testing.assert_array_equal(a != np.array([1.0, 0.0]), [False, True])
    assert (a == None) is False and (a == "x") is False     # noqa: E711: not an array: objects
    for ambiguous in (lambda: bool(a == b), lambda: a in [b, a]):    # PyTorch's error too
        with pytest.raises(RuntimeError, match="Boolean value of Tensor with more than one "
                                               "value is ambiguous"):
            ambiguous()


def _run_threads(work, n_threads=2):
    """Run ``work(k)`` in ``n_threads`` threads started together, with a tiny GIL switch
    interval so that the threads interleave inside calls; re-raises a thread's exception."""
    barrier = threading.Barrier(n_threads)
    errors = []

    def run(k):
        barrier.wait()
        try:
            work(k)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    if errors:
        raise errors[0]

# ------------------------------------------------------------------------------ 2. threads
def _mlp_forward(model, x):
    """The MLP in float64 NumPy: the oracle of the eval graph."""
    (w1, b1, w2, b2) = [p.numpy().astype(np.float64) for p in model.parameters()]
    return np.maximum(x @ w1.T + b1, 0.0) @ w2.T + b2


def test_one_graph_called_from_two_threads_gives_every_call_its_own_result():
    model = small_mlp()
    g = EvalGraph(model)
    r = np.random.default_rng(1)
    inputs = [[r.random((3, 4), dtype=np.float32) for _ in range(8)] for _ in range(2)]
    expected = [[g(x).numpy() for x in xs] for xs in inputs]  # single-threaded results
    for xs, ys in zip(inputs, expected):
        for x, y in zip(xs, ys):
            np.testing.assert_allclose(y, _mlp_forward(model, x), rtol=1e-5, atol=1e-6)
    wrong = [0, 0]

    def work(k):
        for i in range(1500):
            if not np.array_equal(g(inputs[k][i % 8]).numpy(), expected[k][i % 8]):
                wrong[k] += 1

    _run_threads(work)
    assert wrong == [0, 0], f"wrong outputs per thread: {wrong} of 1500"
    assert g.compile_count == 1


def test_a_training_graph_with_a_scaler_from_two_threads_equals_the_same_steps_in_one_thread():
    """The same batch in every call: any order of the 2 x 150 steps is the same sequence, so the
    weights, the scaler's state and the multiset of losses must equal 300 steps in one thread."""
    x, y = xy(6)

    def make():
        model = small_mlp(3)
        scaler = GradScaler(init_scale=2.0 ** 20, growth_interval=5)
        return model, scaler, Step(model, mf.optim.Adam(model.parameters(), lr=1e-2), scaler,
                                   policy="fp32")

    model_1, scaler_1, step_1 = make()
    losses_1 = sorted(float(step_1(x, y).numpy()) for _ in range(300))
    model_2, scaler_2, step_2 = make()
    losses_2 = [[], []]
    _run_threads(lambda k: losses_2[k].extend(float(step_2(x, y).numpy()) for _ in range(150)))
    assert sorted(losses_2[0] + losses_2[1]) == losses_1
    for a, b in zip(param_arrays(model_1), param_arrays(model_2)):
        np.testing.assert_array_equal(a, b)
    assert scaler_2.state_dict() == scaler_1.state_dict()
    assert scaler_1.num_skipped_steps > 0  # the scale overflowed and backed off on the way
    state_1, state_2 = (s._optimizers[0].state_dict()["state"] for s in (step_1, step_2))
    for i, s in state_1.items():
        for k, v in s.items():
            np.testing.assert_array_equal(state_2[i][k], v)
    assert state_2[0]["step"][0] == 300 - scaler_2.num_skipped_steps


class _SlowBuild(EvalGraph):
    """An eval graph whose trace takes a while, so a second thread arrives in the middle of it."""

    def build(self, x):
        out = self.model(x)
        time.sleep(0.05)
        return out


def test_first_calls_from_two_threads_compile_in_turn():
    """Two new signatures at once: the second thread waits for the first one's trace (it used to
    see the other thread's tracer and fail as a nested call)."""
    model = small_mlp()
    g = _SlowBuild(model)
    xs = [np.random.default_rng(k).random((k + 2, 4), dtype=np.float32) for k in range(2)]
    outs = [None, None]

    def work(k):
        time.sleep(0.02 * k)  # thread 1 arrives while thread 0 traces
        outs[k] = g(xs[k]).numpy()

    _run_threads(work)
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(out, _mlp_forward(model, x), rtol=1e-5, atol=1e-6)
    assert g.compile_count == 2


def test_a_graph_calling_itself_from_build_gets_the_nested_call_error_not_a_deadlock():
    class Recursive(nn.Graph):
        def build(self, x):
            return self(x)

    g = Recursive()
    with pytest.raises(RuntimeError, match="Recursive was called inside another graph's build"):
        g(np.ones(2, np.float32))
    free = []

    def try_lock():  # from another thread: the lock was released after the error
        free.append(g._lock.acquire(blocking=False))
        if free[-1]:
            g._lock.release()

    t = threading.Thread(target=try_lock)
    t.start()
    t.join()
    assert free == [True]



def test_two_graphs_tracing_at_the_same_time_in_two_threads_record_into_their_own_graph():
    both_in_build = threading.Barrier(2, timeout=30)

    class Scaled(nn.Graph):
        def __init__(self, factor):
            super().__init__()
            self.factor = factor

        def build(self, x):
            both_in_build.wait()          # the other thread is tracing its own graph now
            return x * self.factor

    graphs = [Scaled(2.0), Scaled(3.0)]
    x = np.arange(4, dtype=np.float32)
    results, errors = {}, []

    def call(g):
        try:
            results[g.factor] = g(x).numpy()
        except Exception as e:  # noqa: BLE001 (reported by the assertion below)
            errors.append(e)

    threads = [threading.Thread(target=call, args=(g,)) for g in graphs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    np.testing.assert_array_equal(results[2.0], x * 2)
    np.testing.assert_array_equal(results[3.0], x * 3)
    assert [len(g.ir.nodes) for g in graphs] == [1, 1]


# ------------------------------------------------------------------ module attributes recompile
class _Scale(nn.Module):
    """``x * self.k``: a plain attribute its forward reads; counts its traces in ``traces``."""

    def __init__(self, k):
        super().__init__()
        self.k = k
        self.traces = 0

    def forward(self, x):
        self.traces += 1   # set while tracing: must not recompile the graph again
        return x * self.k


def test_graph_recompiles_after_an_attribute_of_its_module_changes():
    """Eager PyTorch reads ``dropout.p``, ``layer_norm.eps`` or a custom forward's attribute at
    every call (``torch.compile`` recompiles): a compiled graph kept using the old value."""
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    scale = nn.Sequential(_Scale(2.0))
    g, other = EvalGraph(scale), EvalGraph(_Scale(2.0))
    for _ in range(3):
        np.testing.assert_array_equal(g(x).numpy(), x * 2)
        other(x)
    assert (g.compile_count, scale[0].traces) == (1, 1)
    scale[0].k = 3.0
    np.testing.assert_array_equal(g(x).numpy(), x * 3)
    g(x)
    scale[0].k = 3.0   # an equal value: nothing to recompile
    g(x)
    assert (g.compile_count, scale[0].traces, other.compile_count) == (2, 2, 1)
    other(x)
    assert other.compile_count == 1   # a graph without the module keeps its plan

    ln = nn.LayerNorm(256, elementwise_affine=False)
    g = EvalGraph(ln)
    g(x)
    ln.eps = 10.0
    mu, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    np.testing.assert_allclose(g(x).numpy(), (x - mu) / np.sqrt(var + 10.0), rtol=1e-4,
                               atol=1e-6)
    assert g.compile_count == 2

    d = nn.Dropout(0.0)
    g = EvalGraph(d)
    np.testing.assert_array_equal(g(x).numpy(), x)
    d.p = 0.9
    assert 0.85 < float((g(x).numpy() == 0).mean()) < 0.95 and g.compile_count == 2
    d.eval()   # a mode change keeps its own plan, as before
    np.testing.assert_array_equal(g(x).numpy(), x)
    assert g.compile_count == 3


def test_a_config_object_changed_in_place_is_not_seen_and_a_new_one_is():
    """What differences.md says: only assignments are watched, so a dataclass config changed in
    place keeps its traced value in the graph (torch.compile's guards would recompile), and
    assigning a new one (``dataclasses.replace``) recompiles."""
    import dataclasses

    @dataclasses.dataclass
    class Config:
        k: float = 2.0

    class Configured(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = Config()

        def forward(self, x):
            return x * self.config.k

    model = Configured()
    g = EvalGraph(model)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(g(x).numpy(), x * 2)
    model.config.k = 4.0
    np.testing.assert_array_equal(g(x).numpy(), x * 2)
    model.config = dataclasses.replace(model.config, k=5.0)
    np.testing.assert_array_equal(g(x).numpy(), x * 5)
    assert g.compile_count == 2


def test_each_plan_returns_what_build_returned_for_its_inputs_and_mode():
    """``build`` may return one Tensor for some signatures or modes and a tuple for others: each
    cached plan gives its own structure (it was one flag of the graph, set by the last trace:
    a plan traced earlier lost an output or gained a 1-tuple), and ``lower`` changes nothing."""
    class Either(nn.Graph):
        def __init__(self, m):
            super().__init__()
            self.model = m

        def build(self, x):
            out = self.model(x)
            return out if x.shape[0] == 1 or not self.model.training else (out, out.sum())

    m = nn.Linear(4, 2)
    g = Either(m)
    x = np.ones((3, 4), np.float32)
    assert isinstance(g(x), tuple) and len(g(x)) == 2
    assert isinstance(g(x[:1]), mf.Tensor)
    both = g(x)                             # the first plan again, after another was traced
    assert isinstance(both, tuple) and len(both) == 2
    np.testing.assert_allclose(both[1].numpy(), both[0].numpy().sum(), rtol=1e-6)
    g.lower(x[:1])
    assert isinstance(g(x), tuple)
    m.eval()
    assert isinstance(g(x), mf.Tensor)
    m.train()
    assert isinstance(g(x), tuple) and len(g(x)) == 2


def test_assigning_a_parameter_s_data_is_refused_not_silently_kept():
    """PyTorch's ``p.data = t`` replaces the values; miniflow has no ``.data``: assigning it
    raises (it was kept as a plain attribute the graph never read) and names the in-place
    alternative, which a compiled graph sees at its next call."""
    m = nn.Linear(2, 1, bias=False)
    g, x = EvalGraph(m), np.ones((1, 2), np.float32)
    g(x)
    with pytest.raises(AttributeError, match=r"no \.data .*load_state_dict"):
        m.weight.data = mf.tensor(np.zeros((1, 2), np.float32))
    with pytest.raises(AttributeError, match="no .data"):
        m.weight.data
    m.load_state_dict({"weight": np.zeros((1, 2), np.float32)}, strict=False)
    assert g(x).numpy().tolist() == [[0.0]]


def test_a_0d_constant_stays_0d_in_the_graph():
    """An eager 0-d tensor or mask that ``build`` uses is a constant of shape () (NumPy's
    ``ascontiguousarray`` made it [1]: the loss came back [1], and a 0-d mask did not
    broadcast to a 0-d tensor), as PyTorch keeps it."""
    m = nn.Module()
    m.p = nn.Parameter(np.array([1.5, -0.5], np.float32))
    scale = mf.tensor(np.array(2.0, np.float32))

    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(mf.optim.SGD(m.parameters(), lr=1.0))

        def build(self):
            loss = (self.m.p.sum() * scale).masked_fill(np.array(False), 3.0)
            loss.backward()
            return loss

    loss = G()()
    assert loss.shape == () and float(loss.numpy()) == 2.0
    np.testing.assert_array_equal(m.p.numpy(), [-0.5, -2.5])        # minus the gradient, 2


# ---------------------------------------------------------------- OneFlow's nn.Graph API


class _Sched(nn.Graph):
    """A training step with an Adam, its StepLR (``add_optimizer(lr_sch=)``) and a grad scaler."""

    def __init__(self, seed=0):
        super().__init__()
        self.model = small_mlp(seed)
        opt = mf.optim.Adam(self.model.parameters(), lr=0.01)
        self.add_optimizer(opt, lr_sch=mf.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5))
        self.set_grad_scaler(GradScaler(init_scale=2.0 ** 10))

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def test_name_training_is_compiled_and_repr_as_oneflow():
    first, second = _Sched(), _Sched()
    assert int(second.name.rsplit("_", 1)[1]) == int(first.name.rsplit("_", 1)[1]) + 1
    assert first.name.startswith("_Sched_")
    evaluation = EvalGraph(first.model)
    assert first.training and first.config.training
    assert not evaluation.training and not evaluation.config.training
    assert not first.is_compiled
    first(*xy())
    assert first.is_compiled
    text = repr(first)
    assert text.startswith(f"(GRAPH:{first.name}:_Sched): (\n  (CONFIG:config:GraphConfig("
                           "training=True, ))\n  (MODULE:model): Sequential(")
    first.config.set_gradient_accumulation_steps(2)
    assert "gradient_accumulation_steps=2" in repr(first.config)


def test_state_dict_round_trips_modules_optimizer_scheduler_and_scaler(tmp_path):
    x, y = xy(8)
    a = _Sched(seed=0)
    for _ in range(3):
        a(x, y)
    sd = a.state_dict()
    assert list(sd) == ["model", "System-Optimizer-0", "System-LRScheduler-0",
                        "System-GradScaler"]
    assert list(sd["model"]) == [n for n, _ in a.model.named_parameters()]
    mf.save(sd, tmp_path / "graph.mf")
    b = _Sched(seed=1)
    b(x, y)                               # compiled first: the plans see the loaded state
    b.load_state_dict(mf.load(tmp_path / "graph.mf"))
    for _ in range(3):
        la, lb = a(x, y), b(x, y)
        assert la.numpy() == lb.numpy()
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        np.testing.assert_array_equal(pa.numpy(), pb.numpy())
    assert a.optimizers[0].param_groups[0]["lr"] == b.optimizers[0].param_groups[0]["lr"] == 0.00125
    assert a.grad_scaler.scale == b.grad_scaler.scale


def test_load_state_dict_checks_everything_first_and_strict_false_skips():
    a, b = _Sched(seed=0), _Sched(seed=1)
    sd = a.state_dict()
    before = param_arrays(b.model)
    with pytest.raises(KeyError, match="unexpected keys \\['head'\\]"):
        b.load_state_dict({**sd, "head": {}})
    broken = {**sd, "System-GradScaler": {**sd["System-GradScaler"], "scale": -1.0}}
    with pytest.raises(ValueError, match="System-GradScaler"):
        b.load_state_dict(broken)                   # the module part fits, but nothing loads
    with pytest.raises(KeyError, match="_Sched.load_state_dict: the state_dict has no "
                                       "'System-Optimizer-0'"):
        b.load_state_dict({"model": sd["model"]})
    with pytest.raises(ValueError, match=r"_Sched.load_state_dict: state_dict\['System-GradScal"):
        b.load_state_dict(broken)
    for p, q in zip(b.model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), q)
    b.load_state_dict({"model": {"0.weight": sd["model"]["0.weight"]}, "head": {}}, strict=False)
    np.testing.assert_array_equal(b.model[0].weight.numpy(), a.model[0].weight.numpy())
    np.testing.assert_array_equal(b.model[0].bias.numpy(), before[1])


def test_debug_is_oneflow_s_name_for_printing_the_ir(capsys):
    g = EvalGraph(small_mlp())
    g.debug(0)
    assert g.config.print_ir
    g(xy()[0])
    assert "# IR after dead_code_elimination" in capsys.readouterr().out
    g.debug()                                   # OneFlow's default v_level -1: off
    assert not g.config.print_ir
    g.debug(1, ranks=[5])                       # not this rank
    assert not g.config.print_ir
    g.debug(2, ranks=-1)
    assert g.config.print_ir
    with pytest.raises(ValueError, match="v_level must be an int from -1"):
        g.debug(4)
    with pytest.raises(ValueError, match="no Python stack locations; leave max_py_stack_depth"):
        g.debug(0, max_py_stack_depth=5)

    class Quiet(nn.Graph):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.model = small_mlp()

        def build(self, x):
            return self.model(x)

    assert Quiet(debug_v_level=0).config.print_ir and not Quiet().config.print_ir
    with pytest.raises(ValueError, match="enable_get_runtime_state_dict=True .*graph.state_dict"):
        Quiet(enable_get_runtime_state_dict=True)


def test_a_call_takes_inputs_by_build_s_parameter_names():
    model = small_mlp()
    x, y = xy()

    class TwoInputs(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x, y, scale=None):
            return self.model(x) + self.model(y)

    g = TwoInputs()
    expected = g(x, x * 2).numpy()
    np.testing.assert_array_equal(g(x, y=x * 2).numpy(), expected)
    np.testing.assert_array_equal(g(y=x * 2, x=x).numpy(), expected)
    assert g.compile_count == 1
    with pytest.raises(TypeError, match="input 'z' is not one of its positional parameters"):
        g(x, z=x)
    with pytest.raises(TypeError, match="input 'x' is given twice"):
        g(x, x=x)
    with pytest.raises(TypeError, match="y not given, but a later input is"):
        g(x, scale=x)

    class PositionalOnly(TwoInputs):
        def build(self, x, /, y):
            return self.model(x) + self.model(y)

    g = PositionalOnly()
    np.testing.assert_array_equal(g(x, y=x * 2).numpy(), expected)
    with pytest.raises(TypeError, match="input 'x' is positional-only"):   # as Python refuses it
        g(x=x, y=x * 2)
    with pytest.raises(TypeError, match="graph input 1 is None: every input is an array"):
        g(x, y=None)


def test_oneflow_config_options_are_taken_as_no_ops_or_refused_by_name():
    model = small_mlp()
    g = Step(model, mf.optim.SGD(model.parameters(), lr=0.1))
    cfg = g.config
    cfg.enable_amp(mode=True, dtype=mf.bfloat16)          # OneFlow's keyword
    assert cfg.amp.dtype == mf.bfloat16 and "amp=" in repr(cfg)
    cfg.enable_amp(mode=False)
    assert cfg.amp is None
    g(*xy())
    version = cfg.version
    for method in ("allow_fuse_cast_scale", "allow_fuse_model_update_ops",
                   "enable_multi_tensor_update", "enable_compress_memory",
                   "enable_choose_best_memory_allocation"):
        getattr(cfg, method)(True)
        with pytest.raises(TypeError, match=f"{method}: mode must be True or False"):
            getattr(cfg, method)("yes")
    cfg.enable_straighten_algorithm("SpeedFirst")
    cfg.set_outputs_buffer_size(4)
    for method in ("allow_fuse_add_to_output", "enable_zero", "enable_auto_parallel"):
        getattr(cfg, method)(False)                        # what miniflow does
        with pytest.raises(ValueError, match=f"{method}\\(True\\): .*; remove the call"):
            getattr(cfg, method)(True)
    assert cfg.performance_hints["enable_straighten_algorithm"] == "SpeedFirst"
    assert cfg.performance_hints["set_outputs_buffer_size"] == 4
    assert cfg.version == version                          # nothing recompiles
    g(*xy())
    assert g.compile_count == 1
    with pytest.raises(ValueError, match="has no cuDNN .*; remove the call"):
        cfg.enable_cudnn_conv_heuristic_search_algo(False)
    with pytest.raises(ValueError, match="mode must be one of 'Disable'"):
        cfg.enable_straighten_algorithm("Fast")
    with pytest.raises(ValueError, match="value must be an integer >= 1"):
        cfg.set_outputs_buffer_size(0)



class _TwoOptimizers(nn.Graph):
    """An SGD for the first layer and an Adam for the last; a StepLR on optimizer ``scheduled``."""

    def __init__(self, scheduled):
        super().__init__()
        self.model = small_mlp()
        for k, opt in enumerate((mf.optim.SGD(self.model[0].parameters(), lr=0.1),
                                 mf.optim.Adam(self.model[2].parameters(), lr=0.01))):
            sched = mf.optim.lr_scheduler.StepLR(opt, 1) if k == scheduled else None
            self.add_optimizer(opt, lr_sch=sched)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def test_a_scheduler_s_state_is_keyed_by_its_optimizer_s_index():
    """``System-LRScheduler-<k>`` is the scheduler of optimizer k: the checkpoint of a graph whose
    scheduler is on optimizer 0 does not load into one whose scheduler is on optimizer 1 (it
    loaded the SGD's schedule into the Adam's scheduler)."""
    first, second = _TwoOptimizers(0), _TwoOptimizers(1)
    first(*xy())
    assert list(second.state_dict())[-1] == "System-LRScheduler-1"
    before = second.state_dict()
    with pytest.raises(KeyError, match="unexpected keys \\['System-LRScheduler-0'\\]"):
        second.load_state_dict(first.state_dict())
    second.load_state_dict(first.state_dict(), strict=False)     # the scheduler part: skipped
    assert second.lr_schedulers[0].state_dict() == before["System-LRScheduler-1"]


def test_a_scheduler_given_to_a_graph_is_not_stepped_by_hand_too():
    """``add_optimizer(opt, lr_sch=s)``: the graph steps ``s``; ``s.step()`` after the call too
    advanced the schedule twice per update, silently."""
    model = small_mlp()
    opt = mf.optim.SGD(model.parameters(), lr=0.1)
    warm = mf.optim.lr_scheduler.LinearLR(opt, 0.5, total_iters=2)
    sched = mf.optim.lr_scheduler.SequentialLR(
        opt, [warm, mf.optim.lr_scheduler.StepLR(opt, 1)], milestones=[2])
    g = _ScheduledStep(model, opt, sched)
    g(*xy())
    for s in (sched, warm):
        with pytest.raises(RuntimeError, match=f"given to nn.Graph {g.name} .*twice per update"):
            s.step()
    assert sched.last_epoch == 1 and warm.last_epoch == 1
    del g
    gc.collect()
    sched.step()                      # the graph is gone: stepped by hand again
    assert sched.last_epoch == 2


class _ScheduledStep(Step):
    """``Step`` with ``add_optimizer(opt, lr_sch=sched)``."""

    def __init__(self, model, opt, sched):
        nn.Graph.__init__(self)
        self.model = model
        self.add_optimizer(opt, lr_sch=sched)


def test_a_graph_whose_init_forgot_super_init_says_so_wherever_it_is_used():
    """Every method and property (they read attributes ``Graph.__init__`` sets) names the
    missing call, where they raised ``AttributeError: ... '_lock'`` (or ``'config'``)."""
    class NoSuper(nn.Graph):
        def __init__(self):
            self.model = small_mlp()

        def build(self, x):
            return self.model(x)

    g = NoSuper()
    opt = mf.optim.SGD(g.model.parameters(), lr=0.1)
    for use in (lambda: g.name, lambda: g.training, lambda: g.is_compiled, lambda: g.config,
                g.state_dict, lambda: g.load_state_dict({}), lambda: g.debug(0),
                lambda: g.add_optimizer(opt), lambda: g(xy()[0])):
        with pytest.raises(RuntimeError, match=r"NoSuper.__init__ must call super\(\).__init__"):
            use()
    assert g.model is not None and not hasattr(Step(small_mlp(), opt), "no_such_attribute")


def test_build_returns_nested_tuples_lists_and_dicts_and_the_call_gives_them_back():
    """``build`` may return a dict (``{"loss": ..., "logits": ...}``), named tuples and lists
    nested, as ``torch.compile`` and OneFlow's ``nn.Graph`` take them: it was "build must
    return Tensors, got dict". Anything else in it is refused naming where it is."""
    import collections
    Pair = collections.namedtuple("Pair", "total rows")

    class Nested(nn.Graph):
        def __init__(self, m, extra=None):
            super().__init__()
            self.model, self.extra = m, extra

        def build(self, x):
            y = self.model(x)
            out = {"logits": y, "stats": Pair(y.sum(), [y.sum(1), y.max()])}
            if self.extra is not None:
                out["stats"].rows.append(self.extra)
            return out

    m = nn.Linear(4, 2)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = Nested(m)(x)
    y = m(mf.tensor(x)).numpy()
    assert list(out) == ["logits", "stats"] and isinstance(out["stats"], Pair)
    assert isinstance(out["stats"].rows, list) and len(out["stats"].rows) == 2
    np.testing.assert_allclose(out["logits"].numpy(), y, rtol=1e-6)
    np.testing.assert_allclose(out["stats"].total.numpy(), y.sum(), rtol=1e-5)
    np.testing.assert_allclose(out["stats"].rows[0].numpy(), y.sum(1), rtol=1e-5)
    np.testing.assert_allclose(out["stats"].rows[1].numpy(), y.max(), rtol=1e-6)
    with pytest.raises(TypeError, match=r"build must return Tensors, or tuples, lists and dicts "
                                        r"of them; got float at \['stats'\]\[1\]\[2\]"):
        Nested(m, extra=1.5)(x)


def test_a_none_that_build_returns_comes_back_as_none():
    """nanoGPT's forward returns ``logits, loss`` with ``loss = None`` without targets, which
    ``torch.compile`` returns as it is: a None in what build returns was refused ("got
    NoneType"); it comes back as None, at the top too (a step that returns nothing)."""
    m = nn.Linear(4, 2)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)

    class LogitsLoss(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = m

        def build(self, x, targets=None):
            return self.model(x), None if targets is None else targets.sum()

    logits, loss = LogitsLoss()(x)
    assert loss is None
    np.testing.assert_allclose(logits.numpy(), m(mf.tensor(x)).numpy(), rtol=1e-6)

    class Quiet(TrainGraph):
        def build(self, x, y):
            super().build(x, y)           # returns nothing

    step = Quiet(m, mf.optim.SGD(m.parameters(), lr=0.1))
    before = m.weight.numpy()
    assert step(x, np.zeros(3, np.int64)) is None
    assert not np.array_equal(m.weight.numpy(), before)
