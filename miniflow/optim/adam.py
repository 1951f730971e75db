"""Adam (Kingma & Ba 2015, arXiv:1412.6980) with bias correction, ``torch.optim.Adam`` semantics."""
from __future__ import annotations

import numpy as np

from .optimizer import Optimizer

__all__ = ["Adam"]


class Adam(Optimizer):
    """Per parameter: ``step += 1; g = grad + wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)`` (op ``adam_update``).

    State: ``exp_avg`` (m), ``exp_avg_sq`` (v) and ``step`` (i64[1]), PyTorch's names.

    Raises:
        ValueError: lr <= 0, betas outside [0, 1), eps < 0 or weight_decay < 0.
    """

    state_names = ("exp_avg", "exp_avg_sq", "step")

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        b1, b2 = (float(b) for b in betas)
        if not lr > 0:
            raise ValueError(f"Adam: lr must be > 0, got {lr}")
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"Adam: betas must be in [0, 1), got {tuple(betas)}")
        if eps < 0 or weight_decay < 0:
            raise ValueError(f"Adam: eps and weight_decay must be >= 0, got {eps}, {weight_decay}")
        super().__init__(params, dict(lr=float(lr), beta1=b1, beta2=b2, eps=float(eps),
                                      weight_decay=float(weight_decay)))

    def _initial_state(self, name, p) -> np.ndarray:
        if name == "step":
            return np.zeros(1, np.int64)
        return np.zeros(p.shape, p.dtype.np)

    def emit_update(self, graph, index, name, param, grad, skip_if) -> None:
        m, v, step = self._state_values(graph, name, index)
        graph.emit("adam_update", param, grad, skip_if, m, v, step, **self.defaults)
