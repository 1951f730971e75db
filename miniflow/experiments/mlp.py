"""The digits MLP and the training and evaluation graphs shared by ``miniflow train``
(``experiments.train``), the stability study, the tutorials and the tests.

Model: ``Linear(64, hidden) -> ReLU -> Linear(hidden, 10)``; loss: mean softmax cross-entropy.
"""
from __future__ import annotations

import numpy as np

from .. import nn

__all__ = ["mlp", "TrainGraph", "EvalGraph", "accuracy"]


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


def accuracy(eval_graph: EvalGraph, x: np.ndarray, y: np.ndarray,
             batch_size: int | None = None) -> float:
    """Fraction of rows of ``x`` whose arg-max logit equals ``y``.

    ``batch_size``: evaluate ``batch_size`` rows at a time (PyTorch's evaluation loop over a
    ``DataLoader``), the last batch padded with zero rows whose logits are dropped, so one plan
    (of ``batch_size`` rows) serves every batch: a plan keeps a buffer for every value of the
    graph, so its memory grows with its rows. Rows are independent in an evaluation (batch norm
    in eval mode uses its running statistics), so the result does not depend on it. None: the
    whole of ``x`` as one batch.

    Raises:
        ValueError: ``x`` has no rows (an accuracy of nothing).
    """
    n = len(x)
    if n == 0:
        raise ValueError("accuracy: x has no rows; there is nothing to evaluate")
    if batch_size is None or n <= batch_size:
        batch_size = n
    hits = 0
    for start in range(0, n, batch_size):
        rows = x[start:start + batch_size]
        if len(rows) < batch_size:
            rows = np.concatenate([rows, np.zeros((batch_size - len(rows), *x.shape[1:]),
                                                  x.dtype)])
        logits = eval_graph(rows).numpy()[:n - start]
        hits += int((logits.argmax(axis=1) == y[start:start + batch_size]).sum())
    return hits / n
