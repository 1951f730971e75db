"""Host cost of a cuda training step, measured without a GPU (numba-cuda's real launch path over a
stubbed driver, ``benchmarks/cuda_stub.py``).

    python benchmarks/cuda_host_overhead.py [--steps 300] [--json PATH] [--smoke]

For the digits MLP (64-128-10) and the wide MLP (64-1024-1024-10) at batch 64, fp32 and AMP
(float16 with a dynamic GradScaler), SGD (momentum 0.9) and Adam: the graph is compiled on the
cuda backend (kernels really compiled to PTX for compute capability 9.0), called once, and then
called ``--steps`` times as a training loop calls it (``loss = graph(x, y)``, nothing read back).
Per step it reports the host time (median of the per-step wall times, and the mean), the kernel
launches, the host<->device copies, the calls that wait for the device ("syncs": synchronous
reads, pageable host-to-device copies, stream/context/event synchronisation), device allocations
and frees. The host time is what the Python side costs up to the driver calls; the driver's own
time per launch (a few microseconds on a real GPU) is not in it. For the AMP workloads it also
reports, with the GPU running behind the host (the stub's events complete a few records later),
the blocking waits per step when the loop reads nothing and when it reads ``scaler.found_inf``
after every step.

``--smoke`` runs one step of each workload (the CI test checks the report's fields); ``--json``
writes the report. Results depend on the machine's load: the report records the load average.
Runs in its own process (the stub replaces numba-cuda's driver for good).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

WORKLOADS = {f"{model} {dtype} {opt}": (sizes, dtype == "amp", opt)
             for model, sizes in (("digits", (64, 128, 10)), ("wide", (64, 1024, 1024, 10)))
             for dtype in ("fp32", "amp") for opt in ("sgd", "adam")}
"""Workload name -> (layer sizes, AMP, optimizer)."""
FIELDS = ("host_us_median", "host_us_mean", "launches", "graph_launches", "h2d", "d2h", "d2d",
          "copies", "syncs", "allocs", "frees", "steps")
"""Per-step fields of every workload in the report."""


def _graph(sizes, amp: bool, opt: str, batch: int):
    import miniflow as mf
    from miniflow.experiments.mlp import TrainGraph, mlp
    mf.manual_seed(0)
    model = mlp(sizes)
    optimizer = (mf.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if opt == "sgd"
                 else mf.optim.Adam(model.parameters(), lr=1e-3))
    graph = TrainGraph(model, optimizer)
    if amp:
        graph.config.enable_amp(True)
        graph.set_grad_scaler(mf.amp.GradScaler())
    rng = np.random.default_rng(0)
    x = rng.random((batch, sizes[0]), dtype=np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int64)
    return graph, x, y


PATHS = ("dispatcher", "packed", "graph")
"""How the plan's launches are made: numba-cuda's dispatcher at every launch (the launch path
before packed launches; everything else as now), packed launches, one CUDA graph (the stub
accepts the capture; on a real GPU this path is unverified)."""


def _use_path(path: str):
    """Switch the cuda runtime (and the stub) to ``path``; returns a function restoring it."""
    import cuda_stub
    from miniflow.runtime import cuda as runtime
    saved = (runtime.prepare, runtime.GRAPHS[0], cuda_stub.SETTINGS["graphs"])
    runtime.GRAPHS[0] = cuda_stub.SETTINGS["graphs"] = path == "graph"
    if path == "dispatcher":
        runtime.prepare = lambda steps, stream: (list(steps), list(range(len(steps))),
                                                 "dispatcher calls")

    def restore():
        runtime.prepare, runtime.GRAPHS[0], cuda_stub.SETTINGS["graphs"] = saved
    return restore


GPU_LAG = 3
"""Events recorded after an event before it completes, in the runs with the GPU behind the host
(AMP: two events a step, the inputs' and the read-back's: about 1.5 steps behind)."""


def measure(name: str, steps: int, batch: int, path: str, reads: bool = False,
            gpu_behind: bool = False) -> dict:
    """One workload on one launch path: compile, two calls, then ``steps`` timed calls; per-step
    means of the counts. ``reads``: the loop reads the grad scaler's ``found_inf`` after every
    step (AMP workloads); ``gpu_behind``: the stub's events complete :data:`GPU_LAG` records
    later (or when waited for), as when the GPU runs behind the host."""
    import cuda_stub
    from cuda_stub import COUNTS
    restore = _use_path(path)
    cuda_stub.SETTINGS["events_done"] = not gpu_behind
    cuda_stub.SETTINGS["lag"] = GPU_LAG if gpu_behind else None
    try:
        graph, x, y = _graph(*WORKLOADS[name], batch)
        scaler = graph._grad_scaler if reads else None
        loss = graph(x, y)                               # compiles and runs once
        loss = graph(x, y)
        if scaler is not None:
            scaler.found_inf                             # the steps before are read too
        gc.collect()
        before = COUNTS.copy()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = graph(x, y)
            if scaler is not None:
                scaler.found_inf
            times.append(time.perf_counter() - t0)
        del loss
        c = COUNTS - before
        plan = next(iter(graph.plans.values()))
    finally:
        cuda_stub.SETTINGS["events_done"], cuda_stub.SETTINGS["lag"] = True, None
        restore()
    per = {k: v / steps for k, v in c.items()}
    copies = sum(v for k, v in per.items() if k.startswith(("h2d", "d2h", "d2d")))
    return {"host_us_median": statistics.median(times) * 1e6,
            "host_us_mean": statistics.fmean(times) * 1e6,
            "launches": per.get("launch", 0.0), "graph_launches": per.get("graph_launch", 0.0),
            "h2d": per.get("h2d", 0.0) + per.get("h2d_async", 0.0),
            "d2h": per.get("d2h", 0.0) + per.get("d2h_async", 0.0),
            "d2d": per.get("d2d", 0.0) + per.get("d2d_async", 0.0), "copies": copies,
            "syncs": per.get("sync", 0.0), "allocs": per.get("alloc", 0.0),
            "frees": per.get("free", 0.0), "steps": steps, "how": plan.how,
            "kernel_steps": len(plan.steps),
            "counts": {k: v / steps for k, v in sorted(c.items())}}


def check_packing(name: str, batch: int) -> dict:
    """:func:`packing_report` of workload ``name``."""
    return packing_report(lambda: _graph(*WORKLOADS[name], batch))


def _plan_on(path: str, make):
    """The plan of ``make()``'s graph after one call on launch path ``path``."""
    restore = _use_path(path)
    try:
        graph, x, y = make()
        graph(x, y)
    finally:
        restore()
    return next(iter(graph.plans.values()))


def packing_report(make) -> dict:
    """Every packed launch of the plan of ``make()`` (a fresh ``(graph, x, y)``) passes the
    driver the kernel, grid, block and parameter bytes that numba-cuda's dispatcher passes for
    the same step; the CUDA graph captures the same kernels in the same order. Returns
    ``{"launches": n, "mismatches": [...], "graph_kernels_match": bool, ...}``."""
    import cuda_stub
    from miniflow.kernels.cuda.launch import Launch
    plan = _plan_on("packed", make)
    table = {run.params: run.kernelargs for run, _ in plan._calls if hasattr(run, "params")}
    mismatches, n = [], 0
    cuda_stub.SETTINGS["record"] = True
    try:
        for (run, _), (fn, args) in zip(plan._calls, plan.steps):
            if not isinstance(fn, Launch):
                continue
            cuda_stub.LAUNCHES.clear()
            run()
            fn(*args)                                     # numba-cuda's dispatcher
            (_, f1, g1, b1, params), (_, f2, g2, b2, packed) = cuda_stub.LAUNCHES
            mine = cuda_stub.param_bytes(table[params], params)
            n += 1
            if (f1, tuple(g1), tuple(b1), mine) != (f2, g2, b2, packed):
                mismatches.append(fn.name)
    finally:
        cuda_stub.SETTINGS["record"] = False
    handles = [int(run.launch_args[0]) for run, _ in plan._calls if hasattr(run, "params")]
    plan2 = _plan_on("graph", make)
    captured = cuda_stub.GRAPHS.get(int(getattr(plan2._calls[0][0], "_keep", [0])[0]), [])
    return {"launches": n, "mismatches": mismatches,
            "graph_kernels": len(captured), "graph_kernels_match": captured == handles,
            "graph_how": plan2.how}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="timed steps per workload and path")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--json", type=Path, help="write the report (JSON) here")
    p.add_argument("--smoke", action="store_true", help="one step per workload (the CI test)")
    p.add_argument("--only", nargs="*", default=None, help="workload names (default: all)")
    p.add_argument("--paths", nargs="*", default=list(PATHS), choices=PATHS)
    args = p.parse_args(argv)
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
    import cuda_stub
    cuda_stub.install()
    import miniflow as mf
    import numba
    mf.set_backend("cuda")
    steps = 1 if args.smoke else args.steps
    names = args.only or list(WORKLOADS)
    import importlib.metadata as md
    report = {"machine_load": os.getloadavg(), "numba": numba.__version__,
              "numba_cuda": md.version("numba-cuda"), "cuda_core": md.version("cuda-core"),
              "cuda_bindings": md.version("cuda-bindings"),
              "device": "stubbed driver, compute capability 9.0", "batch": args.batch,
              "steps": steps, "workloads": {}}
    print(f"# cuda host overhead (stubbed driver), batch {args.batch}, {steps} steps, load "
          f"{report['machine_load'][0]:.2f}; host us per step (median)")
    print(f"{'workload':<18s}" + "".join(f"{p + ' us':>14s}" for p in args.paths)
          + f"{'launches':>9s}{'copies':>8s}{'syncs':>7s}{'allocs':>8s}{'frees':>7s}  packing")
    lazy = []
    for name in names:
        r = {path: measure(name, steps, args.batch, path) for path in args.paths}
        if "amp" in name:
            for mode, reads in (("behind", False), ("behind_reads", True)):
                m = measure(name, steps, args.batch, "packed", reads, gpu_behind=True)
                r[mode] = {k: m[k] for k in ("host_us_median", "syncs", "d2h")}
        r["packing"] = check_packing(name, args.batch)
        report["workloads"][name] = r
        main_path = r.get("packed") or r[args.paths[0]]
        ok = not r["packing"]["mismatches"] and r["packing"]["graph_kernels_match"]
        print(f"{name:<18s}" + "".join(f"{r[p]['host_us_median']:14.1f}" for p in args.paths)
              + f"{main_path['launches']:9.1f}{main_path['copies']:8.2f}"
              f"{main_path['syncs']:7.2f}{main_path['allocs']:8.2f}{main_path['frees']:7.2f}"
              f"  {'same bytes' if ok else 'MISMATCH'} ({r['packing']['launches']})",
              flush=True)
        if "behind" in r:
            lazy.append(f"{name:<18s}{r['behind']['syncs']:10.2f}{r['behind']['d2h']:8.2f}"
                        f"{r['behind_reads']['syncs']:14.2f}")
    if lazy:
        print(f"# packed launches, GPU {GPU_LAG} events behind the host: blocking waits and "
              f"async D2H copies per step when nothing is read; waits when the loop reads "
              f"scaler.found_inf every step")
        print(f"{'workload':<18s}{'syncs':>10s}{'d2h':>8s}{'reads: syncs':>14s}")
        print("\n".join(lazy))
    report["machine_load_after"] = os.getloadavg()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    bad = [n for n, r in report["workloads"].items()
           if r["packing"]["mismatches"] or not r["packing"]["graph_kernels_match"]]
    if bad:
        print(f"packed launches differ from numba-cuda's dispatcher: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
