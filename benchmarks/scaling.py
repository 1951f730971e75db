"""How a miniflow training step scales from one thread to N, by Amdahl's law, measured so that
other load on the machine does not spoil it (issue 23, item 6).

For each case (``resnet50:BATCH``: ResNet-50 in the seed's format at 224 x 224, fp32, as
``resnet50.py``; ``wide_mlp:BATCH``: the 64-1024-1024-10 MLP, fp32, as ``speed.py``;
``gpt:BATCH``: the GPT step of ``gpt_step.py``, fp32), two child processes time every step of
the plan alone (after a warm-up): one with every pool on one thread, one on ``--threads`` N
threads and cores with ``OMP_WAIT_POLICY=PASSIVE``, so that a thread waiting for the others
sleeps instead of spinning and each thread's CPU time is its work. Per op type the table gives
the one-thread CPU time and its share of the step, and the N-thread CPU time of the calling
thread: the thread that runs the plan, whose CPU time is the step's critical path on idle
cores (the others work while it does; it sleeps while it waits), and which time the machine
gives other processes does not enter. Their ratio is the op's speed-up ``S``; Amdahl's law
``1 / S = s + (1 - s) / N`` gives each op's serial part ``s``, and their sum, weighted by the
shares, is the step's serial fraction (the time outside the plan's steps, the executor's
Python loop, counted serial). The bound on the step's speed-up is ``1 / (s + (1 - s) / N)``.

    python benchmarks/scaling.py [--cases resnet50:2,resnet50:16,wide_mlp:256,gpt:16]
        [--threads 2] [--steps 3] [--matmul blas]

``--matmul`` sets ``MINIFLOW_MATMUL`` in the children (default ``blas``: the same products in
both, whatever a tuner would measure on a loaded machine; ``auto`` measures). Each child pins
itself to the highest-numbered cores it may use (``harness.pin_core``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402

CASES = ("resnet50:2", "resnet50:16", "wide_mlp:256", "gpt:16")
PREFIX = "@scaling "
"""Marks the child's answer on its stdout."""


def build_step(model: str, batch: int):
    """``step()`` (one fp32 training step; ``step.graph``: its ``nn.Graph``) of a case."""
    if model == "resnet50":
        import resnet50
        train, _ = resnet50.miniflow_step("fp32", None)
        x, y = resnet50.data(batch, 224)

        def step():
            return train(x, y)
        step.graph = train.graph
        return step
    if model == "wide_mlp":
        import speed
        sizes = speed.MODELS["wide_mlp"]
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
        y = rng.integers(0, sizes[-1], batch).astype(np.int64)
        return speed.miniflow_step(sizes, speed.init_weights(sizes), x, y, "fp32")
    if model == "gpt":
        import gpt_step
        with tempfile.TemporaryDirectory() as tmp:
            case = gpt_step.read_case(gpt_step.write_case(Path(tmp) / "case.npz", batch))
        return gpt_step.miniflow_step(*case, "fp32")
    raise SystemExit(f"scaling.py: unknown model {model!r}; choose resnet50, wide_mlp or gpt")


def profile(step, steps: int) -> dict:
    """Every plan step of ``step`` timed alone over ``steps`` steps (after two warm-up steps):
    ``{"ops": {op type: [process CPU s, calling thread's CPU s, wall s]}, "step": [the same
    for whole steps]}``, per step."""
    for _ in range(2):
        step()
    plan = next(reversed(step.graph.plans.values()))
    ops: dict = {}
    clocks = (time.process_time, time.thread_time, time.perf_counter)
    with np.errstate(all="ignore"):
        for _ in range(steps):
            for (fn, args), i in zip(plan.steps, plan._owners):
                t0 = [c() for c in clocks]
                fn(*args)
                t1 = [c() for c in clocks]
                acc = ops.setdefault(plan.graph.nodes[i].op.name, [0.0, 0.0, 0.0])
                for k in range(3):
                    acc[k] += (t1[k] - t0[k]) / steps
    t0 = [c() for c in clocks]
    for _ in range(steps):
        step()
    return {"ops": ops, "step": [(c() - t) / steps for c, t in zip(clocks, t0)]}


def child(case: str, threads: int, steps: int) -> None:
    """The child's entry: pin, build, profile, print the answer."""
    print(harness.pin_threads(threads, ("miniflow",)), flush=True)
    cores = sorted(os.sched_getaffinity(0))[-threads:]
    harness.pin_core(set(cores))
    model, batch = case.split(":")
    res = profile(build_step(model, int(batch)), steps)
    print(PREFIX + json.dumps(res), flush=True)


def run_child(case: str, threads: int, steps: int, matmul: str) -> dict:
    """:func:`child` in a fresh process (``OMP_WAIT_POLICY=PASSIVE`` beyond one thread)."""
    env = {**os.environ, "MINIFLOW_MATMUL": matmul}
    if threads > 1:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    out = subprocess.run([sys.executable, __file__, "--child", case, "--threads", str(threads),
                          "--steps", str(steps)], env=env, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(PREFIX)]
    if out.returncode or not lines:
        raise SystemExit(f"scaling.py: the {threads}-thread child of {case} failed:\n"
                         f"{out.stderr[-3000:]}")
    return json.loads(lines[-1][len(PREFIX):])


def amdahl(one: dict, many: dict, n: int) -> tuple:
    """``(rows, serial fraction, bound, predicted speed-up)`` from the one-thread and
    ``n``-thread profiles: rows ``(op, 1-thread CPU ms, share, n-thread calling thread's ms,
    speed-up, serial part)``, most time first; the time outside the plan's steps counts serial."""
    total = one["step"][0]
    rows, serial = [], 0.0
    for op, (cpu, _, _) in sorted(one["ops"].items(), key=lambda kv: -kv[1][0]):
        main = many["ops"].get(op, [0.0, cpu, 0.0])[1]
        speedup = cpu / main if main > 0 else 1.0
        part = min(1.0, max(0.0, (1 / speedup - 1 / n) / (1 - 1 / n)))
        serial += cpu / total * part
        rows.append((op, 1e3 * cpu, cpu / total, 1e3 * main, speedup, part))
    outside = max(0.0, total - sum(v[0] for v in one["ops"].values()))
    serial += outside / total
    many_main = sum(v[1] for v in many["ops"].values()) + outside
    return rows, serial, 1 / (serial + (1 - serial) / n), total / many_main


def report(case: str, one: dict, many: dict, n: int) -> str:
    """The Markdown table and summary line of one case."""
    rows, s, bound, predicted = amdahl(one, many, n)
    out = [f"{case}: one thread {1e3 * one['step'][0]:.1f} ms of CPU per step; serial fraction "
           f"{s:.3f}, Amdahl bound on {n} threads {bound:.2f}x, the calling thread's time "
           f"predicts {predicted:.2f}x", "",
           f"| op | 1 thread ms | share | {n} threads, calling thread ms | speed-up | serial |",
           "|---|---:|---:|---:|---:|---:|"]
    out += [f"| {op} | {cpu:.2f} | {100 * share:.1f}% | {main:.2f} | {sp:.2f} | {part:.2f} |"
            for op, cpu, share, main, sp, part in rows if share >= 0.005]
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--matmul", default="blas", choices=("auto", "blas", "numba"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.threads, args.steps)
        return
    for case in args.cases.split(","):
        print(f"{case}: load average {harness.load_average():.2f}", flush=True)
        one = run_child(case, 1, args.steps, args.matmul)
        many = run_child(case, args.threads, args.steps, args.matmul)
        print(report(case, one, many, args.threads) + "\n", flush=True)
        print(f"  (load average after: {harness.load_average():.2f})", flush=True)


if __name__ == "__main__":
    main()
