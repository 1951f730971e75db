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
"""Lesson 1: eager versus lazy. Build an nn.Graph, print its IR, run it twice, see the plan reused.

What this lesson shows:

1. Eager mode: outside an ``nn.Graph``, every op on a ``miniflow.Tensor`` runs at once (like NumPy),
   forward only.
2. Lazy mode: inside ``nn.Graph.build`` the same code only *records* ops. The tensors there are
   proxies for IR values (``tensor(lazy %3: f32[8,4])``): they have a shape and a dtype, no data.
3. The recorded program is the IR: one line per node, ``%out: dtype[shape] = op(inputs) {attrs}``.
   A pipeline of passes rewrites it before it runs (``config.debug(print_ir=True)`` prints the IR
   after every pass); lessons 2, 4 and 5 are about those passes.
4. The first call with a new input signature (shapes and dtypes) traces ``build``, runs the pass
   pipeline and builds a *plan* (a flat list of kernel calls over preallocated buffers). Later calls
   with that signature only copy the inputs in and run the plan: ``build`` is not run again.
5. A new input shape is a new signature: a second plan is compiled; the parameters are shared.

Assumes from earlier lessons: nothing (this is the first lesson). You need Python and NumPy.

Run:  python tutorials/01_lazy_graph.py        (a few seconds; no figure)
      or open it in Jupyter / VS Code as a notebook (jupytext's percent format: ``# %%`` cells)
"""
import argparse
import contextlib
import io
import time

import numpy as np

import miniflow as mf
from miniflow import nn
from miniflow.notebook import script_args


# %%
def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


class Net(nn.Graph):
    """An inference graph: ``relu(model(x))``. ``build`` says when it runs (only while tracing)."""

    def __init__(self, model):
        super().__init__()
        self.model = model      # a Module attribute: its parameters become graph variables

    def build(self, x):
        h = self.model(x)
        print(f"  [inside build] x is {x}, h = model(x) is {h}   (lazy: shape and dtype, no data)")
        try:
            h.numpy()
        except RuntimeError as e:
            print(f"  [inside build] h.numpy() raises RuntimeError: {e}")
        return h.relu()


# %%
argparse.ArgumentParser(description="Lesson 1: eager versus lazy, an nn.Graph's IR and "
                        "plans").parse_args(script_args())   # --help; the lesson has no options
mf.set_backend("cpu")
rng = mf.manual_seed(0)   # named: a notebook shows a cell's last value, here the generator

# %% [markdown]
# ## 1. Eager mode
# Outside an `nn.Graph` every op runs at once, forward only.

# %%
print("== 1. Eager mode: ops run at once ==")
x = mf.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]])
y = (x * 2.0 + 1.0).relu()
print(f"eager x: a Tensor holding data {x.numpy().tolist()}, dtype {x.dtype!r}")
print(f"eager y = relu(2 * x + 1), computed immediately: {y.numpy().tolist()}")
print(f"eager y.is_lazy: {y.is_lazy}")
try:
    y.sum().backward()
except RuntimeError as e:
    print(f"eager backward() raises RuntimeError (autograd is a graph pass, lesson 2): {e}")

# %% [markdown]
# ## 2. Lazy mode
# Inside `build` the same code records ops into the IR; the passes rewrite it, then a plan runs it.

# %%
print("\n== 2. Lazy mode: an nn.Graph records ops into an IR ==")
model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
graph = Net(model)
graph.config.debug(print_ir=True)   # print the IR after tracing and after every pass
batch = np.random.default_rng(0).random((8, 3), dtype=np.float32)
print("first call graph(batch of 8): build() runs now, as a trace:")
log = io.StringIO()
t0 = time.perf_counter()
with contextlib.redirect_stdout(log):   # keep the print_ir text to show it piece by piece
    out = graph(batch)
first_ms = 1e3 * (time.perf_counter() - t0)
build_lines, *sections = log.getvalue().split("# IR after ")
print(build_lines.rstrip())
print(f"first call returned: a Tensor of shape {out.shape}, dtype {out.dtype!r}")
traced = sections[0].split("\n", 1)[1]
print("IR as traced by build (inputs, variables and constants first, then one line per recorded op):")
print(indent(traced.strip()))
print(f"passes run on it, in order: {[sec.split(chr(10), 1)[0] for sec in sections[1:]]} "
      f"(without a loss or an optimizer, the training passes have nothing to do here)")
print("IR after the passes, which the plan runs (fused_elementwise = a chain of elementwise "
      "ops merged into one kernel by the fuse_elementwise pass):")
print(indent(str(graph.ir)))
print(f"IR node count by op type after the passes: {graph.ir.count_ops()}")

# %% [markdown]
# In a notebook the IR renders as HTML, each node filled by its AMP color (`graph.ir._repr_html_`;
# lesson 4 turns AMP on); as a script this cell prints nothing.

# %%
graph.ir

# %%
eager_out = model(mf.tensor(batch)).relu().numpy()
print(f"eager model(batch) vs the graph's output, max |difference|: "
      f"{np.abs(eager_out - out.numpy()).max():.3g}   "
      f"(passes change how, not what, it computes)")

# %% [markdown]
# ## 3. The plan is reused
# The same input signature runs the cached plan: `build` does not run again.

# %%
print("\n== 3. Run it again: the plan is reused, build() does not run ==")
t0 = time.perf_counter()
out2 = graph(batch * 0.5)
second_ms = 1e3 * (time.perf_counter() - t0)
print(f"second call printed nothing from build; output shape {out2.shape}")
print(f"compile_count after 2 calls with the same input shape: {graph.compile_count}")
print(f"cached plans after 2 calls: {len(graph.plans)}, keyed by input signature and the "
      f"modules' training flags {list(graph.plans)}")
print(f"time of call 1 (trace + passes + plan + kernel load): {first_ms:.1f} ms")
print(f"time of call 2 (copy input in, run the plan):           {second_ms:.3f} ms")
plan = next(iter(graph.plans.values()))
print(f"the plan: {len(plan)} kernel steps, built once (node index, op, kernel function; the "
      f"Numba kernels are all called 'kernel' by the factories of lesson 3):")
print(indent(plan.describe()))
n = 200
t0 = time.perf_counter()
for _ in range(n):
    graph(batch)
print(f"average time of a plan run over {n} calls: "
      f"{1e6 * (time.perf_counter() - t0) / n:.1f} us")

# %% [markdown]
# ## 4. A new input shape is a new signature
# A second plan is compiled; the parameters are shared by every plan.

# %%
print("\n== 4. A new input shape is a new signature: a second plan ==")
log = io.StringIO()
with contextlib.redirect_stdout(log):   # print_ir is still on: keep only build's own lines
    graph(batch[:5])
print("\n".join(ln for ln in log.getvalue().splitlines() if "[inside build]" in ln))
print(f"compile_count after a call with a batch of 5: {graph.compile_count}")
graph(batch)
print(f"compile_count after calling with the batch of 8 again: {graph.compile_count} "
      f"(its plan was cached)")
print(f"cached plans now: {len(graph.plans)}, signatures {list(graph.plans)}")
print(f"parameters are shared by every plan: the model has "
      f"{sum(int(np.prod(p.shape)) for p in model.parameters())} parameter values, "
      f"stored once")
