"""Adam (Kingma & Ba 2015, arXiv:1412.6980) with bias correction, ``torch.optim.Adam`` semantics."""
from __future__ import annotations

import numpy as np

from ..checks import boolean, real
from ..ops import emitter
from .optimizer import Optimizer

__all__ = ["Adam"]


class Adam(Optimizer):
    """Per parameter: ``step += 1; g = grad + wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)`` (op ``adam_update``;
    ``wd * p`` added only when ``wd != 0``, as PyTorch).

    With ``amsgrad=True`` (Reddi et al., "On the Convergence of Adam and Beyond", ICLR 2018;
    ``torch.optim.Adam``'s rule) ``max_exp_avg_sq = max(max_exp_avg_sq, v)`` replaces ``v`` in
    the denominator.

    State: ``exp_avg`` (m), ``exp_avg_sq`` (v), ``max_exp_avg_sq`` (with amsgrad only, as in
    PyTorch's state dict) and ``step`` (i64[1]), PyTorch's names. The
    bias corrections are computed from ``step`` when the update runs; the learning rate is read
    from :attr:`learning_rate`: neither is an attribute of the compiled graph.

    Args:
        clip_grad_max_norm, clip_grad_norm_type: gradient clipping, as for :class:`SGD`.

    ``foreach``, ``fused`` and ``torch_options`` (PyTorch's keywords miniflow has not): as
    for :class:`SGD`.

    Raises:
        TypeError: betas not a pair, or a hyper-parameter that is not a real number; amsgrad
            not a bool.
        ValueError: a group's amsgrad changed after the group was made (its state would be
            missing or stale: make a new optimizer or add a group); groups may differ in it.
        ValueError: lr, eps or weight_decay not finite >= 0 (lr=0 is allowed, as in PyTorch),
            betas outside [0, 1); clip_grad_max_norm not finite > 0; clip_grad_norm_type not > 0.
    """

    nonnegative_states = ("exp_avg_sq", "max_exp_avg_sq")
    torch_keys = {**Optimizer.torch_keys, "decoupled_weight_decay": False}
    fixed_keys = ("amsgrad",)

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: bool | None = None, fused: bool | None = None,
                 clip_grad_max_norm: float | None = None, clip_grad_norm_type: float = 2.0,
                 **torch_options):
        self.check_torch_options({"foreach": foreach, "fused": fused, **torch_options})
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, clip_grad_max_norm=clip_grad_max_norm,
                                      clip_grad_norm_type=clip_grad_norm_type))

    def group_state_names(self, hyper: dict) -> tuple:
        """PyTorch's state keys: ``max_exp_avg_sq`` only in a group with amsgrad."""
        return ("exp_avg", "exp_avg_sq", *(("max_exp_avg_sq",) if hyper["amsgrad"] else ()),
                "step")

    def check_hyper(self, hyper: dict) -> dict:
        name = type(self).__name__     # AdamW's errors name AdamW
        missing = sorted({"betas", "eps", "weight_decay"} - set(hyper))
        if missing:
            raise KeyError(f"{name}: missing hyper-parameters {missing}")
        try:
            b1, b2 = hyper["betas"]
        except (TypeError, ValueError):
            raise TypeError(f"{name}: betas must be a pair (beta1, beta2), got "
                            f"{hyper['betas']!r}") from None
        amsgrad = boolean(name, "amsgrad", hyper.get("amsgrad", False), numpy=True)
        return {"betas": (real(name, "beta1", b1, 0.0, 1.0, high_open=True),
                          real(name, "beta2", b2, 0.0, 1.0, high_open=True)),
                "eps": real(name, "eps", hyper["eps"], 0.0),
                "weight_decay": real(name, "weight_decay", hyper["weight_decay"], 0.0),
                "amsgrad": amsgrad}

    def _initial_state(self, name, p) -> np.ndarray:
        if name == "step":
            return np.zeros(1, np.int64)
        return np.zeros(p.shape, p.dtype.np)

    def _adam_inputs(self, graph, index, name, hyper) -> list:
        """The state inputs of ``adam_update``: m, v, step (and max_v with amsgrad)."""
        names = ("exp_avg", "exp_avg_sq", "step") + (("max_exp_avg_sq",) if hyper["amsgrad"]
                                                     else ())
        return self._state_values(graph, name, index, names)

    def emit_update(self, graph, index, name, param, grad, lr, skip_if, hyper) -> None:
        h = hyper
        emitter(graph)("adam_update", param, grad, lr, skip_if,
                       *self._adam_inputs(graph, index, name, h), beta1=h["betas"][0],
                       beta2=h["betas"][1], eps=h["eps"], weight_decay=h["weight_decay"],
                       amsgrad=h["amsgrad"])
