"""Registry-wide: every op declares what the rest of miniflow derives from it, and every op's CPU
kernel, on every sample (and its float64 variant, and every cast), agrees with the op's own NumPy
float64 reference run through ``miniflow.ir.evaluate``. An op without a reference or samples
fails here; the CUDA simulator lane runs the same comparison for the CUDA kernels
(``tests/cuda/test_cuda_kernels.py``).

Also: ``evaluate`` itself (a whole training step against the plan), and what the registry
derives (the elementwise kernels, also of an op registered late, the fused-expression functions,
the inputs each op writes).
"""
import ast
import types
from pathlib import Path

import numpy as np
import pytest

import miniflow as mf
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.ir import Graph, evaluate
from miniflow.kernels import cpu
from miniflow.kernels.common.elementwise import elementwise_ops
from miniflow.kernels.common.table import kernel_table
from miniflow.ops import all_ops, emitter, get_op, register, scalar_functions, unregister
from miniflow.ops.fused import arity
from miniflow.ops.registry import OP_REGISTRY

from op_cases import (Case, assert_bit_exact, assert_matches_reference, bfloat16_cases,
                      cast_cases, float64_cases, host_buffers, late_op, make_node, reference,
                      registry_cases, results, run_cpu_placed)

CASES = registry_cases() + float64_cases() + bfloat16_cases() + cast_cases()


@pytest.mark.parametrize("name", sorted(all_ops()))
def test_every_op_declares_a_reference_samples_an_amp_list_and_a_kernel(name):
    op = get_op(name)
    assert op.reference is not None, f"{name}: declare reference= (NumPy float64) in its OpDef"
    assert op.samples is not None and op.samples(), f"{name}: declare samples= in its OpDef"
    assert op.amp is not None or op.amp_note, f"{name}: in no AMP list, without a reason"
    assert cpu.builder_for(op) is not None, f"{name}: no CPU kernel"


def run_cpu(case) -> list:
    """The CPU builder's steps on the case, run as a plan runs them (NumPy's floating-point
    warnings off: inf and NaN are values, whichever of BLAS or a Numba loop the tuner took)."""
    node = make_node(case)
    ins, outs = host_buffers(case, node)
    with np.errstate(all="ignore"):
        for fn, args in cpu.builder_for(node.op)(node, ins, outs):
            fn(*args)
    return results(case, node, ins, outs)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cpu_kernel_matches_the_float64_reference(case):
    assert_matches_reference(case, run_cpu(case))


CAST_LIKE = [c for c in CASES if c.op == "cast_like"]


@pytest.mark.parametrize("case", CAST_LIKE, ids=[c.id for c in CAST_LIKE])
def test_cast_like_reference_rounds_to_the_dtype_of_like_as_the_kernel(case):
    """Op cast_like's reference gave ``in``'s values unrounded (``evaluate`` of a float32 0.1
    cast like a float16 was 0.1, the kernel's 0.0999755859375): only the kernel tests rounded
    it. ``evaluate`` rounds it to ``dtype_like``'s dtype (``round_outputs``): the kernel's
    values, bit for bit, for float16 and bfloat16 likes too."""
    (got,), (want,) = run_cpu(case), reference(case)
    assert want.dtype == np.float64
    np.testing.assert_array_equal(got.astype(np.float64), want, err_msg=case.id)


def test_cast_like_cases_hold_float16_and_bfloat16_likes():
    assert {c.inputs[1].dtype.name for c in CAST_LIKE} >= {"float16", "bfloat16", "float32"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cpu_kernel_bits_do_not_depend_on_where_its_buffers_lie(case):
    """Eight placements of the inputs, outputs and scratch in one arena (in shuffled orders; four
    packed, four with gaps up to the largest input) give the bits of separately allocated
    buffers. A kernel whose loop LLVM vectorizes behind a run-time overlap check, and whose
    vectorized and scalar loops round differently (a sum in partial sums), fails: the softmax
    kernels did, when their scratch lay just past the logits (a one-ulp difference between two
    identical trainings, ``test_checkpoint.py``)."""
    want = run_cpu(case)
    rng = np.random.default_rng(sum(map(ord, case.id)))
    count = len(case.inputs) + len(make_node(case).outputs)
    widest = max([a.nbytes for a in case.inputs] + [64])
    for placement in range(8):
        gaps = [0] if placement < 4 else list(rng.integers(0, widest // 16 + 1, 8) * 16)
        got = run_cpu_placed(case, rng.permutation(count), gaps)
        for k, (g, w) in enumerate(zip(got, want)):
            assert_bit_exact(g, w, f"{case.id} result {k}, placement {placement} (gaps {gaps})")


def test_an_op_without_a_reference_fails_evaluate_naming_it():
    op = register("test_no_reference", lambda ins, attrs: [(ins[0].shape, ins[0].dtype)],
                  amp=None, amp_note="a test op")
    try:
        g = Graph()
        g.set_outputs([g.emit(op, g.add_input("x", (2,), mf.float32))])
        with pytest.raises(NotImplementedError, match="op 'test_no_reference' has no reference"):
            evaluate(g, [np.zeros(2, np.float32)])
    finally:
        unregister("test_no_reference")
    assert "test_no_reference" not in OP_REGISTRY
    with pytest.raises(KeyError, match="unknown op type 'test_no_reference'"):
        unregister("test_no_reference")


def test_evaluate_runs_a_training_step_like_the_plan():
    """A whole SGD-momentum step (forward, backward, updates) in float64 against the float32 plan:
    the loss, every gradient and every updated parameter and momentum buffer."""
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    step = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    r = np.random.default_rng(0)
    x, y = r.random((5, 4), dtype=np.float32), r.integers(0, 3, 5)
    before = {f"model.{k}": v.copy() for k, v in model.state_dict().items()}  # variable names
    loss = float(step(x, y))
    ir = step.ir
    state = {name: before.get(name, np.zeros(v.shape, np.float32))
             for name, v in ir.variables.items()  # the momentum buffers start at zero
             if name != "optimizer0.learning_rate"}  # read from the optimizer's array
    got = evaluate(ir, [x, y], state)
    assert got["loss"].dtype == np.float64 and abs(float(got["loss"]) - loss) < 1e-6
    assert set(ir.grads) == set(before)
    for key, p in model.state_dict().items():
        name = f"model.{key}"
        np.testing.assert_allclose(got[name], p, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got[f"{name}.momentum_buffer"],
                                   ir.variable_data[f"{name}.momentum_buffer"], rtol=1e-5,
                                   atol=1e-6)
    assert not np.array_equal(state["model.0.weight"], got["model.0.weight"])


def test_evaluate_checks_its_arguments():
    g = Graph()
    x = g.add_input("x", (2,), mf.float32)
    w = g.add_variable("w", (2,), mf.float32)
    g.set_outputs([emitter(g)("broadcast_add", x, w)])
    with pytest.raises(ValueError, match="the graph has 1 input"):
        evaluate(g, [])
    with pytest.raises(ValueError, match=r"variable %w has no value; pass variables="):
        evaluate(g, [np.ones(2, np.float32)])
    out = evaluate(g, [np.ones(2, np.float32)], {"w": np.array([0.5, 2.0])})
    np.testing.assert_array_equal(out["output0"], [1.5, 3.0])
    # a new user's findings: other shapes, kinds and names were NumPy errors, or ignored
    with pytest.raises(ValueError, match=r"input %x is f32\[2\], got a floating array of shape "
                                         r"\[3\]"):
        evaluate(g, [np.ones(3, np.float32)], {"w": np.ones(2)})
    with pytest.raises(ValueError, match=r"input %x is f32\[2\], got a integer"):
        evaluate(g, [np.ones(2, np.int64)], {"w": np.ones(2)})
    with pytest.raises(ValueError, match=r"variable %w is f32\[2\], got a floating array of "
                                         r"shape \[3\]"):
        evaluate(g, [np.ones(2, np.float32)], {"w": np.ones(3)})
    with pytest.raises(ValueError, match=r"variables= names no variable of the graph: \['nope'\] "
                                         r"\(its variables: \['w'\]\)"):
        evaluate(g, [np.ones(2, np.float32)], {"w": np.ones(2), "nope": 1.0})


def test_kernel_tables_fusion_functions_and_side_effects_are_derived_from_the_registry():
    elementwise = elementwise_ops()
    assert set(elementwise) == {n for n, op in all_ops().items() if op.scalar is not None}
    assert all(cpu.builder_for(op) is not None for op in elementwise.values())
    assert not set(elementwise) & set(cpu.KERNELS)      # derived, not kept in the table
    functions = scalar_functions()
    assert set(functions) == {op.scalar.__name__ for op in elementwise.values()}
    assert {"f16", "f32", "f64"} <= set(arity()) and set(functions) <= set(arity())
    assert {n for n, op in all_ops().items() if op.writes and not callable(op.writes)} == {
        "sgd_update", "adadelta_update", "dynamic_loss_scale_schedule", "increment", "dropout"}
    assert {n for n, op in all_ops().items() if callable(op.writes)} == {
        "normalization", "adam_update", "multi_tensor_sgd_update_with_cast",
        "multi_tensor_adam_update_with_cast", "multi_tensor_adadelta_update_with_cast"}


def test_what_a_node_writes_depends_on_its_attributes():
    """``normalization`` writes its moving statistics in training mode only: ``Node.written``
    says so, dead-code elimination keeps an unused training node and drops an unused eval one,
    and ``ir.evaluate`` assigns the new statistics only in training mode."""
    from miniflow.passes.dead_code_elimination import dead_code_elimination
    r = np.random.default_rng(0)
    x = r.standard_normal((4, 3, 2, 2)).astype(np.float32)
    stats = {"mm": np.zeros(3, np.float32), "mv": np.ones(3, np.float32),
             "gamma": np.ones(3, np.float32), "beta": np.zeros(3, np.float32)}
    for training in (True, False):
        g = Graph()
        xv = g.add_input("x", x.shape, mf.float32)
        vs = [g.add_variable(k, (3,), mf.float32, data=v) for k, v in stats.items()]
        out = emitter(g)("normalization", xv, *vs, training=training)
        node = g.nodes[0]
        assert node.written == (vs[:2] if training else [])
        got = evaluate(g, [x])
        assert ("mm" in got) is training and ("mv" in got) is training
        if training:
            np.testing.assert_allclose(got["mm"], 0.1 * x.mean(axis=(0, 2, 3)), rtol=1e-6)
        g.set_outputs([])
        assert len(dead_code_elimination(g).nodes) == int(training), out


def test_a_scalar_function_name_clash_is_an_error_at_registration():
    def relu(x):             # not the registered relu
        return x

    with pytest.raises(ValueError, match="scalar function 'relu' .* clashes with another"):
        register("test_clash", lambda ins, attrs: [], scalar=relu, amp="clear")
    with pytest.raises(ValueError, match="in no AMP list: say why in amp_note"):
        register("test_unlisted", lambda ins, attrs: [])
    assert "test_clash" not in OP_REGISTRY and "test_unlisted" not in OP_REGISTRY



THROWAWAY_PREFIXES = ("test_", "lesson", "example_")
"""How the op types that tests, lessons and doc examples register begin: no library op takes such
a name, so adding an op to the library never breaks them (``register`` refuses a name twice)."""


def _registered_names(path: Path) -> list:
    """``(line, op type)`` of every ``register(...)`` / ``elementwise(...)`` call in ``path`` whose
    first argument is a string or a module-level string constant."""
    tree = ast.parse(path.read_text())
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            pairs = (zip(target.elts, value.elts) if isinstance(target, ast.Tuple)
                     and isinstance(value, ast.Tuple) else [(target, value)])
            constants.update({t.id: v.value for t, v in pairs if isinstance(t, ast.Name)
                              and isinstance(v, ast.Constant) and isinstance(v.value, str)})
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and getattr(
                node.func, "id", getattr(node.func, "attr", None)) in ("register", "elementwise"):
            first = node.args[0]
            name = (first.value if isinstance(first, ast.Constant)
                    else constants.get(getattr(first, "id", None)))
            if isinstance(name, str):
                found.append((node.lineno, name))
    return found


def test_tests_and_lessons_register_throwaway_op_names_only():
    root = Path(__file__).resolve().parent.parent
    paths = [*root.glob("tests/**/*.py"), *root.glob("tutorials/*.py")]
    names = {f"{p.relative_to(root)}:{line}": name for p in paths
             for line, name in _registered_names(p)}
    assert any(n == "lesson08_softplus" for n in names.values())   # the scan sees the lesson
    bad = {k: n for k, n in names.items() if not n.startswith(THROWAWAY_PREFIXES)}
    assert not bad, f"register throwaway ops under a prefix of {THROWAWAY_PREFIXES}: {bad}"


def test_an_elementwise_op_registered_late_runs_through_nn_graph():
    """Elementwise kernels are derived when a plan is built, so an op registered after the kernel
    packages were imported runs at once, alone and fused."""
    with late_op() as (op, check):
        assert "test_cube" not in cpu.KERNELS and cpu.builder_for(op) is not None
        check()
    assert "test_cube" not in all_ops() and "throwaway_cube" not in scalar_functions()


def test_a_kernel_table_refuses_two_builders_for_one_op():
    first = types.SimpleNamespace(__name__="first", BUILDERS={"relu": lambda n, i, o: []})
    second = types.SimpleNamespace(__name__="second", BUILDERS={"relu": lambda n, i, o: []})
    assert set(kernel_table(first)) == {"relu"}
    with pytest.raises(ValueError, match="op 'relu' has builders in first and second; keep one"):
        kernel_table(first, second)


# ------------------------------------------------------------------------------ scalar attributes
def test_scalar_args_gives_the_attributes_in_order_with_their_defaults():
    softplus, scalar_mul = get_op("softplus"), get_op("scalar_mul")
    assert softplus.scalar_attrs == ("beta", "threshold") and softplus.tensor_arity == 1
    assert softplus.scalar_args({}) == (1.0, 20.0)
    assert softplus.scalar_args({"threshold": 5.0, "beta": 2.0}) == (2.0, 5.0)
    assert scalar_mul.scalar_args({"scalar": 3.0}) == (3.0,)
    assert get_op("relu").scalar_args({}) == ()
    with pytest.raises(ValueError, match=r"scalar_mul: missing attribute 'scalar' \(it has no "):
        scalar_mul.scalar_args({})


def test_a_node_holds_its_scalar_attributes_as_floats_in_declaration_order():
    """Omitted attributes get their defaults, given ones become floats, first and in
    ``scalar_attrs`` order, so a node prints the same however it was called; ``scalar_*`` nodes
    print as before."""
    g = Graph()
    x = g.add_input("x", (2, 3), mf.float32)
    a = g.emit(get_op("softplus"), x, threshold=5)
    b = g.emit(get_op("softplus"), x)
    c = g.emit(get_op("scalar_add"), x, scalar=1)
    names = g.names()
    assert a.producer.format(names).endswith("softplus(%x) {beta=1.0, threshold=5.0}")
    assert b.producer.format(names).endswith("softplus(%x) {beta=1.0, threshold=20.0}")
    assert c.producer.format(names).endswith("scalar_add(%x) {scalar=1.0}")
    with pytest.raises(ValueError, match="scalar_add: missing attribute 'scalar'"):
        g.emit(get_op("scalar_add"), x)


def _affine_clamp(x, scale, lo, hi):
    """min(max(x * scale, lo), hi): a throwaway function of three scalar attributes."""
    y = x * scale
    if y < lo:
        return lo
    return hi if y > hi else y


def test_an_op_with_three_scalar_attributes_runs_alone_and_fused():
    """The map kernel passes any number of scalar attributes; fusion writes them as numbers."""
    from miniflow.ops.elementwise import elementwise, unary_samples
    from miniflow.passes.fuse_elementwise import fuse_elementwise
    from miniflow.runtime.plan import Plan

    ref = lambda x, scale, lo, hi: np.clip(x * scale, lo, hi)  # noqa: E731
    elementwise("test_affine_clamp", _affine_clamp, ref, amp="clear",
                scalar_attrs=("scale", "lo", "hi"), defaults={"lo": -1.0},
                samples=unary_samples(attrs={"scale": 2.0, "hi": 0.5}))
    try:
        for ins, attrs in get_op("test_affine_clamp").samples():
            case = Case("test_affine_clamp", list(ins), dict(attrs))
            assert_matches_reference(case, run_cpu(case))
        g = Graph()
        x = g.add_input("x", (3, 4), mf.float32)
        emit = emitter(g)
        g.set_outputs([emit("relu", emit("test_affine_clamp", x, scale=3.0, hi=2.0))])
        fused = fuse_elementwise(g)
        assert fused.nodes[0].attrs["expr"] == "relu(_affine_clamp(x0, 3.0, -1.0, 2.0))"
        xs = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
        got = Plan(fused, mf.get_backend()).run([xs])[0]
        np.testing.assert_array_equal(got, np.maximum(np.clip(xs * 3, -1, 2), 0))
    finally:
        unregister("test_affine_clamp")


@pytest.mark.parametrize("kw,match", [
    ({"scalar_attrs": ("a",), "scalar": lambda x, y, a: x}, "need one tensor operand; .* has 2. "
     "Only the map kernels take scalar operands"),
    ({"scalar_attrs": ("a",), "scalar_defaults": {"b": 1.0}}, r"defaults for \['b'\], which "
     "are not in scalar_attrs"),
    ({"scalar_attrs": "a"}, "scalar_attrs must be a tuple of distinct attribute names"),
    ({"scalar_attrs": ("a", "a")}, "scalar_attrs must be a tuple of distinct attribute names"),
    ({"scalar_attrs": ("a",), "scalar": None}, "scalar_attrs without a scalar function"),
])
def test_inconsistent_scalar_attributes_are_refused_at_registration(kw, match):
    def test_scale(x, a):
        return x * a

    fields = {"scalar": test_scale, "amp": "clear", **kw}
    with pytest.raises(ValueError, match=match):
        register("test_bad_attrs", lambda ins, attrs: [], **fields)
    assert "test_bad_attrs" not in OP_REGISTRY
