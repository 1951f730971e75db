"""Adam (Kingma & Ba 2015, arXiv:1412.6980) with bias correction, ``torch.optim.Adam`` semantics."""
from __future__ import annotations

import numpy as np

from ..ops import emitter
from .optimizer import Optimizer, check_real

__all__ = ["Adam"]


class Adam(Optimizer):
    """Per parameter: ``step += 1; g = grad + wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)`` (op ``adam_update``).

    State: ``exp_avg`` (m), ``exp_avg_sq`` (v) and ``step`` (i64[1]), PyTorch's names. The
    bias corrections are computed from ``step`` when the update runs; the learning rate is read
    from :attr:`learning_rate`: neither is an attribute of the compiled graph.

    Args:
        clip_grad_max_norm, clip_grad_norm_type: gradient clipping, as for :class:`SGD`.

    Raises:
        TypeError: betas not a pair, or a hyper-parameter that is not a real number.
        ValueError: lr, eps or weight_decay not finite >= 0 (lr=0 is allowed, as in PyTorch),
            betas outside [0, 1); clip_grad_max_norm not finite > 0; clip_grad_norm_type not > 0.
    """

    state_names = ("exp_avg", "exp_avg_sq", "step")
    nonnegative_states = ("exp_avg_sq",)

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, clip_grad_max_norm: float | None = None,
                 clip_grad_norm_type: float = 2.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      clip_grad_max_norm=clip_grad_max_norm,
                                      clip_grad_norm_type=clip_grad_norm_type))

    def check_hyper(self, hyper: dict) -> dict:
        missing = sorted({"betas", "eps", "weight_decay"} - set(hyper))
        if missing:
            raise KeyError(f"Adam: missing hyper-parameters {missing}")
        try:
            b1, b2 = hyper["betas"]
        except (TypeError, ValueError):
            raise TypeError(f"Adam: betas must be a pair (beta1, beta2), got "
                            f"{hyper['betas']!r}") from None
        return {"betas": (check_real("Adam", "beta1", b1, high=1.0),
                          check_real("Adam", "beta2", b2, high=1.0)),
                "eps": check_real("Adam", "eps", hyper["eps"]),
                "weight_decay": check_real("Adam", "weight_decay", hyper["weight_decay"])}

    def _initial_state(self, name, p) -> np.ndarray:
        if name == "step":
            return np.zeros(1, np.int64)
        return np.zeros(p.shape, p.dtype.np)

    def emit_update(self, graph, index, name, param, grad, lr, skip_if) -> None:
        m, v, step = self._state_values(graph, name, index)
        h = self.hyper
        emitter(graph)("adam_update", param, grad, lr, skip_if, m, v, step,
                       beta1=h["betas"][0], beta2=h["betas"][1], eps=h["eps"],
                       weight_decay=h["weight_decay"])
