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
"""Lesson 3: one elementwise op, from a scalar function to a CPU kernel and a CUDA kernel.

What this lesson shows, for the op ``sigmoid``:

1. The math is one plain Python function of floats, ``miniflow.ops.elementwise.sigmoid``. It is
   never decorated: each backend compiles it its own way.
2. The op declaration next to it (``elementwise("sigmoid", sigmoid, ...)`` in
   ``miniflow/ops/elementwise.py``) gives that function (``OpDef.scalar``), the NumPy reference,
   the gradient rule and the AMP category; the kernels of every backend are derived from it.
3. CPU: a *kernel factory* (``kernels.cpu.elementwise.map_kernel``) closes over the scalar
   function and returns a ``numba.njit`` loop ``out[i] = fn(x[i])``, serial (``range``) or parallel
   (``numba.prange``). Numba's CPU target has no float16, so float16 arrays reach the kernel as
   their ``uint16`` bits and the loop converts on load and store (float32 arithmetic).
4. Timing against NumPy for growing sizes (a figure: time per element), for the forward kernel
   (compute-bound: NumPy's SIMD ``exp`` wins) and the backward kernel ``sigmoid_grad``
   (memory-bound: one fused pass beats NumPy's temporaries).
5. CUDA: the same scalar function compiled with ``numba.cuda.jit(device=True)`` and called from a
   grid-stride loop. Without a GPU this part runs in a *child process* under Numba's CUDA
   simulator (``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is imported, so it cannot be
   switched on in this process, which keeps the cpu backend). The child then uses miniflow's own
   CUDA backend (``miniflow.set_backend("cuda")``), whose kernel factory is the same pattern.

Assumes from lesson 1: plans (a flat list of kernel calls) and ``plan.describe()``; from lesson 2:
op definitions with gradient rules (``get_op``).

Run:  python tutorials/03_numba_kernels.py [--quick] [--out DIR]   (about 15 s; about 5 s with
      --quick). Writes a timing figure.
"""
import argparse
import inspect
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from miniflow.notebook import out_folder, script_args, script_dir

DEFAULT_OUT = script_dir(globals()).parent / "tutorial-output" / "03_numba_kernels"
SIM_SIZE = 64
"""Elements per simulated launch: the simulator runs each GPU thread as a Python thread."""


# %%
def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


# %%
def best_time(fn, budget: float) -> float:
    """Seconds per call of ``fn()``: the best of 5 rounds, each repeating it for ~budget/5 s."""
    fn()
    best = float("inf")
    for _ in range(5):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt > budget / 5:
                break
        best = min(best, dt / n)
    return best


# %%
def reference(x) -> np.ndarray:
    """sigmoid in float64 NumPy, the reference every kernel is compared with."""
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


# %%
# ====================================================================================== CPU part
def cpu_lesson(args) -> None:
    import numba

    import miniflow as mf
    from miniflow import nn
    from miniflow.amp import AmpLists
    from miniflow.kernels.cpu import elementwise as cpu_elementwise
    from miniflow.ops import get_op
    from miniflow.ops.elementwise import sigmoid, sigmoid_grad

    mf.set_backend("cpu")

    print("== 1. The scalar function (miniflow/ops/elementwise.py) ==")
    print(indent(inspect.getsource(sigmoid).rstrip()))
    print(f"sigmoid on Python floats: sigmoid(0.0) = {sigmoid(0.0)}, "
          f"sigmoid(-800.0) = {sigmoid(-800.0)} (no overflow), "
          f"sigmoid(2.0) = {sigmoid(2.0):.6f}")

    print("\n== 2. The op declaration gives it ==")
    op = get_op("sigmoid")
    print(f"op 'sigmoid': scalar function = {op.scalar.__module__}.{op.scalar.__name__}; "
          f"doc: {op.doc}")
    print(f"op 'sigmoid': AMP category = {op.amp!r} (None = unlisted: runs in float32 under AMP, "
          f"lesson 4; AmpLists() reads it: {AmpLists().category('sigmoid')!r})")

    print("\n== 3. The CPU kernel: a factory compiles the scalar function into a loop ==")
    print("the factory (miniflow/kernels/cpu/elementwise.py):")
    print(indent(inspect.getsource(cpu_elementwise.map_kernel).rstrip()))
    serial = cpu_elementwise.map_kernel(sigmoid, False)
    parallel = cpu_elementwise.map_kernel(sigmoid, True)
    x = np.random.default_rng(0).uniform(-8, 8, 1000).astype(np.float32)
    out = np.empty_like(x)
    t0 = time.perf_counter()
    serial(x, out)
    print(f"first call of the serial kernel (compile, or load from NUMBA_CACHE_DIR): "
          f"{1e3 * (time.perf_counter() - t0):.1f} ms")
    t0 = time.perf_counter()
    serial(x, out)
    print(f"second call of the serial kernel (1000 elements): "
          f"{1e6 * (time.perf_counter() - t0):.1f} us")
    print(f"compiled signatures of the serial kernel: {[str(s) for s in serial.signatures]}")
    print(f"float32 CPU kernel vs float64 NumPy, max |error|: "
          f"{np.abs(out - reference(x)).max():.2e} "
          f"(float32 epsilon: {np.finfo(np.float32).eps:.2e})")

    try:
        numba.njit(lambda a: a.size)(np.zeros(2, np.float16))
        print("numba on a float16 array: works on this numba version")
    except Exception as e:  # noqa: BLE001 (which exception numba raises is not the lesson)
        print(f"numba.njit on a float16 array raises {type(e).__name__}: {e}")
    x16 = x.astype(np.float16)
    out16 = np.empty_like(x16)
    serial(x16.view(np.uint16), out16.view(np.uint16))       # the bits go in, fp16 bits come out
    ref16 = reference(x16).astype(np.float16)
    same = np.mean(out16.view(np.uint16) == ref16.view(np.uint16))
    print(f"float16 kernel (uint16 views, float32 math) vs float64 reference rounded to float16: "
          f"{100 * same:.1f}% bit-identical, max |difference| "
          f"{np.abs(out16.astype(np.float64) - ref16.astype(np.float64)).max():.1e}")

    class Sigmoid(nn.Graph):
        def build(self, t):
            return t.sigmoid()

    g = Sigmoid()
    y = g(x).numpy()
    print(f"an nn.Graph calling t.sigmoid() runs the same kernel; its plan (node, op, kernel): "
          f"{g.plans[next(iter(g.plans))].describe().strip()}")
    print(f"graph output equals the kernel called by hand: {bool(np.array_equal(y, out))}")

    print("\n== 4. Timing against NumPy (float32, best of 5 rounds) ==")
    from miniflow.kernels.cpu.common import PARALLEL_MIN_SIZE
    grad_serial = cpu_elementwise.zip_kernel(sigmoid_grad, False)
    grad_parallel = cpu_elementwise.zip_kernel(sigmoid_grad, True)
    sizes = [10 ** 4, 10 ** 6] if args.quick else [10 ** 3, 10 ** 4, 10 ** 5, 10 ** 6, 10 ** 7]
    budget = 0.1 if args.quick else 0.25
    threads = numba.get_num_threads()
    print(f"the forward kernel is the map above; the backward kernel is the zip kernel "
          f"out[i] = sigmoid_grad(y[i], dy[i]) = dy * (1 - y) * y")
    print(f"columns: NumPy | miniflow serial kernel | miniflow parallel kernel ({threads} threads) "
          f"[| eager op mf.tensor(x).sigmoid()], microseconds per call")
    fwd, bwd = [], []
    for n in sizes:
        r = np.random.default_rng(1)
        xs = r.uniform(-8, 8, n).astype(np.float32)
        ys = reference(xs).astype(np.float32)
        dys = r.uniform(-1, 1, n).astype(np.float32)
        o = np.empty_like(xs)
        t = mf.tensor(xs)
        f = (best_time(lambda: 1.0 / (1.0 + np.exp(-xs)), budget),
             best_time(lambda: serial(xs, o), budget),
             best_time(lambda: parallel(xs, o), budget),
             best_time(lambda: t.sigmoid(), budget))
        b = (best_time(lambda: dys * (1.0 - ys) * ys, budget),
             best_time(lambda: grad_serial(ys, dys, o), budget),
             best_time(lambda: grad_parallel(ys, dys, o), budget))
        fwd.append((n, *f))
        bwd.append((n, *b))
        print(f"timing forward  sigmoid      at {n:>10,d} elements: "
              + " | ".join(f"{1e6 * s:9.1f}" for s in f))
        print(f"timing backward sigmoid_grad at {n:>10,d} elements: "
              + " | ".join(f"{1e6 * s:9.1f}" for s in b))
    n, np_f, ser_f = fwd[-1][:3]
    np_b, ser_b = bwd[-1][1:3]
    print(f"forward at {n:,d} elements: the serial kernel runs at {np_f / ser_f:.2f}x NumPy's "
          f"speed. sigmoid is compute-bound: NumPy's exp is SIMD-vectorised, while the Numba loop "
          f"calls the scalar libm exp once per element (numba.config.USING_SVML = "
          f"{numba.config.USING_SVML})")
    print(f"backward at {n:,d} elements: the serial kernel runs at {np_b / ser_b:.2f}x NumPy's "
          f"speed. sigmoid_grad is memory-bound: the kernel reads y and dy once and writes once, "
          f"NumPy makes two temporary arrays ((1 - y), dy * (1 - y)) and reads them back")
    print(f"parallel variant: worth it only for large arrays on idle cores; plan builders choose "
          f"it from {PARALLEL_MIN_SIZE:,d} elements (kernels.cpu.common.PARALLEL_MIN_SIZE)")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    labels = ["NumPy", "miniflow serial kernel", f"miniflow parallel ({threads} threads)",
              "eager op"]
    for ax, rows, title in ((axes[0], fwd, "forward: sigmoid"),
                            (axes[1], bwd, "backward: sigmoid_grad")):
        for k in range(1, len(rows[0])):
            ax.loglog([r[0] for r in rows], [1e9 * r[k] / r[0] for r in rows], "o-",
                      label=labels[k - 1])
        ax.set_xlabel("elements")
        ax.set_title(f"{title}, float32, CPU")
        ax.legend()
    axes[0].set_ylabel("ns per element")
    fig.tight_layout()
    path = args.out / "03_sigmoid_timing.png"
    fig.savefig(path, dpi=100)
    print(f"timing figure written to: {path}")


# %%
# ====================================================================================== CUDA part
def cuda_child(args) -> None:
    """Runs in the child process (simulator) or on a GPU. Every line is labelled by the parent."""
    global cuda  # the simulator swaps a kernel's *global* `cuda` for its fake one: import it there
    from numba import config, cuda

    from miniflow.ops.elementwise import sigmoid

    sim = bool(config.ENABLE_CUDASIM)
    if sim:
        print("device: Numba CUDA simulator (every GPU thread is a Python thread)")
    else:
        name = cuda.get_current_device().name
        print(f"device: {name.decode() if isinstance(name, bytes) else name}")

    # (a) By hand: exactly what miniflow's CUDA backend does with the scalar function.
    sigmoid_device = cuda.jit(device=True)(sigmoid)   # the same function as the CPU's

    @cuda.jit
    def sigmoid_kernel(x, out):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):   # grid-stride loop
            out[i] = sigmoid_device(x[i])

    n = SIM_SIZE if sim else 10 ** 7
    x = np.linspace(-8, 8, n).astype(np.float32)
    d_x = cuda.to_device(x)
    d_out = cuda.device_array_like(d_x)
    threads, blocks = (32, 2) if sim else (256, 1024)
    t0 = time.perf_counter()
    sigmoid_kernel[blocks, threads](d_x, d_out)
    cuda.synchronize()
    first = time.perf_counter() - t0
    got = d_out.copy_to_host()
    err = np.abs(got - reference(x)).max()
    print(f"hand-written kernel: sigmoid_kernel[{blocks} blocks, {threads} threads] over {n:,d} "
          f"elements, first launch {1e3 * first:.1f} ms")
    print(f"hand-written CUDA kernel matches NumPy (max |error| {err:.1e} <= 1e-6): {err <= 1e-6}")
    if sim:
        t = best_time(lambda: sigmoid_kernel[blocks, threads](d_x, d_out), 0.5)
        print(f"simulator speed: {1e3 * t:.1f} ms per launch of {blocks * threads} threads "
              f"= {1e6 * t / (blocks * threads):.0f} us per thread (a model of the GPU, not a "
              f"measurement of one)")
    else:
        def launch():
            sigmoid_kernel[blocks, threads](d_x, d_out)
            cuda.synchronize()
        t_gpu = best_time(launch, 0.5)
        t_np = best_time(lambda: 1.0 / (1.0 + np.exp(-x)), 0.5)
        print(f"GPU timing at {n:,d} elements: kernel {1e6 * t_gpu:.0f} us vs NumPy on the host "
              f"{1e6 * t_np:.0f} us ({t_np / t_gpu:.0f}x)")

    # (b) miniflow's CUDA backend: its factory builds the same loop from the same scalar function.
    import miniflow as mf
    from miniflow import nn
    from miniflow.runtime.backend import cuda_status

    usable, why = cuda_status()
    if not usable:
        print(f"miniflow cuda backend: unavailable ({why}); part (b) skipped")
        return
    mf.set_backend("cuda")
    from miniflow.kernels.cuda import elementwise as cuda_elementwise
    print("miniflow's CUDA kernel factory (miniflow/kernels/cuda/elementwise.py):")
    print(indent(inspect.getsource(cuda_elementwise.map_kernel).rstrip()))

    class Sigmoid(nn.Graph):
        def build(self, t):
            return t.sigmoid()

    g = Sigmoid()
    y = g(x[:SIM_SIZE]).numpy()
    plan = g.plans[next(iter(g.plans))]
    print(f"nn.Graph on the cuda backend, its plan: {plan.describe().strip()}")
    err = np.abs(y - reference(x[:SIM_SIZE])).max()
    print(f"miniflow cuda backend sigmoid matches NumPy (max |error| {err:.1e} <= 1e-6): "
          f"{err <= 1e-6}")
    x16 = x[:SIM_SIZE].astype(np.float16)
    y16 = mf.tensor(x16).sigmoid().numpy()
    ref16 = reference(x16).astype(np.float16)
    print(f"float16 on CUDA is a native type (no uint16 views): result dtype {y16.dtype}, "
          f"{100 * np.mean(y16 == ref16):.0f}% equal to the float64 reference rounded to float16")


# %%
def run_cuda_part(args) -> None:
    """Run :func:`cuda_child` on the GPU, or in a child process under the simulator."""
    from miniflow.runtime.backend import cuda_status

    usable, why = cuda_status()
    env = dict(os.environ)
    if usable:
        print(f"CUDA device found ({why}): the CUDA part runs on it, in a child process "
              f"(this process keeps the cpu backend)")
    else:
        print(f"no CUDA device ({why}): the CUDA part runs in a child process with "
              f"NUMBA_ENABLE_CUDASIM=1 (Numba's CUDA simulator), {SIM_SIZE} elements")
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    env.pop("MINIFLOW_BACKEND", None)
    cmd = [sys.executable, str(script_dir(globals()) / "03_numba_kernels.py"), "--cuda-child"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    for line in r.stdout.splitlines():
        print(f"  [cuda child] {line}")
    if r.returncode != 0:
        print(f"  [cuda child] FAILED with exit code {r.returncode}; its stderr:")
        print(indent(r.stderr[-4000:], "  [cuda child stderr] "))
        raise SystemExit(r.returncode)


# %%
def main():
    p = argparse.ArgumentParser(description="Lesson 3: one op from scalar function to kernels")
    p.add_argument("--quick", action="store_true", help="two timing sizes instead of five")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the figure")
    p.add_argument("--cuda-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(script_args())
    if args.cuda_child:
        cuda_child(args)
        return
    out_folder(p, args.out)
    cpu_lesson(args)
    print("\n== 5. The CUDA kernel: the same scalar function, compiled for the GPU ==")
    run_cuda_part(args)


# %%
if __name__ == "__main__":
    main()
