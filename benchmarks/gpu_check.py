"""Real-GPU check of the cuda backend, sized to finish in under 5 minutes on a fresh machine.

    python benchmarks/gpu_check.py [--out benchmarks/results/gpu_check.txt] [--budget 280]

Sections, in order; the report is written (to ``--out`` and stdout) after every section, and a
section that fails or runs out of time is reported with its error and the check goes on:

1. versions: the GPU, the driver, numba, numba-cuda, cuda-core, cuda-bindings, CuPy (cuBLAS),
   NumPy, Python, the commit.
2. the op tests on the GPU: ``python -m pytest tests/cuda -q`` without the simulator (every CUDA
   kernel against the CPU kernel, training steps against the cpu backend); its output's tail and
   stderr are printed.
3. the runtime on the real driver: three training steps of the digits MLP through numba-cuda's
   dispatcher, packed launches and the CUDA graph must give the same bits; how each plan runs.
4. kernel times: every call of the digits MLP's (fp32 SGD) and the wide MLP's (AMP SGD) plans,
   timed with CUDA events while a spinning kernel keeps the GPU busy (so the launches queue and
   the events time the kernels, not the launches), median of ``--reps``; the host time per launch
   measured separately (wall time of the enqueueing).
5. step times: cpu against cuda (packed launches and CUDA graph), wall time and GPU time (events)
   per training step, for both MLPs.
6. matmul: the register-tiled kernel's GFLOP/s against cuBLAS (when CuPy is installed), f32 and
   f16, on the wide MLP's shapes.
7. ``miniflow train --epochs N --backend B`` on each backend (accuracy and time).

Kernels compile on the first run (about a minute). Every section runs at most
``--section-limit`` seconds (sections 2 and 7 are subprocesses with that timeout; the others are
stopped by an alarm) and within what is left of ``--budget``. ``--simulator`` smoke-tests the
script under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, tiny sizes;
``tests/test_gpu_check.py`` runs it). Exits 1 without a GPU. Copy the report into
``benchmarks/README.md``.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata as md
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import miniflow as mf  # noqa: E402
from miniflow.experiments.mlp import TrainGraph, mlp  # noqa: E402
from miniflow.runtime.backend import cuda_status  # noqa: E402

MODELS = {"digits": (64, 128, 10), "wide": (64, 1024, 1024, 10)}


class Report:
    """Lines of the report, written in full to ``path`` after every section."""

    def __init__(self, path: Path, deadline: float):
        self.path, self.deadline, self.lines = path, deadline, []

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(self.lines) + "\n")

    def left(self) -> float:
        """Seconds left of the budget."""
        return self.deadline - time.perf_counter()

    def section(self, title: str, body, fail: str | None = None, limit: float = 120.0,
                hang: str | None = None) -> None:
        """A section: its title, then what ``body()`` reports; an exception, or running past
        ``limit`` seconds (or past the budget), is reported and the check goes on; the report is
        written at its end. ``fail`` / ``hang``: (part of) the title of a section to fail / hang
        on purpose (``--inject-failure`` / ``--inject-hang``, for the test of this script)."""
        self(f"\n## {title}")
        t0 = time.perf_counter()
        limit = min(limit, self.left())
        previous = signal.signal(signal.SIGALRM, _timed_out)
        try:
            if limit <= 0:
                self("skipped: the time budget is spent")
            else:
                signal.setitimer(signal.ITIMER_REAL, limit)
                if fail and fail in title:
                    raise RuntimeError(f"injected failure ({fail!r})")
                if hang and hang in title:
                    while True:
                        time.sleep(0.05)
                body()
        except SectionTimeout:
            self(f"TIMED OUT after {limit:.0f} s (what it printed before is above)")
        except Exception:  # noqa: BLE001 (a failing section is reported, the check goes on)
            self("FAILED:")
            for line in traceback.format_exc().rstrip().splitlines():
                self(f"    {line}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        self(f"({time.perf_counter() - t0:.1f} s)")
        self.write()


class SectionTimeout(Exception):
    """A section of the check ran past its time limit."""


def _timed_out(signum, frame):
    raise SectionTimeout


def _run(cmd, timeout: float, env=None):
    """``cmd`` in a subprocess: ``(returncode or 'timeout', stdout, stderr)``."""
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=max(1.0, timeout))
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return "timeout", out, err


def _tail(out, text: str, lines: int, what: str) -> None:
    text = text.strip()
    if text:
        out(f"{what} (last {lines} lines):")
        for line in text.splitlines()[-lines:]:
            out(f"    {line}")


def _graph(sizes, amp: bool, batch: int, seed: int = 0):
    mf.manual_seed(seed)
    model = mlp(sizes)
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    if amp:
        graph.config.enable_amp(True)
        graph.set_grad_scaler(mf.amp.GradScaler())
    rng = np.random.default_rng(seed)
    x = rng.random((batch, sizes[0]), dtype=np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int64)
    return graph, model, x, y


@contextlib.contextmanager
def _launch_path(path: str):
    """Plans built inside use ``path``: ``"dispatcher"`` (numba-cuda's dispatcher at every
    launch), ``"packed"`` or ``"graph"``."""
    from miniflow.runtime import cuda as runtime
    saved = runtime.prepare, runtime.GRAPHS[0]
    runtime.GRAPHS[0] = path == "graph"
    if path == "dispatcher":
        runtime.prepare = lambda steps, stream: (list(steps), list(range(len(steps))),
                                                 "dispatcher calls")
    try:
        yield
    finally:
        runtime.prepare, runtime.GRAPHS[0] = saved


@cuda.jit
def spin(out, n):
    """Keeps one thread of the GPU busy for ``n`` dependent multiply-adds (a few ns each)."""
    acc = 0.0
    for i in range(n):
        acc = acc * 0.9999999 + 1.0
    if cuda.threadIdx.x == 0:
        out[0] = acc


def versions(out, gpu: str) -> None:
    from numba.cuda.cudadrv import driver
    out(f"GPU: {gpu}")
    try:
        major, minor = driver.driver.get_version()
        out(f"CUDA driver API: {major}.{minor}")
    except Exception as e:  # noqa: BLE001 (the simulator has no driver)
        out(f"CUDA driver API: unknown ({type(e).__name__})")
    names = ("numba", "numba-cuda", "cuda-core", "cuda-bindings", "cupy-cuda12x", "numpy")
    found = []
    for name in names:
        try:
            found.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            found.append(f"{name} not installed")
    out(", ".join(found) + f", python {sys.version.split()[0]}")
    rc, commit, _ = _run(["git", "rev-parse", "--short", "HEAD"], 10)
    out(f"miniflow commit: {commit.strip() if rc == 0 else 'unknown'}")


def op_tests(out, left: float, env) -> None:
    t0 = time.perf_counter()
    rc, stdout, stderr = _run([sys.executable, "-m", "pytest", "tests/cuda", "-q", "-p",
                               "no:cacheprovider"], left, env)
    summary = (stdout.strip().splitlines() or ["(no output)"])[-1]
    out(f"{summary} (exit {rc}, {time.perf_counter() - t0:.0f} s)")
    if rc != 0:
        _tail(out, stdout, 40, "stdout")
    _tail(out, stderr, 20, "stderr")


def runtime_check(out, batch: int) -> None:
    results = {}
    for path in ("dispatcher", "packed", "graph"):
        with _launch_path(path):
            graph, model, x, y = _graph(MODELS["digits"], False, batch)
            losses = [float(graph(x, y)) for _ in range(3)]
            plan = next(iter(graph.plans.values()))
            results[path] = (losses, [p.numpy() for p in model.parameters()], plan.how)
        out(f"{path}: runs as {results[path][2]}; losses {results[path][0]}")
    ref = results["dispatcher"]
    for path in ("packed", "graph"):
        same = all(a.tobytes() == b.tobytes() for a, b in zip(ref[1], results[path][1]))
        out(f"{path} against the dispatcher: parameters after 3 steps "
            f"{'bit-identical' if same else 'DIFFER'}")
        if not same:
            raise AssertionError(f"{path} launches give other parameters than the dispatcher")


def _ms(value: float) -> str:
    """An event time in ms, or n/a (the simulator's events give -1)."""
    return f"{value:.3f} ms" if value >= 0 else "n/a"


def kernel_times(out, reps: int, batch: int, spin_iters: int, simulator: bool) -> None:
    backend = mf.get_backend()
    flag = cuda.device_array(1, np.float32)
    for model, amp in (("digits", False), ("wide", True)):
        with _launch_path("packed"):
            graph, _, x, y = _graph(MODELS[model], amp, batch)
            graph(x, y)
        plan = next(iter(graph.plans.values()))
        rows = []
        for (fn, args), k in zip(plan._calls, plan._call_steps):
            gpu, host = [], []
            for _ in range(1 if simulator else 3):
                start, end = cuda.event(), cuda.event()
                spin[1, 1, backend.stream](flag, spin_iters)   # the GPU busy: launches queue
                start.record(backend.stream)
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn(*args)
                host.append((time.perf_counter() - t0) / reps * 1e6)
                end.record(backend.stream)
                end.synchronize()
                gpu.append(start.elapsed_time(end) / reps * 1e3)
            label = getattr(plan.steps[k][0], "__name__", "?") if k is not None else "graph"
            rows.append((statistics.median(gpu), statistics.median(host), label))
        out(f"{model} MLP{' AMP' if amp else ''} SGD, batch {batch}: {len(rows)} calls "
            f"({plan.how}); GPU us with events, host us per launch")
        us = (lambda v: "       n/a") if simulator else (lambda v: f"{v:10.2f}")
        for gpu_us, host_us, label in sorted(rows, reverse=True)[:12]:
            out(f"    {us(gpu_us)} {host_us:8.2f}  {label}")
        out(f"    {us(sum(r[0] for r in rows))} {sum(r[1] for r in rows):8.2f}  total"
            + ("  (the simulator's events time nothing)" if simulator else ""))


def step_times(out, steps: int, batch: int, workloads) -> None:
    for model, amp in workloads:
        line = []
        for backend, path in (("cpu", "packed"), ("cuda", "packed"), ("cuda", "graph")):
            mf.set_backend(backend)
            with _launch_path(path):
                graph, _, x, y = _graph(MODELS[model], amp, batch)
                graph(x, y)
            wall, gpu = [], []
            for _ in range(steps):
                if backend == "cuda":
                    start, end = cuda.event(), cuda.event()
                    start.record(mf.get_backend().stream)
                t0 = time.perf_counter()
                loss = graph(x, y)
                wall.append(time.perf_counter() - t0)
                if backend == "cuda":
                    end.record(mf.get_backend().stream)
                    end.synchronize()
                    gpu.append(start.elapsed_time(end))
            del loss
            text = f"{backend}{'' if backend == 'cpu' else ' ' + path} " \
                   f"{statistics.median(wall) * 1e3:.3f} ms"
            if gpu:
                text += f" (GPU {_ms(statistics.median(gpu))})"
            line.append(text)
        mf.set_backend("cuda")
        out(f"{model}{' AMP' if amp else ''} batch {batch}: " + "; ".join(line))


def matmul_times(out, reps: int, shapes) -> None:
    from miniflow.ir import Node, Value
    from miniflow.dtype import as_dtype
    from miniflow.kernels.cuda import cublas, matmul
    from miniflow.ops import get_op
    backend = mf.get_backend()
    for dt in (np.float32, np.float16):
        for m, k, n in shapes:
            a = backend.from_numpy(np.random.default_rng(0).uniform(-1, 1, (m, k)).astype(dt))
            b = backend.from_numpy(np.random.default_rng(1).uniform(-1, 1, (n, k)).astype(dt))
            c = backend.empty((m, n), dt)
            node = Node(get_op("matmul"), [Value("a", (m, k), as_dtype(dt)),
                                           Value("b", (n, k), as_dtype(dt))], [],
                        {"transpose_a": False, "transpose_b": True})
            text = []
            for use_cublas in ((False, True) if cublas._binding() else (False,)):
                cublas.ENABLED[0] = use_cublas
                try:
                    steps = matmul.build_matmul(node, [a, b], [c])
                finally:
                    cublas.ENABLED[0] = True
                fn, args = steps[0]
                fn(*args)
                start, end = cuda.event(), cuda.event()
                start.record()
                for _ in range(reps):
                    fn(*args)
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end) / reps
                name = "cuBLAS" if use_cublas else "kernel"
                text.append(f"{name} {2 * m * n * k / (ms * 1e-3) / 1e9:.0f} GFLOP/s"
                            if ms > 0 else f"{name} n/a")
            out(f"{np.dtype(dt).name} {m}x{k} @ ({n}x{k})^T: " + "; ".join(text)
                + ("" if cublas._binding() else " (CuPy not installed: no cuBLAS)"))


def cli_train(out, epochs: int, left: float, env) -> None:
    for backend in ("cpu", "cuda"):
        t0 = time.perf_counter()
        rc, stdout, stderr = _run([sys.executable, "-m", "miniflow", "train", "--epochs",
                                   str(epochs), "--backend", backend], left / 2, env)
        keep = [ln for ln in stdout.splitlines() if re.match(r"(backend|test accuracy|time):", ln)]
        out(f"miniflow train --epochs {epochs} --backend {backend}: exit {rc}, "
            f"{time.perf_counter() - t0:.0f} s; " + "; ".join(keep))
        _tail(out, stderr, 10, "stderr")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_check.txt")
    p.add_argument("--budget", type=float, default=280.0, help="seconds for the whole check")
    p.add_argument("--epochs", type=int, default=2, help="epochs of `miniflow train`")
    p.add_argument("--reps", type=int, default=50, help="launches per kernel timing")
    p.add_argument("--steps", type=int, default=100, help="training steps timed per backend")
    p.add_argument("--batch", type=int, default=64, help="batch size of the timed steps")
    p.add_argument("--spin", type=int, default=2_000_000,
                   help="iterations of the kernel that keeps the GPU busy while launches queue")
    p.add_argument("--simulator", action="store_true",
                   help="smoke-test this script under NUMBA_ENABLE_CUDASIM=1 (tiny sizes)")
    p.add_argument("--section-limit", type=float, default=150.0,
                   help="seconds one section may run (sections 2 and 7: their subprocesses)")
    p.add_argument("--inject-failure", metavar="SECTION", help=argparse.SUPPRESS)
    p.add_argument("--inject-hang", metavar="SECTION", help=argparse.SUPPRESS)
    p.add_argument("--hang-limit", type=float, help=argparse.SUPPRESS)  # the hung section's
    args = p.parse_args(argv)
    usable, gpu = cuda_status()
    if not usable or (gpu == "CUDA simulator") != args.simulator:
        print(f"gpu_check needs a CUDA GPU (found: {gpu}); --simulator smoke-tests the script "
              f"under NUMBA_ENABLE_CUDASIM=1", file=sys.stderr)
        return 1
    shapes = [(64, 1024, 1024), (256, 1024, 1024), (1024, 1024, 1024)]
    workloads = [("digits", False), ("digits", True), ("wide", False), ("wide", True)]
    if args.simulator:
        args.epochs, args.reps, args.steps, args.batch, args.spin = 0, 1, 1, 4, 2
        MODELS["wide"] = (8, 16, 16, 3)
        MODELS["digits"] = (8, 12, 3)
        shapes, workloads = [(5, 7, 3)], workloads[:1]
    out = Report(args.out, time.perf_counter() + args.budget)
    out(f"# miniflow gpu_check, {datetime.datetime.now().isoformat(timespec='seconds')}")
    env = {k: v for k, v in os.environ.items() if k != "MINIFLOW_BACKEND"}
    limit = args.section_limit

    def section(title, body, subprocess_limit=None):
        # a subprocess section's own timeout fires first (its output is kept), the alarm after;
        # the section hung on purpose (--inject-hang) stops at --hang-limit where given: the
        # test waits that long, while the other sections keep --section-limit
        own = limit + 15 if subprocess_limit else limit
        if args.inject_hang and args.inject_hang in title and args.hang_limit is not None:
            own = args.hang_limit
        out.section(title, body, args.inject_failure, own, args.inject_hang)

    section("1. versions", lambda: versions(out, gpu))
    mf.set_backend("cuda")
    section("2. op tests on the GPU (tests/cuda)",
            (lambda: out("skipped under --simulator (the simulator lane runs them)"))
            if args.simulator else (lambda: op_tests(out, min(limit, out.left()), env)), True)
    section("3. the runtime on the driver: dispatcher, packed launches, CUDA graph",
            lambda: runtime_check(out, args.batch))
    section(f"4. kernel times per plan call, GPU busy, median of {args.reps}",
            lambda: kernel_times(out, args.reps, args.batch, args.spin, args.simulator))
    section(f"5. training step times, median of {args.steps}",
            lambda: step_times(out, args.steps, args.batch, workloads))
    section("6. matmul: register-tiled kernel and cuBLAS",
            lambda: matmul_times(out, args.reps, shapes))
    section("7. miniflow train on each backend",
            (lambda: cli_train(out, args.epochs, min(limit, out.left()), env)) if args.epochs
            else (lambda: out("skipped (--epochs 0)")), True)
    mf.set_backend("cpu")
    out(f"\ngpu_check took {args.budget - out.left():.0f} s")
    out.write()
    print(f"report written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
