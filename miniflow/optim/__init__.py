"""Optimizers (they declare their update ops; the optimizer pass inserts them into the graph)
and learning-rate schedulers (``miniflow.optim.lr_scheduler``, PyTorch's)."""
from .optimizer import Optimizer
from .sgd import SGD
from .adam import Adam
from .adamw import AdamW
from .adadelta import Adadelta
from . import lr_scheduler

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adadelta", "lr_scheduler"]

_TORCH_OPTIMIZERS = ("Adafactor", "Adagrad", "Adamax", "ASGD", "LBFGS", "NAdam",
                     "RAdam", "RMSprop", "Rprop", "SparseAdam")
"""``torch.optim`` optimizers miniflow has not (``__getattr__`` names the ones it has)."""


def __getattr__(name):
    """Raises:
        AttributeError: a name the package has not; one of PyTorch's optimizers (``optim.RMSprop``)
            names miniflow's four."""
    hint = ""
    if name in _TORCH_OPTIMIZERS:
        hint = (f": miniflow has PyTorch's SGD, Adam, AdamW and Adadelta only (their update "
                f"ops); train with one of them (for {name}, Adam or AdamW is the nearest)")
    raise AttributeError(f"module 'miniflow.optim' has no attribute {name!r}{hint}")
