"""Training step time of the digits MLP (64-128-10, SGD momentum) at batch 1, 16 and 64, and the
executor's overhead per node; the cost of a new learning rate every step; gradient accumulation.

Overhead per node is measured by running the same plan with every kernel replaced by a Python
no-op taking the same arguments: what remains is the executor's own loop (copy-in, the step loop,
copy-out). Reported numbers are medians over repeated timings.

The learning rate is a graph input (the optimizer's ``learning_rate`` variable): the lr section
times the batch-64 graph call of SGD (momentum) and Adam with a constant lr, with
``param_groups[0]["lr"]`` set to a new value before every call, and with a warm-up + cosine
``SequentialLR`` stepped after every call (alternating rounds; each call timed on its own), then
the time of setting the lr and of ``scheduler.step()`` themselves, and the compile counts (1: no
call recompiled). The accumulation section times a batch of 64 as 1, 2 and 4 micro-batches.

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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    print(f"new lr every step (batch 64; medians of {args.repeats} alternating rounds of "
          f"{args.steps} steps):")
    for name in ("SGD", "Adam"):
        lr_change(name, args.steps, args.repeats)
    print("gradient accumulation (a batch of 64 as N micro-batches):")
    accumulation(args.steps, args.repeats)


def _graph(opt_name: str, micro: int = 1):
    mf.manual_seed(0)
    model = mlp((64, 128, 10))
    opt = (mf.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if opt_name == "SGD"
           else mf.optim.Adam(model.parameters(), lr=1e-3))
    g = TrainGraph(model, opt)
    if micro > 1:
        g.config.set_gradient_accumulation_steps(micro)
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 64), dtype=np.float32), rng.integers(0, 10, 64)
    g(x, y)  # compile + warm-up
    return g, opt, x, y


def lr_change(opt_name: str, steps: int, repeats: int) -> None:
    """The graph call with a constant lr, with a new lr set before every call, and with a
    scheduler stepped after every call (the calls alone, timed one by one), and the time of
    setting the lr and of ``scheduler.step()`` themselves."""
    from miniflow.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    graphs = {kind: _graph(opt_name) for kind in ("constant", "set", "scheduler")}
    opt_set, opt_s = graphs["set"][1], graphs["scheduler"][1]
    sched = SequentialLR(opt_s, [LinearLR(opt_s, 0.1, total_iters=100),
                                 CosineAnnealingLR(opt_s, T_max=10 ** 6)], milestones=[100])
    lrs = np.linspace(1e-3, 1e-2, 97).tolist()
    before = {"constant": lambda k: None,
              "set": lambda k: opt_set.param_groups[0].__setitem__("lr", lrs[k % len(lrs)]),
              "scheduler": lambda k: None}
    after = {"constant": lambda: None, "set": lambda: None, "scheduler": sched.step}
    calls = {kind: [] for kind in graphs}
    extra = {kind: [] for kind in graphs}
    clock = time.perf_counter
    for _ in range(repeats):  # alternating rounds: load changes hit every kind alike
        for kind, (g, _, x, y) in graphs.items():
            call = side = 0.0
            for k in range(steps):
                t0 = clock()
                before[kind](k)
                t1 = clock()
                g(x, y)
                t2 = clock()
                after[kind]()
                t3 = clock()
                call += t2 - t1
                side += (t1 - t0) + (t3 - t2)
            calls[kind].append(call / steps)
            extra[kind].append(side / steps)
    call = {kind: statistics.median(t) * 1e6 for kind, t in calls.items()}
    side = {kind: statistics.median(t) * 1e6 for kind, t in extra.items()}
    compiles = "/".join(str(g.compile_count) for g, *_ in graphs.values())
    print(f"  {opt_name:4s}: graph call: constant lr {call['constant']:6.1f} us, new lr every "
          f"step {call['set']:6.1f} us ({call['set'] / call['constant']:.2f}x), with a "
          f"scheduler {call['scheduler']:6.1f} us ({call['scheduler'] / call['constant']:.2f}x); "
          f"setting the lr {side['set']:4.1f} us, scheduler.step() {side['scheduler']:4.1f} us; "
          f"compiles {compiles}")


def accumulation(steps: int, repeats: int) -> None:
    graphs = {n: _graph("SGD", n) for n in (1, 2, 4)}
    times = {n: [] for n in graphs}
    for _ in range(repeats):
        for n, (g, _, x, y) in graphs.items():
            times[n].append(_median_time(lambda: g(x, y), steps, 1))
    for n, t in times.items():
        plan = next(iter(graphs[n][0].plans.values()))
        print(f"  {n} micro-batch(es) of {64 // n}: step {statistics.median(t) * 1e6:7.1f} us "
              f"({len(plan)} kernel calls)")


if __name__ == "__main__":
    main()
