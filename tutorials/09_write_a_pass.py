# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %%
"""Lesson 9: write a pass. Common-subexpression elimination (CSE) over the IR, run inside the pass
pipeline, checked by values, and two broken versions: one that ``Graph.verify()`` catches, one
that only a comparison of values catches.

What this lesson shows:

1. The pass contract (``docs/extending.md``, "Add a pass"): ``def name(graph, ctx) -> graph``, the
   graph rewritten in place and returned; ``ctx`` is the pipeline's ``CompileContext``; the
   docstring says what the pass assumes and guarantees and where the algorithm comes from.
2. The pass, :func:`common_subexpression_elimination`: a node of the same op, reading the same
   Values (unchanged since), with the same attributes as an earlier node computes the same
   outputs, so its readers can read the earlier node's outputs (``graph.replace_uses``, which also
   rewires the graph's named results) and the node is dropped. Ops that write their inputs
   (``node.written``: the update ops, a training-mode batch norm) are never merged, and a variable
   they write is a new version for the nodes after them.
3. The IR before and after, on a graph with a copy-pasted subexpression.
4. Into the pipeline: ``passes_for(ctx)`` is the list of ``(name, pass)`` pairs ``nn.Graph`` runs;
   the lesson inserts CSE right after autograd (whose gradient rule for ``x * x`` emits the same
   node twice) and runs the list with ``run_passes``, which verifies the IR after every pass.
5. Same values: ``ir.evaluate`` (the NumPy float64 reference interpreter) before and after, and
   real plans of the pipeline with and without CSE, bit for bit; update ops are kept. Then inside
   ``nn.Graph``, which compiles with ``miniflow.passes.pipeline.PASSES``: a model trained with CSE
   in that list and without it, bit for bit.
6. Broken on purpose: a CSE that drops duplicates but forgets to rewire their readers
   (``verify()``: a value used but never defined), and one that ignores attributes. Merging
   ``reduce_sum`` over axis 0 with one over axis 1 changes a type (``verify()`` catches it);
   merging ``x * 2`` with ``x * 3`` changes no type, so ``verify()`` passes and only
   ``ir.evaluate`` shows the wrong value. Tests of a pass compare values, not only structure.

Assumes from lesson 1: the IR printout and plans; from lesson 2: the autograd pass, building an IR
by hand with ``ops.emitter`` and ``CompileContext``.

Run:  python tutorials/09_write_a_pass.py        (a few seconds; no figure)
"""
import argparse
import dataclasses
import inspect

import numpy as np

import miniflow as mf
from miniflow import nn
from miniflow.ir import Graph, Value, VerifyError, evaluate
from miniflow.notebook import script_args
from miniflow.ops import emitter
from miniflow.passes import pipeline
from miniflow.passes.autograd import autograd
from miniflow.passes.pipeline import CompileContext, CompileSettings, passes_for, run_passes
from miniflow.runtime.plan import Plan


# %%
def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


# %%
# ============================================================================ the pass
def attrs_key(attrs: dict) -> tuple:
    """A hashable form of a node's attributes. Scalars are keyed by type and ``repr``, so ``0.0``
    and ``-0.0`` (equal under ``==``, different as a ``scalar_mul`` factor) or ``1`` and
    ``True`` stay apart."""
    def frozen(v):
        if isinstance(v, (tuple, list)):
            return tuple(frozen(x) for x in v)
        return type(v).__name__, repr(v)
    return tuple(sorted((k, frozen(v)) for k, v in attrs.items()))


# %%
def common_subexpression_elimination(graph: Graph, ctx=None) -> Graph:
    """Reuse the outputs of the first of several identical nodes.

    Assumes: ``graph.nodes`` is in topological order (``verify()`` holds). Two nodes are identical
    when they have the same op, read the same Values, each unchanged since (no update op wrote it
    in between), and have the same attributes (:func:`attrs_key`). Ops are deterministic.

    Guarantees: the graph computes the same values. Every reader of a dropped node's outputs, every
    result naming one (``graph.replace_uses``) and every Value a pass state holds
    (``ctx.state[AutogradState].initial_grad`` ...) reads the first node's outputs instead. Ops
    that write inputs (``node.written``) are never merged or dropped; after one, the Values it
    wrote count as new. Nodes keep their order. Run it before the AMP pass: AMP's decisions
    (``ctx.state[AmpState]``) name nodes, which this pass would drop.

    Source: value numbering (Cocke 1970; "Engineering a Compiler", Cooper & Torczon, 8.4.1) over a
    single block, as LLVM's EarlyCSE and TVM's ``EliminateCommonSubexpr`` do it.
    """
    first: dict = {}        # key -> the first node with that key
    version: dict = {}      # Value -> how many update ops have written it so far
    replaced: dict = {}     # dropped output -> the output that replaces it
    kept = []
    for node in graph.nodes:
        if node.written:
            kept.append(node)
            for v in node.written:
                version[v] = version.get(v, 0) + 1
            continue
        key = (node.op, tuple((v, version.get(v, 0)) for v in node.inputs), attrs_key(node.attrs))
        earlier = first.get(key)
        if earlier is None:
            first[key] = node
            kept.append(node)
            continue
        for old, new in zip(node.outputs, earlier.outputs):
            graph.replace_uses(old, new)      # later nodes and the results read `new`
            replaced[old] = new
    graph.nodes = kept
    if ctx is not None:     # each pass state is a dataclass: replace the Values it holds
        for kind, state in list(ctx.state.items()):
            held = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
            ctx.state[kind] = dataclasses.replace(state, **{
                k: replaced[v] for k, v in held.items() if isinstance(v, Value) and v in replaced})
    return graph


# %%
# ============================================================================ two broken versions
def cse_forgetting_readers(graph: Graph, ctx=None) -> Graph:
    """BROKEN: drops the duplicates but never rewires their readers."""
    seen, kept = set(), []
    for node in graph.nodes:
        key = (node.op, tuple(node.inputs), attrs_key(node.attrs))
        if node.written or key not in seen:
            seen.add(key)
            kept.append(node)
    graph.nodes = kept
    return graph


# %%
def cse_ignoring_attributes(graph: Graph, ctx=None) -> Graph:
    """BROKEN: merges nodes of the same op and inputs whatever their attributes."""
    first, kept = {}, []
    for node in graph.nodes:
        key = (node.op, tuple(node.inputs))
        if node.written or key not in first:
            first.setdefault(key, node)
            kept.append(node)
            continue
        for old, new in zip(node.outputs, first[key].outputs):
            graph.replace_uses(old, new)
    graph.nodes = kept
    return graph


# %%
# ============================================================================ example graphs
def build_ir(w_data: np.ndarray, dtype=mf.float64) -> Graph:
    """``loss = sum(col * col) + sum(row * s)`` with ``col = sum_rows(2 * tanh(x @ w))``,
    ``row = sum_cols(3 * tanh(x @ w))`` and ``s = sum_cols(x)``: ``tanh(x @ w)`` is written
    twice, as copy-pasted code would record it."""
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (4, 3), dtype)
    w = g.add_variable("w", (3, 3), dtype, data=w_data)
    a = emit("scalar_mul", emit("tanh", emit("matmul", x, w)), scalar=2.0)
    b = emit("scalar_mul", emit("tanh", emit("matmul", x, w)), scalar=3.0)
    col = emit("reduce_sum", a, axis=(0,))
    row = emit("reduce_sum", b, axis=(1,))
    s = emit("reduce_sum", x, axis=(1,))
    loss = emit("broadcast_add", emit("reduce_sum", emit("broadcast_mul", col, col), axis=None),
                emit("reduce_sum", emit("broadcast_mul", row, s), axis=None))
    g.set_outputs([loss])
    g.results["loss"] = loss     # what loss.backward() records inside build
    return g


# %%
def same_types_ir() -> Graph:
    """``sum(2 * t) + sum(3 * t)`` with ``t = tanh(x)``: the two scalar_mul nodes differ only in
    an attribute, and have one type."""
    g = Graph()
    emit = emitter(g)
    t = emit("tanh", g.add_input("x", (2, 3), mf.float64))
    total = emit("broadcast_add", emit("reduce_sum", emit("scalar_mul", t, scalar=2.0), axis=None),
                 emit("reduce_sum", emit("scalar_mul", t, scalar=3.0), axis=None))
    g.set_outputs([total])
    return g


# %%
def update_ir(w_data: np.ndarray) -> Graph:
    """Two identical SGD steps on ``w`` and ``tanh(w)`` read before and after them."""
    g = Graph()
    emit = emitter(g)
    w = g.add_variable("w", (3,), mf.float64, data=w_data)
    lr = g.add_constant(np.full(1, 0.1))                 # the learning rate is an f64[1] input
    skip = g.add_constant(np.zeros(1, np.int64))
    before = emit("tanh", w)
    grad = emit("ones_like", w)
    emit("sgd_update", w, grad, lr, skip)
    emit("sgd_update", w, grad, lr, skip)
    after = emit("tanh", w)
    g.set_outputs([before, after])
    return g


# %%
def counted(name: str, fn, log: list):
    """The pass ``fn`` as a pipeline entry that records the node count after it runs."""
    def run(graph, ctx):
        graph = fn(graph, ctx)
        log.append((name, len(graph.nodes)))
        return graph
    return name, run


# %%
def pass_list(with_cse: bool, ctx: CompileContext, log: list) -> list:
    """``passes_for(ctx)`` (what ``nn.Graph`` runs), with CSE right after autograd if asked."""
    passes = passes_for(ctx)
    if with_cse:
        at = [name for name, _ in passes].index("autograd") + 1
        passes.insert(at, ("common_subexpression_elimination", common_subexpression_elimination))
    return [counted(name, fn, log) for name, fn in passes]


# %%
def train_with(extra_pass) -> tuple:
    """Train a small MLP for 5 SGD steps with ``extra_pass`` (or None) put into
    ``miniflow.passes.pipeline.PASSES`` after autograd; returns (losses, parameters, IR nodes).

    ``nn.Graph`` runs ``passes_for(ctx)``, which reads ``PASSES`` when a graph compiles, so the
    edit applies to the graphs compiled meanwhile (tests do it with pytest's ``monkeypatch``); the
    list is restored after. To add a pass to miniflow itself, add it to ``PASSES`` in
    ``miniflow/passes/pipeline.py``."""
    mf.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.GELU(), nn.Linear(8, 2))

    class TrainStep(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.05))

        def build(self, x):
            y = self.model(x)
            loss = (y * y).sum()
            loss.backward()
            return loss

    saved = list(pipeline.PASSES)
    try:
        if extra_pass is not None:
            at = [name for name, _ in pipeline.PASSES].index("autograd") + 1
            pipeline.PASSES.insert(at, (extra_pass.__name__, extra_pass))
        step = TrainStep()
        x = np.random.default_rng(1).uniform(-1, 1, (16, 3)).astype(np.float32)
        losses = [step(x).numpy() for _ in range(5)]
    finally:
        pipeline.PASSES[:] = saved
    return losses, model.state_dict(), len(step.ir.nodes)


# %%
def main():
    argparse.ArgumentParser(description="Lesson 9: write a pass (common-subexpression "
                            "elimination)").parse_args(script_args())   # --help; no options
    mf.set_backend("cpu")
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (4, 3))
    w = rng.uniform(-1, 1, (3, 3))

    print("== 1. A pass is def name(graph, ctx) -> graph ==")
    print(indent(inspect.getsource(common_subexpression_elimination).rstrip()))

    print("\n== 2. The IR before and after CSE ==")
    g = build_ir(w)
    before = evaluate(g, [x])
    print(indent(str(g)))
    n_before = len(g.nodes)
    g = run_passes(g, CompileContext(), [("common_subexpression_elimination",
                                          common_subexpression_elimination)])
    print("after common_subexpression_elimination (run_passes verified it):")
    print(indent(str(g)))
    after = evaluate(g, [x])
    print(f"CSE on the forward graph: {n_before} -> {len(g.nodes)} nodes (the second matmul and "
          f"tanh are gone; the two scalar_mul nodes differ in their attribute and stay)")
    same = bool(np.array_equal(before["loss"], after["loss"]))
    print(f"ir.evaluate before vs after CSE (float64): loss {float(before['loss']):.12f} vs "
          f"{float(after['loss']):.12f}, equal: {same}")

    print("\n== 3. Into the pipeline: after autograd ==")
    ctx = CompileContext(CompileSettings(trainable=["w"]))
    print(f"passes_for(ctx), what nn.Graph runs for this context: "
          f"{[name for name, _ in passes_for(ctx)]}")
    runs = {}
    for with_cse in (False, True):
        log: list = []
        c = CompileContext(CompileSettings(trainable=["w"]))
        graph = build_ir(w.astype(np.float32), mf.float32)
        graph = run_passes(graph, c, pass_list(with_cse, c, log))
        graph.set_outputs([graph.loss, graph.grads["w"]])
        runs[with_cse] = graph
        print(f"pipeline {'with' if with_cse else 'without'} CSE, nodes after each pass: "
              + ", ".join(f"{name} {n}" for name, n in log))
    g = run_passes(build_ir(w), CompileContext(CompileSettings(trainable=["w"])),
                   [("autograd", autograd)])
    ops_before = g.count_ops()
    ops_after = common_subexpression_elimination(g).count_ops()
    merged = {op: n - ops_after.get(op, 0) for op, n in ops_before.items()
              if n > ops_after.get(op, 0)}
    print(f"nodes CSE removed right after autograd, per op: {merged} (the rule of "
          f"broadcast_mul(col, col) emits broadcast_mul(dy, col) once per input: the same node "
          f"twice)")

    print("\n== 4. Same values: real plans and ir.evaluate ==")
    x32 = x.astype(np.float32)
    (loss0, grad0), (loss1, grad1) = (Plan(runs[k], mf.get_backend()).run([x32]) for k in (0, 1))
    print(f"plan without CSE vs plan with CSE (float32): loss bit-identical: "
          f"{bool(np.array_equal(loss0, loss1))}, dL/dw bit-identical: "
          f"{bool(np.array_equal(grad0, grad1))}")
    ref = evaluate(runs[True], [x32])
    print(f"plan with CSE vs ir.evaluate of its IR (float64): max |dL/dw difference| "
          f"{np.abs(grad1 - ref['output1']).max():.1e} (float32 rounding)")
    g = update_ir(w[0].copy())
    want = evaluate(g, [])
    g = common_subexpression_elimination(g)
    got = evaluate(g, [])
    print(f"with update ops: {g.count_ops()['sgd_update']} sgd_update nodes kept, "
          f"{g.count_ops()['tanh']} tanh(w) nodes kept (w changed between them); ir.evaluate "
          f"before vs after CSE: new w equal: {bool(np.array_equal(want['w'], got['w']))}, "
          f"tanh(w) after the updates equal: "
          f"{bool(np.array_equal(want['output1'], got['output1']))}")

    print("\n== 5. Inside nn.Graph: it compiles with pipeline.PASSES ==")
    plain, with_cse = train_with(None), train_with(common_subexpression_elimination)
    print(f"a GELU MLP trained 5 steps on loss = sum(y * y): {plain[2]} nodes without CSE, "
          f"{with_cse[2]} with; losses bit-identical: "
          f"{all(np.array_equal(a, b) for a, b in zip(plain[0], with_cse[0]))}, parameters "
          f"bit-identical: {all(np.array_equal(plain[1][k], with_cse[1][k]) for k in plain[1])}")

    print("\n== 6. Broken on purpose: verify() catches what breaks the IR ==")
    print(indent(inspect.getsource(cse_forgetting_readers).rstrip()))
    try:
        run_passes(build_ir(w), CompileContext(), [("cse_forgetting_readers",
                                                    cse_forgetting_readers)])
        print("cse_forgetting_readers: verify() passed (unexpected)")
    except VerifyError as e:
        print(f"cse_forgetting_readers: VerifyError: {e}")
    try:
        run_passes(build_ir(w), CompileContext(), [("cse_ignoring_attributes",
                                                    cse_ignoring_attributes)])
        print("cse_ignoring_attributes: verify() passed (unexpected)")
    except VerifyError as e:
        print(f"cse_ignoring_attributes on reduce_sum over axis 0 and 1: VerifyError: {e}")

    print("\n== 7. ... and what only values catch ==")
    g = same_types_ir()
    x23 = rng.uniform(-1, 1, (2, 3))
    want = float(evaluate(g, [x23])["output0"])
    g = run_passes(g, CompileContext(), [("cse_ignoring_attributes", cse_ignoring_attributes)])
    got = float(evaluate(g, [x23])["output0"])
    print(f"cse_ignoring_attributes on sum(2 t) + sum(3 t): verify() passed, "
          f"ir.evaluate gives {got:.6f} instead of {want:.6f}: wrong by {abs(got - want):.6f}")
    g = same_types_ir()
    g = common_subexpression_elimination(g)
    print(f"the correct pass on the same graph: {float(evaluate(g, [x23])['output0']):.6f}, "
          f"{g.count_ops()['scalar_mul']} scalar_mul nodes kept")


# %%
if __name__ == "__main__":
    main()
