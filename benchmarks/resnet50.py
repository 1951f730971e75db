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
    loss``."""
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
    return (lambda x, y: float(graph(x, y))), model.state_dict()


def torch_step(dtype: str, state: dict):
    """One PyTorch eager training step as a callable ``step(x, y) -> loss`` (same weights)."""
    import torch

    from torch_resnet import torch_resnet50

    model = torch_resnet50(CLASSES)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
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
    print(f"backend: {backend}; threads: {harness.pin_threads(threads)}")
    rows = run(args.batch, args.dtypes, times, args.warmup, args.image_size, with_torch)
    print(table(rows))
    if not args.no_save:
        print(f"wrote {harness.save_json('resnet50', {'machine': harness.machine(), 'rows': rows})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
