"""Training-step time of the digits MLP: miniflow against PyTorch CPU eager and plain NumPy.

Models: ``mlp`` (64-128-10) and ``wide_mlp`` (64-1024-1024-10), Linear-ReLU-...-Linear, mean softmax
cross-entropy, SGD (lr 0.01, momentum 0.9); batch sizes 1, 2, 4, 8, 16, 64, 256 of the digits data;
fp32 and AMP fp16 (miniflow: ``config.enable_amp()``; PyTorch: ``torch.autocast("cpu",
dtype=torch.float16)``; NumPy: float16 activations with matmuls widened to float32, as miniflow's
CPU backend does). No loss scaling in any of them. All three start from the same weights and train
on the same batch; their first losses are checked to agree.

Timing: a warm-up (miniflow's first call compiles its plan and kernels) is excluded; then
``--repeats`` rounds of N steps per framework, the frameworks alternating inside each round (the
order rotates from round to round); the reported step time is the median round's time / N. Thread
pools are pinned to ``--threads`` (Numba, BLAS, OpenMP and PyTorch all share the cores) and printed;
the load average is printed before and after, since a busy machine skews every number.

Prints, per model, dtype and batch size::

    miniflow mlp time: 0.041ms (= 4.1ms / 100, input_shape=[16, 64], fp32)
    PyTorch mlp time: 0.210ms (= 21.0ms / 100, input_shape=[16, 64], fp32)
    NumPy mlp time: 0.090ms (= 9.0ms / 100, input_shape=[16, 64], fp32)
    Relative speed: 5.12 (= PyTorch / miniflow)
    Relative speed to NumPy: 2.20 (= NumPy / miniflow)

then a Markdown table; writes ``benchmarks/results/speed.json`` and ``speed.png``. PyTorch is the
optional ``bench`` extra (``pip install -e ".[bench]"``); without it the PyTorch columns are empty.

    python benchmarks/speed.py [--threads 1] [--repeats 7] [--models mlp,wide_mlp] [--quick]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402

MODELS = {"mlp": (64, 128, 10), "wide_mlp": (64, 1024, 1024, 10)}
TARGETS = {"mlp": 2.0, "wide_mlp": 0.9}
"""Issue 8's acceptance line for fp32 PyTorch / miniflow (the small MLP's at batch <= 16)."""
BATCHES = (1, 2, 4, 8, 16, 64, 256)
DTYPES = ("fp32", "fp16")
LABEL = {"fp32": "fp32", "fp16": "AMP fp16"}
LR, MOMENTUM = 0.01, 0.9
ROUND_SECONDS = 0.1
"""Target duration of one framework's share of a round (sets N)."""


# ----------------------------------------------------------------------------- the three steps
def init_weights(sizes, seed: int = 0) -> list:
    """``[(W [out, in], b [out]), ...]`` float32, PyTorch's default ``Linear`` init."""
    rng = np.random.default_rng(seed)
    out = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        bound = 1.0 / np.sqrt(n_in)
        out.append((rng.uniform(-bound, bound, (n_out, n_in)).astype(np.float32),
                    rng.uniform(-bound, bound, n_out).astype(np.float32)))
    return out


def miniflow_step(sizes, weights, x, y, half: bool):
    """A miniflow training step (``TrainGraph``, as ``step.graph``), returning the loss."""
    import miniflow as mf
    from miniflow.experiments.mlp import TrainGraph, mlp

    model = mlp(sizes)
    model.load_state_dict({f"{2 * k}.{name}": a for k, (w, b) in enumerate(weights)
                           for name, a in (("weight", w), ("bias", b))})
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM))
    if half:
        graph.config.enable_amp()

    def step():
        return graph(x, y)

    step.graph = graph
    return step


def torch_model(weights):
    """The MLP in PyTorch (``torch.nn.Sequential`` of Linear and ReLU) with ``weights``."""
    import torch

    layers = []
    for k, (w, b) in enumerate(weights):
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        layers += [lin] + ([torch.nn.ReLU()] if k < len(weights) - 1 else [])
    return torch.nn.Sequential(*layers)


def torch_step(sizes, weights, x, y, half: bool, wrap=None):
    """The same step in PyTorch eager (``torch.autocast`` for AMP); ``wrap(model)`` wraps the
    model (``benchmarks/ddp.py``: in ``DistributedDataParallel``). ``step.model`` is the model."""
    import torch

    model = torch_model(weights)
    if wrap is not None:
        model = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16, enabled=half):
            loss = torch.nn.functional.cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()
        return loss.detach()

    step.model = model
    return step


def numpy_step(sizes, weights, x, y, half: bool):
    """The same step in NumPy: forward, softmax cross-entropy, backward, SGD with momentum.

    ``half``: activations and gradients of activations in float16, matmuls on float16 operands
    computed in float32 and rounded to float16; master weights, their updates and the loss float32.
    """
    act = np.float16 if half else np.float32
    params = [(w.copy(), b.copy()) for w, b in weights]
    bufs = [(np.zeros_like(w), np.zeros_like(b)) for w, b in weights]
    onehot = np.eye(sizes[-1], dtype=np.float32)[y]

    def mm(a, b):
        return (a.astype(np.float32) @ b.astype(np.float32)).astype(act) if half else a @ b

    def step():
        hs = [x.astype(act)]
        for k, (w, b) in enumerate(params):
            z = mm(hs[-1], w.astype(act).T) + b.astype(act)
            hs.append(np.maximum(z, 0) if k < len(params) - 1 else z.astype(np.float32))
        z = hs[-1] - hs[-1].max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.mean(np.log(p[np.arange(len(y)), y]))
        g = ((p - onehot) / len(y)).astype(act)
        for k in range(len(params) - 1, -1, -1):
            w, b = params[k]
            grads = (mm(g.T, hs[k]).astype(np.float32), g.sum(axis=0, dtype=np.float32))
            if k > 0:
                g = mm(g, w.astype(act)) * (hs[k] > 0)
            for p_, buf, grad in zip((w, b), bufs[k], grads):
                buf *= MOMENTUM
                buf += grad
                p_ -= LR * buf
        return loss

    return step


FRAMEWORKS = {"miniflow": miniflow_step, "PyTorch": torch_step, "NumPy": numpy_step}


# ----------------------------------------------------------------------------- timing
def time_case(model: str, dtype: str, batch: int, data, frameworks, repeats: int) -> dict:
    """Median step times (seconds) and the N used, for every framework, on one case."""
    sizes = MODELS[model]
    x, y = data[0][:batch], data[1][:batch]
    weights = init_weights(sizes)
    steps = {name: FRAMEWORKS[name](sizes, weights, x, y, dtype == "fp16") for name in frameworks}
    losses = {name: float(step()) for name, step in steps.items()}   # miniflow compiles here
    first = losses["miniflow"]
    tol = 0.05 if dtype == "fp16" else 1e-4
    for name, loss in losses.items():
        if abs(loss - first) > tol * max(1.0, abs(first)):
            raise AssertionError(f"{model} {dtype} batch {batch}: first loss of {name} is {loss}, "
                                 f"miniflow's {first}: the frameworks do not compute the same step")
    slowest = max(harness.round_time(step, 3) / 3 for step in steps.values())   # warm-up
    n = int(min(200, max(3, ROUND_SECONDS / slowest)))
    rounds = {name: [] for name in steps}
    names = list(steps)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rounds[name].append(harness.round_time(steps[name], n))
    return {"steps": n, "losses": losses,
            "total_s": {name: statistics.median(t) for name, t in rounds.items()},
            "step_s": {name: statistics.median(t) / n for name, t in rounds.items()},
            "rounds_s": rounds}


def report(model: str, dtype: str, batch: int, res: dict) -> None:
    """The issue's output lines for one case."""
    for name, total in res["total_s"].items():
        print(f"{name} {model} time: {1e3 * total / res['steps']:.3f}ms (= {1e3 * total:.1f}ms / "
              f"{res['steps']}, input_shape=[{batch}, 64], {LABEL[dtype]})")
    t = res["step_s"]
    if "PyTorch" in t:
        print(f"Relative speed: {t['PyTorch'] / t['miniflow']:.2f} (= PyTorch / miniflow)")
    if "NumPy" in t:
        print(f"Relative speed to NumPy: {t['NumPy'] / t['miniflow']:.2f} (= NumPy / miniflow)")


def table(results: list) -> str:
    """A Markdown table of every case (times in ms)."""
    rows = ["| model | dtype | batch | miniflow | PyTorch | NumPy | PyTorch / miniflow | "
            "NumPy / miniflow |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        t = r["step_s"]
        ms = [f"{1e3 * t[k]:.3f}" if k in t else "-" for k in ("miniflow", "PyTorch", "NumPy")]
        rel = [f"{t[k] / t['miniflow']:.2f}" if k in t else "-" for k in ("PyTorch", "NumPy")]
        rows.append(f"| {r['model']} | {LABEL[r['dtype']]} | {r['batch']} | " + " | ".join(ms + rel)
                    + " |")
    return "\n".join(rows)


def amp_ratios(results: list) -> str:
    """miniflow's AMP fp16 step time over its fp32 step time, per model and batch."""
    t = {(r["model"], r["dtype"], r["batch"]): r["step_s"]["miniflow"] for r in results}
    parts = [f"{m} batch {b}: {t[(m, 'fp16', b)] / t[(m, 'fp32', b)]:.2f}"
             for (m, d, b) in t if d == "fp32" and (m, "fp16", b) in t]
    return "miniflow AMP fp16 / fp32 step time: " + ", ".join(parts)


def plot(results: list, path: Path) -> None:
    """Relative speed against PyTorch (and NumPy) per batch size, one panel per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in results}, key=list(MODELS).index)
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        for dtype, style in (("fp32", "-"), ("fp16", "--")):
            rows = [r for r in results if r["model"] == model and r["dtype"] == dtype]
            for other, color in (("PyTorch", "C0"), ("NumPy", "C1")):
                pts = [(r["batch"], r["step_s"][other] / r["step_s"]["miniflow"]) for r in rows
                       if other in r["step_s"]]
                if pts:
                    ax.plot(*zip(*pts), style, color=color, marker="o",
                            label=f"{other} / miniflow, {LABEL[dtype]}")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.axhline(TARGETS[model], color="gray", lw=0.8, ls=":", label="target (fp32)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("relative speed (higher: miniflow faster)")
        ax.set_title(f"{model} {'-'.join(map(str, MODELS[model]))}: training step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="threads per pool (default 1)")
    p.add_argument("--repeats", type=int, default=7, help="rounds per case (median)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--quick", action="store_true", help="3 rounds, batches 1, 16, 256")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.batches = 3, "1,16,256"
    frameworks = ["miniflow", "PyTorch", "NumPy"]
    try:
        import torch  # noqa: F401  (imported before pinning, so its pools are pinned too)
    except ImportError:
        frameworks.remove("PyTorch")
        print("PyTorch is not installed (pip install -e '.[bench]'): miniflow and NumPy only")
    from miniflow.data import load_digits

    data = load_digits()
    data = ((data.x_train[:256]).astype(np.float32), data.y_train[:256].astype(np.int64))
    info = harness.machine()
    info["threads"] = harness.pin_threads(args.threads)
    info["load_before"] = harness.load_average()
    print(f"machine: {harness.describe(info)}")
    print(f"threads: {info['threads']}")
    print(f"load average (1 min) before: {info['load_before']:.2f}; medians of {args.repeats} "
          f"alternating rounds")
    results = []
    for model in args.models.split(","):
        for dtype in args.dtypes.split(","):
            for batch in map(int, args.batches.split(",")):
                res = time_case(model, dtype, batch, data, frameworks, args.repeats)
                report(model, dtype, batch, res)
                results.append({"model": model, "dtype": dtype, "batch": batch, **res})
    info["load_after"] = harness.load_average()
    print(f"load average (1 min) after: {info['load_after']:.2f}")
    print()
    print(table(results))
    print(amp_ratios(results))
    harness.save_json("speed", {"machine": info, "results": results})
    plot(results, harness.RESULTS / "speed.png")
    print(f"wrote {harness.RESULTS / 'speed.json'} and {harness.RESULTS / 'speed.png'}")


if __name__ == "__main__":
    main()
