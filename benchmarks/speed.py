"""Training-step time of the digits MLPs (and of a small GPT, ``--models gpt``): miniflow against
JAX jit, torch.compile, PyTorch eager and NumPy, all pinned to one core.

Models: ``mlp`` (64-128-10) and ``wide_mlp`` (64-1024-1024-10), Linear-ReLU-...-Linear, mean softmax
cross-entropy, SGD (lr 0.1, momentum 0.9, PyTorch's rule ``buf = 0.9 buf + g; p -= 0.1 buf``);
batch sizes 1, 2, 4, 8, 16, 64, 256 of the digits data. Every framework starts from the same
weights and trains on the same batch. The steps:

* miniflow: ``TrainGraph`` (``miniflow.experiments.mlp``) with ``optim.SGD``.
* JAX jit: one ``jax.jit`` function doing ``jax.value_and_grad`` of the loss and the momentum
  update, parameters and momentum buffers donated (``donate_argnums``); each call is waited for
  (``block_until_ready``), as miniflow's and PyTorch's calls return finished results.
* torch.compile: the same functional step (``torch.func.grad_and_value`` and in-place momentum
  updates) in one ``torch.compile(fullgraph=True, dynamic=False)`` function.
* PyTorch: eager ``nn.Sequential`` + ``optim.SGD`` (its default for-loop update on the CPU).
* NumPy: forward, backward and update written out.

AMP rows, what each column computes. ``fp16`` (AMP float16):

* miniflow: ``config.enable_amp()`` (float16, OneFlow's lists) with ``amp.GradScaler()`` (dynamic:
  init 2^16, growth 2 every 2000 finite steps, backoff 0.5, floor 1; a step with a non-finite
  gradient changes no weight).
* JAX jit and NumPy: the same algorithm written out: float32 master weights cast to float16 for
  each step, float16 activations and matmuls, logits widened to float32 for the loss, the loss
  gradient scaled by the loss scale and cast to float16 before the last matmul, weight gradients
  widened to float32, unscaled, checked for non-finite values, the update skipped and the scale
  schedule applied as in miniflow's GradScaler. Matmuls: JAX's ``float16 @ float16``, which XLA's
  CPU backend compiles (jax 0.10) to widening converts, a float32 dot and a rounding convert;
  NumPy does the same by hand; both are miniflow's CPU contract.
* PyTorch and torch.compile: ``torch.autocast("cpu", dtype=torch.float16)``, no loss scaling.

``bf16`` (AMP bfloat16, no loss scaling: bfloat16 has float32's range): miniflow
``config.enable_amp(dtype=miniflow.bfloat16)``; JAX and NumPy the algorithm above in bfloat16
without the scale (NumPy's bfloat16 is ``ml_dtypes.bfloat16``); PyTorch and torch.compile
``torch.autocast("cpu", dtype=torch.bfloat16)``.

Pinning: the whole process runs on one core (``--core``, default the highest this process may
use): ``os.sched_setaffinity`` for every thread (before and after the frameworks start theirs),
and every pool on one thread: Numba, BLAS/OpenMP (threadpoolctl), PyTorch intra-op and inter-op,
XLA (``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``, set before
JAX is imported); ``harness.start_on_one_core`` does it. ``--threads N``: every pool on N
threads, the process on N cores (``--core`` and the highest others; XLA with its Eigen pool on
N threads).

Timing: a warm-up (compilation) is excluded; then ``--runs`` runs of ``--rounds`` rounds; in every
round each framework does one untimed step and then N timed steps, the frameworks alternating (the
order rotates from round to round). The untimed step keeps the measure a training loop's steady
state: the first step of a round finds the caches holding the previous framework's data, and with
N = 3 (the N of a case where one framework is slow, e.g. PyTorch's float16 autocast) that cold step
was a third of the round (measured: miniflow's AMP wide MLP step at batch 16 1.93 ms with it timed,
against 1.70 ms run back to back). The reported step time is the median over runs of each run's median round / N; the same
median of the process's CPU time is the CPU time per step, the fairer measure on a core that
other processes share (wall time counts their turns too). Each round also records the main
thread's CPU time: ``cpu/wall`` well below 1 means the core was shared with other load;
``other threads`` is the share of the CPU time spent outside the main thread: JAX runs its
computations on a thread of its own (0.4-1.0 here), and a pool that was not kept to one thread
would show here (on one core its threads take turns with the main thread, so the step gets
slower too, while cpu/wall stays near 1).

Prints, per model, dtype and batch size::

    miniflow mlp time: 0.041ms (= 4.1ms / 100, input_shape=[16, 64], fp32) cpu/wall 0.99, \
other threads 0.00
    JAX jit mlp time: ...
    Relative speed: 5.12 (= PyTorch / miniflow)
    Relative speed to JAX jit: 1.60 (= JAX jit / miniflow)
    ...

then Markdown tables (step times, CPU/wall); writes ``benchmarks/results/speed.json`` and
``speed.png``. JAX and PyTorch are the optional ``bench`` extra; a missing package, or a
torch.compile that cannot build (it needs a C++ compiler), skips its columns with the reason.

``--models gpt``: the GPT rows (issue 25; ``gpt_step.py``): a 2-layer, 4-head, 128-wide GPT,
context 64, batch ``--gpt-batch`` (16), AdamW, miniflow against JAX jit, torch.compile and
PyTorch eager, fp32, AMP fp16 and AMP bf16, on ``--threads`` threads. Each framework runs in a
worker process of its own, so its peak RSS (``VmHWM``) is printed beside its step time; the
parent times the workers in the alternating rounds above (by their CPU and wall times).

``--profile`` prints, per case, where miniflow's step spends its time (CPU time at one thread,
wall time at more): the nodes that take the most, with their kernels (:func:`profile`); no
other framework runs.

``--check`` runs ``--check-steps`` steps of every framework on the selected cases instead of
timing, and fails unless the loss of every step agrees with miniflow's (relative to
max(1, |loss|): fp32 1e-4; AMP 1e-2, as the formats and roundings differ). The timing run checks
the first losses the same way, and leaves a framework that differs out of that case, its cell
in the tables giving its loss and miniflow's (it stops only if none agrees with miniflow).

``--isa avx2`` (or ``avx512``) re-runs the benchmark in a child process in which every framework
runs as on that CPU: miniflow's kernels compiled for Numba's ``haswell`` (``skylake-avx512``),
OpenBLAS's ``Haswell`` (``SkylakeX``) kernels, ``XLA_FLAGS=--xla_cpu_max_isa=AVX2`` and
``ATEN_CPU_CAPABILITY=avx2``, oneMKL's and oneDNN's ``MKL_ENABLE_INSTRUCTIONS=AVX2`` and
``ONEDNN_MAX_CPU_ISA=AVX2`` (``harness.ISAS``), with Numba's and inductor's caches in folders
of their own (``harness.isa_cache_dirs``); the default ``native`` is the host's.

    python benchmarks/speed.py [--core N] [--threads 1] [--runs 3] [--rounds 9]
                               [--models mlp,wide_mlp,gpt] [--gpt-batch 16]
                               [--dtypes fp32,fp16] [--batches 1,16,256] [--quick] [--check]
                               [--profile] [--isa native|avx2|avx512]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402

MODELS = {"mlp": (64, 128, 10), "wide_mlp": (64, 1024, 1024, 10)}
BATCHES = (1, 2, 4, 8, 16, 64, 256)
DTYPES = ("fp32", "fp16", "bf16")
LABEL = {"fp32": "fp32", "fp16": "AMP fp16", "bf16": "AMP bf16"}
LR, MOMENTUM = 0.1, 0.9
SCALER = {"init_scale": 2.0 ** 16, "growth_factor": 2.0, "backoff_factor": 0.5,
          "growth_interval": 2000, "min_scale": 1.0}
"""The dynamic loss scale (miniflow's ``GradScaler`` defaults), for the steps written out."""
FRAMEWORKS = ("miniflow", "JAX jit", "torch.compile", "PyTorch", "NumPy")
OTHERS = FRAMEWORKS[1:]
GPT = "gpt"
"""``--models``' name of the GPT rows (``gpt_step.py``: each framework in a process of its own)."""
TARGETS = {"mlp": 1.0, "wide_mlp": 1.0}
"""Issue 16's fp32 acceptance line: relative speed >= 1.0 against every framework."""
ROUND_SECONDS = 0.05
"""Target duration of one framework's share of a round (sets N)."""
QUIET_S = 0.2
"""Seconds each framework's round waits first, so that the threads of the framework before it
stop spinning: an idle OpenBLAS worker spins for about 2^28 cycles (OpenBLAS's ``THREAD_TIMEOUT``,
about 0.1 s) before it sleeps, libgomp's and Eigen's briefly; rounds of ``ROUND_SECONDS`` ran
inside that window, so a framework was timed on cores that the one before still held (at 2
threads miniflow's one-pool wide MLP step: 21 ms at batch 16 after NumPy's round, 1.5 ms alone).
Every framework is timed as a user who runs it alone sees it."""
CHECK_RTOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 3e-2}


# ----------------------------------------------------------------------------- the steps
def init_weights(sizes, seed: int = 0) -> list:
    """``[(W [out, in], b [out]), ...]`` float32, PyTorch's default ``Linear`` init."""
    rng = np.random.default_rng(seed)
    out = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        bound = 1.0 / np.sqrt(n_in)
        out.append((rng.uniform(-bound, bound, (n_out, n_in)).astype(np.float32),
                    rng.uniform(-bound, bound, n_out).astype(np.float32)))
    return out


def next_scale(xp, finite, scale, tracker):
    """miniflow's ``GradScaler`` schedule (``SCALER``) in array namespace ``xp`` (NumPy or
    ``jax.numpy``): returns ``(scale, tracker)`` after a step whose gradients were ``finite``."""
    grow = tracker + 1 >= SCALER["growth_interval"]
    scale = xp.where(finite, xp.where(grow, scale * SCALER["growth_factor"], scale),
                     xp.maximum(scale * SCALER["backoff_factor"], SCALER["min_scale"]))
    return scale.astype(np.float32), xp.where(finite & ~grow, tracker + 1, 0)


def miniflow_step(sizes, weights, x, y, dtype: str):
    """A miniflow training step (``TrainGraph``; ``fp16``: AMP float16 with a dynamic
    ``GradScaler``; ``bf16``: AMP bfloat16, no scaler). ``step.graph`` is the graph."""
    import miniflow as mf
    from miniflow.experiments.mlp import TrainGraph, mlp

    model = mlp(sizes)
    model.load_state_dict({f"{2 * k}.{name}": a for k, (w, b) in enumerate(weights)
                           for name, a in (("weight", w), ("bias", b))})
    graph = amp_graph(TrainGraph(model, mf.optim.SGD(model.parameters(), lr=LR,
                                                     momentum=MOMENTUM)), dtype)

    def step():
        return graph(x, y)

    step.graph = graph
    return step


def amp_graph(graph, dtype: str):
    """``graph`` (a miniflow ``nn.Graph``) set up for ``dtype``: ``fp16`` AMP float16 with a
    dynamic ``GradScaler`` (``SCALER``), ``bf16`` AMP bfloat16 without one, ``fp32`` as it is.
    Returns ``graph``."""
    import miniflow as mf

    if dtype == "fp16":
        graph.config.enable_amp()
        graph.set_grad_scaler(mf.amp.GradScaler(**SCALER))
    elif dtype == "bf16":
        graph.config.enable_amp(dtype=mf.bfloat16)
    return graph


def jax_step(sizes, weights, x, y, dtype: str):
    """The step as one ``jax.jit`` function (value_and_grad + momentum SGD, donated buffers)."""
    import jax
    import jax.numpy as jnp

    act = {"fp32": jnp.float32, "fp16": jnp.float16, "bf16": jnp.bfloat16}[dtype]
    scaled = dtype == "fp16"
    params = [jnp.asarray(a) for wb in weights for a in wb]     # w0, b0, w1, b1, ...
    state = ([jnp.zeros_like(p) for p in params],
             jnp.float32(SCALER["init_scale"]), jnp.int32(0))
    jx, jy = jnp.asarray(x), jnp.asarray(y.astype(np.int32))

    def loss_fn(params, scale):
        h = jx.astype(act)
        for k in range(0, len(params), 2):
            h = h @ params[k].astype(act).T + params[k + 1].astype(act)
            if k < len(params) - 2:
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h.astype(jnp.float32))
        loss = -jnp.mean(jnp.take_along_axis(logp, jy[:, None], axis=1))
        return loss * scale, loss     # scale is 1 without loss scaling

    def step(params, state):
        bufs, scale, tracker = state
        (_, loss), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, scale if scaled else jnp.float32(1))
        finite = jnp.bool_(True)
        if scaled:
            grads = [g * (1 / scale) for g in grads]
            finite = jnp.all(jnp.stack([jnp.isfinite(g).all() for g in grads]))
            scale, tracker = next_scale(jnp, finite, scale, tracker)
        bufs = [jnp.where(finite, MOMENTUM * b + g, b) for b, g in zip(bufs, grads)]
        params = [jnp.where(finite, p - LR * b, p) for p, b in zip(params, bufs)]
        return params, (bufs, scale, tracker), loss

    jstep = jax.jit(step, donate_argnums=(0, 1))
    box = [params, state]

    def run():
        box[0], box[1], loss = jstep(box[0], box[1])
        return loss.block_until_ready()

    return run


def torch_model(weights):
    """The MLP in PyTorch (``torch.nn.Sequential`` of Linear and ReLU) with ``weights``."""
    import torch

    layers = []
    for k, (w, b) in enumerate(weights):
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        layers += [lin] + ([torch.nn.ReLU()] if k < len(weights) - 1 else [])
    return torch.nn.Sequential(*layers)


def _autocast(torch, dtype: str):
    """``torch.autocast("cpu", ...)`` for ``dtype`` (disabled for fp32)."""
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(dtype, torch.bfloat16)
    return torch.autocast("cpu", dtype=half, enabled=dtype != "fp32")


def torch_step(sizes, weights, x, y, dtype: str, wrap=None):
    """The step in PyTorch eager (AMP: ``torch.autocast("cpu")`` in float16 or bfloat16, no
    scaler); ``wrap(model)`` wraps the model (``benchmarks/ddp.py``: in
    ``DistributedDataParallel``). ``step.model`` is the model."""
    import torch

    model = torch_model(weights)
    if wrap is not None:
        model = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=True)
        with _autocast(torch, dtype):
            loss = torch.nn.functional.cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()
        return loss.detach()

    step.model = model
    return step


def torch_compile_step(sizes, weights, x, y, dtype: str):
    """The step as one ``torch.compile`` graph: ``torch.func.grad_and_value`` of the functional
    model and the momentum update in place (AMP: autocast, as :func:`torch_step`)."""
    import torch

    params = [torch.from_numpy(a.copy()) for wb in weights for a in wb]
    bufs = [torch.zeros_like(p) for p in params]
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def loss_fn(params, x, y):
        h = x
        with _autocast(torch, dtype):
            for k in range(0, len(params), 2):
                h = torch.nn.functional.linear(h, params[k], params[k + 1])
                if k < len(params) - 2:
                    h = torch.relu(h)
            return torch.nn.functional.cross_entropy(h, y)

    def step(params, bufs, x, y):
        grads, loss = torch.func.grad_and_value(loss_fn)(params, x, y)
        with torch.no_grad():
            for p, b, g in zip(params, bufs, grads):
                b.mul_(MOMENTUM).add_(g)
                p.add_(b, alpha=-LR)
        return loss

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    return lambda: compiled(params, bufs, tx, ty)


def numpy_step(sizes, weights, x, y, dtype: str):
    """The step in NumPy: forward, softmax cross-entropy, backward, SGD with momentum.

    ``fp16`` / ``bf16``: activations and activation gradients in that type (bfloat16:
    ``ml_dtypes.bfloat16``), matmuls on them computed in float32 and rounded; float32 master
    weights, updates and loss; fp16 with dynamic loss scaling as miniflow's GradScaler (see the
    module docstring).
    """
    half = dtype != "fp32"
    if dtype == "bf16":
        import ml_dtypes
        act = ml_dtypes.bfloat16
    else:
        act = np.float16 if half else np.float32
    scaled = dtype == "fp16"
    params = [(w.copy(), b.copy()) for w, b in weights]
    bufs = [(np.zeros_like(w), np.zeros_like(b)) for w, b in weights]
    onehot = np.eye(sizes[-1], dtype=np.float32)[y]
    scaler = [np.float32(SCALER["init_scale"] if scaled else 1.0), 0]

    def mm(a, b):
        return (a.astype(np.float32) @ b.astype(np.float32)).astype(act) if half else a @ b

    def step():
        scale = scaler[0]
        hs = [x.astype(act)]
        for k, (w, b) in enumerate(params):
            z = mm(hs[-1], w.astype(act).T) + b.astype(act)
            hs.append(np.maximum(z, 0) if k < len(params) - 1 else z.astype(np.float32))
        z = hs[-1] - hs[-1].max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.mean(np.log(p[np.arange(len(y)), y]))
        g = (p - onehot) * (scale / len(y))             # float32, scaled
        grads = [None] * len(params)
        for k in range(len(params) - 1, -1, -1):
            bias_grad = g.sum(axis=0, dtype=np.float32)
            g = g.astype(act)
            grads[k] = (mm(g.T, hs[k]).astype(np.float32), bias_grad)
            if k > 0:
                g = mm(g, params[k][0].astype(act)) * (hs[k] > 0)
        if scaled:
            grads = [tuple(a * (1 / scale) for a in gw) for gw in grads]
            finite = all(np.isfinite(a).all() for gw in grads for a in gw)
            scaler[:] = next_scale(np, np.bool_(finite), scale, scaler[1])
            if not finite:
                return loss
        for (w, b), bw, gw in zip(params, bufs, grads):
            for p_, buf, grad in zip((w, b), bw, gw):
                buf *= MOMENTUM
                buf += grad
                p_ -= LR * buf
        return loss

    return step


BUILDERS = {"miniflow": miniflow_step, "JAX jit": jax_step, "torch.compile": torch_compile_step,
            "PyTorch": torch_step, "NumPy": numpy_step}


# ----------------------------------------------------------------------------- setup
def start_frameworks(core: int, threads: int = 1) -> tuple:
    """Pin this process to ``core`` (``threads`` cores), start the optional frameworks with every
    pool on ``threads`` threads (``harness.start_on_one_core``). Returns ``(frameworks, skipped,
    threads)``: the usable framework names, ``{name: reason}`` for the others, and the pools'
    description."""
    threads, missing = harness.start_on_one_core(core, threads)
    skipped = {}
    if "torch" in missing:
        skipped.update({"torch.compile": missing["torch"], "PyTorch": missing["torch"]})
    else:
        reason = torch_compile_unusable()
        if reason:
            skipped["torch.compile"] = reason
    if "jax" in missing:
        skipped["JAX jit"] = missing["jax"]
    return [f for f in FRAMEWORKS if f not in skipped], skipped, threads


def torch_compile_unusable() -> str:
    """Why torch.compile's inductor cannot build a CPU kernel here ('' when it can)."""
    import torch

    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") \
        or shutil.which("clang++")
    if compiler is None:
        return "no C++ compiler (g++/c++/clang++) on PATH: inductor's CPU kernels are C++"
    try:
        torch.compile(lambda a: torch.relu(a) * 2, fullgraph=True)(torch.ones(3))
    except Exception as e:  # noqa: BLE001  (any failure to build makes the column unusable)
        return f"torch.compile failed with {compiler}: {type(e).__name__}: {str(e)[:200]}"
    torch._dynamo.config.cache_size_limit = 256   # one compilation per case, same code object
    return ""


def digits():
    """The first 256 digits examples: ``(x float32 [256, 64], y int64 [256])``."""
    from miniflow.data import load_digits

    data = load_digits()
    return data.x_train[:256].astype(np.float32), data.y_train[:256].astype(np.int64)


def build(model: str, dtype: str, batch: int, data, frameworks) -> dict:
    """``{framework: step}`` for one case, each from the same weights and batch."""
    sizes = MODELS[model]
    x, y = data[0][:batch], data[1][:batch]
    weights = init_weights(sizes)
    return {name: BUILDERS[name](sizes, weights, x, y, dtype) for name in frameworks}


# ----------------------------------------------------------------------------- check
def check(models, dtypes, batches, data, frameworks, steps: int) -> list:
    """Run ``steps`` steps of every framework per case; raise AssertionError unless every step's
    loss agrees with miniflow's (``CHECK_RTOL``). Returns the printed lines."""
    lines = []
    for model in models:
        for dtype in dtypes:
            for batch in batches:
                built = build(model, dtype, batch, data, frameworks)
                lines += check_losses(f"{model} {LABEL[dtype]} batch {batch}", dtype,
                                      {name: [float(step()) for _ in range(steps)]
                                       for name, step in built.items()})
    return lines


def check_losses(case: str, dtype: str, losses: dict) -> list:
    """Print each framework's losses (``{name: [loss per step]}``) and their largest difference
    to miniflow's, relative to max(1, |loss|); raise AssertionError where it is over
    ``CHECK_RTOL[dtype]``. Returns the printed lines."""
    ref, lines = np.array(losses["miniflow"]), []
    for name, got in losses.items():
        err = np.max(np.abs(np.array(got) - ref) / np.maximum(1, abs(ref)))
        line = (f"{case} {name}: losses {', '.join(f'{v:.6f}' for v in got)}; max relative "
                f"difference to miniflow {err:.2e}")
        lines.append(line)
        print(line)
        if not err <= CHECK_RTOL[dtype]:
            raise AssertionError(f"{line} > {CHECK_RTOL[dtype]}: {name} does not compute "
                                 "miniflow's step")
    return lines


# ----------------------------------------------------------------------------- profile
def profile(model: str, dtype: str, batch: int, data, steps: int) -> dict:
    """:func:`profile_step` of miniflow's step on an MLP case."""
    return profile_step(miniflow_step(MODELS[model], init_weights(MODELS[model]),
                                      data[0][:batch], data[1][:batch], dtype), steps)


def profile_step(step, steps: int) -> dict:
    """Where a miniflow step (``step()``, its graph ``step.graph``) spends its time: every plan
    step timed over ``steps`` steps, summed per node, by the process's CPU time
    (``time.process_time_ns``, so time the core spent on other processes is left out) where
    Numba runs one thread, else by wall time (``time.perf_counter_ns``: at more threads the
    process's CPU time also counts the workers spinning between parallel kernels). Returns
    ``{"step_us": whole step, "clock": "CPU time" or "wall time", "nodes": [(us, node index, op
    type, kernel names)], most first}``."""
    import time

    import numba

    clock, name = ((time.process_time_ns, "CPU time") if numba.get_num_threads() == 1
                   else (time.perf_counter_ns, "wall time"))
    for _ in range(3):
        step()
    plan = next(reversed(step.graph.plans.values()))
    spent, kernels = {}, {}
    for _ in range(steps):
        for (fn, args), i in zip(plan.steps, plan._owners):
            t0 = clock()
            fn(*args)
            spent[i] = spent.get(i, 0) + clock() - t0
            kernels.setdefault(i, {})[_kernel_name(fn)] = None
    t0 = clock()
    for _ in range(steps):
        step()
    nodes = [(spent[i] / steps / 1e3, i, _node_label(plan.graph.nodes[i]), " + ".join(kernels[i]))
             for i in spent]
    return {"step_us": (clock() - t0) / steps / 1e3, "clock": name,
            "nodes": sorted(nodes, reverse=True)}


def _kernel_name(fn) -> str:
    """A step's kernel factory (``dot_block_kernel``) or function name (``dot``)."""
    py_func = getattr(fn, "py_func", None)
    return py_func.__qualname__.split(".")[0] if py_func is not None else fn.__name__


def _node_label(node) -> str:
    """``matmul f16[16,1024] x f16[1024,1024]^T -> f32`` style: op, inputs, output dtype."""
    t = ("^T" if node.attrs.get("transpose_a") else "", "^T" if node.attrs.get("transpose_b")
         else "")
    ins = [f"{v.dtype.short}{list(v.shape)}{t[k] if k < 2 and node.op.name == 'matmul' else ''}"
           for k, v in enumerate(node.inputs[:3])]
    more = ", ..." if len(node.inputs) > 3 else ""
    return f"{node.op.name}({', '.join(ins)}{more}) -> {node.outputs[0].dtype.short}" \
        if node.outputs else f"{node.op.name}({', '.join(ins)}{more})"


def profile_lines(model: str, dtype: str, batch: int, res: dict, top: int = 8) -> list:
    """The printed profile: the step, then the ``top`` nodes by time with their share."""
    total = res["step_us"]
    lines = [f"{model} {LABEL[dtype]} batch {batch}: {total:.0f} us per step ({res['clock']})"]
    lines += [f"  {us:8.0f} us {100 * us / total:5.1f}%  node {i:3d} {op} ({kernel})"
              for us, i, op, kernel in res["nodes"][:top]]
    return lines


# ----------------------------------------------------------------------------- timing
def time_case(model: str, dtype: str, batch: int, data, frameworks, runs: int,
              rounds: int) -> dict:
    """Median step times (seconds), CPU-time shares and the N used, per framework, on one case.

    A framework whose first loss differs from miniflow's (``CHECK_RTOL``) is not timed: it is
    left out of this case, ``"dropped"`` says why (its loss and miniflow's), and its cells in the
    tables say so (a library computing another step, as torch.compile's inductor did from a cache
    built for another ISA, :func:`harness.isa_cache_dirs`).

    Raises:
        AssertionError: no other framework agrees with miniflow's first loss (then miniflow's
            step is the suspect one).
    """
    steps = build(model, dtype, batch, data, frameworks)
    losses = {name: float(step()) for name, step in steps.items()}   # compiles here
    case = f"{model} {dtype} batch {batch}"
    dropped = disagreements(dtype, losses)
    if dropped and len(dropped) == len(steps) - 1:
        raise AssertionError(f"{case}: no framework computes miniflow's step: "
                             f"{'; '.join(f'{k} {v}' for k, v in dropped.items())}")
    for name, reason in dropped.items():
        print(f"{name} {model} {LABEL[dtype]} batch {batch}: dropped, it computes another step "
              f"({reason})")
        del steps[name]
    slowest = max(harness.round_time(step, 3) / 3 for step in steps.values())   # warm-up

    def in_process(step):
        def round_(n):
            time.sleep(QUIET_S)                 # the other frameworks' threads stop spinning
            step()                              # untimed: back to a warm steady state
            return harness.cpu_round(step, n)
        return round_

    timed = interleave({name: in_process(step) for name, step in steps.items()},
                       steps_per_round(slowest), runs, rounds)
    return {"losses": losses, "dropped": dropped, **timed}


def disagreements(dtype: str, losses: dict) -> dict:
    """``{name: reason}`` of the frameworks whose first loss (``losses``: ``{name: loss}``) differs
    from miniflow's by more than ``CHECK_RTOL[dtype]`` relative to max(1, |loss|)."""
    first = losses["miniflow"]
    return {name: f"first loss {loss:.6g}, miniflow's {first:.6g}"
            for name, loss in losses.items()
            if not abs(loss - first) <= CHECK_RTOL[dtype] * max(1.0, abs(first))}


def check_first_losses(case: str, dtype: str, losses: dict) -> None:
    """Raise AssertionError unless every framework's first loss (``{name: loss}``) agrees with
    miniflow's (:func:`disagreements`)."""
    dropped = disagreements(dtype, losses)
    if dropped:
        name = next(iter(dropped))
        raise AssertionError(f"{case}: first loss of {name} is {losses[name]}, miniflow's "
                             f"{losses['miniflow']}: the frameworks do not compute the same step")


def steps_per_round(slowest: float) -> int:
    """N, the timed steps per framework and round, for the slowest step of ``slowest`` seconds:
    a round of about ``ROUND_SECONDS`` per framework, 3 to 200 steps."""
    return int(min(200, max(3, ROUND_SECONDS / slowest)))


def interleave(rounds_of: dict, n: int, runs: int, rounds: int) -> dict:
    """Time the frameworks in alternating rounds: ``rounds_of[name](n)`` runs one untimed step
    and ``n`` timed ones and returns ``(wall, process CPU, main thread CPU)`` seconds
    (:func:`harness.cpu_round`); ``runs`` runs of ``rounds`` rounds, the order rotating from round
    to round. Returns the medians (see the module docstring) per framework."""
    names = list(rounds_of)
    per_run = {name: [] for name in names}
    per_run_cpu = {name: [] for name in names}
    samples = {name: [] for name in names}     # (wall, process cpu, main thread cpu) per round
    for run in range(runs):
        walls = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                sample = rounds_of[name](n)
                walls[name].append(sample[0])
                samples[name].append(sample)
        for name in names:
            per_run[name].append(statistics.median(walls[name]))
            per_run_cpu[name].append(statistics.median(s[1] for s in samples[name][-rounds:]))
    total = {name: statistics.median(t) for name, t in per_run.items()}
    return {"steps": n, "total_s": total,
            "step_s": {name: t / n for name, t in total.items()},
            "cpu_step_s": {name: statistics.median(t) / n for name, t in per_run_cpu.items()},
            "cpu_per_wall": {name: statistics.median(c / w for w, c, _ in s)
                             for name, s in samples.items()},
            "other_threads": {name: statistics.median(max(0.0, c - t) / c if c > 0 else 0.0
                                                      for _, c, t in s)
                              for name, s in samples.items()},
            "rounds_s": {name: [s[0] for s in samples[name]] for name in names}}


def report(model: str, dtype: str, input_shape: list, res: dict) -> None:
    """The output lines for one case."""
    for name, total in res["total_s"].items():
        print(f"{name} {model} time: {1e3 * total / res['steps']:.3f}ms (= {1e3 * total:.1f}ms / "
              f"{res['steps']}, input_shape={list(input_shape)}, {LABEL[dtype]}) cpu/wall "
              f"{res['cpu_per_wall'][name]:.2f}, other threads {res['other_threads'][name]:.2f}")
    t = res["step_s"]
    if "PyTorch" in t:
        print(f"Relative speed: {t['PyTorch'] / t['miniflow']:.2f} (= PyTorch / miniflow)")
    for name in OTHERS:
        if name in t and name != "PyTorch":
            print(f"Relative speed to {name}: {t[name] / t['miniflow']:.2f} "
                  f"(= {name} / miniflow)")


def table(results: list, key: str = "step_s") -> str:
    """A Markdown table of every case (times in ms, relative speeds): wall-clock step times
    (``step_s``), or the process's CPU time per step (``cpu_step_s``: on a shared core the time
    other processes held it is left out; JAX's own thread is counted). A framework dropped from a
    case (:func:`time_case`) has the reason in its time's cell."""
    rows = ["| model | dtype | batch | " + " | ".join(FRAMEWORKS) + " | "
            + " | ".join(f"{k} / miniflow" for k in OTHERS) + " |",
            "|---|---|---:|" + "---:|" * (2 * len(FRAMEWORKS) - 1)]
    for r in results:
        t, dropped = r[key], r.get("dropped", {})
        ms = [f"{1e3 * t[k]:.3f}" if k in t else
              f"dropped: {dropped[k]}" if k in dropped else "-" for k in FRAMEWORKS]
        rel = [f"{t[k] / t['miniflow']:.2f}" if k in t else "-" for k in OTHERS]
        rows.append(f"| {r['model']} | {LABEL[r['dtype']]} | {r['batch']} | "
                    + " | ".join(ms + rel) + " |")
    return "\n".join(rows)


def cpu_table(results: list) -> str:
    """CPU time / wall time (and the share of CPU time in threads other than the main one)."""
    rows = ["| model | dtype | batch | " + " | ".join(FRAMEWORKS) + " |",
            "|---|---|---:|" + "---:|" * len(FRAMEWORKS)]
    for r in results:
        c, o = r["cpu_per_wall"], r["other_threads"]
        rows.append(f"| {r['model']} | {LABEL[r['dtype']]} | {r['batch']} | " + " | ".join(
            f"{c[k]:.2f} ({o[k]:.2f})" if k in c else "-" for k in FRAMEWORKS) + " |")
    return "\n".join(rows)


def amp_ratios(results: list) -> str:
    """miniflow's AMP step time over its fp32 step time, per model and batch."""
    t = {(r["model"], r["dtype"], r["batch"]): r["step_s"]["miniflow"] for r in results}
    lines = []
    for half in DTYPES[1:]:
        parts = [f"{m} batch {b}: {t[(m, half, b)] / t[(m, 'fp32', b)]:.2f}"
                 for (m, d, b) in t if d == "fp32" and (m, half, b) in t]
        if parts:
            lines.append(f"miniflow {LABEL[half]} / fp32 step time: " + ", ".join(parts))
    return "\n".join(lines)


def plot(results: list, path: Path) -> None:
    """Relative speed against every other framework per batch size, one panel per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in results}, key=list(MODELS).index)
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        for dtype, style in (("fp32", "-"), ("fp16", "--"), ("bf16", ":")):
            rows = [r for r in results if r["model"] == model and r["dtype"] == dtype]
            for k, other in enumerate(OTHERS):
                pts = [(r["batch"], r["step_s"][other] / r["step_s"]["miniflow"]) for r in rows
                       if other in r["step_s"]]
                if pts:
                    ax.plot(*zip(*pts), style, color=f"C{k}", marker="o",
                            label=f"{other} / miniflow, {LABEL[dtype]}")
        ax.axhline(TARGETS[model], color="gray", lw=0.8, ls=":", label="target (fp32)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("relative speed (higher: miniflow faster)")
        ax.set_title(f"{model} {'-'.join(map(str, MODELS[model]))}: training step, one core")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--core", type=int, default=harness.default_core(),
                   help="the core to pin the process to (default: the highest available)")
    p.add_argument("--threads", type=harness.positive_int, default=1,
                   help="threads of every pool, on as many cores (--core and the highest others)")
    p.add_argument("--runs", type=harness.positive_int, default=3,
                   help="runs per case (median of run medians)")
    p.add_argument("--rounds", type=harness.positive_int, default=9,
                   help="interleaved rounds per run")
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"of {', '.join(MODELS)}, {GPT} (the GPT rows, gpt_step.py)")
    p.add_argument("--gpt-batch", type=harness.positive_int, default=16,
                   help="the GPT's batch (of 64 tokens)")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--batches", type=harness.positive_ints, default=None,
                   help=f"default {','.join(map(str, BATCHES))} (--quick: 1,16,256)")
    p.add_argument("--quick", action="store_true",
                   help="1 run of 3 rounds, batches 1, 16, 256 unless --batches is given")
    p.add_argument("--check", action="store_true",
                   help="check that every framework's losses agree with miniflow's; no timing")
    p.add_argument("--check-steps", type=harness.positive_int, default=5)
    p.add_argument("--profile", action="store_true",
                   help="miniflow only: time per node of the step (where the time goes; CPU "
                        "time at one thread, wall time at more)")
    harness.add_isa_argument(p)
    args = p.parse_args(argv)
    harness.check_cores(p, args.core, args.threads)
    harness.run_as_isa(args.isa, __file__, sys.argv[1:] if argv is None else list(argv))
    if args.quick:
        args.runs, args.rounds = 1, 3
    models, dtypes = args.models.split(","), args.dtypes.split(",")
    batches = args.batches or ([1, 16, 256] if args.quick else list(BATCHES))
    for name, values, known in (("model", models, (*MODELS, GPT)), ("dtype", dtypes, DTYPES)):
        bad = [v for v in values if v not in known]
        if bad:
            p.error(f"unknown {name} {', '.join(bad)}; choose from {', '.join(known)}")
    frameworks, skipped, threads = start_frameworks(args.core, args.threads)
    for name, reason in skipped.items():
        print(f"{name}: skipped: {reason}")
    data = digits()
    with_gpt = GPT in models
    models = [m for m in models if m != GPT]
    if with_gpt:
        import gpt_step
        gpt_frameworks = [f for f in frameworks if f in gpt_step.FRAMEWORKS]
    if args.profile:
        for model in models:
            for dtype in dtypes:
                for batch in batches:
                    print("\n".join(profile_lines(model, dtype, batch,
                                                   profile(model, dtype, batch, data, 20))))
        for dtype in dtypes if with_gpt else ():
            print("\n".join(profile_lines(GPT, dtype, args.gpt_batch, gpt_step.profile_step(
                dtype, args.gpt_batch, 5), top=16)))
        return
    if args.check:
        check(models, dtypes, batches, data, frameworks, args.check_steps)
        for dtype in dtypes if with_gpt else ():
            gpt_step.check_gpt(dtype, args.gpt_batch, gpt_frameworks, args.core, args.threads,
                               args.check_steps)
        print(f"check passed: {', '.join(frameworks)} agree with miniflow")
        return
    info = harness.machine()
    info.update(core=args.core, threads=threads, skipped=skipped,
                load_before=harness.load_average())
    print(f"machine: {harness.describe(info)}")
    info["isa"] = harness.isa_line()
    print(f"ISA: {info['isa']}")
    print(f"pinned to core {args.core}; threads: {threads}")
    print(f"load average (1 min) before: {info['load_before']:.2f}; medians of {args.runs} runs x "
          f"{args.rounds} interleaved rounds")
    results = []
    for model in models:
        for dtype in dtypes:
            for batch in batches:
                res = time_case(model, dtype, batch, data, frameworks, args.runs, args.rounds)
                report(model, dtype, [batch, MODELS[model][0]], res)
                results.append({"model": model, "dtype": dtype, "batch": batch, **res})
    gpt_rows = []
    for dtype in dtypes if with_gpt else ():
        res = gpt_step.time_gpt(dtype, args.gpt_batch, gpt_frameworks, args.core, args.threads,
                                args.runs, args.rounds)
        report(GPT, dtype, [args.gpt_batch, gpt_step.BLOCK], res)
        gpt_rows.append(res)
    info["load_after"] = harness.load_average()
    print(f"load average (1 min) after: {info['load_after']:.2f}")
    harness.save_json("speed", {"machine": info, "results": results, "gpt": gpt_rows})
    if gpt_rows:
        print()
        print(f"GPT ({gpt_step.CONFIG}, batch {args.gpt_batch} x {gpt_step.BLOCK} tokens, "
              f"AdamW), each framework in its own process: CPU ms per step (wall), ratios, "
              f"peak RSS (after imports):")
        print()
        print(gpt_step.table(gpt_rows))
    if not results:
        print(f"wrote {harness.RESULTS / 'speed.json'}")
        return
    print()
    print(table(results))
    print()
    print("The same by CPU time per step (the process's, all its threads):")
    print()
    print(table(results, "cpu_step_s"))
    print()
    print("CPU time / wall time (share of the CPU time in other threads than the main one):")
    print()
    print(cpu_table(results))
    print()
    print(amp_ratios(results))
    plot(results, harness.RESULTS / "speed.png")
    print(f"wrote {harness.RESULTS / 'speed.json'} and {harness.RESULTS / 'speed.png'}")


if __name__ == "__main__":
    main()
