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
"""Lesson 8: add an op end to end. Declare a plain softplus, log(1 + e**x), as the op
``lesson08_softplus`` with its gradient op ``lesson08_softplus_grad`` in this script, and watch
everything else come from the declaration. A lesson's throwaway op takes a name no library op will
(``register`` refuses a name twice: the library has its own ``softplus``). The library's op is
PyTorch's full one, ``softplus(x, beta=1, threshold=20)``: the same kind of declaration with two
scalar attributes and their defaults (``scalar_attrs=("beta", "threshold")``, ``defaults=``, in
``miniflow/ops/elementwise.py``); part 1 prints it and part 4 compares the two at those defaults.

What this lesson shows:

1. The declaration (the checklist of ``docs/extending.md``, "Add an elementwise op"): two scalar
   functions, plain Python of floats using ``math`` only (:func:`lesson08_softplus`,
   :func:`lesson08_softplus_grad`), and two calls of ``miniflow.ops.elementwise.elementwise``
   (:func:`declare`) that give each op its inference (the default one-float-input rule, and
   ``y_dy_infer`` for the gradient op), the gradient rule (it *emits* ``lesson08_softplus_grad``),
   a NumPy float64 reference, sample inputs and an AMP category. ``register`` checks the
   declaration: an op in no AMP list without a note, or a scalar function whose name another
   function already has, is refused.
2. Inference validates inputs when a node is emitted: the output's shape and dtype, and an int64
   input refused with a message naming the op.
3. The CPU kernel is derived, not written: ``lesson08_softplus`` is in no kernel table
   (``miniflow.kernels.cpu.KERNELS``); ``builder_for(op)`` derives its builder from the scalar
   function (``kernels/common/elementwise.py``, ``derived_builder``), and the CPU factory
   ``map_kernel`` compiles the function into a ``numba.njit`` loop.
4. The kernel against the reference: every sample of both ops (float32, float16 and a float64 copy)
   runs through a one-node graph on the CPU and through ``miniflow.ir.evaluate``, the NumPy float64
   reference interpreter, at the tolerance of the dtype (what ``tests/test_registry.py`` does for
   every registered op).
5. The gradient rule against central finite differences in float64
   (``miniflow.testing.check_grad``: the autograd pass and a real plan).
6. In a model: a two-line ``Softplus`` Module, an MLP trained on the digits with AMP. The fusion
   pass fuses ``bias_add`` + ``lesson08_softplus`` into one generated kernel, whose source imports
   ``lesson08_softplus`` from this script; AMP's ``amp_report()`` shows the gray op turned float16
   between the float16 matmuls; an inference graph's output equals ``ir.evaluate`` of its IR.
7. The CUDA kernel, derived the same way (``cuda.jit(device=True)`` of the same function): in a
   child process, under Numba's CUDA simulator when there is no GPU (``NUMBA_ENABLE_CUDASIM=1``
   must be set before numba is imported, as in lesson 3), every sample against ``ir.evaluate``.
8. ``miniflow.ops.unregister`` removes both ops again.

Assumes from lesson 2: gradient rules that emit ops, ``check_grad``; from lesson 3: a scalar
function compiled into CPU and CUDA kernels; from lesson 4: AMP colors and ``amp_report``.

Note on Numba's disk cache: a kernel's cache key holds its closure, so the scalar function in it.
A function of a script (``__main__``, as here) is keyed with its code, so editing
:func:`lesson08_softplus` in this file recompiles the kernel; a function of a module
(``miniflow/ops/elementwise.py``) is keyed by its name only: after editing one, clear ``NUMBA_CACHE_DIR`` or an old kernel is loaded.

Run:  python tutorials/08_add_an_op.py        (about 10 s; a minute with a cold Numba cache)
"""
import argparse
import inspect
import math
import os
import subprocess
import sys

import numpy as np

import miniflow as mf
from miniflow import nn, notebook
from miniflow.dtype import as_dtype
from miniflow.ir import Graph, evaluate
from miniflow.notebook import script_args, script_dir
from miniflow.ops import all_ops, get_op, scalar_functions, unregister
from miniflow.ops.common import y_dy_infer
from miniflow.ops.elementwise import elementwise, grad_samples, unary_samples
from miniflow.runtime.plan import Plan
from miniflow.tensor import apply

TOL = {np.dtype(np.float16): (2e-3, 2e-3), np.dtype(np.float32): (2e-5, 2e-5),
       np.dtype(np.float64): (1e-12, 1e-12)}
"""(rtol, atol) of a kernel against the float64 reference rounded to the output dtype (the
kernels compute in float32 for f16 and f32): the registry-wide test's tolerances."""
EPOCHS = 5
"""Training epochs of the digits MLP in part 6."""
OP, GRAD_OP = "lesson08_softplus", "lesson08_softplus_grad"
"""The op types this lesson registers (and unregisters at the end)."""


# %%
def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


# ============================================================================ 1. the declaration
def lesson08_softplus(x):
    """log(1 + e**x), evaluated as max(x, 0) + log1p(e**-|x|) so that no exp overflows (NaN
    propagates: every branch keeps it). PyTorch's ``softplus`` with beta=1 and no threshold (the
    library's op ``softplus`` has both attributes; at threshold 20 it returns x where x > 20,
    which differs from this by under 3e-9)."""
    m = x if x > 0.0 else 0.0
    return m + math.log1p(math.exp(-abs(x)))


def lesson08_softplus_grad(x, dy):
    """dy * sigmoid(x), the derivative of softplus, evaluated so that no exp overflows
    (OneFlow's ``softplus_grad(x, dy)``)."""
    if x >= 0.0:
        return dy / (1.0 + math.exp(-x))
    z = math.exp(x)
    return dy * z / (1.0 + z)


AMP_NOTE = ("not in OneFlow's lists (there it runs in float32); declared gray here, like gelu and "
            "silu, so it follows its neighbours: its kernel computes in float32 and rounds once")


# %%
def declare():
    """Register ``lesson08_softplus`` and ``lesson08_softplus_grad``; returns their OpDefs."""
    op = elementwise(
        OP, lesson08_softplus, lambda x: np.logaddexp(0.0, x),     # reference: float64 NumPy
        amp="gray", amp_note=AMP_NOTE,
        grad=lambda node, grads, emit: [emit(GRAD_OP, node.inputs[0], grads[0])],
        samples=unary_samples(-6.0, 6.0),
        doc="out = log(1 + exp(x)); dx = lesson08_softplus_grad(x, dy)")
    grad_op = elementwise(
        GRAD_OP, lesson08_softplus_grad, lambda x, dy: dy * np.exp(-np.logaddexp(0.0, -x)),
        amp="gray", infer=y_dy_infer(GRAD_OP, first="x"),
        samples=grad_samples(-3.0, 3.0), doc="dx = dy * sigmoid(x)")
    return op, grad_op


# %%
def declare_clash():
    """Declare an op whose scalar function is another function named ``lesson08_softplus``
    (refused)."""
    def lesson08_softplus(x):
        return math.log(1.0 + math.exp(x))
    return elementwise("lesson08_softplus_naive", lesson08_softplus, lambda x: np.log1p(np.exp(x)),
                       amp="gray")


# %%
def refused(fn) -> str:
    """The error ``fn()`` raises, as ``Type: message``."""
    try:
        fn()
    except (KeyError, ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    raise AssertionError("expected an error")


# %%
# ============================================================================ helpers
def one_node_graph(name: str, arrays: list, attrs=None) -> Graph:
    """``op(*inputs)`` as a graph with one input per array."""
    g = Graph()
    ins = [g.add_input(f"x{i}", a.shape, as_dtype(a.dtype)) for i, a in enumerate(arrays)]
    g.set_outputs([g.emit(get_op(name), *ins, **(attrs or {}))])
    return g


# %%
def check_samples(name: str) -> dict:
    """Every sample of op ``name`` (plus a float64 copy of each float32 one) on the current backend
    against ``ir.evaluate``; returns dtype -> (samples, worst |error| on finite values, all within
    the dtype's tolerance, the last plan)."""
    samples = get_op(name).samples()
    samples += [([a.astype(np.float64) for a in ins], attrs) for ins, attrs in samples
                if ins[0].dtype == np.float32]
    out = {}
    for ins, attrs in samples:
        g = one_node_graph(name, ins, attrs)
        plan = Plan(g, mf.get_backend())
        got = plan.run(ins)[0]
        with np.errstate(over="ignore", invalid="ignore"):
            want = evaluate(g, ins)["output0"].astype(got.dtype)   # the value a tensor stores
        rtol, atol = TOL[got.dtype]
        ok = bool(np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                              atol=atol, equal_nan=True))
        finite = np.isfinite(want)
        worst = float(np.abs(got[finite].astype(np.float64) - want[finite]).max(initial=0.0))
        n, w, all_ok, _ = out.get(got.dtype.name, (0, 0.0, True, None))
        out[got.dtype.name] = (n + 1, max(w, worst), all_ok and ok, plan)
    return out


# %%
def print_sample_checks() -> None:
    """One line per op and dtype: :func:`check_samples` on the current backend."""
    for name in (OP, GRAD_OP):
        for dtype, (n, worst, ok, _) in check_samples(name).items():
            print(f"{mf.get_backend().name} kernel of {name:<22} {dtype:<7}: {n} samples, max "
                  f"|kernel - float64 reference rounded to {dtype}| {worst:.1e}, within "
                  f"tolerance: {ok}")


def print_library_comparison() -> None:
    """``lesson08_softplus`` against the library's ``softplus`` at its defaults (beta 1,
    threshold 20), float32, over [-30, 30]: both kernels on the current backend."""
    x = np.linspace(-30.0, 30.0, 601, dtype=np.float32)
    ours = Plan(one_node_graph(OP, [x]), mf.get_backend()).run([x])[0]
    library = Plan(one_node_graph("softplus", [x]), mf.get_backend()).run([x])[0]
    diff = np.abs(ours.astype(np.float64) - library).max()
    print(f"{OP} vs the library's softplus (beta=1.0, threshold=20.0), float32 over [-30, 30]: "
          f"max |difference| {diff:.1e}")


class Softplus(nn.Module):
    """``lesson08_softplus(x)`` elementwise (op ``lesson08_softplus``): the Module of a new
    activation."""

    def forward(self, x):
        return apply(OP, [x])


# %%
# ============================================================================ the CPU process
def main_lesson() -> None:
    mf.set_backend("cpu")
    mf.manual_seed(0)

    print("== 1. Declare the op: scalar functions and one elementwise(...) call each ==")
    print(indent(inspect.getsource(lesson08_softplus).rstrip()))
    print(indent(inspect.getsource(declare).rstrip()))
    op, grad_op = declare()
    print(f"registered: {op!r} and {grad_op!r}; op {OP!r} now has: scalar function "
          f"{op.scalar.__module__}.{op.scalar.__name__} ({op.tensor_arity} tensor operand), "
          f"reference {op.reference is not None}, gradient rule {op.grad is not None}, "
          f"samples {len(op.samples())}, AMP list {op.amp!r}, writes {op.written({}, 1)}")
    print(f"its AMP note: {op.amp_note}")
    print(f"the function lesson08_softplus is now in the fused-expression language: "
          f"{'lesson08_softplus' in scalar_functions()}")
    library = get_op("softplus")
    print(f"the library's own op 'softplus' is declared the same way, with scalar attributes "
          f"{library.scalar_attrs} (defaults {library.scalar_defaults}): "
          f"{library.scalar.__name__}{inspect.signature(library.scalar)}")
    print("register() checks the declaration:")
    print(f"  registering {OP!r} again -> {refused(declare)}")
    print(f"  no AMP list and no note -> " + refused(lambda: elementwise(
        "lesson08_softplus_nolist", lesson08_softplus, np.logaddexp, amp=None)))
    print(f"  another function named lesson08_softplus -> {refused(declare_clash)}")

    print("\n== 2. Inference: emitting a node checks its inputs ==")
    g = Graph()
    x = g.add_input("x", (4, 3), mf.float32)
    y = g.emit(op, x)
    print(f"  {y.producer.format(g.names())}   (shape and dtype from op.infer)")
    bad = g.add_input("labels", (4,), mf.int64)
    print(f"  lesson08_softplus of an int64 input -> {refused(lambda: g.emit(op, bad))}")

    print("\n== 3. The CPU kernel is derived from the scalar function ==")
    from miniflow.kernels import cpu
    from miniflow.kernels.common import elementwise as common_elementwise
    from miniflow.kernels.cpu import elementwise as cpu_elementwise
    print(f"{OP!r} in miniflow.kernels.cpu.KERNELS: {OP in cpu.KERNELS} "
          f"(the table holds only ops with hand-written kernels)")
    print("cpu.builder_for(op) derives the builder (miniflow/kernels/common/elementwise.py):")
    print(indent(inspect.getsource(common_elementwise.derived_builder).rstrip()))
    print("and the CPU step maker compiles the function with this factory "
          "(miniflow/kernels/cpu/elementwise.py):")
    print(indent(inspect.getsource(cpu_elementwise.map_kernel).rstrip()))
    results = check_samples(OP)
    plan = results["float32"][3]
    (kernel, _), = plan.steps
    print(f"the float32 plan's step: {kernel.py_func.__qualname__} from "
          f"{kernel.py_func.__module__}, compiled for {[str(s) for s in kernel.signatures]}")

    print("\n== 4. Every sample against the float64 reference (ir.evaluate) ==")
    print_sample_checks()
    print_library_comparison()

    print("\n== 5. The gradient rule against finite differences (miniflow.testing.check_grad) ==")
    from miniflow.testing import check_grad, gradient_graph
    x64 = np.random.default_rng(0).uniform(-4.0, 4.0, (3, 5))
    graph, _, _ = gradient_graph(OP, [x64], {})
    print(f"the autograd pass emitted, for loss = sum(lesson08_softplus(x) * w): "
          f"{[n.op.name for n in graph.nodes]}")
    worst = check_grad(OP, [x64])
    print(f"check_grad({OP!r}): max |rule - central finite differences| = {worst:.1e} "
          f"(rtol 1e-5, atol 1e-7): agrees")

    print("\n== 6. In a model: nn.Graph, fusion, AMP and ir.evaluate ==")
    print(indent(notebook.source(Softplus).rstrip()))   # also in a notebook cell
    from miniflow.amp import AmpLists
    from miniflow.data import batches, load_digits
    data = load_digits()
    model = nn.Sequential(nn.Linear(64, 64), Softplus(), nn.Linear(64, 10))

    class TrainStep(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
            self.config.enable_amp(True)

        def build(self, x, y):
            loss = nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            return loss

    class Predict(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x):
            return self.model(x)

    step, predict = TrainStep(), Predict()
    losses = []
    for epoch in range(EPOCHS):
        for xb, yb in batches(data.x_train, data.y_train, 64, drop_last=True):
            losses.append(float(step(xb, yb).numpy()))
    acc = float((predict(data.x_test).numpy().argmax(1) == data.y_test).mean())
    print(f"a 64-64-10 MLP with Softplus, AMP on, {EPOCHS} epochs of SGD on the digits: loss "
          f"{losses[0]:.3f} -> {losses[-1]:.3f}, test accuracy {100 * acc:.1f}%")
    print(f"AmpLists().category({OP!r}) = {AmpLists().category(OP)!r}; "
          f"amp_report() rows of the new ops:")
    for row in step.amp_report().rows:
        if row.op.startswith(OP):
            print(f"  {row.op:<22} {row.outputs:<5} color {row.color:<6} dtype {row.dtype}: "
                  f"{row.reason}")
    fused = [n for n in predict.ir.nodes if n.op.name == "fused_elementwise"]
    print(f"the inference IR after fusion: {[n.op.name for n in predict.ir.nodes]}, "
          f"fused expression {fused[0].attrs['expr']!r}")
    from miniflow.kernels.cpu.fused import fused_source
    from miniflow.ops.fused import broadcast_kinds
    out_shape = fused[0].outputs[0].shape
    dims, kinds = broadcast_kinds(out_shape, [v.shape for v in fused[0].inputs])
    source, _ = fused_source(fused[0].attrs["expr"], [v.dtype for v in fused[0].inputs], kinds,
                             len(dims) == 2, False)
    print("its generated kernel (miniflow.kernels.cpu.fused.fused_source) imports "
          "lesson08_softplus from the module that declares it, this script:")
    print(indent("\n".join(ln for ln in source.splitlines() if ln.startswith("from __main__")
                           or "lesson08_softplus(" in ln)))
    logits = predict(data.x_test).numpy()
    ref = evaluate(predict.ir, [data.x_test])["output0"]
    print(f"Predict's plan vs ir.evaluate of its IR (float64), max |difference|: "
          f"{np.abs(logits - ref).max():.1e} (float32 rounding)")

    print("\n== 7. The CUDA kernel: derived from the same function ==")
    run_cuda_part()

    print("\n== 8. Unregister ==")
    unregister(GRAD_OP)
    unregister(OP)
    print(f"after ops.unregister: {OP!r} in all_ops(): {OP in all_ops()}, "
          f"in scalar_functions(): {'lesson08_softplus' in scalar_functions()}")
    print(f"get_op({OP!r}) -> {refused(lambda: get_op(OP)).split(';')[0]}\"")


# %%
# ============================================================================ the CUDA process
def cuda_child() -> None:
    """Runs in the child process (simulator) or on a GPU; the parent labels every line."""
    from miniflow.kernels import cuda
    from miniflow.runtime.backend import cuda_status

    usable, why = cuda_status()
    print(f"device: {why}")
    if not usable:
        print(f"miniflow cuda backend unavailable ({why}); skipped")
        return
    mf.set_backend("cuda")
    op, _ = declare()               # a new process: the script declares its ops again
    print(f"{OP!r} in miniflow.kernels.cuda.KERNELS: {OP in cuda.KERNELS}; "
          f"cuda.builder_for(op) derived: {cuda.builder_for(op) is not None}")
    from miniflow.kernels.cuda import elementwise as cuda_elementwise
    print("the CUDA step maker compiles the function with this factory "
          "(miniflow/kernels/cuda/elementwise.py):")
    print(indent(inspect.getsource(cuda_elementwise.map_kernel).rstrip()))
    print_sample_checks()
    plan = check_samples(OP)["float32"][3]
    print(f"the float32 plan on the cuda backend: {plan.describe().strip()}")


# %%
def run_cuda_part() -> None:
    """Run :func:`cuda_child` on the GPU, or in a child process under the simulator."""
    from miniflow.runtime.backend import cuda_status

    usable, why = cuda_status()
    env = dict(os.environ)
    if usable:
        print(f"CUDA device found ({why}): the CUDA part runs on it, in a child process")
    else:
        print(f"no CUDA device ({why}): the CUDA part runs in a child process with "
              f"NUMBA_ENABLE_CUDASIM=1 (Numba's CUDA simulator)")
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    env.pop("MINIFLOW_BACKEND", None)
    me = str(script_dir(globals()) / "08_add_an_op.py")
    r = subprocess.run([sys.executable, me, "--cuda-child"], env=env,
                       capture_output=True, text=True, timeout=300)
    for line in r.stdout.splitlines():
        print(f"  [cuda child] {line}")
    if r.returncode != 0:
        print(f"  [cuda child] FAILED with exit code {r.returncode}; its stderr:")
        print(indent(r.stderr[-4000:], "  [cuda child stderr] "))
        raise SystemExit(r.returncode)


# %%
def main():
    p = argparse.ArgumentParser(description="Lesson 8: add an op end to end")
    p.add_argument("--cuda-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(script_args())
    if args.cuda_child:
        cuda_child()
    else:
        main_lesson()


# %%
if __name__ == "__main__":
    main()
