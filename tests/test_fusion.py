"""The elementwise-fusion pass: fused and unfused graphs compute the same bits (fp32 and fp16, whole
training runs and random elementwise chains), the fused IR prints readably, the pass respects
readers, update ops and broadcasting, and the expression language parses what it prints."""
import os
import re
import warnings

import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import miniflow as mf
from miniflow.dtype import float16, float32, float64
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.ir import Graph
from miniflow.kernels.common import codegen
from miniflow.kernels.cpu import fused as cpu_fused
from miniflow.kernels.cpu.common import flat
from miniflow.ops.fused import broadcast_kinds, format_program, parse
from miniflow.passes import pipeline
from miniflow.passes.dead_code_elimination import dead_code_elimination
from miniflow.passes.fuse_elementwise import fuse_elementwise
from miniflow.runtime.backend import get_backend
from miniflow.runtime.plan import Plan
from miniflow.ops import all_ops, emitter
from miniflow.ops.amp_ops import AMP_IDENTITY_OPS


def _same_bits(a, b, what=""):
    """Equal dtype, shape and bits; NaN only where the other has NaN (payloads may differ)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, what
    nan = np.isnan(b) if b.dtype.kind == "f" else np.zeros(b.shape, bool)
    assert np.array_equal(np.isnan(a) if a.dtype.kind == "f" else nan, nan), what
    bits = f"u{b.dtype.itemsize}"
    np.testing.assert_array_equal(a[~nan].view(bits), b[~nan].view(bits), err_msg=what)


def _without_fusion(monkeypatch):
    monkeypatch.setattr(pipeline, "PASSES",
                        [p for p in pipeline.PASSES if p[0] != "fuse_elementwise"])


# ------------------------------------------------------------------------------ whole training runs
def _train(amp: bool, steps: int = 12, hidden: int = 32, fused_update: bool = True):
    """Losses and final parameters of an SGD-momentum run of the digits-shaped MLP."""
    mf.manual_seed(0)
    model = mlp((64, hidden, 10))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    if amp:
        graph.config.enable_amp()
        graph.config.enable_fused_model_update_cast(fused_update)
        graph.set_grad_scaler(mf.amp.GradScaler(init_scale=1024.0, growth_interval=4))
    rng = np.random.default_rng(0)
    losses = []
    for batch in [16, 16, 5, 16] * (steps // 4):
        x = rng.normal(size=(batch, 64)).astype(np.float32)
        losses.append(graph(x, rng.integers(0, 10, batch)).numpy())
    return graph, losses, model.state_dict()


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp_fp16"])
def test_training_is_bit_identical_with_and_without_fusion(amp, monkeypatch):
    fused, fused_losses, fused_params = _train(amp)
    assert "fused_elementwise" in fused.ir.count_ops()
    _without_fusion(monkeypatch)
    plain, plain_losses, plain_params = _train(amp)
    assert "fused_elementwise" not in plain.ir.count_ops()
    assert len(plain.ir.nodes) > len(fused.ir.nodes)
    for k, (a, b) in enumerate(zip(fused_losses, plain_losses)):
        _same_bits(a, b, f"loss {k}")
    for name in plain_params:
        _same_bits(fused_params[name], plain_params[name], name)


class _TypeAs(mf.nn.Module):
    """A gate computed in float32 and cast back with ``type_as`` (op ``cast_like`` in build)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = mf.nn.Linear(8, 8), mf.nn.Linear(8, 3)

    def forward(self, x):
        h = self.a(x)                                   # float16 under AMP
        return self.b((h.float() * 0.5).sigmoid().type_as(h) * h)


def _train_type_as():
    mf.manual_seed(0)
    model = _TypeAs()
    opt = mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    class Train(mf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            self.config.enable_amp()

        def build(self, x, y):
            loss = mf.nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            return loss

    graph, rng = Train(), np.random.default_rng(0)
    losses = [graph(rng.normal(size=(6, 8)).astype(np.float32), rng.integers(0, 3, 6)).numpy()
              for _ in range(4)]
    return graph, losses, model.state_dict()


def test_type_as_under_amp_fuses_and_trains_bit_identically(monkeypatch):
    """``type_as`` inside build under AMP is op cast_like, which fusion left as a kernel of its
    own: it joins the fused gate, and the training run keeps its bits."""
    fused, fused_losses, fused_params = _train_type_as()
    assert "cast_like" not in fused.ir.count_ops()
    _without_fusion(monkeypatch)
    plain, plain_losses, plain_params = _train_type_as()
    assert "cast_like" in plain.ir.count_ops()
    for k, (a, b) in enumerate(zip(fused_losses, plain_losses)):
        _same_bits(a, b, f"loss {k}")
    for name in plain_params:
        _same_bits(fused_params[name], plain_params[name], name)


def test_fused_ir_prints_readably():
    graph, _, _ = _train(amp=False, steps=4)
    text = str(graph.ir)
    assert re.search(r"%\d+: f32\[5,32\] = fused_elementwise\(%\d+, %model\.0\.bias\) "
                     r"\{expr='relu\(add\(x0, x1\)\)'\}", text), text
    amp, _, _ = _train(amp=True, steps=4, fused_update=False)
    assert re.search(r"%\d+: f16\[5,32\] = fused_elementwise\(%model\.0\.bias, %\d+\) "
                     r"\{expr='relu\(add\(x1, f16\(x0\)\)\)'\}", str(amp.ir)), str(amp.ir)
    amp, _, _ = _train(amp=True, steps=4)          # the bias's half copy instead of its cast
    assert re.search(r"%\d+: f16\[5,32\] = fused_elementwise\(%\d+, "
                     r"%model\.0\.bias\.float16_copy\) \{expr='relu\(add\(x0, x1\)\)'\}",
                     str(amp.ir)), str(amp.ir)


# ------------------------------------------------------------------------------ random chains
ELEMENTWISE = {n: op for n, op in all_ops().items()
               if op.scalar is not None and n not in AMP_IDENTITY_OPS}   # AMP identities stay
UNARY = sorted(n for n, op in ELEMENTWISE.items() if op.tensor_arity == 1 and not op.scalar_attrs)
BINARY = sorted(n for n, op in ELEMENTWISE.items() if op.tensor_arity == 2)
SCALAR = sorted(n for n, op in ELEMENTWISE.items() if op.scalar_attrs)
"""Every elementwise op the fusion pass fuses (from the registry: a new op is tested at once);
the two-input ones that are not ``broadcast_*`` need operands of one shape; the ops with scalar
attributes get a random value for each."""
DTYPES = {"f16": float16, "f32": float32, "f64": float64}


def _compile(graph, fuse: bool):
    """Plan of ``graph`` after (fusion and) dead-code elimination."""
    if fuse:
        graph = fuse_elementwise(graph)
    graph = dead_code_elimination(graph)
    graph.verify()
    return Plan(graph, get_backend()), graph


@st.composite
def _recipes(draw):
    """Ops of a random elementwise chain: ``(op, argument indices, attrs)``; values 0, 1 are the
    inputs (full shape), 2 a row vector; every op appends one value. A ``cast`` picks a dtype,
    a ``cast_like`` a value to take it from."""
    recipe, types = [], [("in", True), ("in", True), ("in", False)]   # (dtype, full shape?)
    for _ in range(draw(st.integers(3, 8))):
        x = draw(st.integers(0, len(types) - 1))
        kind = draw(st.sampled_from(["unary", "binary", "scalar", "cast", "cast_like"]))
        dtype, full = types[x]
        if kind == "unary":
            recipe.append((draw(st.sampled_from(UNARY)), (x,), {}))
        elif kind == "scalar":
            op = draw(st.sampled_from(SCALAR))
            recipe.append((op, (x,), {a: draw(st.floats(-4, 4, width=32))
                                      for a in ELEMENTWISE[op].scalar_attrs}))
        elif kind == "cast":
            dtype = draw(st.sampled_from(sorted(DTYPES)))
            recipe.append(("cast", (x,), {"dtype": DTYPES[dtype]}))
        elif kind == "cast_like":            # like any value, of any shape: its dtype only
            like = draw(st.integers(0, len(types) - 1))
            recipe.append(("cast_like", (x, like), {}))
            dtype = types[like][0]
        else:
            op = draw(st.sampled_from(BINARY))
            same = [k for k, t in enumerate(types)
                    if t[0] == dtype and (op.startswith("broadcast") or t[1] == full)]
            y = draw(st.sampled_from(same))
            recipe.append((op, (x, y), {}))
            full = full or types[y][1]
        types.append((dtype, full))
    return recipe, draw(st.booleans())


def _build(recipe, all_outputs: bool, dtype, shape):
    """The graph of ``recipe`` (see :func:`_recipes`), returning every value or the last one."""
    g = Graph()
    emit = emitter(g)
    vals = [g.add_input("a", shape, dtype), g.add_input("b", shape, dtype),
            g.add_input("row", shape[-1:], dtype)]
    for op, args, attrs in recipe:
        vals.append(emit(op, *(vals[k] for k in args), **attrs))
    g.set_outputs(vals[3:] if all_outputs else vals[-1:])
    return g


@pytest.mark.slow
@settings(deadline=None)
@given(recipe=_recipes(), dtype=st.sampled_from(["f16", "f32"]),
       shape=st.sampled_from([(3, 5), (1, 7), (4, 1), (2, 3, 4)]), seed=st.integers(0, 3))
def test_random_elementwise_chains_fuse_bit_exactly(recipe, dtype, shape, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-3, 3, s).astype(DTYPES[dtype].np) for s in (shape, shape, shape[-1:])]
    arrays[0].flat[0] = np.nan
    want = _compile(_build(*recipe, DTYPES[dtype], shape), fuse=False)[0].run(arrays)
    fused, fused_ir = _compile(_build(*recipe, DTYPES[dtype], shape), fuse=True)
    for k, (a, b) in enumerate(zip(fused.run(arrays), want)):
        _same_bits(a, b, f"output {k} of\n{fused_ir}")


@pytest.mark.parametrize("dtype", [mf.bfloat16, float32])
def test_a_chain_of_two_gelu_grads_compiles_without_numba_warnings(dtype):
    """Found by the random chains: the float32 gelu_grad body (kernels/cpu/special.py), inlined
    twice into one kernel, made Numba's SSA pass warn that a variable of its inlined helpers (a
    loop's, a conditional expression's) was "not in scope" (``NumbaIRAssumptionWarning``), at every
    user's first compile of such a chain. Compiled afresh here (a cached kernel compiles
    nothing)."""
    from numba.core.errors import NumbaIRAssumptionWarning
    kernel, numbers = cpu_fused._kernel("gelu_grad(x0, gelu_grad(x0, x1))", (dtype, dtype),
                                        ("full", "full"), True, False)
    options = {k: v for k, v in kernel.targetoptions.items() if k not in ("cache", "nopython")}
    fresh = numba.njit(**options)(kernel.py_func)
    x = np.linspace(-4, 4, 6, dtype=np.float32).reshape(2, 3).astype(dtype.np)
    out = np.empty_like(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NumbaIRAssumptionWarning)
        fresh(*(flat(a) for a in (x, x)), *numbers, flat(out), 2, 3)
    want = np.empty_like(x)
    kernel(*(flat(a) for a in (x, x)), *numbers, flat(want), 2, 3)
    _same_bits(out, want, "fresh against cached")


@pytest.mark.parametrize("dtype", [float16, float32])
def test_an_op_with_two_scalar_attributes_fuses_bit_exactly(dtype):
    """softplus's beta and threshold (given, and a default) are the numbers after its tensor
    operand in the expression, in declaration order; the fused kernel gives the unfused bits on
    both sides of the threshold (x = 1.5 here)."""
    recipe = ([("broadcast_add", (0, 2), {}), ("softplus", (3,), {"threshold": 3.0, "beta": 2}),
               ("scalar_mul", (4,), {"scalar": 0.5})], False)
    fused, ir = _compile(_build(*recipe, dtype, (3, 5)), fuse=True)
    assert [n.op.name for n in ir.nodes] == ["fused_elementwise"]
    assert ir.nodes[0].attrs["expr"] == "mul(softplus(add(x0, x1), 2.0, 3.0), 0.5)"
    x = np.linspace(-4, 4, 15, dtype=dtype.np).reshape(3, 5)
    x.flat[3] = np.nan
    arrays = [x, x, x[0] / 4]
    want = _compile(_build(*recipe, dtype, (3, 5)), fuse=False)[0].run(arrays)
    _same_bits(fused.run(arrays)[0], want[0], str(ir))


def test_dead_member_does_not_add_an_unread_input():
    """Found by hypothesis: relu(a) -> add(b, .) (dead) and relu(.) (returned)."""
    recipe = ([("relu", (0,), {}), ("broadcast_add", (1, 3), {}), ("relu", (3,), {})], False)
    fused, ir = _compile(_build(*recipe, float16, (3, 5)), fuse=True)
    assert [n.op.name for n in ir.nodes] == ["fused_elementwise"] and len(ir.nodes[0].inputs) == 1
    x = np.linspace(-2, 2, 15, dtype=np.float16).reshape(3, 5)
    _same_bits(fused.run([x, x, x[0]])[0], np.maximum(x, 0), str(ir))


def test_cast_like_fuses_as_a_cast_without_reading_its_like():
    """``x.float().exp().type_as(x)`` under AMP: op cast_like (a cast to the dtype of
    ``dtype_like``, known once AMP ran) was never fused, a kernel of its own between two fused
    groups; it fuses as the cast to its output's dtype, and the fused node does not read the
    like (here a value of another shape, which does not broadcast to the output, computed for
    its dtype only), bit for bit as the unfused graph."""
    def graph():
        g = Graph()
        emit = emitter(g)
        x, y = g.add_input("x", (3, 5), float32), g.add_input("y", (7,), float16)
        out = emit("scalar_mul", emit("cast_like", emit("exp", x), emit("relu", y)), scalar=3.0)
        g.set_outputs([emit("broadcast_add", out, emit("cast", x, dtype=float16))])
        return g

    fused, ir = _compile(graph(), fuse=True)
    assert [n.op.name for n in ir.nodes] == ["fused_elementwise"]
    assert [v.name for v in ir.nodes[0].inputs] == ["x"] and ir.nodes[0].attrs["expr"] == (
        "add(mul(f16(exp(x0)), 3.0), f16(x0))")
    arrays = [np.linspace(-12, 12, 15, dtype=np.float32).reshape(3, 5), np.ones(7, np.float16)]
    arrays[0][0, 0] = np.nan
    want = _compile(graph(), fuse=False)[0].run(arrays)[0]
    assert want.dtype == np.float16 and np.isinf(want).any()      # exp(12) overflows float16
    _same_bits(fused.run(arrays)[0], want, str(ir))


# ------------------------------------------------------------------------------ legality
def _graph(shape=(4, 6), dtype=float32):
    g = Graph()
    return g, g.add_input("x", shape, dtype), g.add_input("y", shape, dtype)


def test_chain_becomes_one_node_and_reused_values_become_outputs():
    g, x, y = _graph()
    emit = emitter(g)
    a = emit("broadcast_add", x, y)
    r = emit("relu", a)
    e = emit("exp", r)
    g.set_outputs([emit("broadcast_mul", e, r), a])
    g = fuse_elementwise(g)
    g.verify()
    assert [n.op.name for n in g.nodes] == ["fused_elementwise"]
    assert g.nodes[0].attrs["expr"] == "y0 = add(x0, x1); t0 = relu(y0); y1 = mul(exp(t0), t0)"
    assert g.nodes[0].outputs == [a, g.outputs[0]]


def test_reader_before_the_last_member_keeps_the_value_out_of_the_group():
    g, x, y = _graph()
    emit = emitter(g)
    a = emit("relu", x)
    s = emit("reduce_sum", a, axis=(0,))               # reads a before b exists
    b = emit("broadcast_add", a, y)
    g.set_outputs([s, b])
    g = fuse_elementwise(g)
    assert [n.op.name for n in g.nodes] == ["relu", "reduce_sum", "broadcast_add"]


def test_an_update_between_a_read_and_the_fused_node_stops_fusion():
    g = Graph()
    emit = emitter(g)
    w = g.add_variable("w", (4, 6), float32, data=np.ones((4, 6), np.float32))
    x = g.add_input("x", (4, 6), float32)
    skip = g.add_constant(np.zeros(1, np.int64))
    c = emit("cast", w, dtype=float16)
    emit("sgd_update", w, x, g.add_constant(np.array([0.1])), skip)
    g.set_outputs([emit("relu", c)])
    g = fuse_elementwise(g)
    assert [n.op.name for n in g.nodes] == ["cast", "sgd_update", "relu"]


def test_int64_identities_stay_unfused_and_exact():
    """``ids.clone().clone()`` (and ``floor`` / ``round`` of int64, copies) are int64
    ``identity`` chains, which the fused expression language (floats) cannot hold: the pass
    left one fused node that failed verification; they stay apart and copy exactly."""
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (3,), mf.int64)
    g.set_outputs([emit("identity", emit("identity", x))])
    assert [n.op.name for n in fuse_elementwise(g).nodes] == ["identity", "identity"]

    class Copies(mf.nn.Graph):
        def build(self, ids):
            return ids.clone().clone().floor().round()

    big = np.array([2 ** 62 + 1, -3, 0])
    np.testing.assert_array_equal(Copies()(mf.tensor(big)).numpy(), big)


def test_smaller_producer_joins_only_when_nothing_else_reads_it():
    g, x, _ = _graph()
    emit = emitter(g)
    bias = g.add_input("b", (6,), float32)
    c = emit("scalar_mul", bias, scalar=2.0)
    g.set_outputs([emit("relu", emit("bias_add", x, c))])
    fused = fuse_elementwise(g)
    assert fused.nodes[0].attrs["expr"] == "relu(add(x1, mul(x0, 2.0)))"
    g, x, _ = _graph()
    emit = emitter(g)
    bias = g.add_input("b", (6,), float32)
    c = emit("scalar_mul", bias, scalar=2.0)
    g.set_outputs([emit("relu", emit("bias_add", x, c)), c])
    assert [n.op.name for n in fuse_elementwise(g).nodes] == ["scalar_mul", "fused_elementwise"]


def test_broadcasts_beyond_rows_and_columns_stay_unfused():
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (2, 3, 4), float32)
    y = g.add_input("y", (2, 1, 4), float32)
    g.set_outputs([emit("relu", emit("broadcast_add", x, y))])
    assert broadcast_kinds((2, 3, 4), [(2, 3, 4), (2, 1, 4)]) is None
    assert [n.op.name for n in fuse_elementwise(g).nodes] == ["broadcast_add", "relu"]
    kinds = broadcast_kinds((2, 3, 4), [(3, 4), (2, 1, 1), ()])
    assert kinds == ((2, 12), ["row", "col", "scalar"])


def test_amp_identities_are_not_fused():
    g, x, _ = _graph()
    emit = emitter(g)
    g.set_outputs([emit("relu", emit("amp_white_identity", emit("exp", x)))])
    assert [n.op.name for n in fuse_elementwise(g).nodes] == ["exp", "amp_white_identity", "relu"]


# ------------------------------------------------------------------------------ expressions
@pytest.mark.parametrize("expr", ["relu(add(x0, x1))", "mul(x0, -0.5)", "add(x0, inf)",
                                  "t0 = f32(x0); y0 = f16(mul(t0, t0)); y1 = sigmoid(t0)",
                                  "sub(x1, nan)"])
def test_expressions_round_trip(expr):
    program = parse(expr)
    assert format_program(program.statements) == expr


@pytest.mark.parametrize("expr,match", [("relu(add(x0, z1))", "unknown name"),
                                        ("softmax(x0)", "unknown function"),
                                        ("relu(x0, x1)", "relu takes 1 operand"),
                                        ("x0 +", "bad expr"),
                                        ("y1 = relu(x0)", "outputs must be y0"),
                                        ("t0 = relu(x0)", "outputs must be y0")])
def test_bad_expressions_are_rejected(expr, match):
    with pytest.raises(ValueError, match=match):
        parse(expr)


def test_mixed_dtypes_in_a_function_are_a_type_error():
    g = Graph()
    emit = emitter(g)
    a, b = g.add_input("a", (3,), float32), g.add_input("b", (3,), float16)
    with pytest.raises(TypeError, match="add needs operands of one float dtype"):
        emit("fused_elementwise", a, b, expr="add(x0, x1)")


# ------------------------------------------------------------------------------ generated files
def test_generated_source_lives_in_the_cache_folder_and_is_written_once():
    source, numbers = cpu_fused.fused_source("mul(relu(x0), 0.25)", (float32,), ["full"],
                                             False, False)
    assert numbers == [0.25] and "0.25" not in source   # numbers are arguments
    module = codegen.load_source("fused_cpu", source)
    path = module.__file__
    assert os.path.dirname(path) == codegen.generated_dir()
    assert not path.startswith(os.path.dirname(os.path.abspath(mf.__file__)))  # not in the package
    if os.environ.get("NUMBA_CACHE_DIR"):
        assert path.startswith(os.path.abspath(os.environ["NUMBA_CACHE_DIR"]))
    mtime = os.stat(path).st_mtime_ns
    codegen._MODULES.clear()
    assert codegen.load_source("fused_cpu", source).__file__ == path
    assert os.stat(path).st_mtime_ns == mtime


def test_amp_cast_and_unscale_of_each_gradient_fuse():
    """With AMP and the unfused update (the fused one unscales inside the multi-tensor update)
    each float16 weight gradient is cast to float32 and unscaled (``scalar_mul_by_tensor`` by
    1/scale): one fused node each, bit for bit the two nodes."""
    graph, _, _ = _train(amp=True, steps=4, fused_update=False)
    fused = [n.attrs["expr"] for n in graph.ir.nodes if n.op.name == "fused_elementwise"]
    assert fused.count("mul(f32(x0), x1)") == 3, fused  # float16: both weights, the first bias
    left = [n.inputs[0].producer for n in graph.ir.nodes if n.op.name == "scalar_mul_by_tensor"]
    assert left and all(p is None or p.op.name != "cast" for p in left), left  # no cast + unscale


def test_scalar_mul_by_tensor_fuses_only_with_a_scalar_that_broadcasts_into_the_output():
    g = Graph()
    emit = emitter(g)
    x, s = g.add_input("x", (2, 3), float32), g.add_input("s", (1,), float32)
    t = g.add_input("t", (1, 1, 1), float32)
    g.set_outputs([emit("relu", emit("scalar_mul_by_tensor", x, s)),
                   emit("relu", emit("scalar_mul_by_tensor", x, t))])
    assert [n.op.name for n in fuse_elementwise(g).nodes] == \
        ["fused_elementwise", "scalar_mul_by_tensor", "relu"]
    plan, fused = _compile(g, True)
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(2, 3)).astype(np.float32), np.array([0.3], np.float32),
          np.array([[[0.7]]], np.float32)]
    want = [np.maximum(xs[0] * xs[1], 0), np.maximum(xs[0] * xs[2][0, 0], 0)]
    for got, w in zip(plan.run(xs), want):
        _same_bits(got, w.astype(np.float32))
