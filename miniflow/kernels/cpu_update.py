"""Optimizer update CPU kernels (in place, no outputs): ``sgd_update`` and ``adam_update``.

Both follow PyTorch's single-tensor rules (``torch/optim/sgd.py``, ``torch/optim/adam.py``; Adam,
not AdamW: weight decay is added to the gradient) and do nothing at all when ``skip_if[0] != 0``
(OneFlow's update kernels return early; the loss-scale pass feeds the non-finite count there).
Math runs in the model's compute type; Adam's bias corrections in float64.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .cpu_common import flat, jit, loop_for, use_parallel
from .fp16 import load, store, to_compute

__all__ = ["sgd_kernel", "adam_kernel", "BUILDERS"]


@functools.cache
def sgd_kernel(momentum: bool, parallel: bool):
    """``kernel(p, grad, skip_if, buf, lr, mu, wd)``, unless skip_if[0]:
    ``g = grad[i] + wd*p[i]``; with ``momentum``: ``buf[i] = mu*buf[i] + g; g = buf[i]``;
    ``p[i] -= lr*g``. (buf starts at zeros, which equals PyTorch's first step buf = g.)"""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(p, grad, skip_if, buf, lr, mu, wd):
        if skip_if[0] != 0:
            return
        lr_c, mu_c, wd_c = to_compute(p, lr), to_compute(p, mu), to_compute(p, wd)
        for i in loop(p.size):
            pi = load(p, i)
            g = load(grad, i) + wd_c * pi
            if momentum:
                g = mu_c * load(buf, i) + g
                store(buf, i, g)
            store(p, i, pi - lr_c * g)

    return kernel


@functools.cache
def adam_kernel(parallel: bool):
    """``kernel(p, grad, skip_if, m, v, step, lr, beta1, beta2, eps, wd)``, unless skip_if[0]:
    ``step += 1; g = grad + wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*(g*g);
    p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)`` with ``bc = 1 - b**step`` (float64)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(p, grad, skip_if, m, v, step, lr, beta1, beta2, eps, wd):
        if skip_if[0] != 0:
            return
        step[0] += 1
        step_size = to_compute(p, lr / (1.0 - beta1 ** step[0]))
        bc2_sqrt = to_compute(p, math.sqrt(1.0 - beta2 ** step[0]))
        b1, b2 = to_compute(p, beta1), to_compute(p, beta2)
        one_b1, one_b2 = to_compute(p, 1.0 - beta1), to_compute(p, 1.0 - beta2)
        eps_c, wd_c = to_compute(p, eps), to_compute(p, wd)
        for i in loop(p.size):
            pi = load(p, i)
            g = load(grad, i) + wd_c * pi
            mi = b1 * load(m, i) + one_b1 * g
            vi = b2 * load(v, i) + one_b2 * (g * g)
            store(m, i, mi)
            store(v, i, vi)
            store(p, i, pi - step_size * (mi / (math.sqrt(vi) / bc2_sqrt + eps_c)))

    return kernel


def build_sgd_update(node, ins, outs):
    """``sgd_update(model, model_diff, skip_if[, momentum_buf]) {lr, momentum, weight_decay}``.

    Raises:
        ValueError: ``momentum != 0`` without a momentum buffer input.
    """
    a = node.attrs
    mu = float(a.get("momentum", 0.0))
    if mu != 0.0 and len(ins) < 4:
        raise ValueError("sgd_update: momentum != 0 needs a momentum_buf input (4 inputs)")
    p, grad, skip_if = ins[:3]
    buf = flat(ins[3]) if mu != 0.0 else flat(np.zeros(1, p.dtype))
    kernel = sgd_kernel(mu != 0.0, use_parallel(p.size))
    return [(kernel, (flat(p), flat(grad), skip_if.reshape(-1), buf, float(a["lr"]), mu,
                      float(a.get("weight_decay", 0.0))))]


def build_adam_update(node, ins, outs):
    """``adam_update(model, model_diff, skip_if, m, v, step) {lr, beta1, beta2, eps, weight_decay}``."""
    a = node.attrs
    p, grad, skip_if, m, v, step = ins
    kernel = adam_kernel(use_parallel(p.size))
    return [(kernel, (flat(p), flat(grad), skip_if.reshape(-1), flat(m), flat(v), step.reshape(-1),
                      float(a["lr"]), float(a["beta1"]), float(a["beta2"]), float(a["eps"]),
                      float(a.get("weight_decay", 0.0))))]


BUILDERS = {"sgd_update": build_sgd_update, "adam_update": build_adam_update}
"""Op type -> builder for the optimizer updates."""
