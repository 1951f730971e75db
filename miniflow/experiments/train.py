"""``miniflow train``: a model trained on the bundled digits (1,437 training and 360 test images of
8x8 pixels), with SGD and momentum, in float32 or under AMP with a dynamic loss scale.

Models (:data:`MODELS`): ``mlp`` (64-128-10, flat pixels), ``lenet`` (``miniflow.models.lenet``,
with batch norm) and ``resnet18`` (``miniflow.models.resnet18`` with the small-input stem, one
input channel); the convolutional ones see the images as ``[N, 1, 8, 8]``. Each has a recipe
(:data:`RECIPES`: epochs, learning rate, momentum, weight decay), any part of which the caller can
override. Batch norm trains in training mode and is evaluated in eval mode (its running
statistics): the accuracy after every epoch and at the end comes from an eval graph of the same
model.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace


from .. import models, optim
from ..amp import GradScaler
from ..data import batches, load_digits
from ..random import manual_seed
from .mlp import EvalGraph, TrainGraph, accuracy, mlp

__all__ = ["MODELS", "Recipe", "RECIPES", "make_model", "train_digits"]

MODELS = ("mlp", "lenet", "resnet18")
"""The models ``miniflow train --model`` knows."""


@dataclass(frozen=True)
class Recipe:
    """How a model is trained by default: ``epochs`` of SGD (``lr``, ``momentum``,
    ``weight_decay``) on batches of ``batch_size``; ``cosine``: the learning rate of epoch ``e``
    (from 0) is ``lr * (1 + cos(pi e / epochs)) / 2`` (Loshchilov & Hutter, SGDR, 2017, without
    restarts), set between epochs (each change recompiles the graph once)."""

    epochs: int
    lr: float
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int = 64
    cosine: bool = False

    def lr_at(self, epoch: int) -> float:
        """The learning rate of epoch ``epoch`` (0-based)."""
        if not self.cosine:
            return self.lr
        return self.lr * 0.5 * (1.0 + math.cos(math.pi * epoch / self.epochs))


RECIPES = {"mlp": Recipe(epochs=20, lr=0.1),
           "lenet": Recipe(epochs=20, lr=0.05, weight_decay=5e-4),
           "resnet18": Recipe(epochs=10, lr=0.05, weight_decay=5e-4, cosine=True)}
"""The default recipe of each model (measured test accuracies: ``benchmarks/README.md``)."""


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


def train_digits(model: str = "mlp", *, epochs: int | None = None,
                 batch_size: int | None = None, lr: float | None = None,
                 momentum: float | None = None, weight_decay: float | None = None,
                 hidden: int = 128, amp: bool = False, seed: int = 0,
                 progress: bool = True) -> dict:
    """Train ``model`` on the digits; ``None`` arguments come from its :data:`RECIPES` entry.

    Args:
        amp: mixed precision (``config.enable_amp``) with a dynamic ``GradScaler`` (PyTorch's
            defaults: initial scale 2^16, growth every 2000 steps).
        progress: a tqdm progress bar over the steps (loss and the last test accuracy).

    Raises:
        ValueError: an unknown model, listing the known ones.

    Returns:
        dict with ``losses`` (per step), ``test_accuracy`` and ``train_accuracy`` (in [0, 1],
        eval mode), ``epoch_test_accuracy`` (after every epoch), ``seconds`` (the whole run,
        compilation included), ``recipe``, ``graph``, ``model`` and ``scaler`` (None without
        AMP).
    """
    from tqdm import tqdm

    if model not in RECIPES:
        raise ValueError(f"train: unknown model {model!r}; choose one of {', '.join(MODELS)}")
    manual_seed(seed)
    net = make_model(model, hidden)
    given = {"epochs": epochs, "batch_size": batch_size, "lr": lr, "momentum": momentum,
             "weight_decay": weight_decay}
    r = replace(RECIPES[model], **{k: v for k, v in given.items() if v is not None})
    data = load_digits()
    shape = (-1, 64) if model == "mlp" else (-1, 1, 8, 8)
    x_test, x_train = data.x_test.reshape(shape), data.x_train.reshape(shape)
    sgd = optim.SGD(net.parameters(), lr=r.lr, momentum=r.momentum,
                    weight_decay=r.weight_decay)
    graph = TrainGraph(net, sgd)
    scaler = None
    if amp:
        graph.config.enable_amp(True)
        scaler = GradScaler()
        graph.set_grad_scaler(scaler)
    evaluator = EvalGraph(net)

    def test_accuracy(x, y):
        net.eval()
        acc = accuracy(evaluator, x, y)
        net.train()
        return acc

    steps_per_epoch = -(-len(x_train) // r.batch_size)
    losses, epoch_acc = [], []
    t0 = time.perf_counter()
    with tqdm(total=r.epochs * steps_per_epoch, desc=f"train {model}", unit="step",
              disable=not progress) as bar:
        for epoch in range(r.epochs):
            sgd.param_groups[0]["lr"] = r.lr_at(epoch)
            for xb, yb in batches(x_train, data.y_train, r.batch_size):
                losses.append(float(graph(xb, yb)))
                bar.update()
                bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}",
                                test_acc=f"{epoch_acc[-1]:.3f}" if epoch_acc else "-")
            epoch_acc.append(test_accuracy(x_test, data.y_test))
            bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}",
                            test_acc=f"{epoch_acc[-1]:.3f}")
    return {"losses": losses, "test_accuracy": epoch_acc[-1],
            "train_accuracy": test_accuracy(x_train, data.y_train),
            "epoch_test_accuracy": epoch_acc, "seconds": time.perf_counter() - t0,
            "recipe": r, "graph": graph, "model": net, "scaler": scaler}
