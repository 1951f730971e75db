"""Small training graphs shared by the test files of several subsystems (the optimizer, the
grad scaler, nn.Graph, the IR printer): a one-optimizer cross-entropy step, its data and a
4-8-3 MLP, and a least-squares step."""
import numpy as np

import miniflow as mf
from miniflow import nn
from miniflow.experiments.mlp import mlp

__all__ = ["Step", "MseFit", "xy", "small_mlp", "param_arrays"]


class Step(nn.Graph):
    """One optimizer step of ``model`` on cross entropy, with an optional scaler and AMP."""

    def __init__(self, model, opt, scaler=None, policy=None):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)
        if policy is not None:
            self.config.enable_amp(True, loss_scale_policy=policy)
        if scaler is not None:
            self.set_grad_scaler(scaler)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


class MseFit(nn.Graph):
    """One optimizer step of ``model`` on the mean squared error ``mean((model(x) - y)^2)``
    (the optimizer trajectory tests' least-squares fits)."""

    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        d = self.model(x) - y
        loss = (d * d).mean()
        loss.backward()
        return loss


def xy(n=4, seed=0):
    """Four float32 inputs of 4 features and their int64 labels in ``[0, 3)``, seeded."""
    r = np.random.default_rng(seed)
    return r.random((n, 4), dtype=np.float32), r.integers(0, 3, n).astype(np.int64)


def small_mlp(seed=0):
    """A seeded 4-8-3 ``mlp``."""
    mf.manual_seed(seed)
    return mlp((4, 8, 3))


def param_arrays(model):
    """Copies of ``model``'s parameters as NumPy arrays, in parameter order."""
    return [p.numpy().copy() for p in model.parameters()]
