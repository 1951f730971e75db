"""``miniflow train``: a model trained on the bundled digits (1,437 training and 360 test images of
8x8 pixels) with SGD and momentum, in float32 or under AMP with a dynamic loss scale.

Models (:data:`MODELS`): ``mlp`` (64-128-10, flat pixels), ``lenet`` (``miniflow.models.lenet``,
with batch norm) and ``resnet18`` (``miniflow.models.resnet18`` with the small-input stem, one
input channel); the convolutional ones see the images as ``[N, 1, 8, 8]``. Each has a recipe
(:data:`RECIPES`: epochs, learning rate and its schedule, momentum, weight decay), any part of
which the caller can override. Batch norm trains in training mode and is evaluated in eval mode
(its running statistics): the accuracy after every epoch and at the end comes from an eval graph
of the same model.

The loop can schedule the learning rate (``miniflow.optim.lr_scheduler``), accumulate gradients
over micro-batches (``config.set_gradient_accumulation_steps``), clip them
(``clip_grad_max_norm``), and save a checkpoint (``miniflow.save``) that a later run resumes bit
for bit: the model (buffers included), the optimizer, the grad scaler, the LR scheduler, the step
count, the epoch's data order and the generator's state. Data parallel (``ddp=True``,
``mpiexec -n N miniflow train --ddp``): every rank trains on its shard of every epoch
(``DistributedSampler``) with ``batch_size`` rows per step (all of the shard when it has fewer,
as with PyTorch's ``DataLoader``), and the training graph averages the
gradients across the ranks; rank 0 alone evaluates, shows progress and writes the checkpoint
(every rank resumes from it).
"""
from __future__ import annotations

import math
import os
import shlex
import time
from dataclasses import dataclass, replace

import numpy as np

from .. import distributed, models, optim
from ..amp import GradScaler
from ..checkpoint import restore
from ..checks import positive_integer
from ..data import DistributedSampler, load_digits
from ..dtype import bfloat16, float16
from ..optim import lr_scheduler
from ..random import RngState, generator, manual_seed
from ..serialization import load, save
from .interrupts import Interrupted, interrupt_signals
from .mlp import EvalGraph, TrainGraph, accuracy, mlp
from .run_folder import CHECKPOINT_FILE, FolderInUseError, RunFolder, check_not_in_use

__all__ = ["MODELS", "Recipe", "RECIPES", "TrainSettings", "make_model", "train_digits",
           "SCHEDULES", "make_lr_schedule", "epoch_batches", "ResumeError", "DataSizeError",
           "TrainingInterrupted", "CHECKPOINT_FILE", "run_name", "named_run",
           "accumulated", "clipped", "scaler_line", "tensorboard_command"]

MODELS = ("mlp", "lenet", "resnet18")
"""The models ``miniflow train --model`` knows."""

SCHEDULES = {
    "constant": "the same lr for every update (no scheduler)",
    "step": "StepLR: the lr times 0.1 after each third of the updates",
    "cosine": "CosineAnnealingLR: cosine decay from the lr to 0 over the run",
    "warmup-cosine": "LinearLR from 0.1 x the lr over the first 5% of the updates (at least 1), "
                     "then CosineAnnealingLR to 0 (SequentialLR)",
}
"""``--lr-schedule`` name -> what it does (the scheduler steps once per update)."""


class ResumeError(ValueError):
    """A run cannot start from (or over) the checkpoint folder it was given: nothing to resume,
    a checkpoint that another run would overwrite, or a checkpoint of other settings."""


class DataSizeError(ValueError):
    """The settings leave no batch in an epoch: ``accumulate`` above the rows of the training
    set (this rank's shard under ``ddp``), so every batch, cut to a multiple of ``accumulate``
    rows, would be dropped."""




@dataclass(frozen=True)
class Recipe:
    """How a model is trained by default: ``epochs`` of SGD (``lr``, ``momentum``,
    ``weight_decay``) on batches of ``batch_size``, the learning rate following ``lr_schedule``
    (a :data:`SCHEDULES` name; ``cosine`` is Loshchilov & Hutter's SGDR without restarts, 2017)."""

    epochs: int
    lr: float
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int = 64
    lr_schedule: str = "constant"


RECIPES = {"mlp": Recipe(epochs=20, lr=0.1),
           "lenet": Recipe(epochs=20, lr=0.05, weight_decay=5e-4),
           "resnet18": Recipe(epochs=10, lr=0.05, weight_decay=1e-3, lr_schedule="cosine")}
"""The default recipe of each model (measured test accuracies: docs/usage.md's "Convolutional
networks"). ResNet-18's weight decay is 1e-3: with 5e-4 its seeds 0-3 reached 96.67, 98.89,
98.33 and 98.06% on one AMD Zen 4 machine, with 1e-3 99.17, 99.17, 98.89 and 98.06%."""


def make_model(name: str, hidden: int = 128, classes: int = 10):
    """The model ``name`` (:data:`MODELS`), with parameters from miniflow's generator.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name == "mlp":
        return mlp((64, hidden, classes))
    if name == "lenet":
        return models.lenet(classes)
    if name == "resnet18":
        return models.resnet18(classes, in_channels=1, small_input=True)
    raise ValueError(f"train: unknown model {name!r}; choose one of {', '.join(MODELS)}")


AMP_DTYPES = {"fp16": float16, "bf16": bfloat16}
"""The ``amp`` modes of ``miniflow train`` and their half dtypes."""

AMP_LINES = {None: "float32", "fp16": "AMP (float16) with a dynamic loss scale",
             "bf16": "AMP (bfloat16)"}
"""How ``miniflow train`` names the precision of a run, per ``amp`` mode."""


def accumulated(rows: int, accumulate: int) -> str:
    """What ``--accumulate`` adds after a model line's ``batch {rows}``: `` as 4 accumulated
    micro-batches of 16`` ("" without accumulation; every model of ``miniflow train``)."""
    if accumulate == 1:
        return ""
    return f" as {accumulate} accumulated micro-batches of {rows // accumulate}"


def clipped(clip_norm) -> str:
    """What ``--clip-norm`` adds to a model line's settings: ``, gradients clipped to an L2 norm
    of 1`` ("" for None, no clipping)."""
    return "" if clip_norm is None else f", gradients clipped to an L2 norm of {clip_norm:g}"


def tensorboard_command(logdir) -> str:
    """``tensorboard --logdir runs``: the command a run line suggests, with ``logdir`` quoted
    for the shell (a folder with a space, ``my runs``, is ``'my runs'``) so it can be pasted."""
    return f"tensorboard --logdir {shlex.quote(os.fspath(logdir))}"


def scaler_line(scaler) -> str:
    """``loss scale: 65536 at the end, 0 steps skipped``: a run's ``GradScaler`` at its end
    (``miniflow train --amp fp16``, every model)."""
    return f"loss scale: {scaler.scale:g} at the end, {scaler.num_skipped_steps} steps skipped"


def amp_mode(amp, owner: str) -> str | None:
    """``amp`` as None (float32), ``"fp16"`` or ``"bf16"`` (True means ``"fp16"``, False
    None).

    Raises:
        ValueError: anything else, naming ``owner`` and the choices."""
    if amp is None or amp is False:
        return None
    if amp is True:
        return "fp16"
    if isinstance(amp, str) and amp in AMP_DTYPES:
        return amp
    raise ValueError(f"{owner}: amp must be None/False (float32), 'fp16' (or True) or 'bf16', "
                     f"got {amp!r}")


def make_lr_schedule(opt, name: str, total_steps: int):
    """The LR scheduler of :data:`SCHEDULES` ``name`` for a run of ``total_steps`` updates (None
    for ``"constant"``).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    S = lr_scheduler
    if name == "constant":
        return None
    if name == "step":
        return S.StepLR(opt, step_size=max(1, math.ceil(total_steps / 3)), gamma=0.1)
    if name == "cosine":
        return S.CosineAnnealingLR(opt, T_max=max(1, total_steps))
    warm = max(1, total_steps // 20)
    return S.SequentialLR(opt, [S.LinearLR(opt, start_factor=0.1, total_iters=warm),
                                S.CosineAnnealingLR(opt, T_max=max(1, total_steps - warm))],
                          milestones=[warm])


def epoch_batches(n: int, batch_size: int, accumulate: int = 1) -> list:
    """``(start, stop)`` of every batch of an epoch over ``n`` shuffled rows: ``batch_size``
    rows each, the last one shorter; with gradient accumulation every batch is cut to a
    multiple of ``accumulate`` rows (a last batch of fewer rows is dropped)."""
    spans = []
    for start in range(0, n, batch_size):
        rows = min(batch_size, n - start)
        rows -= rows % accumulate
        if rows:
            spans.append((start, start + rows))
    return spans


def train_digits(model: str = "mlp", *, epochs: int | None = None,
                 batch_size: int | None = None, lr: float | None = None,
                 momentum: float | None = None, weight_decay: float | None = None,
                 lr_schedule: str | None = None, hidden: int = 128, seed: int = 0,
                 progress: bool = True, accumulate: int = 1, clip_norm: float | None = None,
                 amp: bool | str | None = False,
                 checkpoint: str | os.PathLike | None = None,
                 resume: bool = False, checkpoint_every: int = 100, ddp: bool = False,
                 logdir: str | os.PathLike | None = None) -> dict:
    """Train ``model`` on the digits; ``None`` arguments come from its :data:`RECIPES` entry.

    Args:
        lr_schedule: a name of :data:`SCHEDULES`; the scheduler steps after every update (a
            step the grad scaler skips does not count).
        accumulate: micro-batches per batch (``set_gradient_accumulation_steps``); batch_size
            must be a multiple of it.
        clip_norm: clip the gradients to this total L2 norm (``clip_grad_max_norm``), or None.
        amp: mixed precision (``config.enable_amp``): ``"fp16"`` (or True) float16 with a
            dynamic ``GradScaler`` (PyTorch's defaults: initial scale 2^16, growth every 2000
            steps), ``"bf16"`` bfloat16 without loss scaling (bfloat16 has float32's exponent
            range, so gradients do not underflow: PyTorch's ``autocast(dtype=torch.bfloat16)``
            recipe uses no GradScaler); False or None: float32.
        progress: a tqdm progress bar over the steps (loss and the last test accuracy).
        checkpoint: a folder (``miniflow.experiments.run_folder``): the training state is
            saved to ``<folder>/checkpoint.safetensors`` every ``checkpoint_every`` updates, at
            the end and at a Ctrl-C (atomically, ``miniflow.save``; by rank 0 alone under
            ``ddp``), the losses to ``<folder>/losses.csv``; the folder is locked for the run.
            A folder that holds a checkpoint is refused unless ``resume``.
        resume: continue the run saved in ``checkpoint`` (made with the same settings): the
            rest of the run is bit-identical to the uninterrupted one.
        ddp: data parallel over the process world (``miniflow.distributed``; a world of one
            without an MPI launcher): each rank trains on its ``DistributedSampler`` shard
            (shuffled with ``seed`` and the epoch), ``batch_size`` rows per rank and step, and only
            rank 0 evaluates, shows the progress bar and writes the checkpoint.
        logdir: write TensorBoard scalars (``miniflow.logging.TrainingLog``, rank 0) to the run
            ``<logdir>/<run_name(...)>``: per step the loss, lr, gradient norm, loss scale and
            skipped steps, per epoch the test accuracy. Under AMP the model-update cast is then
            not fused (the same bits; the log reads the unscaled gradients).

    Returns:
        dict with ``losses`` (one float per update since the start of the run, the mean of the
        micro-batch losses with accumulation; this rank's batches under ``ddp``),
        ``test_accuracy`` and ``train_accuracy`` (in [0, 1], eval mode; None on the ranks other
        than 0 under ``ddp``), ``epoch_test_accuracy`` (after every epoch of this call, rank 0),
        ``seconds`` (wall time of this call, compilation included), ``steps`` (updates done in
        total), ``resumed_from`` (the checkpoint's step, or None), ``checkpoint`` (its path, or
        None), ``recipe`` (the settings used), ``graph`` (the TrainGraph), ``model``, ``scaler``
        (None without AMP), ``rank``, ``world_size``, ``logdir`` (the run's folder, or None),
        ``epoch_rows`` (the training rows of an epoch: under ``ddp`` this rank's shard) and
        ``batch_rows`` (the rows of every batch but an epoch's last: ``batch_size``, or all of
        ``epoch_rows`` when they are fewer, as PyTorch's ``DataLoader`` gives them, cut to a
        multiple of ``accumulate``).

    Ctrl-C (SIGINT, in the main thread) or SIGTERM: the step running ends, a checkpoint is saved
    there (with ``checkpoint``), and :class:`TrainingInterrupted` is raised; a second signal
    stops at once (keeping the last checkpoint).

    Raises:
        ValueError: an unknown model (listing the known ones); an unknown ``amp``; batch_size
            not a multiple of accumulate; an unknown lr_schedule; resume without checkpoint.
        DataSizeError: accumulate above the rows of an epoch (this rank's shard under ``ddp``).
        ResumeError: another run holds ``checkpoint``, nothing to resume there, a checkpoint
            there without ``resume``, one made with other settings or another world size
            (naming them, and ``--ddp`` / ``mpiexec -n N``), or one that does not fit the
            model, optimizer ... (naming the part and the key; nothing is loaded).
        TrainingInterrupted: Ctrl-C or SIGTERM (a ``KeyboardInterrupt``; its message names the
            step and the last checkpoint, its ``signum`` the signal).
        miniflow.CheckpointError: the checkpoint file is truncated or edited (naming the key).
        OSError: the checkpoint folder cannot be created or written (before the first step).
    """
    given = {"epochs": epochs, "batch_size": batch_size, "lr": lr, "momentum": momentum,
             "weight_decay": weight_decay, "lr_schedule": lr_schedule}
    settings = TrainSettings(model, _recipe(model, given, accumulate), hidden=hidden, seed=seed,
                             progress=progress, accumulate=accumulate, clip_norm=clip_norm,
                             amp=amp_mode(amp, "train_digits"), checkpoint=checkpoint,
                             resume=resume, checkpoint_every=checkpoint_every, ddp=ddp,
                             logdir=logdir)
    if resume and checkpoint is None:
        raise ValueError("train_digits: resume needs the checkpoint folder to resume from")
    return _Training(settings).train()


def _recipe(model: str, given: dict, accumulate: int) -> Recipe:
    """``model``'s :data:`RECIPES` entry with the ``given`` values that are not None.

    Raises:
        ValueError: an unknown model; ``epochs``, ``batch_size`` or ``accumulate`` not a
            positive integer (a batch of 0 has no step, 0 epochs no run); a batch size that is
            not a multiple of ``accumulate``.
    """
    if model not in RECIPES:
        raise ValueError(f"train: unknown model {model!r}; choose one of {', '.join(MODELS)}")
    for name in ("epochs", "batch_size"):
        if given[name] is not None:
            positive_integer("train_digits", name, given[name])
    positive_integer("train_digits", "accumulate", accumulate)
    r = replace(RECIPES[model], **{k: v for k, v in given.items() if v is not None})
    if r.batch_size % accumulate:
        raise ValueError(f"train_digits: batch_size {r.batch_size} must be a multiple of "
                         f"accumulate {accumulate} (equal micro-batches)")
    return r


@dataclass(frozen=True)
class TrainSettings:
    """What one :func:`train_digits` run is asked to do: the ``model`` name, its ``recipe``
    (the :data:`RECIPES` entry with the caller's overrides) and the run's options (the
    keyword arguments of :func:`train_digits`, which documents them; ``amp`` as
    :func:`amp_mode` gives it: None, ``"fp16"`` or ``"bf16"``)."""

    model: str
    recipe: Recipe
    hidden: int = 128
    seed: int = 0
    progress: bool = True
    accumulate: int = 1
    clip_norm: float | None = None
    amp: str | None = None
    checkpoint: str | os.PathLike | None = None
    resume: bool = False
    checkpoint_every: int = 100
    ddp: bool = False
    logdir: str | os.PathLike | None = None

    def config(self) -> dict:
        """The settings a checkpoint records and a resumed run must repeat (``run_name`` reads
        them too); ``world_size`` is added under ``ddp``."""
        r = self.recipe
        return {"model": self.model, "epochs": r.epochs, "batch_size": r.batch_size,
                "lr": r.lr, "momentum": r.momentum, "weight_decay": r.weight_decay,
                "lr_schedule": r.lr_schedule, "hidden": self.hidden, "seed": self.seed,
                "accumulate": self.accumulate, "clip_norm": self.clip_norm,
                "amp": {None: False, "fp16": True}.get(self.amp, self.amp)}  # fp16 as before


def _train_graph(net, opt, s: TrainSettings):
    """The training graph of ``net`` and ``opt`` (float16 AMP with a dynamic ``GradScaler``,
    bfloat16 AMP without one, gradient accumulation as ``s`` asks) and its scaler (None without
    float16 AMP)."""
    graph = TrainGraph(net, opt)
    scaler = GradScaler() if s.amp == "fp16" else None
    if s.amp is not None:
        graph.config.enable_amp(True, AMP_DTYPES[s.amp])
    if scaler is not None:
        graph.set_grad_scaler(scaler)
    if s.amp and s.logdir is not None:
        graph.config.enable_fused_model_update_cast(False)
    if s.accumulate > 1:
        graph.config.set_gradient_accumulation_steps(s.accumulate)
    return graph, scaler


class _Training:
    """One :func:`train_digits` run: the data, model, optimizer, graphs, learning-rate schedule,
    the run record (``step``, ``epoch``, ``batch``, the epoch's data ``order``) and the
    checkpoint folder; :meth:`train` runs it."""

    def __init__(self, s: TrainSettings):
        r = self.recipe = s.recipe
        self.s, self.config = s, s.config()
        self.t0 = time.perf_counter()
        manual_seed(s.seed)
        data = self.data = load_digits()
        shape = (-1, 64) if s.model == "mlp" else (-1, 1, 8, 8)
        self.x_train, self.x_test = data.x_train.reshape(shape), data.x_test.reshape(shape)
        self.net = make_model(s.model, s.hidden, data.num_classes)
        self.opt = optim.SGD(self.net.parameters(), lr=r.lr, momentum=r.momentum,
                             weight_decay=r.weight_decay, clip_grad_max_norm=s.clip_norm)
        self.graph, self.scaler = _train_graph(self.net, self.opt, s)
        self.sampler = None
        if s.ddp:
            distributed.init()
            self.sampler = DistributedSampler(self.x_train, seed=s.seed)
            self.config["world_size"] = distributed.world_size()  # it shards another way
        self.rank = distributed.rank() if s.ddp else 0
        self.epoch_rows = len(self.x_train) if self.sampler is None else len(self.sampler)
        self.spans = epoch_batches(self.epoch_rows, r.batch_size, s.accumulate)
        if not self.spans:
            where = "this rank's shard" if s.ddp else "the training set"
            raise DataSizeError(
                f"train_digits: accumulate {s.accumulate} needs at least {s.accumulate} rows per "
                f"batch, but {where} has {self.epoch_rows}: every batch would be dropped; give "
                f"accumulate <= {self.epoch_rows}")
        self.total = r.epochs * len(self.spans)
        self.sched = make_lr_schedule(self.opt, r.lr_schedule, self.total)
        self.run = {"step": 0, "epoch": 0, "batch": 0, "order": None}
        self.losses, self.epoch_acc = [], []
        self.folder = self.path = self.log = self.resumed_from = self.saved_at = None
        self.evaluator = EvalGraph(self.net)

    def train(self) -> dict:
        """Run the epochs left, with the checkpoint folder and the log open; the result dict of
        :func:`train_digits`."""
        s = self.s
        if s.checkpoint is not None:
            self.folder = _run_folder(s.checkpoint, s.resume, lock=self.rank == 0)
            self.path = self.folder.path
        try:
            self._start()
            self._epochs()
        finally:
            if self.folder is not None:
                self.folder.close()
            if self.log is not None:
                self.log.close()
        return self._result()

    def _start(self) -> None:
        """Resume from the checkpoint (``resume``), start the loss log and the TensorBoard log."""
        if self.s.resume:
            self.run, self.losses = _resume(
                self.folder, self.config, model=self.net, optimizer=self.opt,
                grad_scaler=self.scaler, scheduler=self.sched, rng=RngState())
            self.resumed_from = self.saved_at = self.run["step"]
        if self.folder is not None and self.rank == 0:
            self.folder.start_log(self.losses)      # the checkpoint's steps, none after them
        if self.s.logdir is not None and self.rank == 0:
            from ..logging import TrainingLog
            # a resumed run continues the TensorBoard run it wrote (name-2 when name was taken),
            # which its checkpoint names; older checkpoints and runs without a log do not
            name = self.run.get("tensorboard_run") if self.s.resume else None
            self.log = TrainingLog(self.s.logdir, self.graph, name or run_name(self.config),
                                   resume_step=self.resumed_from)
            self.run["tensorboard_run"] = os.path.basename(self.log.path)

    def _save(self) -> None:
        """Checkpoint the run (rank 0 writes; under ddp every rank holds the same state)."""
        if self.rank == 0:
            self.folder.append_losses(self.losses, self.saved_at or 0)  # the log covers the file
            sched, scaler = self.sched, self.scaler
            save({"config": self.config, "run": self.run, "model": self.net.state_dict(),
                  "optimizer": self.opt.state_dict(),
                  "grad_scaler": scaler and scaler.state_dict(),
                  "scheduler": sched and sched.state_dict(), "rng": RngState().state_dict()},
                 self.path)
            if self.log is not None:
                self.log.flush()            # the TensorBoard run covers the checkpoint too
        self.saved_at = self.run["step"]

    def _accuracy(self, x, y) -> float:
        """The eval-mode accuracy on ``x``, ``y`` (batch norm from its running statistics: an
        eval-mode plan), in batches of a training (micro-)batch's rows."""
        self.net.eval()
        try:
            return accuracy(self.evaluator, x, y,
                            batch_size=self.recipe.batch_size // self.s.accumulate)
        finally:
            self.net.train()

    def _epochs(self) -> None:
        """The epochs left, under a progress bar; a Ctrl-C checkpoints (see
        :func:`train_digits`), the end of the run too."""
        from tqdm import tqdm

        run = self.run
        with tqdm(total=self.total, initial=run["step"], desc=f"train {self.s.model}",
                  unit="step", disable=not self.s.progress or self.rank != 0) as bar, \
                interrupt_signals(defer=True) as sigint:
            try:
                for epoch in range(run["epoch"], self.recipe.epochs):
                    self._epoch(epoch, bar, sigint)
                if self.path is not None and self.saved_at != run["step"]:
                    self._save()
            except TrainingInterrupted:
                raise
            except KeyboardInterrupt:  # a second Ctrl-C: stop at once, no checkpoint now
                raise TrainingInterrupted(run["step"], self.path, self.saved_at,
                                          saved_now=False) from None

    def _epoch(self, epoch: int, bar, sigint) -> None:
        """The batches left of ``epoch``, then (rank 0) its test accuracy."""
        run = self.run
        if self.sampler is not None:  # this rank's shard (seed + epoch, alike on every rank)
            self.sampler.set_epoch(epoch)
            run["order"] = self.sampler.indices()
        elif run["order"] is None:    # the epoch's shuffle (as miniflow.data.batches')
            run["order"] = generator().permutation(len(self.x_train))
        for b in range(run["batch"], len(self.spans)):
            if sigint.requested:
                raise _interrupted(run["step"], self.path, self.saved_at, self._save)
            self._step(run["order"][self.spans[b][0]:self.spans[b][1]])
            run.update(step=run["step"] + 1, epoch=epoch, batch=b + 1)
            if self.path is not None and run["step"] % self.s.checkpoint_every == 0:
                self._save()
            bar.update()
            acc = self.epoch_acc
            bar.set_postfix(epoch=epoch + 1, loss=f"{self.losses[-1]:.4f}",
                            test_acc=f"{acc[-1]:.3f}" if acc else "-")
        run.update(epoch=epoch + 1, batch=0, order=None)
        if self.rank == 0:
            self.epoch_acc.append(self._accuracy(self.x_test, self.data.y_test))
            if self.log is not None:
                self.log.epoch(test_accuracy=self.epoch_acc[-1])
            bar.set_postfix(epoch=epoch + 1, loss=f"{self.losses[-1]:.4f}",
                            test_acc=f"{self.epoch_acc[-1]:.3f}")

    def _step(self, rows) -> None:
        """One update on the training rows ``rows``: its loss recorded, the schedule stepped."""
        loss = self.graph(np.ascontiguousarray(self.x_train[rows]), self.data.y_train[rows])
        self.losses.append(float(loss.numpy().mean()))
        if self.log is not None:
            self.log.step(loss)
        if self.sched is not None:
            self.sched.step()

    def _result(self) -> dict:
        """The result dict of :func:`train_digits` (the final accuracies on rank 0)."""
        first, data = self.rank == 0, self.data
        return {"losses": self.losses,
                "test_accuracy": self._accuracy(self.x_test, data.y_test) if first else None,
                "train_accuracy": self._accuracy(self.x_train, data.y_train) if first else None,
                "epoch_test_accuracy": self.epoch_acc, "seconds": time.perf_counter() - self.t0,
                "steps": self.run["step"], "resumed_from": self.resumed_from,
                "checkpoint": self.path, "recipe": self.recipe, "graph": self.graph,
                "model": self.net, "scaler": self.scaler, "rank": self.rank,
                "world_size": distributed.world_size() if self.s.ddp else 1,
                "logdir": None if self.log is None else self.log.path,
                "epoch_rows": self.epoch_rows,
                "batch_rows": max((stop - start for start, stop in self.spans), default=0)}


def run_name(config: dict) -> str:
    """The TensorBoard run name of a ``train_digits`` configuration: model, precision, lr and
    schedule, batch, the settings that differ from the model's recipe and defaults, seed
    (``mlp-fp32-lr0.1-constant-bs64-seed0``, ``lenet-amp-lr0.05-cosine-bs32-ep3-clip1-seed2``)."""
    precision = {False: "fp32", True: "amp"}.get(config["amp"], config["amp"])
    recipe = RECIPES[config["model"]]
    defaults = {k: getattr(recipe, k) for k in ("epochs", "momentum", "weight_decay")}
    return named_run([config["model"], precision, f"lr{config['lr']:g}", config["lr_schedule"],
                      f"bs{config['batch_size']}"], config,
                     {**defaults, "hidden": 128 if config["model"] == "mlp" else config["hidden"]},
                     (("epochs", "ep"), ("momentum", "mom"), ("weight_decay", "wd"),
                      ("hidden", "h")))


def named_run(head: list, config: dict, defaults: dict, tags) -> str:
    """``head``, then ``<tag><value>`` for each ``(key, tag)`` of ``tags`` whose value differs
    from ``defaults``, accumulation, clipping, the world size, the seed, joined by ``-``: a run
    name of :func:`run_name` and ``train_gpt.run_name``."""
    parts = list(head) + [f"{tag}{config[key]:g}" for key, tag in tags
                          if config[key] != defaults[key]]
    if config["accumulate"] > 1:
        parts.append(f"acc{config['accumulate']}")
    if config["clip_norm"] is not None:
        parts.append(f"clip{config['clip_norm']:g}")
    if config.get("world_size", 1) > 1:
        parts.append(f"ddp{config['world_size']}")
    return "-".join(parts + [f"seed{config['seed']}"])


class TrainingInterrupted(Interrupted):
    """Ctrl-C (SIGINT) or SIGTERM stopped :func:`train_digits` after ``step`` updates;
    ``saved_at`` is the step of the last checkpoint in ``path`` (None: none was written),
    ``saved_now`` whether it was written at the interrupt, ``signum`` the signal
    (``signal.SIGINT`` or ``signal.SIGTERM``). An :class:`~.interrupts.Interrupted`, so code
    that catches ``KeyboardInterrupt`` still does; ``str()`` is the one line ``miniflow train``
    prints after the signal's name (SIGTERM only)."""

    def __init__(self, step: int, path: str | None, saved_at: int | None, saved_now: bool):
        self.step, self.path, self.saved_at, self.saved_now = step, path, saved_at, saved_now
        if path is None:
            where = "no checkpoint (--checkpoint DIR saves one)"
        elif saved_at is None:
            where = f"no checkpoint written yet in {path!r}"
        else:
            where = (f"checkpoint {'saved' if saved_now else 'kept'} at step {saved_at} in "
                     f"{path!r} (--resume continues it)")
        super().__init__(f"interrupted at step {step}; {where}")


def _interrupted(step: int, path, saved_at, save_state) -> TrainingInterrupted:
    """The exception of a Ctrl-C seen between two steps: the state is whole there, so it is
    checkpointed first (when the run has a checkpoint folder and the last one is older)."""
    if path is not None and saved_at != step:
        save_state()
        return TrainingInterrupted(step, path, step, saved_now=True)
    return TrainingInterrupted(step, path, saved_at, saved_now=False)


def _run_folder(folder, resume: bool, lock: bool) -> RunFolder:
    """The checkpoint folder of a run, locked when ``lock`` (see ``run_folder``).

    Raises:
        ResumeError: ``resume`` and no checkpoint there (nothing is created; naming the
            run that holds the folder, if one does), another run holds the folder, or a
            checkpoint is there and ``resume`` is not set (it would be overwritten).
        OSError: the folder cannot be created or written (``NotADirectoryError``: a file).
    """
    saved = os.path.join(os.fspath(folder), CHECKPOINT_FILE)
    if resume and not os.path.exists(saved):    # before the folder and its lock are made
        try:                    # a run still before its first save: the folder is in use
            check_not_in_use(folder)
        except FolderInUseError as e:
            raise ResumeError(f"nothing to resume yet: {e}") from None
        raise ResumeError(f"nothing to resume: {saved!r} does not exist (train without "
                          "--resume to start a run that saves there)")
    try:
        run_folder = RunFolder(folder, lock=lock)
    except FolderInUseError as e:
        raise ResumeError(str(e)) from None
    if os.path.exists(run_folder.path) and not resume:
        run_folder.close()
        raise ResumeError(f"{run_folder.path!r} holds a checkpoint that a new run would "
                          "overwrite: pass --resume to continue that run, or give another "
                          "--checkpoint folder")
    return run_folder


def _world_mismatch(path: str, saved, this) -> str | None:
    """Why a checkpoint of a run on ``saved`` ranks (None: without ``--ddp``) cannot continue
    in a run on ``this`` ranks (the data order depends on the world), or None."""
    if saved == this:
        return None
    if saved is None:
        return (f"{path!r} was saved by a run without --ddp (one process, its own data order): "
                "resume it without --ddp")
    return (f"{path!r} was saved by a data-parallel run of {saved} rank(s)"
            + ("" if this is None else f", this run has {this}")
            + f": resume it with `mpiexec -n {saved} miniflow train --ddp ... --resume`")


_KEYWORD_ONLY = frozenset({"n_layer", "n_head", "n_embd", "dropout", "eval_batches"})
"""Settings a checkpoint records that ``miniflow train`` has no option for (``train_gpt``'s
keyword arguments only)."""


def _spelled(key: str, value) -> str:
    """A setting of a run's config as its ``miniflow train`` option: ``--amp fp16`` (the digits
    models' config holds True for it), ``--lr 0.1``, ``no --clip-norm`` (None or False); one
    without an option as its keyword argument: ``n_layer=4``."""
    if key in _KEYWORD_ONLY:
        return f"{key}={value!r}"
    option = "--" + key.replace("_", "-")
    value = "fp16" if key == "amp" and value is True else value
    return f"no {option}" if value is None or value is False else f"{option} {value}"


def _resume(folder: RunFolder, config: dict, **objects) -> tuple:
    """Load the checkpoint of ``folder`` into ``objects`` (all or nothing) after checking it was
    made with ``config``; returns its run record (step, epoch, batch, order) and the losses of
    its steps: from the loss log, or from the record itself in a checkpoint written before the
    log existed (which kept every loss there).

    Raises:
        ResumeError: one made with other settings (naming each as its option and both
            values; a checkpoint of another ``--model`` names that alone) or another world
            size, one that does not
            fit the model, optimizer ... (``restore``'s message: nothing is loaded), or a loss
            log that lacks its steps.
        miniflow.CheckpointError: a truncated or edited file (``miniflow.load``).
    """
    path = folder.path
    ckpt = load(path)
    saved = ckpt.get("config") if isinstance(ckpt, dict) else None
    if not isinstance(saved, dict) or not isinstance(ckpt.get("run"), dict):
        raise ResumeError(f"{path!r} is not a checkpoint of miniflow train (no 'config' and "
                          "'run' entries)")
    world = _world_mismatch(path, saved.get("world_size"), config.get("world_size"))
    if world:
        raise ResumeError(world)
    keys = ["model"] if saved.get("model") != config.get("model") else config  # others: noise
    differ = [f"{_spelled(k, saved.get(k))} (this run: {_spelled(k, config[k])})" for k in keys
              if saved.get(k) != config[k]
              and _spelled(k, saved.get(k)) != _spelled(k, config[k])]   # None, False: unset
    if differ:
        raise ResumeError(f"{path!r} was saved by a run with other settings: "
                          f"{'; '.join(differ)}; resume with the same options")
    run = dict(ckpt["run"])
    try:
        losses = (list(run.pop("losses")) if "losses" in run   # an older checkpoint: no log
                  else folder.read_losses(run["step"]))
    except ValueError as e:
        raise ResumeError(f"{path!r} cannot be resumed: {e}") from None
    try:
        restore(ckpt, **objects)
    except (KeyError, TypeError, ValueError) as e:  # nothing was loaded
        message = e.args[0] if e.args else type(e).__name__
        raise ResumeError(f"{path!r} does not fit this run: {message}") from None
    return run, losses
