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
"""Lesson 2: autograd as a graph pass. The backward nodes it emits, and a finite-difference check.

What this lesson shows:

1. ``loss.backward()`` inside ``build`` only marks the loss. The *autograd pass* then walks the
   forward nodes in reverse and calls each op's gradient rule; a rule *emits* ordinary IR nodes
   (``tanh`` -> ``tanh_grad``, ``matmul`` -> two matmuls with transposes). The backward graph is
   part of the same IR, so later passes (AMP, loss scaling, the optimizer) see and rewrite it too.
2. A value used twice gets two gradient contributions, summed by one ``add_n`` node.
3. The backward starts from ``ones_like(loss)`` (the *initial gradient*, in the autograd pass's
   state: ``ctx.state[AutogradState].initial_grad``); each parameter's gradient is a named result
   of the graph, ``graph.results["grad:w"]`` (``graph.grads`` lists them).
4. The gradients are right: equal to the hand-derived formula, and to central finite differences
   ``(L(w + eps) - L(w - eps)) / (2 eps)`` in float64, for the whole graph and for single ops
   (``miniflow.testing.check_grad``).
5. Inside ``nn.Graph`` the same pass runs between tracing and the optimizer pass
   (``config.debug(print_ir=True)`` prints the IR after every pass).

Assumes from lesson 1: the IR printout (``%out: dtype[shape] = op(inputs) {attrs}``), graph inputs
and variables, nn.Graph and plans. Here we build the IR by hand with ``Graph.emit`` (exactly the
nodes that tracing ``build`` would record; ``ops.emitter(g)`` emits an op by its name) so that we
can run one pass at a time.

Run:  python tutorials/02_graph_autograd.py [--out DIR]   (a few seconds; writes one text file)
"""
import argparse
import contextlib
import inspect
import io
from pathlib import Path

import numpy as np

import miniflow as mf
from miniflow import nn
from miniflow.ir import Graph
from miniflow.notebook import out_folder, script_args, script_dir
from miniflow.ops import emitter, get_op
from miniflow.passes.autograd import AutogradState, autograd
from miniflow.passes.pipeline import CompileContext, CompileSettings
from miniflow.runtime.plan import Plan
from miniflow.testing import check_grad

DEFAULT_OUT = script_dir(globals()).parent / "tutorial-output" / "02_graph_autograd"


# %%
def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


# %%
def build_ir(w_data: np.ndarray) -> Graph:
    """loss = sum(h * h) with h = tanh(x @ w): x is an input, w a variable (a parameter)."""
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (4, 3), mf.float64)
    w = g.add_variable("w", (3, 2), mf.float64, data=w_data)   # the plan reads w_data in place
    h = emit("tanh", emit("matmul", x, w))
    loss = emit("reduce_sum", emit("broadcast_mul", h, h), axis=None)  # h is used twice
    g.set_outputs([loss])
    g.results["loss"] = loss   # what loss.backward() records inside build
    return g


# %%
def main():
    p = argparse.ArgumentParser(description="Lesson 2: autograd as a graph pass")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the text file")
    args = p.parse_args(script_args())
    out_folder(p, args.out)
    mf.set_backend("cpu")
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (4, 3))
    w = rng.uniform(-1, 1, (3, 2))

    print("== 1. The forward IR, as build would record it ==")
    g = build_ir(w)
    n_forward = len(g.nodes)
    print("IR before autograd (loss = sum(h * h), h = tanh(x @ w)):")
    print(indent(str(g)))

    print("\n== 2. Run the autograd pass: it emits backward nodes into the same IR ==")
    for op in dict.fromkeys(n.op for n in g.nodes):
        print(f"op definition of {op.name:<14} (its doc string): {op.doc}")
    print("the rule of broadcast_mul, as written in miniflow/ops/elementwise.py:")
    print(indent(inspect.getsource(get_op("broadcast_mul").grad).rstrip()))
    ctx = CompileContext(CompileSettings(trainable=["w"]))
    g = autograd(g, ctx)
    g.verify()
    names = g.names()      # the printer's names: %0, %1 ... in order
    print("IR after autograd (fwd = recorded by build, bwd = emitted by the pass):")
    for i, node in enumerate(g.nodes):
        print(f"    {'fwd' if i < n_forward else 'bwd'}  {node.format(names)}")
    backward_ops = [n.op.name for n in g.nodes[n_forward:]]
    print(f"backward node types, in order: {backward_ops}")
    print(f"initial gradient (seed of the backward pass, ctx.state[AutogradState].initial_grad): "
          f"{ctx.state[AutogradState].initial_grad.producer.format(names)}")
    print(f"h = tanh(...) is read twice, so its two gradient contributions are summed by: "
          f"{[n.format(names) for n in g.nodes if n.op.name == 'add_n']}")
    print(f"gradient of each trainable variable (the results \"grad:<name>\"): "
          f"{ {k: '%' + names[v] for k, v in g.results.items() if k.startswith('grad:')} }")
    print("dropped node: matmul's rule also emitted the gradient of the input x; no parameter "
          "needs it, so the pass removed it before returning (one matmul is left in the backward)")

    print("\n== 3. Run it: the gradient is the hand-derived one ==")
    g.set_outputs([g.loss, g.grads["w"]])
    plan = Plan(g, mf.get_backend())
    loss, dw = plan.run([x])
    h = np.tanh(x @ w)
    dw_by_hand = x.T @ (2 * h * (1 - h * h))      # dL/dh = 2h, dtanh = 1 - h^2, dmatmul: x.T @ .
    print(f"loss computed by the plan: {float(loss):.6f} (NumPy: {float((h * h).sum()):.6f})")
    print(f"dL/dw from the graph:\n{indent(np.array2string(dw, precision=6))}")
    print(f"max |graph dL/dw - hand-derived x.T @ (2h(1 - h^2))|: "
          f"{np.abs(dw - dw_by_hand).max():.3g}")

    eps, fd = 1e-6, np.zeros_like(w)
    w0 = w.copy()
    for idx in np.ndindex(w.shape):          # w is the variable's storage: edit it in place
        for sign in (1, -1):
            w[...] = w0
            w[idx] += sign * eps
            fd[idx] += sign * float(plan.run([x])[0]) / (2 * eps)
    w[...] = w0
    print(f"max |graph dL/dw - central finite differences (eps={eps:g})|: "
          f"{np.abs(dw - fd).max():.3g}")

    print("\n== 4. Every gradient rule against finite differences (miniflow.testing.check_grad) ==")
    u = lambda *s: rng.uniform(-1, 1, s)  # noqa: E731
    cases = [("matmul", [u(3, 4), u(4, 2)], {}),
             ("matmul", [u(3, 4), u(2, 4)], {"transpose_b": True}),
             ("bias_add", [u(5, 3), u(3)], {"axis": 1}),
             ("tanh", [u(3, 4)], {}),
             ("sigmoid", [u(3, 4)], {}),
             ("broadcast_mul", [u(3, 4), u(3, 1)], {}),
             ("broadcast_div", [u(3, 4), u(4) + 2.0], {}),
             ("reduce_sum", [u(3, 4, 2)], {"axis": (0, 2)}),
             ("log_softmax", [u(3, 5)], {}),
             ("sparse_softmax_cross_entropy", [u(4, 5), np.array([0, 4, 2, 2])], {})]
    passed = 0
    for op, inputs, attrs in cases:
        try:
            worst = check_grad(op, inputs, attrs)
            passed += 1
            verdict = "agrees"
        except AssertionError as e:
            worst, verdict = float("nan"), f"MISMATCH: {e}"
        print(f"finite-difference check of {op:<28} {str(attrs):<22} max |rule - FD| = "
              f"{worst:.2e}  {verdict}")
    print(f"finite-difference check: {passed} of {len(cases)} ops agree")

    print("\n== 5. The same pass inside nn.Graph: config.debug(print_ir=True) ==")
    mf.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 1))

    class TrainStep(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.1))
            self.config.debug(print_ir=True)

        def build(self, x):
            loss = self.model(x).tanh().sum()
            loss.backward()          # marks the loss; emits nothing yet
            return loss

    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        TrainStep()(x.astype(np.float32))
    path = args.out / "print_ir.txt"
    path.write_text(log.getvalue())
    print(f"print_ir output written to: {path}")
    sections = [s for s in log.getvalue().split("# IR after ") if s.strip()]
    for s in sections:
        name, body = s.split("\n", 1)
        ops = [ln.split(" = ")[-1].split("(")[0].strip() for ln in body.splitlines()
               if " = " in ln or "_update(" in ln]
        print(f"IR after {name:<22}: {len(ops):2d} nodes; op types {sorted(set(ops))}")


# %%
if __name__ == "__main__":
    main()
