"""Training-step time and peak memory of the GPT (``miniflow.models.gpt``) against PyTorch eager
on the same model (``torch_gpt.TorchGPT``, nanoGPT's structure), float32 and AMP, on one thread
and on all the machine's cores.

Every case runs in a fresh process (so its peak RSS, ``ru_maxrss``, is its own): the same weights
(PyTorch's initialisation, loaded into miniflow), the same batch of token windows of
``miniflow.data.stdlib_text``, AdamW (lr 1e-3, weight decay 0.1), mean cross-entropy. AMP:
miniflow ``config.enable_amp()`` (float16, OneFlow's lists) with a dynamic ``GradScaler``; PyTorch
``torch.autocast("cpu", dtype=torch.float16)`` with ``torch.amp.GradScaler("cpu")``. Pools pinned
with ``harness.pin_threads``. Timing: warm-up steps excluded, then the median over ``--rounds``
rounds of ``--steps`` steps; the process's CPU time per step is printed too (the fairer measure
on a shared machine) with the load average.

Not measured here (issue 25, item 5, left to do): torch.compile and JAX jit columns.

Usage: ``python benchmarks/gpt_step.py [--batch 16] [--block 64] [--threads 1,all]``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

CONFIG = dict(n_layer=2, n_head=4, n_embd=128)


def _batch(args):
    import numpy as np

    from miniflow.data import stdlib_text
    corpus = stdlib_text()
    x, y = corpus.batch("train", args.batch, args.block, np.random.default_rng(0))
    return corpus.vocab_size, x, y


def _torch_model(vocab, args):
    import torch
    from torch_gpt import TorchGPT
    torch.manual_seed(0)
    return TorchGPT(vocab, args.block, **CONFIG)


def _miniflow_step(args, vocab, x, y):
    import miniflow as mf
    from miniflow.experiments.train_gpt import TrainGPT
    ref = _torch_model(vocab, args)
    model = mf.models.gpt(vocab, args.block, **CONFIG)
    model.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    del ref
    graph = TrainGPT(model, mf.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1))
    if args.dtype == "amp":
        graph.config.enable_amp(True)
        graph.set_grad_scaler(mf.amp.GradScaler())
    tx, ty = mf.tensor(x), mf.tensor(y)
    return lambda: graph(tx, ty)


def _torch_step(args, vocab, x, y):
    import torch
    model = _torch_model(vocab, args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    tx, ty = torch.tensor(x), torch.tensor(y)
    scaler = torch.amp.GradScaler("cpu") if args.dtype == "amp" else None

    def step():
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            _, loss = model(tx, ty)
            loss.backward()
            opt.step()
        else:
            with torch.autocast("cpu", dtype=torch.float16):
                _, loss = model(tx, ty)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss
    return step


def run_case(args) -> dict:
    """One framework, dtype and thread count in this process: step time, CPU time, peak RSS."""
    import torch  # noqa: F401  (first, so harness.pin_threads sees its pools)
    threads = os.cpu_count() if args.threads_case == "all" else int(args.threads_case)
    pools = harness.pin_threads(threads)
    vocab, x, y = _batch(args)
    step = (_miniflow_step if args.framework == "miniflow" else _torch_step)(args, vocab, x, y)
    for _ in range(args.warmup):
        step()
    rounds = [harness.cpu_round(step, args.steps) for _ in range(args.rounds)]
    return {"framework": args.framework, "dtype": args.dtype, "threads": threads,
            "step_s": statistics.median(r[0] for r in rounds) / args.steps,
            "cpu_s": statistics.median(r[1] for r in rounds) / args.steps,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "pools": pools}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--threads", default="1,all")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--case", nargs=3, metavar=("FRAMEWORK", "DTYPE", "THREADS"))
    args = p.parse_args(argv)
    if args.case:
        args.framework, args.dtype, args.threads_case = args.case
        print(json.dumps(run_case(args)))
        return
    info = harness.machine()
    print(f"# GPT training step ({CONFIG}, batch {args.batch} x {args.block} tokens, AdamW): "
          f"{harness.describe(info)}; load average {harness.load_average():.1f}")
    rows = []
    for threads in args.threads.split(","):
        for dtype in ("fp32", "amp"):
            for fw in ("miniflow", "torch"):
                cmd = [sys.executable, __file__, "--batch", str(args.batch), "--block",
                       str(args.block), "--steps", str(args.steps), "--rounds",
                       str(args.rounds), "--warmup", str(args.warmup), "--case", fw, dtype,
                       threads]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"| threads | dtype | miniflow ms | PyTorch eager ms | speed-up (>1: miniflow "
          f"faster) | miniflow RSS MiB | PyTorch RSS MiB | RSS ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for i in range(0, len(rows), 2):
        m, t = rows[i], rows[i + 1]
        print(f"| {m['threads']} | {m['dtype']} | {1e3 * m['step_s']:.1f} | "
              f"{1e3 * t['step_s']:.1f} | {t['step_s'] / m['step_s']:.2f} | "
              f"{m['peak_rss_mib']:.0f} | {t['peak_rss_mib']:.0f} | "
              f"{m['peak_rss_mib'] / t['peak_rss_mib']:.2f} |")
    print(f"# load average at the end {harness.load_average():.1f}; machine "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    harness.save_json("gpt_step", {"machine": info, "rows": rows})


if __name__ == "__main__":
    main()
