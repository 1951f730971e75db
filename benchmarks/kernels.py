"""Kernel benchmarks: how close miniflow's CPU kernels run to the machine's limits.

1. Elementwise bandwidth: ``relu``, ``broadcast_add`` and a fused ``relu(add(x0, x1))`` against
   ``numpy.copyto`` on arrays of the same size and dtype (fp32 and fp16), in GB/s counting every
   byte read and written; the serial kernel is the fair comparison (``copyto`` is one thread), the
   parallel one runs on ``--threads``.
2. float16 conversion throughput: ``cast`` f32 -> f16 and f16 -> f32 against NumPy's
   ``copyto(casting="same_kind")``, in G elements/s.
3. Serial against parallel kernels per size: where a ``parallel=True`` launch starts to pay, which
   checks ``PARALLEL_MIN_SIZE`` (with ``--threads`` > 1).
4. Matmul GFLOP/s: the plan's matmul step (BLAS or the skinny loops; the fp16 path widens,
   multiplies in float32 and rounds) against ``numpy.dot`` in float32, on the MLPs' shapes.
5. Cold start: a fresh process that imports miniflow, compiles ``miniflow train``'s graph (the
   64-128-10 MLP, SGD with momentum, batch 64) and runs one training step, with an empty and with
   a warm Numba cache (``NUMBA_CACHE_DIR``).

Times are medians (``--repeats``); thread pools are pinned (``--threads``, default all cores) and
printed. Writes ``benchmarks/results/kernels.json``.

    python benchmarks/kernels.py [--threads N] [--repeats 7] [--skip-cold-start]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def plan_steps(op: str, ins: list, out_specs: list, attrs=None) -> list:
    """The CPU steps of one node of ``op`` on ``ins``, built and run once (compiled)."""
    from miniflow.dtype import as_dtype
    from miniflow.ir import Node, Value
    from miniflow.kernels.cpu import builder_for
    from miniflow.ops import get_op

    node = Node(get_op(op), [Value(f"i{k}", a.shape, as_dtype(a.dtype)) for k, a in enumerate(ins)],
                [Value(f"o{k}", s, as_dtype(d)) for k, (s, d) in enumerate(out_specs)],
                dict(attrs or {}))
    outs = [np.empty(s, d) for s, d in out_specs]
    steps = builder_for(node.op)(node, ins, outs)
    run = _runner(steps)
    run()
    return run


def _runner(steps):
    def run():
        for fn, args in steps:
            fn(*args)
    return run


def seconds(fn, repeats: int, budget: float = 0.05) -> float:
    """Median seconds per call of ``fn``, each round long enough to time (about ``budget``)."""
    t = harness.round_time(fn, 1)
    calls = max(1, min(10000, int(budget / max(t, 1e-7))))
    return harness.median_time(fn, calls, repeats)


# ----------------------------------------------------------------------------- 1-3 elementwise
def elementwise(n: int, repeats: int) -> list:
    """Rows ``(what, dtype, GB/s, copy GB/s)`` for the elementwise kernels on ``n`` elements (the
    parallel variants with BLAS on one thread, as plans choose them)."""
    from threadpoolctl import threadpool_limits

    from miniflow.kernels.cpu import common as cpu_common

    rows, threshold = [], cpu_common.PARALLEL_MIN_SIZE
    for dt in (np.float32, np.float16):
        r = np.random.default_rng(0)
        x, y = (r.uniform(-1, 1, n).astype(dt) for _ in range(2))
        out = np.empty(n, dt)
        copy = 2 * x.nbytes / seconds(lambda: np.copyto(out, x), repeats)
        cases = [("relu", [x], 2), ("broadcast_add", [x, y], 3),
                 ("fused_elementwise", [x, y], 3)]
        for parallel in (False, True):
            cpu_common.PARALLEL_MIN_SIZE = n if parallel else n + 1
            for op, ins, arrays in cases:
                attrs = {"expr": "relu(add(x0, x1))"} if op == "fused_elementwise" else {}
                with threadpool_limits(1, user_api="blas"):
                    run = plan_steps(op, ins, [((n,), dt)], attrs)
                gbs = arrays * x.nbytes / seconds(run, repeats)
                label = "relu(add(x0, x1))" if op == "fused_elementwise" else op
                rows.append((f"{label} ({'parallel' if parallel else 'serial'})",
                             np.dtype(dt).name, gbs, copy))
        cpu_common.PARALLEL_MIN_SIZE = threshold
    return rows


def conversions(n: int, repeats: int) -> list:
    """Rows ``(conversion, miniflow G elements/s, NumPy G elements/s)``."""
    x32 = np.random.default_rng(0).uniform(-6e4, 6e4, n).astype(np.float32)
    x16 = x32.astype(np.float16)
    rows = []
    for src, dst in ((x32, np.empty(n, np.float16)), (x16, np.empty(n, np.float32))):
        run = plan_steps("cast", [src], [((n,), dst.dtype)], {"dtype": dst.dtype.name})
        numpy = n / seconds(lambda: np.copyto(dst, src, casting="same_kind"), repeats) / 1e9
        rows.append((f"{src.dtype.name} -> {dst.dtype.name}", n / seconds(run, repeats) / 1e9,
                     numpy))
    return rows


def crossover(repeats: int) -> list:
    """Rows ``(elements, serial us, parallel us)`` of ``relu`` f32 from 2^10 to 2^22 elements."""
    from miniflow.kernels.cpu.elementwise import map_kernel
    from miniflow.ops import get_op

    rows = []
    for e in range(10, 23, 2):
        x = np.ones(1 << e, np.float32)
        out = np.empty_like(x)
        times = []
        for parallel in (False, True):
            k = map_kernel(get_op("relu").scalar, parallel)
            k(x, out)
            times.append(1e6 * seconds(lambda: k(x, out), repeats))
        rows.append((1 << e, *times))
    return rows


# ----------------------------------------------------------------------------- 4 matmul
MATMULS = [(1, 64, 128), (16, 64, 128), (64, 64, 128), (256, 64, 128), (64, 128, 64),
           (4, 1024, 1024), (16, 1024, 1024), (64, 1024, 1024), (256, 1024, 1024)]
"""``(m, k, n)``: forward ``x @ W.T`` shapes of the two MLPs (``W`` stored ``[n, k]``)."""


def matmuls(repeats: int) -> list:
    """Rows ``(m, k, n, miniflow fp32, miniflow fp16 path, numpy.dot fp32)`` in GFLOP/s."""
    rows = []
    for m, k, n in MATMULS:
        r = np.random.default_rng(0)
        x, w = (r.uniform(-1, 1, s).astype(np.float32) for s in ((m, k), (n, k)))
        out = np.empty((m, n), np.float32)
        flop = 2.0 * m * k * n
        rates = []
        for dt in (np.float32, np.float16):
            run = plan_steps("matmul", [x.astype(dt), w.astype(dt)], [((m, n), dt)],
                             {"transpose_b": True})
            rates.append(flop / seconds(run, repeats) / 1e9)
        rates.append(flop / seconds(lambda: np.dot(x, w.T, out), repeats) / 1e9)
        rows.append((m, k, n, *rates))
    return rows


# ----------------------------------------------------------------------------- 5 cold start
_COLD = textwrap.dedent("""
    import time
    t0 = time.perf_counter()
    import numpy as np
    import miniflow as mf
    from miniflow.experiments.mlp import TrainGraph, mlp
    t1 = time.perf_counter()
    model = mlp((64, 128, 10))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    rng = np.random.default_rng(0)
    graph(rng.random((64, 64), dtype=np.float32), rng.integers(0, 10, 64))
    t2 = time.perf_counter()
    print(t1 - t0, t2 - t1)
""")


def cold_start() -> list:
    """Rows ``(cache, process seconds, import seconds, first-step seconds)``: a fresh and a warm
    Numba cache, each a new process."""
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        env.pop("MINIFLOW_BACKEND", None)
        for label in ("empty cache", "warm cache"):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-c", _COLD], env=env, capture_output=True,
                               text=True, check=True)
            total = time.perf_counter() - t0
            imp, first = map(float, r.stdout.split())
            rows.append((label, total, imp, first))
    return rows


# ----------------------------------------------------------------------------- main
def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--elements", type=int, default=10 ** 7)
    p.add_argument("--skip-cold-start", action="store_true")
    args = p.parse_args(argv)
    info = harness.machine()
    info["threads"] = harness.pin_threads(args.threads)
    info["load_before"] = harness.load_average()
    print(f"machine: {harness.describe(info)}")
    print(f"threads: {info['threads']}; load average before: {info['load_before']:.2f}")
    out = {"machine": info}

    n = args.elements
    print(f"\nelementwise, {n:.0e} elements (GB/s read + written; copy = numpy.copyto):")
    out["elementwise"] = elementwise(n, args.repeats)
    for what, dt, gbs, copy in out["elementwise"]:
        print(f"  {what:<34s} {dt:<8s} {gbs / 1e9:6.1f} GB/s = {100 * gbs / copy:5.1f}% of copy "
              f"({copy / 1e9:.1f} GB/s)")
    print(f"\nfloat16 conversion, {n:.0e} elements (G elements/s):")
    out["conversions"] = conversions(n, args.repeats)
    for what, ours, numpy in out["conversions"]:
        print(f"  {what:<18s} miniflow {ours:6.2f}   NumPy {numpy:6.2f}")
    print("\nrelu f32, serial against parallel kernel (us):")
    out["crossover"] = crossover(args.repeats)
    for size, serial, parallel in out["crossover"]:
        print(f"  {size:>9d} elements: serial {serial:9.2f}  parallel {parallel:9.2f}  "
              f"({'parallel' if parallel < serial else 'serial'} faster)")
    print("\nmatmul x @ W.T (GFLOP/s):")
    out["matmul"] = matmuls(args.repeats)
    for m, k, nn, f32, f16, blas in out["matmul"]:
        print(f"  m={m:<4d} k={k:<5d} n={nn:<5d} miniflow fp32 {f32:6.1f}  fp16 path {f16:6.1f}  "
              f"numpy.dot fp32 {blas:6.1f}")
    if not args.skip_cold_start:
        print("\ncold start (new process: import, compile or load, one training step):")
        out["cold_start"] = cold_start()
        for label, total, imp, first in out["cold_start"]:
            print(f"  {label:<12s} {total:5.2f} s in all (import {imp:.2f} s, graph + first step "
                  f"{first:.2f} s)")
    info["load_after"] = harness.load_average()
    print(f"\nload average after: {info['load_after']:.2f}")
    print(f"wrote {harness.save_json('kernels', out)}")


if __name__ == "__main__":
    main()
