"""Optimizer update CUDA kernels (in place, no outputs): ``sgd_update`` and ``adam_update``.

Same rules as ``cpu_update`` (PyTorch's single-tensor SGD and Adam; weight decay added to the
gradient) and the same ``skip_if``: when ``skip_if[0] != 0`` every thread returns at once and
nothing changes. Math runs in the model's compute type, Adam's bias corrections in float64.

Adam's step counter is shared by all threads, so it cannot be incremented inside the update
kernel (threads of other blocks could read it after the increment). Every thread computes with
``step[0] + 1``, and a second one-thread kernel, launched after it on the same stream, stores the
increment.
"""
from __future__ import annotations

import functools

from numba import cuda

from .cuda_common import compute_type, flat, jit, math, storage_type
from .cuda_elementwise import short
from .cuda_launch import flat_steps

__all__ = ["sgd_kernel", "adam_kernel", "adam_step_kernel", "BUILDERS"]


@functools.cache
def sgd_kernel(momentum: bool, ct, st):
    """``kernel(p, grad, skip_if, buf, lr, mu, wd)``, unless skip_if[0]:
    ``g = grad[i] + wd*p[i]``; with ``momentum``: ``buf[i] = mu*buf[i] + g; g = buf[i]``;
    ``p[i] -= lr*g``."""

    @jit
    def kernel(p, grad, skip_if, buf, lr, mu, wd):
        if skip_if[0] != 0:
            return
        lr_c, mu_c, wd_c = ct(lr), ct(mu), ct(wd)
        for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
            pi = ct(p[i])
            g = ct(grad[i]) + wd_c * pi
            if momentum:
                g = mu_c * ct(buf[i]) + g
                buf[i] = st(g)
            p[i] = st(pi - lr_c * g)

    return kernel


@functools.cache
def adam_kernel(ct, st):
    """``kernel(p, grad, skip_if, m, v, step, lr, beta1, beta2, eps, wd)``, unless skip_if[0], with
    ``t = step[0] + 1``: ``g = grad + wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*(g*g);
    p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)``, ``bc = 1 - b**t`` (float64)."""

    @jit
    def kernel(p, grad, skip_if, m, v, step, lr, beta1, beta2, eps, wd):
        if skip_if[0] != 0:
            return
        t = step[0] + 1
        step_size = ct(lr / (1.0 - beta1 ** t))
        bc2_sqrt = ct(math.sqrt(1.0 - beta2 ** t))
        b1, b2, one_b1, one_b2 = ct(beta1), ct(beta2), ct(1.0 - beta1), ct(1.0 - beta2)
        eps_c, wd_c = ct(eps), ct(wd)
        for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
            pi = ct(p[i])
            g = ct(grad[i]) + wd_c * pi
            mi = b1 * ct(m[i]) + one_b1 * g
            vi = b2 * ct(v[i]) + one_b2 * (g * g)
            m[i] = st(mi)
            v[i] = st(vi)
            p[i] = st(pi - step_size * (mi / (math.sqrt(vi) / bc2_sqrt + eps_c)))

    return kernel


@functools.cache
def adam_step_kernel():
    """``kernel(skip_if, step)``: ``step[0] += 1`` unless skip_if[0] (one thread)."""

    @jit
    def kernel(skip_if, step):
        if cuda.grid(1) == 0 and skip_if[0] == 0:
            step[0] += 1

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
    buf = ins[3] if mu != 0.0 else p          # unused without momentum
    kernel = sgd_kernel(mu != 0.0, compute_type(p.dtype), storage_type(p.dtype))
    return flat_steps(kernel, p.size, (flat(p), flat(grad), flat(skip_if), flat(buf),
                                       float(a["lr"]), mu, float(a.get("weight_decay", 0.0))),
                      f"sgd_update {short(p.dtype)}")


def build_adam_update(node, ins, outs):
    """``adam_update(model, model_diff, skip_if, m, v, step)``
    ``{lr, beta1, beta2, eps, weight_decay}``."""
    a = node.attrs
    p, grad, skip_if, m, v, step = ins
    kernel = adam_kernel(compute_type(p.dtype), storage_type(p.dtype))
    update = flat_steps(kernel, p.size, (flat(p), flat(grad), flat(skip_if), flat(m), flat(v),
                                         flat(step), float(a["lr"]), float(a["beta1"]),
                                         float(a["beta2"]), float(a["eps"]),
                                         float(a.get("weight_decay", 0.0))),
                        f"adam_update {short(p.dtype)}")
    return update + flat_steps(adam_step_kernel(), 1, (flat(skip_if), flat(step)), "adam_step")


BUILDERS = {"sgd_update": build_sgd_update, "adam_update": build_adam_update}
"""Op type -> builder for the optimizer updates."""
