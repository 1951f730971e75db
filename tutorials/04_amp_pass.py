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
"""Lesson 4: the AMP pass. White/black/gray/clear coloring step by step, the casts it inserts, the
AMP report and the DOT picture.

What this lesson shows:

1. Every op type declares its AMP list where it is defined (``OpDef.amp``;
   ``miniflow/amp/lists.py`` collects them: OneFlow's lists): *white* ops run in float16
   (``matmul``), *black* ops in float32, *gray* ops follow their neighbours (``bias_add``,
   ``reduce_sum``, softmax cross-entropy ...), *clear* ops are layout/trivial ops that take the
   color of their white neighbours (``relu``, ``reshape``, ``ones_like``). Unlisted ops stay
   float32.
2. The pass colors the forward *and* backward graph (autograd ran first, lesson 2) in three steps,
   each made of graph walks (OneFlow's ``AutoMixedPrecision::Apply``):
   step 1, the black set; step 2, the white set; step 3, clear propagation.
3. Casts go only on edges between white (float16) and other (float32) nodes, one per value and
   dtype.
   Parameters stay float32 master weights: white ops read them through a cast.
4. Without anything on the loss path, the colors spread through the loss into the whole backward
   graph: everything runs in float16. That is why miniflow puts an ``amp_black_identity`` on the
   initial gradient by default (lesson 5 explains the loss-scale side of it).
5. On a real ``nn.Graph`` with ``config.enable_amp(True)``: ``amp_report()`` (per node: color, dtype
   and the rule or neighbour that decided it) and ``graph.ir.to_dot(path)`` (Graphviz, nodes filled
   by color). This lesson also draws the colored IR with matplotlib, so you get a picture without
   Graphviz.

Assumes from lesson 1: the IR printout, nn.Graph; from lesson 2: the autograd pass, backward nodes,
``ctx.state[AutogradState].initial_grad``, building an IR by hand with ``ops.emitter``. Values are
named as the printer names them (``graph.names()``), so the names here match each printout.

Run:  python tutorials/04_amp_pass.py [--out DIR]   (a few seconds; writes .dot and .png files)
"""
import argparse
from pathlib import Path

import numpy as np

import miniflow as mf
from miniflow.amp import AmpLists, amp_report
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.ir import Graph
from miniflow.notebook import out_folder, script_args, script_dir
from miniflow.ops import emitter
from miniflow.passes import auto_mixed_precision as amp_pass
from miniflow.passes.autograd import AutogradState, autograd
from miniflow.passes.pipeline import CompileContext, CompileSettings
from miniflow.passes.prune_amp_identity import prune_amp_identity

DEFAULT_OUT = script_dir(globals()).parent / "tutorial-output" / "04_amp_pass"
PARAMS = ["w1", "b1", "w2", "b2"]
FILL = {"white": "white", "black": "black", "gray": "0.7", "clear": "lightblue",
        "unlisted": "khaki", "cast": "gold", "added after AMP": "lavender"}
"""AMP color -> fill in the matplotlib picture (the colors of ``Graph.to_dot``); nodes that later
passes added (the optimizer's casts and updates) have no AMP color (``node.meta["amp_color"]``)."""


# %%
def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


# %%
def mlp_ir(batch=8, n_in=4, hidden=5, classes=3) -> Graph:
    """The IR that tracing ``cross_entropy(Linear -> ReLU -> Linear)`` records (as in lesson 1)."""
    f32 = mf.float32
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (batch, n_in), f32)
    y = g.add_input("y", (batch,), mf.int64)
    w1, b1 = g.add_variable("w1", (hidden, n_in), f32), g.add_variable("b1", (hidden,), f32)
    w2, b2 = g.add_variable("w2", (classes, hidden), f32), g.add_variable("b2", (classes,), f32)
    h = emit("relu", emit("bias_add", emit("matmul", x, w1, transpose_b=True), b1, axis=1))
    z = emit("bias_add", emit("matmul", h, w2, transpose_b=True), b2, axis=1)
    _, per_sample = emit("sparse_softmax_cross_entropy", z, y)
    loss = emit("scalar_mul", emit("reduce_sum", per_sample, axis=None), scalar=1.0 / batch)
    g.set_outputs([loss])
    g.results["loss"] = loss
    return g


# %%
def label(node, names: dict) -> str:
    """``"matmul %3"``, the value named as ``names`` (``Graph.names()``) names it."""
    return f"{node.op.name} %{names[node.outputs[0]]}" if node.outputs else node.op.name


# %%
def show_set(title: str, members: dict, why: str, names: dict) -> None:
    """Print one walk's result: node -> witness (the member that let it join; None = start node)."""
    print(f"{title}: {len(members)} nodes ({why})")
    for node, witness in members.items():
        how = "start node" if witness is None else f"joined via {label(witness, names)}"
        print(f"    {label(node, names):<42} {how}")


# %%
def draw_colored_ir(graph: Graph, path: Path, title: str) -> None:
    """A picture of the IR: one line per node, filled with its AMP color (like the DOT export)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = graph.names()
    lines = [(n.format(names), n.meta.get("amp_color") or "added after AMP") for n in graph.nodes]
    fig = plt.figure(figsize=(11, 0.3 * len(lines) + 1.2))
    fig.text(0.01, 0.99, title, fontsize=10, va="top")
    for i, (text, color) in enumerate(lines):
        y = 1 - (i + 0.5) / len(lines)
        fg = "white" if color == "black" else "black"
        fig.text(0.01, y * 0.93, text[:120], family="monospace", fontsize=8, color=fg, va="center",
                 bbox=dict(facecolor=FILL.get(color, "white"), edgecolor="0.5", pad=2))
    handles = [matplotlib.patches.Patch(facecolor=c, edgecolor="0.5", label=k)
               for k, c in FILL.items()]
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=7)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# %%
def main():
    p = argparse.ArgumentParser(description="Lesson 4: the AMP pass")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for .dot and .png files")
    args = p.parse_args(script_args())
    out_folder(p, args.out)
    mf.set_backend("cpu")
    lists = AmpLists()

    print("== 1. The AMP lists (each op's OpDef.amp, collected by miniflow/amp/lists.py) ==")
    for category in ("white", "black", "gray", "clear"):
        print(f"AMP {category} list: {', '.join(lists.ops(category))}")

    print("\n== 2. A small MLP, forward and backward (autograd ran first) ==")
    g = mlp_ir()
    ctx = CompileContext(CompileSettings(  # an identity on the initial gradient: nn.Graph's default
        trainable=PARAMS, amp=amp_pass.AmpConfig(lists),
        initial_grad_identity="amp_black_identity"))
    autograd(g, ctx)
    names = g.names()
    print("IR before AMP, with each node's AMP list (category) on the right:")
    for n in g.nodes:
        print(f"    {n.format(names):<88} [{lists.category(n.op.name) or 'unlisted'}]")
    print("note: the amp_black_identity after ones_like is what nn.Graph adds by default "
          "(loss_scale_policy='fp32', lesson 5); it is black")

    print("\n== 3. Coloring, step by step (the walks of auto_mixed_precision._color) ==")
    # _color is the pass's internal helper; we call it here only to watch each stage.
    s = amp_pass._color(g, lists)
    show_set("step 1a, walk UP from black and gray nodes, collecting clear producers",
             s.near_black, "candidates for black", names)
    show_set("step 1b, walk DOWN from black nodes through the candidates = the BLACK set",
             s.black, "black: float32", names)
    show_set("step 2a, walk UP from white nodes and gray/clear sinks through non-black gray/clear",
             s.near_white, "candidates for white", names)
    show_set("step 2b, walk DOWN from white nodes through the candidates = the WHITE set",
             s.white, "white: float16", names)
    added = [f"{label(n, names)} ({rule})" for n, rule in s.white_rule.items()
             if rule != "white walk"]
    print(f"step 3, clear propagation (clear nodes next to white ones turn white): "
          f"{added or 'no node added'}")
    untouched = [label(n, names) for n in g.nodes if n not in s.white and n not in s.black]
    print(f"neither white nor black (they stay float32 in their list's color): {untouched}")

    print("\n== 4. Casts: the pass rewrites the IR ==")
    before = {id(n) for n in g.nodes}
    amp_pass.auto_mixed_precision(g, ctx)
    names = g.names()      # casts were inserted: the printer numbers the values afresh
    print("IR after auto_mixed_precision (+cast = inserted by the pass; values renumbered):")
    for n in g.nodes:
        print(f"    {'+cast' if id(n) not in before else '     '} {n.format(names)}")
    report = amp_report(ctx.state[amp_pass.AmpState], g)
    print("AMP report of the hand-built MLP:")
    print(indent(str(report)))
    prune_amp_identity(g, ctx)
    g.verify()
    left = sum(n.op.name.startswith("amp_") for n in g.nodes)
    print(f"after prune_amp_identity: {left} amp identity nodes left, {len(g.nodes)} nodes; the "
          f"colors they caused stay")
    print(f"parameters after AMP are still: "
          f"{ {k: v.type_str for k, v in g.variables.items()} } (float32 master weights)")
    draw_colored_ir(g, args.out / "04_hand_built_mlp_ir.png", "hand-built MLP after AMP")
    print(f"matplotlib picture of the colored IR written to: "
          f"{args.out / '04_hand_built_mlp_ir.png'}")

    print("\n== 5. Without the identity on the initial gradient: colors run through the loss ==")
    plain = mlp_ir()
    ctx_plain = CompileContext(CompileSettings(trainable=PARAMS, amp=amp_pass.AmpConfig(lists)))
    autograd(plain, ctx_plain)
    amp_pass.auto_mixed_precision(plain, ctx_plain)
    rep = amp_report(ctx_plain.state[amp_pass.AmpState], plain)
    print(f"AMP report counts without the identity: {rep.n_fp16} float16 nodes, {rep.n_fp32} "
          f"float32 nodes, {rep.n_casts} inserted casts")
    print(f"loss dtype without the identity: {plain.loss.dtype.short} (with it: "
          f"{g.loss.dtype.short}); initial gradient: "
          f"{ctx_plain.state[AutogradState].initial_grad.dtype.short} (with it: "
          f"{ctx.state[AutogradState].initial_grad.dtype.short})")
    print("why: ones_like reads the loss, so forward and backward form one chain of gray/clear "
          "nodes between white matmuls, and OneFlow's rule makes such a chain white")

    print("\n== 6. The same on a real nn.Graph: amp_report() and to_dot() ==")
    mf.manual_seed(0)
    model = mlp((64, 32, 10))
    step = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    step.config.enable_amp(True)
    rng = np.random.default_rng(0)
    x = rng.random((64, 64), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    loss_amp = float(step(x, y))
    print("amp_report() of the digits MLP training step (64-32-10, batch 64):")
    print(indent(str(step.amp_report())))
    print("the report shows the AMP pass's decisions: rows marked [pruned after AMP] are the "
          "identities prune_amp_identity drops; nodes that fuse_elementwise later merges into "
          "fused_elementwise kernels still compute in the dtype AMP chose, so they are counted")
    dot_path = args.out / "04_amp_mlp.dot"
    step.ir.to_dot(str(dot_path))
    print(f"DOT file written to: {dot_path}")
    png = dot_path.with_suffix(".png")
    if png.exists():
        print(f"Graphviz picture written to: {png}")
    else:
        print(f"Graphviz picture: 'dot' is not installed here; render it with "
              f"`dot -Tpng {dot_path} -o {png}`")
    draw_colored_ir(step.ir, args.out / "04_amp_mlp_ir.png", "digits MLP training step after AMP")
    print(f"matplotlib picture of the colored IR written to: {args.out / '04_amp_mlp_ir.png'}")
    mf.manual_seed(0)
    model32 = mlp((64, 32, 10))
    loss_fp32 = float(TrainGraph(model32, mf.optim.SGD(model32.parameters(), lr=0.1))(x, y))
    print(f"first-step loss with AMP: {loss_amp:.5f}, in float32: {loss_fp32:.5f} "
          f"(|difference| {abs(loss_amp - loss_fp32):.1e}: float16 matmuls, float32 loss)")


# %%
if __name__ == "__main__":
    main()
