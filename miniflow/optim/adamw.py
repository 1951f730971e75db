"""AdamW: Adam with decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight Decay
Regularization", ICLR 2019, arXiv:1711.05101), ``torch.optim.AdamW``'s formula and defaults."""
from __future__ import annotations

from ..ops import emitter
from .adam import Adam

__all__ = ["AdamW"]


class AdamW(Adam):
    """Per parameter: ``step += 1; p *= 1 - lr * wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)`` (op ``adam_update`` with
    ``decoupled_weight_decay``; the gradient is not changed by the decay, unlike
    :class:`Adam`'s ``weight_decay``).

    PyTorch's defaults: ``lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2``. State, the
    learning rate, ``amsgrad`` and clipping as :class:`Adam` (``exp_avg``, ``exp_avg_sq``,
    ``step``, ``max_exp_avg_sq`` with amsgrad).

    ``foreach``, ``fused`` and ``torch_options`` (PyTorch's keywords miniflow has not): as
    for :class:`SGD`.

    Raises:
        as :class:`Adam`.
    """

    torch_keys = {**Adam.torch_keys, "decoupled_weight_decay": True}

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 foreach: bool | None = None, fused: bool | None = None,
                 clip_grad_max_norm: float | None = None, clip_grad_norm_type: float = 2.0,
                 **torch_options):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, clip_grad_max_norm=clip_grad_max_norm,
                         clip_grad_norm_type=clip_grad_norm_type, foreach=foreach,
                         fused=fused, **torch_options)

    def emit_update(self, graph, index, name, param, grad, lr, skip_if, hyper) -> None:
        h = hyper
        emitter(graph)("adam_update", param, grad, lr, skip_if,
                       *self._adam_inputs(graph, index, name, h), beta1=h["betas"][0],
                       beta2=h["betas"][1], eps=h["eps"], weight_decay=0.0,
                       decoupled_weight_decay=h["weight_decay"], amsgrad=h["amsgrad"])
