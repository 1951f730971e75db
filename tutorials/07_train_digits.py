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
"""Lesson 7: a complete mixed-precision training run on the digits data, from data to test accuracy.

What this lesson shows (everything from lessons 1-6 in one script, as you would write it):

1. Data: scikit-learn's bundled 8x8 handwritten digits (1,437 training and 360 test images,
   ``miniflow.data.load_digits``), shuffled mini-batches of 64.
2. Model and step: ``Linear(64, 128) -> ReLU -> Linear(128, 10)``, mean softmax cross-entropy, SGD
   with momentum, all in one ``nn.Graph`` (lesson 1) whose IR holds the backward pass (lesson 2).
3. AMP (``config.enable_amp(True)``, lesson 4) with a dynamic loss scaler (``GradScaler``, lesson 5)
   under the default ``"fp32"`` loss-scale policy; the scale lives in the graph.
4. A progress bar (tqdm) over the steps, with the loss, the loss scale and the test accuracy.
5. The outcome: test accuracy (and a float32 run of the same model for comparison), skipped steps,
   and a figure of the loss and the loss scale per step.

"Checkpointless but complete": nothing is saved except the figure; to keep a trained model, save
``model.state_dict()`` (NumPy arrays) and ``scaler.state_dict()``.

Assumes from earlier lessons: nn.Graph and plans (1), graph autograd (2), the AMP pass (4), loss
scaling and skipped steps (5). Lessons 3 and 6 are background only.

Run:  python tutorials/07_train_digits.py [--quick] [--epochs N] [--out DIR]
      (20 epochs: about 6 s; --quick: 5 epochs). Writes a figure.
"""
import argparse
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

import miniflow as mf
from miniflow import nn
from miniflow.amp import GradScaler
from miniflow.data import batches, load_digits
from miniflow.experiments.mlp import mlp
from miniflow.notebook import out_folder, script_args, script_dir

DEFAULT_OUT = script_dir(globals()).parent / "tutorial-output" / "07_train_digits"


# %%
class TrainStep(nn.Graph):
    """One training step: forward, loss, backward, SGD update, all compiled into one plan."""

    def __init__(self, model, optimizer, amp: bool, scaler=None):
        super().__init__()
        self.model = model
        self.add_optimizer(optimizer)
        if amp:
            self.config.enable_amp(True)              # loss_scale_policy="fp32" by default
        if scaler is not None:
            self.set_grad_scaler(scaler)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


# %%
class Predict(nn.Graph):
    """Inference: logits of a batch (shares the model's parameters with the training step)."""

    def __init__(self, model, amp: bool):
        super().__init__()
        self.model = model
        if amp:
            self.config.enable_amp(True)

    def build(self, x):
        return self.model(x)


# %%
def accuracy(predict: Predict, x: np.ndarray, y: np.ndarray) -> float:
    return float((predict(x).numpy().argmax(axis=1) == y).mean())


# %%
def train(data, epochs: int, amp: bool, progress: bool, seed: int = 0) -> dict:
    """Train the digits MLP; returns per-step losses, scales, skips and per-epoch test accuracy."""
    mf.manual_seed(seed)
    model = mlp((64, 128, 10))
    scaler = GradScaler(init_scale=2.0 ** 16, growth_interval=50) if amp else None
    step = TrainStep(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), amp, scaler)
    predict = Predict(model, amp)
    steps_per_epoch = -(-len(data.x_train) // 64)
    losses, scales, skipped, test_acc = [], [], [], []
    bar = tqdm(total=epochs * steps_per_epoch, unit="step", disable=not progress,
               desc="AMP training" if amp else "float32 training")
    t0 = time.perf_counter()
    for epoch in range(epochs):
        for xb, yb in batches(data.x_train, data.y_train, 64):
            scales.append(scaler.scale if scaler else 1.0)
            losses.append(float(step(xb, yb)))
            skipped.append(bool(scaler and scaler.found_inf))
            bar.update(1)
            bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}",
                            scale=f"2^{np.log2(scales[-1]):.0f}",
                            test_acc=f"{test_acc[-1]:.3f}" if test_acc else "-")
        test_acc.append(accuracy(predict, data.x_test, data.y_test))
    bar.close()
    return {"seconds": time.perf_counter() - t0, "losses": np.array(losses),
            "scales": np.array(scales), "skipped": np.array(skipped), "test_acc": test_acc,
            "train_acc": accuracy(predict, data.x_train, data.y_train), "step": step,
            "scaler": scaler, "steps_per_epoch": steps_per_epoch}


# %%
def main():
    p = argparse.ArgumentParser(description="Lesson 7: a complete AMP training run")
    p.add_argument("--quick", action="store_true", help="5 epochs instead of 20")
    p.add_argument("--epochs", type=int, default=None, help="number of epochs (overrides --quick)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the figure")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = p.parse_args(script_args())
    if args.epochs is not None and args.epochs < 1:     # 0 meant the default, -2 a traceback
        p.error(f"--epochs must be an integer >= 1, got {args.epochs}")
    out_folder(p, args.out)
    epochs = args.epochs if args.epochs is not None else 5 if args.quick else 20
    mf.set_backend("cpu")

    data = load_digits()
    print(f"data: {len(data.x_train)} training and {len(data.x_test)} test images of "
          f"{data.x_train.shape[1]} pixels, {data.num_classes} classes")
    print(f"run: MLP 64-128-10, SGD lr 0.1 momentum 0.9, batch 64, {epochs} epochs, AMP float16 "
          f"with a dynamic loss scale from 2^16 (growth every 50 finite steps)")
    r = train(data, epochs, amp=True, progress=not args.no_progress)
    step, scaler = r["step"], r["scaler"]
    rep = step.amp_report()
    print(f"AMP decisions: {rep.n_fp16} nodes in float16, {rep.n_fp32} in float32 "
          f"(amp_report(), the pinning identities pruned; lesson 4)")
    print(f"test accuracy per epoch: {' '.join(f'{100 * a:.1f}' for a in r['test_acc'])}")
    n = len(r["losses"])
    print(f"training time: {r['seconds']:.1f} s for {n} steps ({1e3 * r['seconds'] / n:.2f} ms "
          f"per step incl. evaluation), {step.compile_count} compiled plans (batch 64 and the "
          f"last batch of {len(data.x_train) % 64})")
    print(f"loss scale: started 2^16, final 2^{np.log2(scaler.scale):.0f}, skipped steps "
          f"{int(r['skipped'].sum())} of {n} (each one halves the scale; no parameter changes)")
    print(f"final training loss (mean of the last epoch): "
          f"{r['losses'][-r['steps_per_epoch']:].mean():.4f}")
    print(f"train accuracy (AMP): {100 * r['train_acc']:.2f}%")
    print(f"test accuracy (AMP): {100 * r['test_acc'][-1]:.2f}% on {len(data.x_test)} test images")
    base = train(data, epochs, amp=False, progress=False)
    print(f"test accuracy (float32, same seed, for comparison): {100 * base['test_acc'][-1]:.2f}%")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    steps = np.arange(n)
    ax1.plot(steps, r["losses"], lw=0.7, label="AMP, per step")
    ax1.plot(steps, base["losses"], lw=0.7, alpha=0.6, label="float32, per step")
    ax1.set_yscale("log")
    ax1.set_ylabel("training loss")
    ax1.legend(loc="upper right")
    acc_ax = ax1.twinx()
    epoch_ends = r["steps_per_epoch"] * np.arange(1, epochs + 1) - 1
    acc_ax.plot(epoch_ends, 100 * np.array(r["test_acc"]), "k.-", label="AMP test accuracy")
    acc_ax.set_ylabel("test accuracy (%)")
    acc_ax.legend(loc="center right")
    ax2.plot(steps, np.log2(r["scales"]), label="loss scale")
    ax2.plot(steps[r["skipped"]], np.log2(r["scales"][r["skipped"]]), "rx", label="skipped step")
    ax2.set_ylabel("log2(loss scale)")
    ax2.set_xlabel("step")
    ax2.legend(loc="lower right")
    fig.suptitle(f"digits MLP, AMP + dynamic loss scaling: test accuracy "
                 f"{100 * r['test_acc'][-1]:.1f}%")
    fig.tight_layout()
    path = args.out / "07_loss_and_scale.png"
    fig.savefig(path, dpi=100)
    print(f"figure (loss, test accuracy and loss scale per step) written to: {path}")


# %%
if __name__ == "__main__":
    main()
