"""SGD with momentum, dampening, Nesterov momentum and weight decay (``torch.optim.SGD``
semantics and signature)."""
from __future__ import annotations

import numpy as np

from ..checks import boolean, real
from ..ops import emitter
from .optimizer import Optimizer

__all__ = ["SGD"]

STEPPED = "momentum_steps"
"""The state of a parameter of a group with dampening: i64[1], how many steps updated its
momentum buffer (0: none yet, PyTorch's buffer None). Not in :meth:`SGD.state_dict`, where
PyTorch's layout says it: a buffer is there once a step made it."""


class SGD(Optimizer):
    """``g = grad + weight_decay * p`` (added only when ``weight_decay != 0``, as PyTorch: an
    infinite weight stays infinite); ``buf = momentum * buf + (1 - dampening) * g; p -= lr *
    buf`` (op ``sgd_update``), ``buf = g`` on a parameter's first step (PyTorch's: its buffer is
    None until then); with ``nesterov=True`` ``p -= lr * (g + momentum * buf)`` (Sutskever et
    al., "On the importance of initialization and momentum in deep learning", ICML 2013, as
    ``torch.optim.SGD`` writes it). PyTorch's positional order and defaults (``SGD(params,
    lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False)``).

    State: ``momentum_buffer`` (PyTorch's name; used when momentum != 0). Without dampening it
    starts at zeros (``momentum * 0 + g`` is the first step's ``g``); in a group with dampening
    each parameter also counts the steps that updated its buffer (:data:`STEPPED`, an input of
    ``sgd_update``, so a step the grad scaler skips leaves the first step to come), and
    :meth:`state_dict` holds a parameter's buffer only once a step made it, as PyTorch's: a
    ``torch.optim.SGD`` state dict loads and continues exactly, and back.

    Args:
        dampening: PyTorch's (default 0; any finite number, as PyTorch checks none); whether
            a group has dampening (0 or not) is fixed when the group is made (its state
            depends on it: a change from or to 0 is a ValueError, make a new optimizer or add a
            group), another non-zero value may be set at any time.
        nesterov: Nesterov momentum (PyTorch's default False); needs momentum > 0 and
            dampening 0.
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
            PyTorch); dampening not finite; nesterov with momentum 0 or dampening != 0
            (PyTorch's "Nesterov momentum requires a momentum and zero dampening");
            clip_grad_max_norm not finite > 0; clip_grad_norm_type not > 0.
    """

    state_names = ("momentum_buffer",)
    fixed_keys = ("dampening",)

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *,
                 foreach: bool | None = None, fused: bool | None = None,
                 clip_grad_max_norm: float | None = None, clip_grad_norm_type: float = 2.0,
                 **torch_options):
        self.check_torch_options({"foreach": foreach, "fused": fused, **torch_options})
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      clip_grad_max_norm=clip_grad_max_norm,
                                      clip_grad_norm_type=clip_grad_norm_type))

    def group_state_names(self, hyper: dict) -> tuple:
        """``momentum_buffer``, and :data:`STEPPED` in a group with dampening."""
        return self.state_names + ((STEPPED,) if hyper["dampening"] else ())

    def _initial_state(self, name, p) -> np.ndarray:
        return np.zeros(1, np.int64) if name == STEPPED else super()._initial_state(name, p)

    def check_hyper(self, hyper: dict) -> dict:
        missing = sorted({"momentum", "weight_decay"} - set(hyper))
        if missing:
            raise KeyError(f"SGD: missing hyper-parameters {missing}")
        out = {"momentum": real("SGD", "momentum", hyper["momentum"], 0.0),
               "dampening": real("SGD", "dampening", hyper.get("dampening", 0.0)),
               "weight_decay": real("SGD", "weight_decay", hyper["weight_decay"], 0.0)}
        out["nesterov"] = boolean("SGD", "nesterov", hyper.get("nesterov", False), numpy=True)
        if out["nesterov"] and (out["momentum"] <= 0.0 or out["dampening"] != 0.0):
            raise ValueError("SGD: Nesterov momentum requires a momentum and zero dampening "
                             f"(nesterov=True needs momentum > 0 and dampening 0, got momentum "
                             f"{out['momentum']:g}, dampening {out['dampening']:g})")
        return out

    def emit_update(self, graph, index, name, param, grad, lr, skip_if, hyper) -> None:
        h = hyper
        state = self._state_values(graph, name, index) if h["momentum"] != 0 else []
        emitter(graph)("sgd_update", param, grad, lr, skip_if, *state, momentum=h["momentum"],
                       dampening=h["dampening"], weight_decay=h["weight_decay"],
                       nesterov=h["nesterov"])

    def state_dict(self) -> dict:
        """As :meth:`Optimizer.state_dict`; in a group with dampening a parameter's
        ``momentum_buffer`` only once a step made it (PyTorch's buffer None: the parameter is
        left out of ``state``), and never :data:`STEPPED`."""
        out = super().state_dict()
        for i, s in list(out["state"].items()):
            stepped = s.pop(STEPPED, None)
            if stepped is not None and stepped[0] == 0:
                del out["state"][i]
        return out

    def prepare_load_state_dict(self, state_dict: dict):
        """As :meth:`Optimizer.prepare_load_state_dict`; in a group with dampening a parameter
        whose ``momentum_buffer`` is loaded has stepped (PyTorch's buffer not None), one left
        out of ``state`` has not (its buffer zeros, its first step ``buf = g``)."""
        st = state_dict.get("state") if isinstance(state_dict, dict) else None
        if isinstance(st, dict):
            st = dict(st)
            for i, s in enumerate(self.state.values()):
                if STEPPED in s and isinstance(st.get(i), dict) and STEPPED not in st[i]:
                    st[i] = {**st[i], STEPPED: np.array([int("momentum_buffer" in st[i])])}
            state_dict = {**state_dict, "state": st}
        return super().prepare_load_state_dict(state_dict)
