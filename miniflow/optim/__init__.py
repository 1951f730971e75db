"""Optimizers (they declare their update ops; the optimizer pass inserts them into the graph)
and learning-rate schedulers (``miniflow.optim.lr_scheduler``, PyTorch's)."""
from .optimizer import Optimizer
from .sgd import SGD
from .adam import Adam
from .adamw import AdamW
from . import lr_scheduler

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
