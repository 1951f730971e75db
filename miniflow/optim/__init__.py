"""Optimizers. They declare their update ops; the optimizer pass inserts them into the graph."""
from .optimizer import Optimizer
from .sgd import SGD
from .adam import Adam

__all__ = ["Optimizer", "SGD", "Adam"]
