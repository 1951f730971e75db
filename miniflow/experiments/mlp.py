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


def accuracy(eval_graph: EvalGraph, x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of rows of ``x`` whose arg-max logit equals ``y``."""
    logits = eval_graph(x).numpy()
    return float((logits.argmax(axis=1) == y).mean())
