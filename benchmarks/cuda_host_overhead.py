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
time per launch (a few microseconds on a real GPU) is not in it.

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


def measure(name: str, steps: int, batch: int) -> dict:
    """One workload: compile, one call, then ``steps`` timed calls; per-step means of the counts."""
    from cuda_stub import COUNTS
    graph, x, y = _graph(*WORKLOADS[name], batch)
    loss = graph(x, y)                                   # compiles and runs once
    loss = graph(x, y)
    gc.collect()
    before = COUNTS.copy()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = graph(x, y)
        times.append(time.perf_counter() - t0)
    del loss
    c = COUNTS - before
    per = {k: v / steps for k, v in c.items()}
    copies = sum(v for k, v in per.items() if k.startswith(("h2d", "d2h", "d2d")))
    return {"host_us_median": statistics.median(times) * 1e6,
            "host_us_mean": statistics.fmean(times) * 1e6,
            "launches": per.get("launch", 0.0), "graph_launches": per.get("graph_launch", 0.0),
            "h2d": per.get("h2d", 0.0) + per.get("h2d_async", 0.0),
            "d2h": per.get("d2h", 0.0) + per.get("d2h_async", 0.0),
            "d2d": per.get("d2d", 0.0) + per.get("d2d_async", 0.0), "copies": copies,
            "syncs": per.get("sync", 0.0), "allocs": per.get("alloc", 0.0),
            "frees": per.get("free", 0.0), "steps": steps,
            "counts": {k: v / steps for k, v in sorted(c.items())}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="timed steps per workload")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--json", type=Path, help="write the report (JSON) here")
    p.add_argument("--smoke", action="store_true", help="one step per workload (the CI test)")
    p.add_argument("--only", nargs="*", default=None, help="workload names (default: all)")
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
              "device": "stubbed driver, compute capability 9.0", "batch": args.batch,
              "workloads": {}}
    print(f"# cuda host overhead (stubbed driver), batch {args.batch}, {steps} steps, load "
          f"{report['machine_load'][0]:.2f}")
    print(f"{'workload':<20s}{'host us':>10s}{'launch':>8s}{'copies':>8s}{'syncs':>7s}"
          f"{'allocs':>8s}{'frees':>7s}")
    for name in names:
        r = measure(name, steps, args.batch)
        report["workloads"][name] = r
        print(f"{name:<20s}{r['host_us_median']:10.1f}{r['launches']:8.1f}{r['copies']:8.2f}"
              f"{r['syncs']:7.2f}{r['allocs']:8.2f}{r['frees']:7.2f}", flush=True)
    report["machine_load_after"] = os.getloadavg()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
