"""Training step time of the digits MLP (64-128-10, SGD momentum) at batch 1, 16 and 64, and the
executor's overhead per node.

Overhead per node is measured by running the same plan with every kernel replaced by a Python
no-op taking the same arguments: what remains is the executor's own loop (copy-in, the step loop,
copy-out). Reported numbers are medians over repeated timings.

    python benchmarks/step_time.py [--repeats 7] [--steps 200]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import miniflow as mf
from miniflow.experiments.mlp import TrainGraph, mlp


def _median_time(fn, steps: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args(argv)
    print(f"backend: {mf.get_backend().name}; medians of {args.repeats} x {args.steps} steps")
    for batch in (1, 16, 64):
        mf.manual_seed(0)
        model = mlp((64, 128, 10))
        g = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
        rng = np.random.default_rng(0)
        x = rng.random((batch, 64), dtype=np.float32)
        y = rng.integers(0, 10, batch).astype(np.int64)
        g(x, y)  # compile + warm-up
        step = _median_time(lambda: g(x, y), args.steps, args.repeats)
        plan = next(iter(g.plans.values()))
        real = plan.steps
        plan.steps = [(lambda *a: None, a) for _, a in real]
        loop = _median_time(lambda: g(x, y), args.steps, args.repeats)
        plan.steps = real
        n = len(real)
        print(f"batch {batch:3d}: step {step * 1e6:8.1f} us  ({n} kernel calls, "
              f"{step / n * 1e6:5.2f} us per call); executor overhead {loop * 1e6:6.1f} us "
              f"per step = {loop / n * 1e6:5.2f} us per node")


if __name__ == "__main__":
    main()
