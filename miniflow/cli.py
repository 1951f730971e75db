"""``miniflow`` / ``python -m miniflow``: subcommands ``info`` and ``train``."""
from __future__ import annotations

import argparse
import platform


def _info(args) -> int:
    import numba
    import numpy

    import miniflow
    backend = miniflow.get_backend()
    print(f"miniflow {miniflow.__version__}")
    print(f"python {platform.python_version()} on {platform.machine()}")
    print(f"numpy {numpy.__version__}, numba {numba.__version__}")
    print(f"backend: {backend.name}")
    from .kernels import fp16
    print(f"float16 conversion on the CPU: {fp16.PATH}")
    print(f"numba cache dir: {numba.config.CACHE_DIR or '(next to the sources)'}")
    return 0


def _train(args) -> int:
    from .experiments.mlp import train_digits
    r = train_digits(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                     momentum=args.momentum, hidden=args.hidden, seed=args.seed)
    print(f"final loss: {r['losses'][-1]:.4f}")
    print(f"train accuracy: {100 * r['train_accuracy']:.2f}%")
    print(f"test accuracy: {100 * r['test_accuracy']:.2f}% (360 test images)")
    print(f"time: {r['seconds']:.1f} s for {len(r['losses'])} steps")
    return 0


def main(argv=None) -> int:
    """Parse ``argv`` and run the subcommand; returns the exit code."""
    p = argparse.ArgumentParser(prog="miniflow", description="a small lazy-graph DL framework")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="backend, versions, float16 path").set_defaults(fn=_info)
    t = sub.add_parser("train", help="train the 64-128-10 MLP on the digits data set")
    t.add_argument("--epochs", type=int, default=20)
    t.add_argument("--batch-size", type=int, default=64)
    t.add_argument("--lr", type=float, default=0.1)
    t.add_argument("--momentum", type=float, default=0.9)
    t.add_argument("--hidden", type=int, default=128)
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(fn=_train)
    args = p.parse_args(argv)
    return args.fn(args)
