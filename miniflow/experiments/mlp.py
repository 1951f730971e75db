"""The digits MLP and its training loop, used by ``miniflow train``, the tutorials and the tests.

Model: ``Linear(64, hidden) -> ReLU -> Linear(hidden, 10)``; loss: mean softmax cross-entropy.
Data parallel (``ddp=True``, ``mpiexec -n N miniflow train --ddp``): every rank trains on its
shard of every epoch (``DistributedSampler``) with ``batch_size`` rows per step, and the training
graph averages the gradients across the ranks; rank 0 alone evaluates and shows progress.
"""
from __future__ import annotations

import time

import numpy as np

from .. import distributed, nn, optim
from ..data import DistributedSampler, batches, load_digits
from ..random import manual_seed

__all__ = ["mlp", "TrainGraph", "EvalGraph", "accuracy", "train_digits"]


def mlp(sizes=(64, 128, 10)) -> nn.Sequential:
    """``Linear -> ReLU -> ... -> Linear`` with the given layer sizes."""
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class TrainGraph(nn.Graph):
    """One training step: forward, mean cross-entropy, backward, optimizer update; returns the loss."""

    def __init__(self, model, optimizer):
        super().__init__()
        self.model = model
        self.add_optimizer(optimizer)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


class EvalGraph(nn.Graph):
    """Inference: returns the logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x):
        return self.model(x)


def accuracy(eval_graph: EvalGraph, x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of rows of ``x`` whose arg-max logit equals ``y``."""
    logits = eval_graph(x).numpy()
    return float((logits.argmax(axis=1) == y).mean())


def train_digits(epochs: int = 20, batch_size: int = 64, lr: float = 0.1, momentum: float = 0.9,
                 hidden: int = 128, seed: int = 0, progress: bool = True,
                 ddp: bool = False) -> dict:
    """Train the digits MLP with SGD; returns losses per step, test accuracy and timings.

    Args:
        ddp: data parallel over the process world (``miniflow.distributed``; a world of one
            without an MPI launcher): each rank trains on its ``DistributedSampler`` shard
            (shuffled with ``seed`` and the epoch), ``batch_size`` rows per rank and step, and only
            rank 0 evaluates and shows the progress bar.

    Returns:
        dict with ``losses`` (list of float: this rank's batch losses), ``test_accuracy`` (float
        in [0, 1]), ``train_accuracy`` (both None on the ranks other than 0 under ``ddp``),
        ``seconds`` (wall time of the whole run), ``graph`` (the TrainGraph), ``rank`` and
        ``world_size``.
    """
    from tqdm import tqdm

    manual_seed(seed)
    data = load_digits()
    model = mlp((64, hidden, data.num_classes))
    graph = TrainGraph(model, optim.SGD(model.parameters(), lr=lr, momentum=momentum))
    evaluator = EvalGraph(model)
    sampler = None
    if ddp:
        distributed.init()
        sampler = DistributedSampler(data.x_train, seed=seed)
    rank = distributed.rank() if ddp else 0
    losses = []
    t0 = time.perf_counter()
    bar = tqdm(range(epochs), desc="train", unit="epoch", disable=not progress or rank != 0)
    for epoch in bar:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for xb, yb in batches(data.x_train, data.y_train, batch_size, sampler=sampler):
            losses.append(float(graph(xb, yb)))
        if rank == 0:
            acc = accuracy(evaluator, data.x_test, data.y_test)
            bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}", test_acc=f"{acc:.3f}")
    first = rank == 0
    return {"losses": losses,
            "test_accuracy": accuracy(evaluator, data.x_test, data.y_test) if first else None,
            "train_accuracy": accuracy(evaluator, data.x_train, data.y_train) if first else None,
            "seconds": time.perf_counter() - t0, "graph": graph, "rank": rank,
            "world_size": distributed.world_size() if ddp else 1}
