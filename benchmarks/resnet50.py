"""ResNet-50 training step time, miniflow against PyTorch eager: the benchmark OneFlow's CI runs
against PyTorch (``ci/test/test_speed_multi_client.sh``: ResNet-50 at input_shape
[16|8|4|2|1, 3, 224, 224]), on the current backend.

Each framework trains ``miniflow.models.resnet50`` (PyTorch: the torchvision-identical
``torch_resnet50``, loaded with miniflow's initial weights) with SGD (lr 0.01, momentum 0.9) and
mean cross entropy on one random batch (fixed seed, 1000 classes), in float32 and under AMP
(miniflow: ``config.enable_amp()`` and a dynamic ``GradScaler``; PyTorch:
``torch.autocast(device, dtype=torch.float16)`` and ``torch.amp.GradScaler``). A warm-up of
``--warmup`` steps (miniflow's first call compiles its plan and kernels) is excluded; then
``--times`` steps are timed per framework, frameworks one after the other. Thread pools are pinned
to ``--threads`` (Numba, BLAS, OpenMP and PyTorch), and the load average is printed before and
after each batch size: on a shared machine only runs at a low load are comparable.

Prints, per dtype and batch size, the lines of OneFlow's CI::

    miniflow resnet50 time: 140.5ms (= 14045.2ms / 100, input_shape=[16, 3, 224, 224])
    PyTorch resnet50 time: 160.4ms (= 16040.3ms / 100, input_shape=[16, 3, 224, 224])
    Relative speed: 1.14 (= 160.4ms / 140.5ms)

(relative speed: PyTorch's time over miniflow's, > 1 when miniflow is faster), then a Markdown
table, and writes ``benchmarks/results/resnet50.json``.

    python benchmarks/resnet50.py [--batch 16 8 4 2 1] [--times N] [--dtypes fp32 amp]
        [--threads T] [--image-size 224] [--no-torch]

``--times`` defaults to 100 on a GPU and 3 on a CPU (a CPU step at batch 16 takes seconds).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402

BATCHES = (16, 8, 4, 2, 1)
DTYPES = ("fp32", "amp")
LABEL = {"fp32": "fp32", "amp": "AMP (float16, dynamic loss scale)"}
LR, MOMENTUM, CLASSES = 0.01, 0.9, 1000


def data(batch: int, size: int, seed: int = 0):
    """A random float32 batch ``[batch, 3, size, size]`` and int64 labels."""
    r = np.random.default_rng(seed)
    return (r.standard_normal((batch, 3, size, size)).astype(np.float32),
            r.integers(0, CLASSES, batch).astype(np.int64))


def miniflow_step(dtype: str, state: dict):
    """``(step, initial weights)``: one miniflow training step as a callable ``step(x, y) ->
    loss`` (``step.model`` is the model; under ``mpiexec`` its graph is data parallel)."""
    import miniflow as mf
    from miniflow.experiments.mlp import TrainGraph
    from miniflow.models import resnet50

    mf.manual_seed(0)
    model = resnet50(CLASSES)
    if state is not None:
        model.load_state_dict(state)
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM))
    if dtype == "amp":
        graph.config.enable_amp(True)
        graph.set_grad_scaler(mf.amp.GradScaler())

    def step(x, y):
        return float(graph(x, y))

    step.model = model
    return step, model.state_dict()


def torch_step(dtype: str, state: dict, wrap=None):
    """One PyTorch eager training step as a callable ``step(x, y) -> loss`` (same weights);
    ``wrap(model)`` wraps the model (``benchmarks/ddp.py``: in ``DistributedDataParallel``),
    ``step.model`` is the model."""
    import torch

    from torch_resnet import torch_resnet50

    model = torch_resnet50(CLASSES)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    if wrap is not None:
        model = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    amp = dtype == "amp"
    scaler = torch.amp.GradScaler("cpu") if amp else None

    def step(x, y):
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        if amp:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return float(loss.detach())
    step.model = model
    return step


def timed(step, x, y, warmup: int, times: int) -> tuple:
    """``(first loss, seconds for `times` steps)`` after ``warmup`` untimed steps."""
    first = step(x, y)
    for _ in range(warmup - 1):
        step(x, y)
    t0 = time.perf_counter()
    for _ in range(times):
        step(x, y)
    return first, time.perf_counter() - t0


def line(name: str, seconds: float, times: int, shape) -> str:
    """``miniflow resnet50 time: 140.5ms (= 14045.2ms / 100, input_shape=[16, 3, 224, 224])``."""
    ms = 1e3 * seconds
    return (f"{name} resnet50 time: {ms / times:.1f}ms (= {ms:.1f}ms / {times}, "
            f"input_shape={list(shape)})")


def run(batches, dtypes, times: int, warmup: int, size: int, with_torch: bool) -> list:
    """Time every (dtype, batch); returns one dict per pair and prints the CI lines."""
    rows = []
    for dtype in dtypes:
        print(f"== {LABEL[dtype]} ==")
        for b in batches:
            x, y = data(b, size)
            load0 = harness.load_average()
            mf_step, state = miniflow_step(dtype, None)
            mf_first, mf_s = timed(mf_step, x, y, warmup, times)
            del mf_step
            row = {"dtype": dtype, "batch": b, "shape": list(x.shape), "times": times,
                   "miniflow_ms": 1e3 * mf_s / times, "miniflow_first_loss": mf_first}
            print(line("miniflow", mf_s, times, x.shape))
            if with_torch:
                pt_first, pt_s = timed(torch_step(dtype, state), x, y, warmup, times)
                row.update(pytorch_ms=1e3 * pt_s / times, pytorch_first_loss=pt_first,
                           relative=pt_s / mf_s)
                print(line("PyTorch", pt_s, times, x.shape))
                print(f"Relative speed: {pt_s / mf_s:.2f} (= {1e3 * pt_s / times:.1f}ms / "
                      f"{1e3 * mf_s / times:.1f}ms)")
            row["load"] = [round(load0, 2), round(harness.load_average(), 2)]
            print(f"  (load average {row['load'][0]} before, {row['load'][1]} after; first "
                  f"losses: miniflow {mf_first:.4f}"
                  + (f", PyTorch {row['pytorch_first_loss']:.4f})" if with_torch else ")"),
                  flush=True)
            rows.append(row)
    return rows


CATEGORIES = {
    "conv forward": ("conv2d",), "conv backward": ("conv_data_grad", "conv_filter_grad"),
    "batch norm forward": ("normalization",), "batch norm backward": ("normalization_grad",),
    "pools (+ grads)": ("max_pool_2d", "max_pool_2d_grad", "adaptive_avg_pool2d",
                        "adaptive_avg_pool2d_grad"),
    "relu, add (+ grads)": ("relu", "relu_grad", "add_n", "broadcast_add", "fused_elementwise"),
    "SGD update": ("sgd_update",),
}
"""Profile categories: miniflow op types in each (the rest is "other")."""
TORCH_CATEGORIES = {
    "conv forward": ("aten::mkldnn_convolution", "aten::thnn_conv2d",
                     "aten::_slow_conv2d_forward"),
    "conv backward": ("aten::convolution_backward",),
    "batch norm forward": ("aten::native_batch_norm",),
    "batch norm backward": ("aten::native_batch_norm_backward",),
    "pools (+ grads)": ("aten::max_pool2d_with_indices", "aten::max_pool2d_with_indices_backward",
                        "aten::mean", "aten::adaptive_avg_pool2d", "aten::sum", "aten::expand",
                        "aten::div"),
    "relu, add (+ grads)": ("aten::relu_", "aten::clamp_min_", "aten::threshold_backward",
                            "aten::add_", "aten::add"),
    "SGD update": ("aten::_foreach_add_", "aten::_foreach_mul_", "aten::_foreach_add",
                   "aten::mul_"),
}
"""PyTorch's self-time events per category (``add_`` is counted with the residual adds; SGD's
momentum and update are ``_foreach`` ops)."""


def _miniflow_profile(batch: int, size: int) -> tuple:
    """``(per category ms, per conv layer ms, state dict)`` of one fp32 training step:
    every plan step timed alone (after a warm-up step)."""
    import miniflow as mf
    from miniflow.experiments.mlp import TrainGraph
    from miniflow.models import resnet50

    mf.manual_seed(0)
    model = resnet50(CLASSES)
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM))
    x, y = data(batch, size)
    graph(x, y)
    plan = next(reversed(graph.plans.values()))
    for buf, a in zip(plan.input_buffers, (x, y)):
        plan.backend.copy_in(buf, a)
    per_node: dict = {}
    for k, (fn, args) in enumerate(plan.steps):
        t0 = time.perf_counter()
        fn(*args)
        i = plan._owners[k]
        per_node[i] = per_node.get(i, 0.0) + time.perf_counter() - t0
    cats, layers = {}, {}
    for i, dt in per_node.items():
        node = plan.graph.nodes[i]
        op = node.op.name
        cat = next((c for c, ops in CATEGORIES.items() if op in ops), "other")
        cats[cat] = cats.get(cat, 0.0) + 1e3 * dt
        if op in ("conv2d", "conv_data_grad", "conv_filter_grad"):
            x_shape = node.inputs[2 if op == "conv_data_grad" else 1 if op == "conv_filter_grad"
                                  else 0].shape
            w_shape = (node.inputs[1].shape if op != "conv_filter_grad" else node.outputs[0].shape)
            key = (tuple(x_shape), tuple(w_shape), "forward" if op == "conv2d" else "backward")
            layers[key] = layers.get(key, 0.0) + 1e3 * dt
    return cats, layers, model.state_dict()


def _torch_profile(batch: int, size: int, state: dict) -> tuple:
    """``(per category ms, per conv layer ms)`` of one PyTorch fp32 training step
    (``torch.profiler``, self CPU time per op and input shapes, after a warm-up step)."""
    from torch.profiler import ProfilerActivity, profile

    step = torch_step("fp32", state)
    x, y = data(batch, size)
    step(x, y)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step(x, y)
    cats, layers = {}, {}
    for ev in prof.key_averages(group_by_input_shape=True):
        ms = ev.self_cpu_time_total / 1e3
        cat = next((c for c, ops in TORCH_CATEGORIES.items() if ev.key in ops), "other")
        cats[cat] = cats.get(cat, 0.0) + ms
        shapes = ev.input_shapes
        if ev.key in TORCH_CATEGORIES["conv forward"] and len(shapes) >= 2:
            key = (tuple(shapes[0]), tuple(shapes[1]), "forward")
        elif ev.key == "aten::convolution_backward" and len(shapes) >= 3:
            key = (tuple(shapes[1]), tuple(shapes[2]), "backward")
        else:
            continue
        layers[key] = layers.get(key, 0.0) + ms
    return cats, layers


def profile_step(batch: int, size: int) -> str:
    """Where the time of one fp32 training step goes, miniflow against PyTorch (Markdown)."""
    cats, layers, state = _miniflow_profile(batch, size)
    t_cats, t_layers = _torch_profile(batch, size, state)
    names = list(CATEGORIES) + ["other"]
    out = [f"One fp32 training step at input_shape [{batch}, 3, {size}, {size}], ms (miniflow: "
           f"every plan step timed alone; PyTorch: torch.profiler self CPU time):", "",
           "| part | miniflow | PyTorch | PyTorch / miniflow |", "|---|---:|---:|---:|"]
    for n in names:
        m, t = cats.get(n, 0.0), t_cats.get(n, 0.0)
        out.append(f"| {n} | {m:.1f} | {t:.1f} | {t / m:.2f} |" if m else
                   f"| {n} | {m:.1f} | {t:.1f} | - |")
    out.append(f"| total | {sum(cats.values()):.1f} | {sum(t_cats.values()):.1f} | "
               f"{sum(t_cats.values()) / sum(cats.values()):.2f} |")
    out += ["", "Convolution layers (forward; backward = data + filter gradient), grouped by "
            "input and weight shape, slowest against PyTorch first:", "",
            "| input | weight | pass | miniflow | PyTorch | PyTorch / miniflow |",
            "|---|---|---|---:|---:|---:|"]
    common = [k for k in layers if k in t_layers]
    for k in sorted(common, key=lambda k: t_layers[k] / layers[k]):
        out.append(f"| {list(k[0])} | {list(k[1])} | {k[2]} | {layers[k]:.1f} | "
                   f"{t_layers[k]:.1f} | {t_layers[k] / layers[k]:.2f} |")
    return "\n".join(out)


def table(rows) -> str:
    """The results as a Markdown table."""
    out = ["| dtype | input_shape | miniflow (ms) | PyTorch (ms) | relative speed |",
           "|---|---|---:|---:|---:|"]
    for r in rows:
        pt = f"{r['pytorch_ms']:.1f}" if "pytorch_ms" in r else "-"
        rel = f"{r['relative']:.2f}" if "relative" in r else "-"
        out.append(f"| {r['dtype']} | {r['shape']} | {r['miniflow_ms']:.1f} | {pt} | {rel} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    p.add_argument("--times", type=int, help="timed steps (default: 100 on a GPU, 3 on a CPU)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (>= 1)")
    p.add_argument("--threads", type=int, help="threads of every pool (default: all cores)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--no-torch", action="store_true", help="time miniflow only")
    p.add_argument("--no-save", action="store_true", help="do not write results/resnet50.json")
    p.add_argument("--profile", type=int, metavar="BATCH",
                   help="instead: where one fp32 step's time goes at this batch, miniflow "
                        "against PyTorch (needs torch)")
    args = p.parse_args(argv)
    if args.warmup < 1 or (args.times is not None and args.times < 1):
        p.error("--warmup and --times must be >= 1")
    import os

    import miniflow as mf
    with_torch = not args.no_torch
    if with_torch:
        try:
            import torch  # noqa: F401  (imported before pinning, so its pools are pinned too)
        except ImportError:
            print("PyTorch is not installed: timing miniflow only (pip install -e '.[bench]')")
            with_torch = False
    backend = mf.get_backend().name
    if with_torch and backend != "cpu":
        print(f"the PyTorch comparison runs on the CPU; the backend is {backend}: timing "
              f"miniflow only")
        with_torch = False
    times = args.times or (100 if backend == "cuda" else 3)
    threads = args.threads or os.cpu_count()
    print(f"machine: {harness.describe(harness.machine())}")
    if args.profile and not with_torch:
        p.error("--profile compares with PyTorch: install torch, run on the cpu backend")
    with harness.threads_restored():    # main() called in-process gives the pools back
        print(f"backend: {backend}; threads: {harness.pin_threads(threads)}")
        if args.profile:
            print(profile_step(args.profile, args.image_size))
            return 0
        rows = run(args.batch, args.dtypes, times, args.warmup, args.image_size, with_torch)
    print(table(rows))
    if not args.no_save:
        print(f"wrote {harness.save_json('resnet50', {'machine': harness.machine(), 'rows': rows})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
