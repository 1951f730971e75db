"""Optimizer update ops. They have no outputs: they write their variable inputs in place
(``writes``), which makes them side-effecting, so dead-code elimination keeps them. Their references
return the new values of the written inputs (float64 arithmetic).

* ``sgd_update(model, model_diff, learning_rate, skip_if[, momentum_buf])`` {momentum,
  weight_decay}: PyTorch ``torch.optim.SGD``: ``g = diff + wd * p; buf = momentum * buf + g;
  p -= lr * buf``.
* ``adam_update(model, model_diff, learning_rate, skip_if, m, v, step)`` {beta1, beta2, eps,
  weight_decay}: PyTorch ``torch.optim.Adam`` (Kingma & Ba 2015, arXiv:1412.6980) with bias
  correction at step ``step + 1``.

``learning_rate`` is an f64 ``[1]`` value (OneFlow's update ops take the learning rate as the
tensor input ``learning_rate``; OneFlow's is float32, miniflow's float64, so a Python float lr is
used exactly, as the optimizer's ``param_groups[0]["lr"]`` holds it): the optimizer owns it as a
graph variable, so a new lr changes a number in memory and never the compiled graph. Adam's bias
corrections come from its ``step`` variable in the kernel (OneFlow computes them from its
``train_step`` tensor with ``adam_bias_correction_factor``): nothing step-dependent is an attribute.

``skip_if`` is an int64 ``[1]`` value; when non-zero the op changes nothing (parameters, moments, step
count), as OneFlow's update kernels return early on ``skip_if`` (loss scaling skips overflowing steps).
"""
from __future__ import annotations

import numpy as np

from ..dtype import float64, int64
from .common import fmt, rand
from .registry import register


N_FIXED = 4
"""Inputs every update op starts with: model, model_diff, learning_rate, skip_if."""


def _check(op, inputs, n_state):
    if len(inputs) != N_FIXED + n_state:
        raise ValueError(f"{op}: expects {N_FIXED + n_state} inputs, got {len(inputs)}")
    model, diff, lr, skip_if = inputs[:N_FIXED]
    if not model.dtype.is_float or model.kind != "variable":
        raise TypeError(f"{op}: model {fmt(model)} must be a floating-point variable")
    if diff.shape != model.shape or diff.dtype is not model.dtype:
        raise ValueError(f"{op}: model_diff {fmt(diff)} must match model {fmt(model)} in shape "
                         f"and dtype (fp16 gradients are cast to the master weight dtype first)")
    if lr.dtype is not float64 or lr.shape != (1,):
        raise TypeError(f"{op}: learning_rate {fmt(lr)} must be f64[1] (the optimizer's lr "
                        "variable)")
    if skip_if.dtype is not int64 or skip_if.shape != (1,):
        raise TypeError(f"{op}: skip_if {fmt(skip_if)} must be i64[1]")


def _no_lr_attr(op, attrs):
    if "lr" in attrs:
        raise ValueError(f"{op}: the learning rate is the input learning_rate (an f64[1] "
                         "variable), not an attribute; drop lr=")


def _sgd_norm(inputs, attrs):
    _no_lr_attr("sgd_update", attrs)
    for k in ("momentum", "weight_decay"):
        attrs[k] = float(attrs.get(k, 0.0))
    return attrs


def _sgd_infer(inputs, attrs):
    n_state = 1 if attrs["momentum"] != 0.0 else 0
    _check("sgd_update", inputs, n_state)
    if n_state and inputs[N_FIXED].shape != inputs[0].shape:
        raise ValueError(f"sgd_update: momentum buffer {fmt(inputs[N_FIXED])} must match "
                         f"{fmt(inputs[0])}")
    return []


def _adam_norm(inputs, attrs):
    _no_lr_attr("adam_update", attrs)
    for k, d in (("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8), ("weight_decay", 0.0)):
        attrs[k] = float(attrs.get(k, d))
    return attrs


def _adam_infer(inputs, attrs):
    _check("adam_update", inputs, 3)
    m, v, step = inputs[N_FIXED:]
    for s in (m, v):
        if s.shape != inputs[0].shape or s.dtype is not inputs[0].dtype:
            raise ValueError(f"adam_update: moment {fmt(s)} must match {fmt(inputs[0])}")
    if step.dtype is not int64 or step.shape != (1,):
        raise TypeError(f"adam_update: step {fmt(step)} must be i64[1]")
    return []


def _samples(n_state, lr, attrs):
    def make():
        out = []
        for skip in (0, 1):
            r = np.random.default_rng(21)
            p, g = rand(4, 3, r=r), rand(4, 3, r=r)
            state = [rand(4, 3, r=r) for _ in range(min(n_state, 1))]
            if n_state == 3:
                state = [rand(4, 3, r=r) * 0.1, rand(4, 3, r=r, lo=0.0, hi=0.1),
                         np.array([3], np.int64)]
            out.append(([p, g, np.array([lr]), np.array([skip], np.int64), *state], dict(attrs)))
        return out
    return make


def _sgd_ref(arrays, attrs):
    """PyTorch's SGD step: the new parameter (and momentum buffer)."""
    p, diff, lr, skip_if, *buf = arrays
    if skip_if[0] != 0:
        return [p.copy(), *(b.copy() for b in buf)]
    g = diff + attrs["weight_decay"] * p
    if buf:
        buf = [attrs["momentum"] * buf[0] + g]
        g = buf[0]
    return [p - lr[0] * g, *buf]


def _adam_ref(arrays, attrs):
    """PyTorch's Adam step with bias correction: the new parameter, moments and step count."""
    p, diff, lr, skip_if, m, v, step = arrays
    if skip_if[0] != 0:
        return [p.copy(), m.copy(), v.copy(), step.copy()]
    b1, b2, t = attrs["beta1"], attrs["beta2"], step + 1
    g = diff + attrs["weight_decay"] * p
    m = b1 * m + (1.0 - b1) * g
    v = b2 * v + (1.0 - b2) * g * g
    bc1, bc2 = 1.0 - b1 ** t[0], 1.0 - b2 ** t[0]
    return [p - lr[0] / bc1 * m / (np.sqrt(v) / np.sqrt(bc2) + attrs["eps"]), m, v, t]


_UPDATE_NOTE = "optimizer update: runs after AMP, writes the float32 master weights"

register("sgd_update", _sgd_infer, normalize=_sgd_norm, writes=(0, N_FIXED),
         reference=_sgd_ref, samples=_samples(1, 0.1, {"momentum": 0.9, "weight_decay": 0.01}),
         amp=None, amp_note=_UPDATE_NOTE,
         doc="p -= lr * (momentum buffer of diff + wd * p); skipped when skip_if != 0")
register("adam_update", _adam_infer, normalize=_adam_norm,
         writes=(0, N_FIXED, N_FIXED + 1, N_FIXED + 2), reference=_adam_ref,
         samples=_samples(3, 0.01, {"weight_decay": 0.01}), amp=None, amp_note=_UPDATE_NOTE,
         doc="Adam with bias correction; skipped when skip_if != 0")
