"""Optimizer update CUDA kernels (in place, no outputs): ``sgd_update`` and ``adam_update``.

Grid-stride loops over the scalar bodies of ``kernels.common.update`` (PyTorch's rules; the
builders are there too), compiled as device functions: the same math as the CPU kernels. When
``skip_if[0] != 0`` every thread returns at once and nothing changes. Hyperparameters are
converted to the compute type (``ct``), the learning rate from its f64[1] array (``lr[0]``, read
by every thread when the kernel runs); Adam's bias corrections are float64.

Adam's step counter is shared by all threads, so it cannot be incremented inside the update
kernel (threads of other blocks could read it after the increment). Every thread computes with
``step[0] + 1``, and a second one-thread kernel, launched after it on the same stream, stores the
increment.
"""
from __future__ import annotations

import functools

from numba import cuda

from .common import device, flat, jit, short, types_of
from .launch import flat_steps
from ..common.update import (adam_builder, adam_corrections, adam_element, sgd_builder,
                             sgd_element)

__all__ = ["sgd_kernel", "adam_kernel", "adam_step_kernel", "BUILDERS"]


@functools.cache
def sgd_kernel(momentum: bool, ct, st):
    """``kernel(p, grad, lr, skip_if, buf, mu, wd)``: ``p[i], buf[i] = sgd_element(...)`` with
    the learning rate ``lr[0]``, unless skip_if[0] (buf is read and written only with
    ``momentum``)."""
    sgd = device(sgd_element)

    @jit
    def kernel(p, grad, lr, skip_if, buf, mu, wd):
        if skip_if[0] != 0:
            return
        lr_c, mu_c, wd_c = ct(lr[0]), ct(mu), ct(wd)
        for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
            pi, b = sgd(ct(p[i]), ct(grad[i]), ct(buf[i]) if momentum else mu_c, lr_c, mu_c, wd_c,
                        momentum)
            if momentum:
                buf[i] = st(b)
            p[i] = st(pi)

    return kernel


@functools.cache
def adam_kernel(ct, st):
    """``kernel(p, grad, lr, skip_if, m, v, step, beta1, beta2, eps, wd)``, unless skip_if[0]:
    ``p[i], m[i], v[i] = adam_element(...)`` at step ``t = step[0] + 1`` with the learning
    rate ``lr[0]``."""
    corrections, adam = device(adam_corrections), device(adam_element)

    @jit
    def kernel(p, grad, lr, skip_if, m, v, step, beta1, beta2, eps, wd):
        if skip_if[0] != 0:
            return
        step_size, bc2_sqrt = corrections(lr[0], beta1, beta2, step[0] + 1)
        hyper = (ct(step_size), ct(bc2_sqrt), ct(beta1), ct(beta2), ct(1.0 - beta1),
                 ct(1.0 - beta2), ct(eps), ct(wd))
        for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
            pi, mi, vi = adam(ct(p[i]), ct(grad[i]), ct(m[i]), ct(v[i]), hyper)
            m[i], v[i], p[i] = st(mi), st(vi), st(pi)

    return kernel


@functools.cache
def adam_step_kernel():
    """``kernel(skip_if, step)``: ``step[0] += 1`` unless skip_if[0] (one thread)."""

    @jit
    def kernel(skip_if, step):
        if cuda.grid(1) == 0 and skip_if[0] == 0:
            step[0] += 1

    return kernel


def sgd_steps(p, grad, lr, skip_if, buf, mu, wd):
    """One launch of :func:`sgd_kernel` (``p`` stands in for ``buf`` without momentum)."""
    kernel = sgd_kernel(buf is not None, *types_of(p))
    return flat_steps(kernel, p.size, (flat(p), flat(grad), flat(lr), flat(skip_if),
                                       flat(p if buf is None else buf), mu, wd),
                      f"sgd_update {short(p.dtype)}")


def adam_steps(p, grad, lr, skip_if, m, v, step, beta1, beta2, eps, wd):
    """A launch of :func:`adam_kernel`, then one of :func:`adam_step_kernel`."""
    update = flat_steps(adam_kernel(*types_of(p)), p.size,
                        (flat(p), flat(grad), flat(lr), flat(skip_if), flat(m), flat(v),
                         flat(step), beta1, beta2, eps, wd), f"adam_update {short(p.dtype)}")
    return update + flat_steps(adam_step_kernel(), 1, (flat(skip_if), flat(step)), "adam_step")


BUILDERS = {"sgd_update": sgd_builder(sgd_steps), "adam_update": adam_builder(adam_steps)}
"""Op type -> builder for the optimizer updates."""
