"""Kernel benchmarks: how close miniflow's CPU kernels run to the machine's limits.

1. Elementwise bandwidth: ``relu``, ``broadcast_add`` and a fused ``relu(add(x0, x1))`` against
   ``numpy.copyto`` on arrays of the same size and dtype (fp32 and fp16), in GB/s counting every
   byte read and written; the serial kernel is the fair comparison (``copyto`` is one thread), the
   parallel one runs on ``--threads``.
2. float16 conversion throughput: ``cast`` f32 -> f16 and f16 -> f32 against NumPy's
   ``copyto(casting="same_kind")``, in G elements/s.
3. Serial against parallel kernels per size: where a ``parallel=True`` launch starts to pay, which
   checks ``PARALLEL_MIN_SIZE`` (with ``--threads`` > 1).
4. Matmul GFLOP/s and % of the measured single-core sgemm peak: the plan's matmul step (the
   kernel it picks: BLAS or a Numba loop; in fp16 the loops read the half operands as they are
   and BLAS gets widened copies, the product in float32 rounded once) against ``numpy.dot`` in float32, for every product of the
   wide MLP's training step (each forward and its two gradients) at batch 16, 64 and 256, on
   ``--threads`` threads, from CPU time (wall time for more than one thread; ``--only matmul``
   runs this part alone).
5. Cold start: a fresh process that imports miniflow, compiles ``miniflow train``'s graph (the
   64-128-10 MLP, SGD with momentum, batch 64) and runs one training step, with an empty and with
   a warm Numba cache (``NUMBA_CACHE_DIR``).

Times are medians (``--repeats``); thread pools are pinned (``--threads``, default all cores) and
printed. Writes ``benchmarks/results/kernels.json``. ``--isa avx2|avx512`` runs it all as on
that CPU (a child process: ``harness.run_as_isa``; the GFLOP/s are then that ISA's, against
``numpy.dot`` with OpenBLAS's kernels for it).

    python benchmarks/kernels.py [--threads N] [--repeats 7] [--skip-cold-start] [--only matmul]
                                 [--isa native|avx2|avx512]
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
    names = [_step_name(fn) for fn, _ in steps]
    run.kernel = " + ".join(n for n in names if n not in ("cast_kernel", "cast_count_kernel"))
    return run


def _step_name(fn) -> str:
    """A step's kernel factory (``dot_block_kernel``) or function name (``dot``)."""
    py_func = getattr(fn, "py_func", None)
    return py_func.__qualname__.split(".")[0] if py_func is not None else fn.__name__


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
WIDE = (64, 1024, 1024, 10)
"""The wide MLP's layer sizes; its matmuls are timed at :data:`MATMUL_BATCHES`."""
MATMUL_BATCHES = (16, 64, 256)


def cpu_seconds(fn, repeats: int, budget: float = 0.02, clock: int = 1) -> float:
    """Median process CPU seconds per call of ``fn`` (rounds of about ``budget``): on a shared
    machine the time other processes held the core is left out. ``clock=0``: wall seconds (for
    several threads, whose CPU times add up)."""
    fn()
    one = harness.cpu_round(fn, 1)[clock]
    calls = max(1, min(10000, int(budget / max(one, 1e-7))))
    return min(sorted(harness.cpu_round(fn, calls)[clock] / calls for _ in range(repeats))[
        repeats // 2], float("inf"))


def interleaved_seconds(fns: list, repeats: int, budget: float = 0.02, clock: int = 1) -> list:
    """:func:`cpu_seconds` of each of ``fns``, their rounds interleaved (``fns[0]``, ``fns[1]``,
    ... then again), so that a change of the machine's load hits every one alike."""
    calls = []
    for fn in fns:
        fn()
        one = harness.cpu_round(fn, 1)[clock]
        calls.append(max(1, min(10000, int(budget / max(one, 1e-7)))))
    rounds = [[] for _ in fns]
    for _ in range(repeats):
        for k, (fn, n) in enumerate(zip(fns, calls)):
            rounds[k].append(harness.cpu_round(fn, n)[clock] / n)
    return [sorted(r)[repeats // 2] for r in rounds]


def sgemm_peak(repeats: int, clock: int = 1) -> float:
    """The float32 GEMM peak, GFLOP/s, at the threads in force: the best of ``numpy.dot`` on
    512^3 and 1024^3 (``clock``: as :func:`cpu_seconds`)."""
    best = 0.0
    for n in (512, 1024):
        a, b = (np.random.default_rng(0).uniform(-1, 1, (n, n)).astype(np.float32)
                for _ in range(2))
        out = np.empty((n, n), np.float32)
        best = max(best, 2.0 * n ** 3 / cpu_seconds(lambda: np.dot(a, b, out), repeats,
                                                    clock=clock) / 1e9)
    return best


def fma_peak(repeats: int) -> float:
    """The single-core float32 fused multiply-add peak of the ISA the kernels are compiled for,
    GFLOP/s: twelve independent chains of ``simd.vfma`` in registers (no memory traffic; twelve
    hide the FMA latency on the cores measured), ``2 LANES`` flops each."""
    import numba

    from miniflow.kernels.cpu.simd import LANES, vfma, vload, vstore

    @numba.njit
    def chains(x, steps):
        c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = c9 = c10 = c11 = vload(x, 0, 0)
        y, z = vload(x, 1, 0), vload(x, 2, 0)
        for _ in range(steps):
            c0, c1, c2, c3 = vfma(c0, y, z), vfma(c1, y, z), vfma(c2, y, z), vfma(c3, y, z)
            c4, c5, c6, c7 = vfma(c4, y, z), vfma(c5, y, z), vfma(c6, y, z), vfma(c7, y, z)
            c8, c9, c10, c11 = vfma(c8, y, z), vfma(c9, y, z), vfma(c10, y, z), vfma(c11, y, z)
        for r, c in enumerate((c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11)):
            vstore(x, 3 + r, 0, c)

    x = np.zeros((15, LANES), np.float32)
    x[1] = 0.5
    steps = 1 << 20
    return 24.0 * LANES * steps / cpu_seconds(lambda: chains(x, steps), repeats) / 1e9


def bf16_dot_peak(repeats: int):
    """The single-core peak of ``vdpbf16ps`` (``simd.vdot_pairs``: two bfloat16 products per
    float32 lane), GFLOP/s, twelve independent chains as :func:`fma_peak`; None where the target
    has no AVX512-BF16. One Sapphire Rapids core: 106 GFLOP/s, half :func:`fma_peak`'s 214 (it
    issues one every two cycles, with 4 to 24 chains alike), where Zen 4 ran the bfloat16 tile at
    twice its float32 one (``packed_gemm``'s module docstring)."""
    import numba

    from miniflow.kernels.cpu.simd import HAS_BF16_DOT, LANES, vdot_pairs, vload, vload_run, vstore

    if not HAS_BF16_DOT:
        return None

    @numba.njit
    def chains(x, pairs, steps):
        c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = c8 = c9 = c10 = c11 = vload(x, 0, 0)
        y, z = vload_run(pairs, 0, 0), vload_run(pairs, 1, 0)
        for _ in range(steps):
            c0, c1, c2 = vdot_pairs(c0, y, z), vdot_pairs(c1, y, z), vdot_pairs(c2, y, z)
            c3, c4, c5 = vdot_pairs(c3, y, z), vdot_pairs(c4, y, z), vdot_pairs(c5, y, z)
            c6, c7, c8 = vdot_pairs(c6, y, z), vdot_pairs(c7, y, z), vdot_pairs(c8, y, z)
            c9, c10, c11 = vdot_pairs(c9, y, z), vdot_pairs(c10, y, z), vdot_pairs(c11, y, z)
        for r, c in enumerate((c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11)):
            vstore(x, 1 + r, 0, c)

    x = np.zeros((13, LANES), np.float32)
    pairs = np.zeros((2, 2 * LANES), np.int16)
    steps = 1 << 20
    return 48.0 * LANES * steps / cpu_seconds(lambda: chains(x, pairs, steps), repeats) / 1e9


def mlp_products(sizes, batch: int) -> list:
    """``(label, m, k, n, transpose_a, transpose_b)`` of every matmul of one training step of
    the MLP ``sizes`` at ``batch``, as the IR holds them: per layer ``l`` with ``W [out, in]``
    the forward ``x @ W.T``, the input gradient ``dy @ W`` (not for the first layer) and the
    weight gradient ``dy.T @ x``."""
    out = []
    for l, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        out.append((f"L{l} {n_in}->{n_out} x @ W.T", batch, n_in, n_out, False, True))
        if l:
            out.append((f"L{l} {n_in}->{n_out} dy @ W", batch, n_out, n_in, False, False))
        out.append((f"L{l} {n_in}->{n_out} dy.T @ x", n_out, batch, n_in, True, False))
    return out


def matmuls(repeats: int, threads: int = 1) -> dict:
    """The plan's matmul step (the kernel it picks, ``kernels.cpu.tune``'s choice at these
    threads; fp32, and the fp16 path: float32 products of half operands, rounded once) against
    ``numpy.dot`` in float32 on the same views, for every product of the wide MLP's step at
    :data:`MATMUL_BATCHES`, BLAS and Numba on ``threads`` threads, GFLOP/s from CPU time (one
    thread) or wall time (more). Returns ``{"peak": GFLOP/s, "fma_peak": GFLOP/s,
    "bf16_dot_peak": GFLOP/s or None, "threads": n, "rows": [...]}`` (:func:`sgemm_peak`,
    :func:`fma_peak`, :func:`bf16_dot_peak`)."""
    import numba
    from threadpoolctl import threadpool_limits

    rows = []
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    clock = 1 if threads == 1 else 0
    try:
        with threadpool_limits(threads):
            peak, fma, dot = sgemm_peak(repeats, clock), fma_peak(repeats), bf16_dot_peak(repeats)
            for batch in MATMUL_BATCHES:
                for label, m, k, n, ta, tb in mlp_products(WIDE, batch):
                    r = np.random.default_rng(0)
                    a = r.uniform(-1, 1, (k, m) if ta else (m, k)).astype(np.float32)
                    b = r.uniform(-1, 1, (n, k) if tb else (k, n)).astype(np.float32)
                    out = np.empty((m, n), np.float32)
                    flop = 2.0 * m * k * n
                    attrs = {"transpose_a": ta, "transpose_b": tb}
                    runs = [plan_steps("matmul", [a.astype(dt), b.astype(dt)], [((m, n), dt)],
                                       attrs) for dt in (np.float32, np.float16)]
                    kernel = runs[0].kernel
                    av, bv = (a.T if ta else a), (b.T if tb else b)
                    runs.append(lambda: np.dot(av, bv, out))
                    rates = [flop / t / 1e9
                             for t in interleaved_seconds(runs, repeats, clock=clock)]
                    rows.append({"batch": batch, "product": label, "m": m, "k": k, "n": n,
                                 "kernel": kernel, "fp32": rates[0], "fp16": rates[1],
                                 "numpy_dot": rates[2]})
    finally:
        numba.set_num_threads(before)
    return {"peak": peak, "fma_peak": fma, "bf16_dot_peak": dot, "threads": threads, "rows": rows}


def matmul_table(res: dict) -> str:
    """A Markdown table of :func:`matmuls`: GFLOP/s and % of the measured peak."""
    peak = res["peak"]
    lines = [f"sgemm peak at {res.get('threads', 1)} thread(s) (numpy.dot, 512^3 / 1024^3): "
             f"{peak:.1f} GFLOP/s; FMA peak of the kernels' ISA (fma_peak): "
             f"{res['fma_peak']:.1f} GFLOP/s; vdpbf16ps peak (bf16_dot_peak): "
             + (f"{res['bf16_dot_peak']:.1f} GFLOP/s" if res.get("bf16_dot_peak")
                else "no AVX512-BF16"), "",
             "| batch | product | m, k, n | kernel | miniflow fp32 | % of peak | fp16 path | "
             "numpy.dot fp32 | % of peak | fp32 / numpy.dot |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['batch']} | `{r['product']}` | {r['m']}, {r['k']}, {r['n']} | "
                     f"{r['kernel']} | {r['fp32']:.1f} | {100 * r['fp32'] / peak:.0f} | "
                     f"{r['fp16']:.1f} | {r['numpy_dot']:.1f} | "
                     f"{100 * r['numpy_dot'] / peak:.0f} | {r['fp32'] / r['numpy_dot']:.2f} |")
    return "\n".join(lines)


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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=harness.positive_int,
                   default=len(os.sched_getaffinity(0)))
    p.add_argument("--repeats", type=harness.positive_int, default=7)
    p.add_argument("--elements", type=harness.positive_int, default=10 ** 7)
    p.add_argument("--skip-cold-start", action="store_true")
    p.add_argument("--only", choices=("matmul",), help="run one part only")
    harness.add_isa_argument(p)
    args = p.parse_args(argv)
    harness.check_cores(p, harness.default_core(), args.threads)
    harness.run_as_isa(args.isa, __file__, sys.argv[1:] if argv is None else list(argv))
    info = harness.machine()
    info["threads"] = harness.pin_threads(args.threads)
    info["load_before"] = harness.load_average()
    print(f"machine: {harness.describe(info)}")
    info["isa"] = harness.isa_line()
    print(f"ISA: {info['isa']}")
    print(f"threads: {info['threads']}; load average before: {info['load_before']:.2f}")
    out = {"machine": info}

    if args.only != "matmul":
        bandwidth(out, args)
    print(f"\nmatmul, every product of the wide MLP's training step, {args.threads} thread(s) "
          f"(GFLOP/s from {'CPU' if args.threads == 1 else 'wall'} time):\n")
    out["matmul"] = matmuls(args.repeats, args.threads)
    print(matmul_table(out["matmul"]))
    if not args.skip_cold_start and args.only is None:
        print("\ncold start (new process: import, compile or load, one training step):")
        out["cold_start"] = cold_start()
        for label, total, imp, first in out["cold_start"]:
            print(f"  {label:<12s} {total:5.2f} s in all (import {imp:.2f} s, graph + first step "
                  f"{first:.2f} s)")
    info["load_after"] = harness.load_average()
    print(f"\nload average after: {info['load_after']:.2f}")
    print(f"wrote {harness.save_json('kernels', out)}")


def bandwidth(out: dict, args) -> None:
    """Parts 1-3 (elementwise, conversions, serial/parallel), printed and put into ``out``."""
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


if __name__ == "__main__":
    main()
