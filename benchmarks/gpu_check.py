"""Real-GPU check of the cuda backend, sized to finish in under 5 minutes.

    python benchmarks/gpu_check.py [--epochs 3] [--reps 50]

1. The op tests on the GPU: ``python -m pytest tests/cuda -q`` without the simulator, so every
   CUDA kernel runs on the device against the CPU kernel (all registered samples, GPU-sized extra
   cases, training steps against the cpu backend). Kernels compile on the first run (about a
   minute) and come from Numba's cache afterwards.
2. Kernel times: the digits MLP training step (batch 64, SGD with momentum) is compiled on both
   backends; every plan step is timed on its own (median of ``--reps`` launches, the device
   synchronised around them) and the times are summed per op type.
3. Training: ``miniflow train --epochs N`` on each backend (accuracy, wall time), and the median
   training step time of the same MLP on each backend.

Prints the GPU's name, the date and the versions first, and writes the whole report to
``benchmarks/results/gpu_check.txt``; copy it into ``benchmarks/README.md``. Exits 1 without a GPU
(``--simulator`` runs a small smoke version under ``NUMBA_ENABLE_CUDASIM=1`` to test the script).
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import miniflow as mf  # noqa: E402
from miniflow.experiments.mlp import TrainGraph, mlp  # noqa: E402
from miniflow.runtime.backend import cuda_status  # noqa: E402


class Report:
    """Prints lines and keeps them for the results file."""

    def __init__(self):
        self.lines = []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)


def _sync(backend_name: str) -> None:
    if backend_name == "cuda":
        from numba import cuda
        cuda.synchronize()


def _train_graph(backend_name: str, batch: int = 64):
    """The digits MLP's training graph on ``backend_name``, compiled by one call: (graph, x, y)."""
    mf.set_backend(backend_name)
    mf.manual_seed(0)
    model = mlp((64, 128, 10))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    rng = np.random.default_rng(0)
    x = rng.random((batch, 64), dtype=np.float32)
    y = rng.integers(0, 10, batch).astype(np.int64)
    graph(x, y)
    return graph, x, y


def kernel_times(backend_name: str, reps: int, batch: int) -> dict:
    """Op type -> summed median time (us) of its plan steps in one training step."""
    graph, _, _ = _train_graph(backend_name, batch)
    plan = next(iter(graph.plans.values()))
    per_op: dict = defaultdict(float)
    for (fn, args), owner in zip(plan.steps, plan._owners):
        times = []
        for _ in range(3):
            _sync(backend_name)
            t0 = time.perf_counter()
            for _ in range(reps):
                fn(*args)
            _sync(backend_name)
            times.append((time.perf_counter() - t0) / reps)
        per_op[plan.graph.nodes[owner].op.name] += statistics.median(times) * 1e6
    return dict(per_op)


def step_time(backend_name: str, steps: int, batch: int) -> float:
    """Median wall time (ms) of one training step (inputs copied in, loss copied out)."""
    graph, x, y = _train_graph(backend_name, batch)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        float(graph(x, y))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def run_cli_train(backend_name: str, epochs: int, env: dict) -> str:
    """``miniflow train --epochs N`` on ``backend_name``; its summary lines."""
    r = subprocess.run([sys.executable, "-m", "miniflow", "train", "--epochs", str(epochs)],
                       cwd=ROOT, env={**env, "MINIFLOW_BACKEND": backend_name},
                       capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        return f"FAILED (exit {r.returncode}): {r.stderr.strip()[-500:]}"
    keep = [ln for ln in r.stdout.splitlines() if re.match(r"(test accuracy|time):", ln)]
    return "; ".join(keep)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3, help="epochs of `miniflow train` per backend")
    p.add_argument("--reps", type=int, default=50, help="launches per kernel timing")
    p.add_argument("--steps", type=int, default=100, help="training steps timed per backend")
    p.add_argument("--batch", type=int, default=64, help="batch size of the timed steps")
    p.add_argument("--simulator", action="store_true",
                   help="smoke-test this script under NUMBA_ENABLE_CUDASIM=1 (tiny sizes)")
    args = p.parse_args(argv)
    usable, gpu = cuda_status()
    if not usable or (gpu == "CUDA simulator") != args.simulator:
        print(f"gpu_check needs a CUDA GPU (found: {gpu}); --simulator smoke-tests the script "
              f"under NUMBA_ENABLE_CUDASIM=1", file=sys.stderr)
        return 1
    if args.simulator:
        args.epochs, args.reps, args.steps, args.batch = 0, 1, 2, 4
    import importlib.metadata
    import numba
    out = Report()
    out(f"# miniflow gpu_check, {datetime.datetime.now().isoformat(timespec='seconds')}")
    out(f"GPU: {gpu}")
    out(f"numba {numba.__version__}, numba-cuda {importlib.metadata.version('numba-cuda')}, "
        f"numpy {np.__version__}, python {sys.version.split()[0]}")
    t_start = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "MINIFLOW_BACKEND"}

    out("\n## 1. op tests on the GPU (tests/cuda)")
    if args.simulator:
        out("skipped under --simulator (the simulator lane runs them)")
    else:
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "pytest", "tests/cuda", "-q", "-p",
                            "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
        summary = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
        out(f"{summary} ({time.perf_counter() - t0:.0f} s)")
        if r.returncode != 0:
            out(r.stdout[-6000:])

    out(f"\n## 2. kernel times per op type, one training step (batch {args.batch}), "
        f"median of {args.reps}")
    cpu_t = kernel_times("cpu", args.reps, args.batch)
    cuda_t = kernel_times("cuda", args.reps, args.batch)
    out(f"{'op':<36s}{'cpu us':>12s}{'cuda us':>12s}")
    for op in sorted(set(cpu_t) | set(cuda_t), key=lambda o: -cuda_t.get(o, 0.0)):
        out(f"{op:<36s}{cpu_t.get(op, 0.0):12.1f}{cuda_t.get(op, 0.0):12.1f}")
    out(f"{'total':<36s}{sum(cpu_t.values()):12.1f}{sum(cuda_t.values()):12.1f}")

    out("\n## 3. training")
    for name in ("cpu", "cuda") if args.epochs else ():
        out(f"miniflow train --epochs {args.epochs} on {name}: "
            f"{run_cli_train(name, args.epochs, env)}")
    cpu_ms = step_time("cpu", args.steps, args.batch)
    cuda_ms = step_time("cuda", args.steps, args.batch)
    out(f"training step (batch {args.batch}, median of {args.steps}): cpu {cpu_ms:.3f} ms, "
        f"cuda {cuda_ms:.3f} ms ({cpu_ms / cuda_ms:.2f}x)")
    out(f"\ngpu_check took {time.perf_counter() - t_start:.0f} s")
    mf.set_backend("cpu")

    results = ROOT / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "gpu_check.txt").write_text("\n".join(out.lines) + "\n")
    print(f"report written to {results / 'gpu_check.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
