# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 12: a real training run, killed and resumed bit for bit
#
# What this lesson teaches:
#
# 1. **A training recipe as you would run it**: a ResNet-18 (torchvision's, with the small-input
#    stem, one input channel) on the digits, SGD with momentum and weight decay, a learning rate
#    with linear warm-up then cosine decay (`LinearLR` + `CosineAnnealingLR` in `SequentialLR`,
#    PyTorch's schedulers), gradient accumulation over micro-batches
#    (`config.set_gradient_accumulation_steps`), gradient clipping by the total L2 norm
#    (`clip_grad_max_norm`), AMP with a dynamic loss scale, and a checkpoint every few updates.
# 2. **What a checkpoint must hold** to resume bit for bit: the model (parameters *and* batch norm
#    buffers), the optimizer (momentum buffers), the grad scaler (scale, growth tracker), the LR
#    scheduler, the step count and the losses so far. The data order is a function of the epoch
#    (a generator seeded with it), so it needs no state of its own. `miniflow.save` writes the file
#    atomically: a kill never leaves half a checkpoint.
# 3. **Kill it, resume it**: the lesson starts the run in a child process, waits for its second
#    checkpoint, kills it with SIGKILL (no chance to clean up), resumes from the file, and shows
#    that the resumed run's losses and final weights are bit-identical to an uninterrupted run.
#
# Assumes: nn.Graph (lesson 1), AMP and loss scaling (lessons 4, 5), a training loop (lesson 7),
# convolutions and batch norm under AMP (lesson 10).
#
# Run: `python tutorials/12_a_real_training_run.py [--quick] [--out DIR]` (--quick: 64 training
# images, 2 epochs; the full run: all 1,437 images, 3 epochs).

# %%
import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

import miniflow as mf
from miniflow.amp import GradScaler
from miniflow.checkpoint import restore
from miniflow.data import load_digits
from miniflow.experiments.mlp import EvalGraph, TrainGraph, accuracy
from miniflow.experiments.train import make_lr_schedule
from miniflow.models import resnet18
from miniflow.serialization import load, save
from miniflow.notebook import out_folder, script_args, script_dir

LESSON = script_dir(globals()) / "12_a_real_training_run.py"
DEFAULT_OUT = LESSON.parent.parent / "tutorial-output" / "12_a_real_training_run"
SAVE_EVERY = 2
"""Updates between checkpoints."""
KILL_AFTER_SAVES = 2
"""The parent kills the child once it has written this many checkpoints."""


# %% [markdown]
# ## 1. The recipe, and everything a run holds

# %%
def settings(quick: bool) -> dict:
    """The recipe: data size, batch, micro-batches, epochs, optimizer and clipping."""
    return {"n_train": 64 if quick else None, "batch": 16 if quick else 64, "accumulate": 2,
            "epochs": 2 if quick else 3, "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4,
            "clip_norm": 1.0, "seed": 0}


class Run:
    """Everything a training run holds: model, optimizer, scaler, scheduler, graph, step."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        data = load_digits()
        n = cfg["n_train"] or len(data.x_train)
        self.x = data.x_train[:n].reshape(-1, 1, 8, 8)
        self.y = data.y_train[:n]
        self.x_test, self.y_test = data.x_test.reshape(-1, 1, 8, 8), data.y_test
        mf.manual_seed(cfg["seed"])
        self.model = resnet18(data.num_classes, in_channels=1, small_input=True)
        self.opt = mf.optim.SGD(self.model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"],
                                weight_decay=cfg["weight_decay"],
                                clip_grad_max_norm=cfg["clip_norm"])
        self.graph = TrainGraph(self.model, self.opt)
        self.graph.config.enable_amp(True)
        self.scaler = GradScaler()
        self.graph.set_grad_scaler(self.scaler)
        self.graph.config.set_gradient_accumulation_steps(cfg["accumulate"])
        self.steps_per_epoch = len(self.x) // cfg["batch"]          # full batches only
        self.total = cfg["epochs"] * self.steps_per_epoch
        self.sched = make_lr_schedule(self.opt, "warmup-cosine", self.total)
        self.step, self.losses, self.lrs, self.skipped = 0, [], [], []

    def batch(self, step: int) -> tuple:
        """The rows of update ``step``: the epoch's order comes from a generator seeded with the
        epoch, so a resumed run draws the same batches without saving any generator state."""
        epoch, b = divmod(step, self.steps_per_epoch)
        order = np.random.default_rng(1000 + epoch).permutation(len(self.x))
        rows = order[b * self.cfg["batch"]:(b + 1) * self.cfg["batch"]]
        return np.ascontiguousarray(self.x[rows]), self.y[rows]

    def train_one(self) -> None:
        self.lrs.append(self.opt.param_groups[0]["lr"])
        loss = self.graph(*self.batch(self.step))
        self.losses.append(float(loss.numpy().mean()))   # the micro-batches' mean loss
        self.skipped.append(bool(self.scaler.found_inf))
        self.sched.step()
        self.step += 1

    def save(self, path: Path) -> None:
        save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
              "grad_scaler": self.scaler.state_dict(), "scheduler": self.sched.state_dict(),
              "run": {"step": self.step, "losses": self.losses, "lrs": self.lrs}}, path)

    def resume(self, path: Path) -> None:
        ckpt = load(path)
        restore(ckpt, model=self.model, optimizer=self.opt, grad_scaler=self.scaler,
                scheduler=self.sched)
        self.step = ckpt["run"]["step"]
        self.losses, self.lrs = list(ckpt["run"]["losses"]), list(ckpt["run"]["lrs"])

    def test_accuracy(self) -> float:
        self.model.eval()
        try:
            return accuracy(EvalGraph(self.model), self.x_test, self.y_test)
        finally:
            self.model.train()


# %% [markdown]
# ## 2. The run in a child process, killed after its second checkpoint

# %%
def child_main(cfg: dict, ckpt: Path) -> None:
    """The run the parent kills: train, checkpoint every SAVE_EVERY updates, say so."""
    run = Run(cfg)
    while run.step < run.total:
        run.train_one()
        if run.step % SAVE_EVERY == 0:
            run.save(ckpt)
            print(f"saved step {run.step}", flush=True)


def kill_after_saves(quick: bool, ckpt: Path) -> int:
    """Start the run in a child process and SIGKILL it after KILL_AFTER_SAVES checkpoints;
    returns the step of the checkpoint it left."""
    cmd = [sys.executable, str(LESSON), "--child", "--out", str(ckpt.parent)] + \
        (["--quick"] if quick else [])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(mf.__path__[0]).resolve().parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=env)
    saves = 0
    try:
        for line in child.stdout:
            saves += line.startswith("saved step")
            if saves == KILL_AFTER_SAVES:
                child.send_signal(signal.SIGKILL)       # no cleanup, no final save
                break
    finally:
        child.kill()
        child.wait()
    if saves < KILL_AFTER_SAVES:
        raise SystemExit(f"the training child exited (code {child.returncode}) after {saves} "
                         f"checkpoints; run it alone: {' '.join(cmd)}")
    print(f"child process {child.pid} killed with SIGKILL after its checkpoint "
          f"{KILL_AFTER_SAVES} (exit code {child.returncode})")
    return load(ckpt)["run"]["step"]


# %% [markdown]
# ## 3. The lesson: an uninterrupted run, the killed run, the resumed run, compared

# %%
def main() -> None:
    p = argparse.ArgumentParser(description="Lesson 12: a real training run, killed and resumed")
    p.add_argument("--quick", action="store_true", help="64 training images, 2 epochs")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the checkpoint")
    p.add_argument("--child", action="store_true",
                   help="internal: the training process the lesson kills")
    args = p.parse_args(script_args())    # a notebook kernel passes its own arguments
    out_folder(p, args.out)
    mf.set_backend("cpu")
    cfg = settings(args.quick)
    ckpt = args.out / "checkpoint.safetensors"
    if args.child:
        child_main(cfg, ckpt)
        return

    print("== 1. The run: ResNet-18 on the digits ==")
    full = Run(cfg)
    n_params = sum(p.numpy().size for p in full.model.parameters())
    print(f"model: ResNet-18, small-input stem, {n_params} parameters; {len(full.x)} training "
          f"images, batch {cfg['batch']} in {cfg['accumulate']} micro-batches of "
          f"{cfg['batch'] // cfg['accumulate']}, {cfg['epochs']} epochs = {full.total} updates")
    print(f"SGD lr {cfg['lr']} momentum {cfg['momentum']} weight decay {cfg['weight_decay']}, "
          f"gradients clipped to total L2 norm {cfg['clip_norm']}, AMP float16 with a dynamic "
          f"loss scale from 2^16, warm-up + cosine schedule")
    while full.step < full.total:
        full.train_one()
    print(f"updates the loss scaler skipped (non-finite float16 gradients; the scale halves "
          f"each time): {np.flatnonzero(full.skipped).tolist()}")
    print(f"learning rate per update: {' '.join(f'{v:.4f}' for v in full.lrs)} (linear warm-up "
          f"from 0.1 x lr, then cosine to 0; a skipped update does not advance the schedule)")
    print(f"uninterrupted run: loss per update {' '.join(f'{v:.4f}' for v in full.losses)}")
    print(f"loss scale at the end: 2^{np.log2(full.scaler.scale):.0f}; test accuracy "
          f"{100 * full.test_accuracy():.1f}% on {len(full.x_test)} images")

    print(f"\n== 2. The same run in a child process, checkpointing every {SAVE_EVERY} updates, "
          f"killed ==")
    if ckpt.exists():
        ckpt.unlink()
    at = kill_after_saves(args.quick, ckpt)
    print(f"the checkpoint it left holds step {at} of {full.total}: model (with batch norm's "
          f"running statistics), optimizer momentum, grad scaler, LR scheduler, losses")

    print("\n== 3. Resume from the checkpoint in this process and finish ==")
    resumed = Run(cfg)
    resumed.resume(ckpt)
    while resumed.step < resumed.total:
        resumed.train_one()
    print(f"resumed run: loss per update {' '.join(f'{v:.4f}' for v in resumed.losses)}")
    same_losses = resumed.losses == full.losses and resumed.lrs == full.lrs
    a, b = full.model.state_dict(), resumed.model.state_dict()
    same_weights = a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    print(f"resumed from step {at}: losses and learning rates bit-identical to the uninterrupted "
          f"run: {same_losses}; all {len(a)} parameters and buffers bit-identical: "
          f"{same_weights}; loss scale equal: {resumed.scaler.scale == full.scaler.scale}")
    print(f"checkpoint written to: {ckpt}")


if __name__ == "__main__":
    main()
