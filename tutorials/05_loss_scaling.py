# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %%
"""Lesson 5: loss scaling. Why it is needed, static versus dynamic scalers, and the three
loss-scale policies side by side on one model, with the IR difference between them.

What this lesson shows:

1. Why: float16 has a narrow range. Its smallest subnormal is 2^-24 (about 6e-8): anything below
   about 3e-8 rounds to 0 (*underflow*), and values below 2^-14 (6.1e-5) keep fewer bits. Real
   gradients of a trained model are that small. Multiplying the loss (in practice: the initial
   gradient) by a *scale* S multiplies every gradient by S and lifts them into range; the optimizer
   stage divides by S again in float32. Too large an S overflows float16 (> 65504 is inf).
2. Static scaler (``StaticGradScaler(S)``): S never changes. Dynamic scaler (``GradScaler``,
   PyTorch's rules): a step with non-finite gradients is *skipped* (no update) and S is halved;
   after ``growth_interval`` finite steps S doubles. Both live in the graph: the scale is a graph
   variable, the update ops take the non-finite count as ``skip_if``. Whether a *static* scaler
   skips differs: OneFlow counts non-finite gradients and sets ``skip_if`` only under a dynamic
   scaler (``CountNotFiniteIfNeeded`` and ``SetDynamicLossScaleSkipIf`` return early otherwise),
   so under a static scale it applies an inf/NaN update. miniflow's ``StaticGradScaler`` skips
   by default; ``StaticGradScaler(S, skip_nonfinite=False)`` is OneFlow's behaviour.
3. The three ``loss_scale_policy`` values (``config.enable_amp(..., loss_scale_policy=...)``) differ
   in one place only: how the scale meets the initial gradient ``ones_like(loss)``.

   * ``"legacy"`` (OneFlow before PR 9126): the scale is made/cast in the gradient's dtype. Under
     AMP that dtype is float16 (lesson 4, section 5), so any S >= 65520 becomes inf.
   * ``"cast_back"`` (OneFlow PR 9126): cast the gradient to float32, multiply, cast back to
     float16. Exact, but since the initial gradient is 1, the product *is* S: S > 65504 still
     overflows on the way back.
   * ``"fp32"`` (miniflow's default, miniflow's own design): autograd puts ``amp_black_identity``
     (the op PR 9126 added) on the initial gradient, so AMP keeps the whole loss-gradient path
     float32 (lesson 4, section 4); the first cast to float16 comes after the mean's 1/N, where a
     white matmul reads the gradient. OneFlow itself never inserts that op there.

   On the digits MLP (batch 64) with a static S = 2^17: as OneFlow runs them (no skip), "legacy"
   and "cast_back" apply the inf update of step 1 and the weights are NaN from then on; with
   miniflow's skip they skip *every* step and learn nothing; "fp32" trains. With a dynamic scaler
   from 2^16 (it skips in OneFlow too) the first two never apply a step at a scale above 2^15,
   while "fp32" grows until real gradients overflow.
4. The IR of the loss-scale stage under each policy, node by node.

Assumes from lesson 1: nn.Graph, plans; lesson 2: the initial gradient ``ones_like(loss)`` and
``graph.grads``; lesson 4: AMP colors, casts, ``amp_black_identity``, and that without it the loss
path is float16.

Run:  python tutorials/05_loss_scaling.py [--quick] [--out DIR]   (about 6 s; writes a figure)
"""
import argparse
import warnings
from pathlib import Path

import numpy as np

import miniflow as mf
from miniflow.amp import GradScaler, StaticGradScaler
from miniflow.data import batches, load_digits
from miniflow.dtype import FP16_MAX, FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL
from miniflow.experiments.mlp import EvalGraph, TrainGraph, accuracy, mlp
from miniflow.experiments.stability import first_step
from miniflow.notebook import out_folder, script_args, script_dir
from miniflow.passes.autograd import AutogradState
from miniflow.passes.loss_scale import LossScaleOverflowWarning, LossScaleState

DEFAULT_OUT = script_dir(globals()).parent / "tutorial-output" / "05_loss_scaling"
POLICIES = ("legacy", "cast_back", "fp32")
STATIC_RUNS = (("legacy", False), ("legacy", True), ("cast_back", False), ("cast_back", True),
               ("fp32", True))
"""``(policy, skip_nonfinite)`` of the static 2^17 runs: OneFlow's policies as OneFlow runs them
(no skip) and with miniflow's skip; "fp32" (miniflow's) with miniflow's default."""


# %%
def make_step(policy=None, scaler=None, seed=0, hidden=128):
    """The digits MLP training step (lesson 1's TrainGraph), optionally with AMP and a scaler."""
    mf.manual_seed(seed)
    model = mlp((64, hidden, 10))
    step = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    if policy is not None:
        step.config.enable_amp(True, loss_scale_policy=policy)
    if scaler is not None:
        step.set_grad_scaler(scaler)
    return model, step


# %%
def train(model, step, scaler, data, epochs):
    """Run ``epochs`` epochs; per step: the scale it used, whether it was skipped, its loss, and
    whether the weights were NaN or inf after it."""
    rng = np.random.default_rng(0)
    scales, skipped, losses, bad = [], [], [], []
    # Skipped or NaN steps have inf/NaN gradients; NumPy's matmul in the CPU kernels would warn.
    with np.errstate(invalid="ignore", over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", LossScaleOverflowWarning)
        for _ in range(epochs):
            for xb, yb in batches(data.x_train, data.y_train, 64, rng=rng):
                scales.append(scaler.scale if scaler else 1.0)
                losses.append(float(step(xb, yb)))
                skipped.append(bool(scaler and scaler.found_inf and scaler.skip_nonfinite))
                bad.append(not all(np.isfinite(p.numpy()).all() for p in model.parameters()))
    return np.array(scales), np.array(skipped), np.array(losses), np.array(bad)



# %%
def main():
    p = argparse.ArgumentParser(description="Lesson 5: loss scaling")
    p.add_argument("--quick", action="store_true", help="3 epochs per run instead of 10")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the figure")
    args = p.parse_args(script_args())
    out_folder(p, args.out)
    mf.set_backend("cpu")
    epochs = 3 if args.quick else 10
    data = load_digits()

    print("== 1. Why scale: float16 underflow ==")
    with np.errstate(over="ignore"):
        tiny, huge = float(np.float16(1e-8)), float(np.float16(1e5))
    print(f"float16 range: largest {FP16_MAX:g}, smallest normal {FP16_MIN_NORMAL:.3g}, "
          f"smallest subnormal {FP16_MIN_SUBNORMAL:.3g}; 1e-8 in float16 is {tiny}, "
          f"1e5 is {huge}")
    model, step = make_step()
    train(model, step, None, data, 3)
    logits = EvalGraph(model)(data.x_train[:64]).numpy().astype(np.float64)
    prob = np.exp(logits - logits.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    grad = prob.copy()
    grad[np.arange(64), data.y_train[:64]] -= 1
    grad /= 64                                   # d(mean cross-entropy) / d(logits)
    g = grad[grad != 0]
    print(f"gradient of the mean loss w.r.t. the logits (float32 MLP after 3 epochs, batch 64; "
          f"AMP casts it to float16 before the backward matmuls): {g.size} non-zero values, "
          f"|g| from {np.abs(g).min():.1e} to {np.abs(g).max():.1e}, "
          f"median {np.median(np.abs(g)):.1e}")
    print("scaled gradient cast to float16, by scale: % rounded to 0 | % subnormal (precision "
          "lost) | % overflowed to inf")
    for k in (0, 4, 8, 12, 16, 20, 24):
        with np.errstate(over="ignore"):
            h = (g * 2.0 ** k).astype(np.float16)
        zero = 100 * np.mean(h == 0)
        sub = 100 * np.mean((h != 0) & (np.abs(h) < FP16_MIN_NORMAL))
        inf = 100 * np.mean(np.isinf(h))
        print(f"float16 cast of gradient x 2^{k:<2d}: {zero:5.1f}% zero | {sub:5.1f}% subnormal | "
              f"{inf:5.1f}% inf")

    print("\n== 2 and 3. Static and dynamic scalers, three policies, one model ==")
    print(f"each run: the digits MLP (64-128-10, batch 64, SGD momentum 0.9, seed 0), AMP on, "
          f"{epochs} epochs = {epochs * 23} steps")
    runs = {}
    kinds = [(policy, "static", skip) for policy, skip in STATIC_RUNS]
    kinds += [(policy, "dynamic", True) for policy in POLICIES]
    for policy, kind, skip in kinds:
        scaler = (StaticGradScaler(2.0 ** 17, skip_nonfinite=skip, max_consecutive_skips=10 ** 6)
                  if kind == "static" else GradScaler(init_scale=2.0 ** 16, growth_interval=10))
        model, step = make_step(policy, scaler)
        scales, skipped, losses, bad = train(model, step, scaler, data, epochs)
        acc = accuracy(EvalGraph(model), data.x_test, data.y_test)
        runs[policy, kind, skip] = (scales, skipped, losses)
        if kind == "dynamic":
            what = "dynamic from 2^16, growth every 10"
        else:
            what = "static 2^17, " + ("skip (miniflow)" if skip else "no skip (OneFlow)")
        head = f"policy {policy:<9} | {what:<34}: "
        if bad.any():
            print(f"{head}weights NaN after step {first_step(bad)}, loss NaN from step "
                  f"{first_step(~np.isfinite(losses))}, skipped {skipped.sum()}/{len(skipped)} "
                  f"steps, test accuracy {100 * acc:5.1f}% (the NaN model predicts class 0)")
            continue
        applied = scales[~skipped]
        top = f"2^{np.log2(applied.max()):.0f}" if applied.size else "none"
        print(f"{head}skipped {skipped.sum():3d}/{len(skipped)} steps, largest scale of an "
              f"applied step {top:>5}, final scale 2^{np.log2(scaler.scale):.0f}, test accuracy "
              f"{100 * acc:5.1f}%")
    print("reading: with a static 2^17, 'legacy' and 'cast_back' overflow the float16 initial "
          "gradient at every step. OneFlow never skips under a static scale, so it applies the "
          "inf update of step 1 and the weights are NaN for good; miniflow's default "
          "StaticGradScaler skips instead, so every update is skipped and the model stays at its "
          "random start. 'fp32' (miniflow's design) multiplies in float32 and trains")
    print("reading: with a dynamic scaler (it skips in OneFlow too), 'legacy' and 'cast_back' "
          "skip a step every time the scale grows to 2^16, so they can never use more than 2^15; "
          "'fp32' grows until real gradients overflow")

    print("\n== 4. The IR difference: the loss-scale stage under each policy ==")
    x, y = data.x_train[:64], data.y_train[:64]
    for policy in POLICIES:
        _, step = make_step(policy, GradScaler(init_scale=2.0 ** 16), hidden=16)
        with warnings.catch_warnings(record=True) as caught, np.errstate(invalid="ignore"):
            warnings.simplefilter("always", LossScaleOverflowWarning)
            step(x, y)
        caught = [w for w in caught if issubclass(w.category, LossScaleOverflowWarning)]
        ir, ctx = step.ir, step.compile_context
        nodes, names = ir.nodes, ir.names()
        start = next(i for i, n in enumerate(nodes) if n.op.name == "ones_like")
        end = next(i for i, n in enumerate(nodes) if i > start and n.op.name == "matmul")
        initial = ctx.state[AutogradState].initial_grad
        scaled = ctx.state[LossScaleState].scaled_initial_grad
        print(f"policy {policy!r}: initial gradient %{names[initial]} is "
              f"{initial.dtype.short}, scaled initial gradient "
              f"{'%' + names[scaled] if scaled in names else '(inside a fused node)'} is "
              f"{scaled.dtype.short}; IR from "
              f"ones_like to the first backward matmul:")
        for n in nodes[start:end + 1]:
            mark = "scale" if ir.variables.get("loss_scale") in n.inputs else "     "
            print(f"    {mark} {n.format(names)}")
        for w in caught:
            print(f"policy {policy!r} compile-time warning: {w.category.__name__}: {w.message}")
        if not caught:
            print(f"policy {policy!r} compile-time warning: none")
    print("the rest of the stage is the same for every policy (from the 'fp32' IR): unscale in "
          "float32, count non-finite values, update the scale, skip_if on every update:")
    last_matmul = max(i for i, n in enumerate(nodes) if n.op.name == "matmul")
    for n in nodes[last_matmul + 1:]:
        print(f"    {n.format(names)}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"legacy": "tab:red", "cast_back": "tab:orange", "fp32": "tab:blue"}
    for policy, style in zip(POLICIES, ("-", "--", "-")):
        scales, skipped, _ = runs[policy, "dynamic", True]
        steps = np.arange(len(scales))
        ax1.plot(steps, np.log2(scales), style, color=colors[policy], label=policy)
        ax1.plot(steps[skipped], np.log2(scales[skipped]), "x", color=colors[policy])
    for policy, skip in STATIC_RUNS:
        losses = runs[policy, "static", skip][2]
        if skip:
            style, label = ("-" if policy == "fp32" else ":"), f"{policy}, skip (miniflow)"
        else:
            style = "o" if policy == "legacy" else "x"
            label = (f"{policy}, no skip (OneFlow): loss NaN from step "
                     f"{first_step(~np.isfinite(losses))}")
        ax2.plot(np.arange(1, len(losses) + 1), losses, style, color=colors[policy], label=label,
                 markersize=7)
    ax1.axhline(np.log2(FP16_MAX), color="0.5", lw=0.8)
    ax1.set_title("dynamic scaler from 2^16 (x = skipped step; gray: float16 max)")
    ax1.set_xlabel("step")
    ax1.set_ylabel("log2(loss scale)")
    ax1.legend()
    ax2.set_title("static scale 2^17: training loss (NaN is not drawn)")
    ax2.set_xlabel("step")
    ax2.set_ylabel("mean cross-entropy")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path = args.out / "05_loss_scale_policies.png"
    fig.savefig(path, dpi=100)
    print(f"figure (scale per step, dynamic; loss per step, static, OneFlow's no-skip and "
          f"miniflow's skip) written to: {path}")


# %%
if __name__ == "__main__":
    main()
