"""SGD with momentum, Nesterov momentum and weight decay (``torch.optim.SGD`` semantics and
signature; dampening only 0)."""
from __future__ import annotations

from ..checks import boolean, real
from ..ops import emitter
from .optimizer import Optimizer

__all__ = ["SGD"]


class SGD(Optimizer):
    """``g = grad + weight_decay * p`` (added only when ``weight_decay != 0``, as PyTorch: an
    infinite weight stays infinite); ``buf = momentum * buf + g; p -= lr * buf`` (op
    ``sgd_update``); with ``nesterov=True`` ``p -= lr * (g + momentum * buf)`` (Sutskever et
    al., "On the importance of initialization and momentum in deep learning", ICML 2013, as
    ``torch.optim.SGD`` writes it). PyTorch's positional order and defaults (``SGD(params,
    lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False)``); its ``dampening`` is
    taken at 0 only (another value is a ValueError: the update op has no dampening).

    State: ``momentum_buffer`` (PyTorch's name; used when momentum != 0).

    Args:
        nesterov: Nesterov momentum (PyTorch's default False); needs momentum > 0.
        clip_grad_max_norm, clip_grad_norm_type: (keyword only) clip the gradients of these
            parameters to a total norm of at most ``clip_grad_max_norm`` before the update
            (OneFlow's param-group keys, ``torch.nn.utils.clip_grad_norm_``'s rule; None: no
            clipping).

    ``foreach``, ``fused``: PyTorch's choice of implementation, taken at None or any bool
    and named in the signature (nanoGPT tests ``'fused' in
    inspect.signature(torch.optim.AdamW).parameters``); ``torch_options``: PyTorch's other
    keywords miniflow has not (``maximize``, ``capturable``, ``differentiable`` ...), taken
    at their no-op values only (``Optimizer.check_torch_options``: another value is a
    ValueError, an unknown keyword a TypeError).

    Raises:
        TypeError: a hyper-parameter that is not a real number.
        TypeError: nesterov not a bool.
        ValueError: lr, momentum or weight_decay not finite >= 0 (lr=0 is allowed, as in
            PyTorch); nesterov with momentum 0 (PyTorch's "Nesterov momentum requires a
            momentum and zero dampening"); clip_grad_max_norm not finite > 0;
            clip_grad_norm_type not > 0; dampening other than 0.
    """

    state_names = ("momentum_buffer",)
    torch_keys = {**Optimizer.torch_keys, "dampening": 0}

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *,
                 foreach: bool | None = None, fused: bool | None = None,
                 clip_grad_max_norm: float | None = None, clip_grad_norm_type: float = 2.0,
                 **torch_options):
        self.check_torch_options({"dampening": dampening, "foreach": foreach, "fused": fused,
                                  **torch_options})
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      nesterov=nesterov, clip_grad_max_norm=clip_grad_max_norm,
                                      clip_grad_norm_type=clip_grad_norm_type))

    def check_hyper(self, hyper: dict) -> dict:
        missing = sorted({"momentum", "weight_decay"} - set(hyper))
        if missing:
            raise KeyError(f"SGD: missing hyper-parameters {missing}")
        out = {"momentum": real("SGD", "momentum", hyper["momentum"], 0.0),
               "weight_decay": real("SGD", "weight_decay", hyper["weight_decay"], 0.0)}
        out["nesterov"] = boolean("SGD", "nesterov", hyper.get("nesterov", False), numpy=True)
        if out["nesterov"] and out["momentum"] <= 0.0:
            raise ValueError("SGD: Nesterov momentum requires a momentum and zero dampening "
                             f"(nesterov=True needs momentum > 0, got momentum "
                             f"{out['momentum']:g})")
        return out

    def emit_update(self, graph, index, name, param, grad, lr, skip_if, hyper) -> None:
        h = hyper
        state = self._state_values(graph, name, index) if h["momentum"] != 0 else []
        emitter(graph)("sgd_update", param, grad, lr, skip_if, *state, momentum=h["momentum"],
                       weight_decay=h["weight_decay"], nesterov=h["nesterov"])
