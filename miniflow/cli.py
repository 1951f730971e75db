"""``miniflow`` / ``python -m miniflow``: subcommands ``info``, ``train`` (``--model mlp|lenet|
resnet18``, ``--amp``) and ``stability``."""
from __future__ import annotations

import argparse
import math
import platform
import sys


def _info(args) -> int:
    """Versions, the backend, the GPU (or why there is none), the float16 path, the kernel cache.

    Never a traceback: a backend that cannot be used (``MINIFLOW_BACKEND=cuda`` without a GPU, a
    bad ``MINIFLOW_BACKEND``) is reported on the ``backend:`` line and the exit code is 1.
    """
    import importlib.metadata

    import numba
    import numpy

    import miniflow
    from .kernels.common.cache import CACHE
    from .kernels.cpu import fp16
    from .runtime.backend import BackendUnavailableError, UnknownBackendError, cuda_status

    try:
        numba_cuda = importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        numba_cuda = "not installed (pip install 'miniflow[cuda]')"
    print(f"miniflow {miniflow.__version__}")
    print(f"python {platform.python_version()} on {platform.machine()}")
    print(f"numpy {numpy.__version__}, numba {numba.__version__}, numba-cuda {numba_cuda}")
    usable, gpu = cuda_status()
    print(f"GPU: {gpu}" if usable else f"GPU: no GPU ({gpu})")
    try:
        backend = miniflow.get_backend()
        print(f"backend: {backend.name}")
    except (BackendUnavailableError, UnknownBackendError) as e:
        backend = None
        print(f"backend: unavailable: {e}")
    print(f"float16 conversion on the CPU: {fp16.PATH}")
    print(f"Numba cache of the kernels: {CACHE.describe()}")
    if CACHE.enabled and not fp16.JIT_CACHE:
        print("  (off for the CPU kernels: MINIFLOW_FP16_FALLBACK=1)")
    if backend is None:
        print("kernels from the Numba cache: not checked (no usable backend)")
        return 1
    print(f"kernels from the Numba cache: {_cache_probe(backend)}")
    return 0


def _cache_probe(backend) -> str:
    """Run one small kernel (relu, f32) on ``backend`` and say whether it was loaded from Numba's
    on-disk cache or compiled now (or why it could not run: ``info`` never raises)."""
    import numpy as np

    from .dtype import float32
    from .ir import Node, Value
    from .ops import get_op
    from .runtime.plan import build_steps

    node = Node(get_op("relu"), [Value("x", (4,), float32, kind="input")], [])
    node.outputs = [Value("y", (4,), float32, producer=node)]
    try:
        buffers = {id(node.inputs[0]): backend.from_numpy(np.zeros(4, np.float32))}
        steps, _ = build_steps([node], buffers, backend)
        for fn, a in steps:
            fn(*a)
    except Exception as e:  # noqa: BLE001 (a diagnostic: report the failure, do not crash)
        return f"unknown: the probe kernel failed ({type(e).__name__}: {e})"
    kernel = getattr(steps[0][0], "kernel", steps[0][0])
    stats = getattr(kernel, "stats", None)
    if stats is None:
        return "no (the CUDA simulator runs kernels as Python)"
    if sum(stats.cache_hits.values()):
        return "yes (loaded, not compiled)"
    if not getattr(stats, "cache_path", None):
        return "no (caching is off for these kernels)"
    return "no (compiled now and cached for the next run)"


def _train(args) -> int:
    """Train ``--model`` on the digits (``miniflow.experiments.train``) and print the result."""
    from .experiments.train import train_digits
    r = train_digits(args.model, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                     momentum=args.momentum, weight_decay=args.weight_decay, hidden=args.hidden,
                     amp=args.amp, seed=args.seed, progress=not args.no_progress)
    recipe = r["recipe"]
    print(f"model: {args.model}, {recipe.epochs} epochs of SGD (lr {recipe.lr:g}"
          f"{', cosine' if recipe.cosine else ''}, momentum {recipe.momentum:g}, weight decay "
          f"{recipe.weight_decay:g}, batch {recipe.batch_size}), "
          + ("AMP (float16) with a dynamic loss scale" if args.amp else "float32"))
    print(f"final loss: {r['losses'][-1]:.4f}")
    print(f"train accuracy: {100 * r['train_accuracy']:.2f}%")
    print(f"test accuracy: {100 * r['test_accuracy']:.2f}% (360 test images)")
    if r["scaler"] is not None:
        print(f"loss scale: {r['scaler'].scale:g} at the end, "
              f"{r['scaler'].num_skipped_steps} steps skipped")
    print(f"time: {r['seconds']:.1f} s for {len(r['losses'])} steps")
    return 0


def _stability(args) -> int:
    """The training-stability study (``miniflow.experiments.stability``)."""
    import dataclasses
    from pathlib import Path

    import miniflow
    from .experiments import stability
    from .experiments.stability_report import headline_table

    if args.backend:
        miniflow.set_backend(args.backend)
    cfg = stability.QUICK if args.quick else stability.StudyConfig()
    cfg = dataclasses.replace(cfg, seeds=args.seeds or cfg.seeds, steps=args.steps or cfg.steps)
    out = Path(args.out)
    try:
        stability.check_out_dir(out)   # before any run: the study takes minutes
    except stability.OutputDirError as e:
        print(f"miniflow stability: {e}", file=sys.stderr)
        return 2
    metrics = stability.run_study(cfg, out)
    print(headline_table(metrics))
    print(f"{len(metrics['runs'])} runs in {metrics['config']['seconds']:.0f} s; figures, "
          f"metrics.json and summary.md in {out}/")
    return 0


def _integer(low: int):
    """argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value
    return parse


_positive = _integer(1)
"""argparse type: an integer >= 1."""
_seed = _integer(0)
"""argparse type: a seed, an integer >= 0 (``miniflow.manual_seed``; NumPy takes no negative
seeds)."""


def _real(low: float, low_inclusive: bool):
    """argparse type: a finite float above ``low`` (or at it when ``low_inclusive``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        ok = math.isfinite(value) and (value >= low if low_inclusive else value > low)
        if not ok:
            bound = f">= {low:g}" if low_inclusive else f"> {low:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
        return value
    return parse


def main(argv=None) -> int:
    """Parse ``argv`` and run the subcommand; returns the exit code."""
    p = argparse.ArgumentParser(prog="miniflow", description="a small lazy-graph DL framework")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="backend, versions, GPU, float16 path, kernel cache").set_defaults(
        fn=_info)
    from .experiments.train import MODELS, RECIPES
    t = sub.add_parser("train", help="train a model (mlp, lenet, resnet18) on the digits data set")
    t.add_argument("--model", choices=MODELS, default="mlp",
                   help="mlp: 64-128-10; lenet: a LeNet with batch norm; resnet18: ResNet-18 with "
                        "the small-input stem (default mlp)")
    defaults = ", ".join(f"{m} {r.epochs}" for m, r in RECIPES.items())
    t.add_argument("--epochs", type=_positive, help=f"default per model: {defaults}")
    t.add_argument("--batch-size", type=_positive, help="default 64")
    t.add_argument("--lr", type=_real(0.0, False),
                   help="default per model: " + ", ".join(f"{m} {r.lr:g}"
                                                          for m, r in RECIPES.items()))
    t.add_argument("--momentum", type=_real(0.0, True), help="default 0.9")
    t.add_argument("--weight-decay", type=_real(0.0, True),
                   help="default per model: " + ", ".join(f"{m} {r.weight_decay:g}"
                                                          for m, r in RECIPES.items()))
    t.add_argument("--hidden", type=_positive, default=128, help="the MLP's hidden units")
    t.add_argument("--amp", action="store_true",
                   help="mixed precision (float16) with a dynamic GradScaler")
    t.add_argument("--seed", type=_seed, default=0, help="any integer >= 0 (default 0)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(fn=_train)
    st = sub.add_parser("stability", help="training-stability study of the loss-scale policies: "
                        "figures, metrics.json, summary.md")
    st.add_argument("--quick", action="store_true", help="1 seed, 220 steps per run (for CI)")
    st.add_argument("--out", default="stability-results", help="output folder")
    st.add_argument("--seeds", type=_positive, help="seeds 0..N-1 of every run (default 3; "
                    "--quick: 1)")
    st.add_argument("--steps", type=_positive, help="steps per run, any number >= 1 (default "
                    "660 = 30 epochs of 22 steps; --quick: 220)")
    st.add_argument("--backend", choices=["cpu", "cuda"], help="default: MINIFLOW_BACKEND, else "
                    "cuda with a GPU, else cpu")
    st.set_defaults(fn=_stability)
    args = p.parse_args(argv)
    from .runtime.backend import BackendUnavailableError, UnknownBackendError
    try:
        return args.fn(args)
    except (BackendUnavailableError, UnknownBackendError) as e:  # a bad MINIFLOW_BACKEND, or cuda
        print(e, file=sys.stderr)                                # without a GPU: no traceback
        return 2
