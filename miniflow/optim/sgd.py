"""SGD with momentum and weight decay (``torch.optim.SGD`` semantics, no dampening/nesterov)."""
from __future__ import annotations

from .optimizer import Optimizer

__all__ = ["SGD"]


class SGD(Optimizer):
    """``g = grad + weight_decay * p; buf = momentum * buf + g; p -= lr * buf`` (op ``sgd_update``).

    Raises:
        ValueError: lr <= 0, momentum < 0 or weight_decay < 0.
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        if not lr > 0:
            raise ValueError(f"SGD: lr must be > 0, got {lr}")
        if momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: momentum and weight_decay must be >= 0, got {momentum}, "
                             f"{weight_decay}")
        self.state_names = ("momentum_buffer",) if momentum != 0 else ()
        super().__init__(params, dict(lr=float(lr), momentum=float(momentum),
                                      weight_decay=float(weight_decay)))

    def emit_update(self, graph, index, name, param, grad, skip_if) -> None:
        state = self._state_values(graph, name, index)
        graph.emit("sgd_update", param, grad, skip_if, *state, **self.defaults)
