"""Adadelta (Zeiler, "ADADELTA: An Adaptive Learning Rate Method", 2012, arXiv:1212.5701),
``torch.optim.Adadelta``'s algorithm, defaults and state keys (the PyTorch MNIST example's
optimizer)."""
from __future__ import annotations

import numpy as np

from ..checks import boolean, real
from ..ops import emitter
from .optimizer import Optimizer

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    """Per parameter: ``step += 1; g = -grad`` with ``maximize`` (else ``grad``); ``g += wd * p``
    (only when ``wd != 0``, as PyTorch); ``square_avg = rho * square_avg + (1 - rho) * g^2;
    delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g; acc_delta = rho * acc_delta +
    (1 - rho) * delta^2; p -= lr * delta`` (op ``adadelta_update``; source: the algorithm of
    ``torch.optim.Adadelta``'s documentation and ``_single_tensor_adadelta``).

    PyTorch's defaults: ``lr=1.0, rho=0.9, eps=1e-6, weight_decay=0``. State: ``square_avg``,
    ``acc_delta`` and ``step`` (i64[1]; PyTorch keeps it, 0-d float, and reads it nowhere),
    PyTorch's names, so a ``torch.optim.Adadelta`` state dict loads and miniflow's loads into
    torch. The learning rate is read from :attr:`learning_rate` (a scheduler such as the MNIST
    example's ``StepLR(gamma=0.7)`` changes it without a recompilation).

    Args:
        maximize: maximize the objective (PyTorch's keyword: the gradient's negative), a
            hyper-parameter of each group.
        clip_grad_max_norm, clip_grad_norm_type: gradient clipping, as for :class:`SGD`.

    ``foreach`` (PyTorch's choice of implementation) is taken at None or any bool;
    ``capturable`` (CUDA graph capture) and ``differentiable`` (autograd through the step)
    only at False: miniflow's update runs inside its compiled graph and is not differentiated
    (another value is a ValueError naming it).

    Raises:
        TypeError: a hyper-parameter that is not a real number; maximize not a bool.
        ValueError: lr, eps or weight_decay not finite >= 0 (lr=0 is allowed, as in PyTorch);
            rho outside [0, 1] (PyTorch's "Invalid rho value"); clip_grad_max_norm not finite
            > 0; clip_grad_norm_type not > 0.
    """

    state_names = ("square_avg", "acc_delta", "step")
    nonnegative_states = ("square_avg", "acc_delta")
    torch_keys = {"foreach": None, "capturable": False, "differentiable": False}

    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0, foreach: bool | None = None, *,
                 capturable: bool = False, maximize: bool = False, differentiable: bool = False,
                 clip_grad_max_norm: float | None = None, clip_grad_norm_type: float = 2.0):
        self.check_torch_options({"foreach": foreach, "capturable": capturable,
                                  "differentiable": differentiable})
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize, clip_grad_max_norm=clip_grad_max_norm,
                                      clip_grad_norm_type=clip_grad_norm_type))

    def check_hyper(self, hyper: dict) -> dict:
        missing = sorted({"rho", "eps", "weight_decay"} - set(hyper))
        if missing:
            raise KeyError(f"Adadelta: missing hyper-parameters {missing}")
        return {"rho": real("Adadelta", "rho", hyper["rho"], 0.0, 1.0),
                "eps": real("Adadelta", "eps", hyper["eps"], 0.0),
                "weight_decay": real("Adadelta", "weight_decay", hyper["weight_decay"], 0.0),
                "maximize": boolean("Adadelta", "maximize", hyper.get("maximize", False),
                                    numpy=True)}

    def _initial_state(self, name, p) -> np.ndarray:
        if name == "step":
            return np.zeros(1, np.int64)
        return np.zeros(p.shape, p.dtype.np)

    def emit_update(self, graph, index, name, param, grad, lr, skip_if, hyper) -> None:
        h = hyper
        emitter(graph)("adadelta_update", param, grad, lr, skip_if,
                       *self._state_values(graph, name, index), rho=h["rho"], eps=h["eps"],
                       weight_decay=h["weight_decay"], maximize=h["maximize"])
