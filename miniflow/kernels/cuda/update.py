"""Optimizer update CUDA kernels (in place, no outputs): ``sgd_update``, ``adam_update`` and the
multi-tensor updates with cast.

Grid-stride loops over the scalar bodies of ``kernels.common.update`` (PyTorch's rules; the
builders are there too), compiled as device functions: the same math as the CPU kernels. When
``skip_if[0] != 0`` every thread returns at once and nothing changes. Hyperparameters are
converted to the compute type (``ct``), the learning rate from its f64[1] array (``lr[0]``, read
by every thread when the kernel runs); Adam's bias corrections are float64.

Adam's step counter is shared by all threads, so it cannot be incremented inside the update
kernel (threads of other blocks could read it after the increment). Every thread computes with
``step[0] + 1``, and a second one-thread kernel, launched after it on the same stream, stores the
increment.

The multi-tensor updates with cast launch the same loops once per tensor, with the gradient
multiplied by ``scale[0]`` (float32) after its load and one more store, of the new weight into
its half copy (a plain launch per tensor; one launch over all tensors is issue 17's work on
launches). Adam's step counters get one more one-thread kernel over all tensors.
"""
from __future__ import annotations

import functools

from numba import cuda

from .common import device, flat, jit, short, types_of
from .launch import flat_steps
from ..common.update import (adam_builder, adam_corrections, adam_element, multi_adam_builder,
                             multi_sgd_builder, sgd_builder, sgd_element)

__all__ = ["sgd_kernel", "adam_kernel", "adam_step_kernel", "sgd_cast_kernel", "adam_cast_kernel",
           "adam_steps_kernel", "BUILDERS"]


@functools.cache
def sgd_kernel(momentum: bool, ld, ct, st):
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
            pi, b = sgd(ld(p[i]), ld(grad[i]), ld(buf[i]) if momentum else mu_c, lr_c, mu_c, wd_c,
                        momentum)
            if momentum:
                buf[i] = st(b)
            p[i] = st(pi)

    return kernel


@functools.cache
def adam_kernel(ld, ct, st):
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
            pi, mi, vi = adam(ld(p[i]), ld(grad[i]), ld(m[i]), ld(v[i]), hyper)
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


@functools.cache
def sgd_cast_kernel(momentum: bool, ld, ct, st, ld_g, st_c):
    """``kernel(p, grad, copy, buf, lr, skip_if, scale, mu, wd)``: unless skip_if[0],
    ``g = grad[i] * scale[0]``, ``p[i], buf[i] = sgd_element(...)``, ``copy[i] = p[i]`` rounded
    (``ld_g``: the gradient's load; ``st_c``: the copy's store)."""
    sgd = device(sgd_element)

    @jit
    def kernel(p, grad, copy, buf, lr, skip_if, scale, mu, wd):
        if skip_if[0] != 0:
            return
        lr_c, mu_c, wd_c, s = ct(lr[0]), ct(mu), ct(wd), ct(scale[0])
        for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
            pi, b = sgd(ld(p[i]), ct(ld_g(grad[i]) * s), ld(buf[i]) if momentum else mu_c, lr_c,
                        mu_c, wd_c, momentum)
            if momentum:
                buf[i] = st(b)
            p[i] = st(pi)
            copy[i] = st_c(pi)

    return kernel


@functools.cache
def adam_cast_kernel(ld, ct, st, ld_g, st_c):
    """``kernel(p, grad, copy, m, v, step, lr, skip_if, scale, beta1, beta2, eps, wd)``: unless
    skip_if[0], Adam at step ``step[0] + 1`` on ``g = grad[i] * scale[0]``, and ``copy[i] = p[i]``
    rounded."""
    corrections, adam = device(adam_corrections), device(adam_element)

    @jit
    def kernel(p, grad, copy, m, v, step, lr, skip_if, scale, beta1, beta2, eps, wd):
        if skip_if[0] != 0:
            return
        step_size, bc2_sqrt = corrections(lr[0], beta1, beta2, step[0] + 1)
        hyper = (ct(step_size), ct(bc2_sqrt), ct(beta1), ct(beta2), ct(1.0 - beta1),
                 ct(1.0 - beta2), ct(eps), ct(wd))
        s = ct(scale[0])
        for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
            pi, mi, vi = adam(ld(p[i]), ct(ld_g(grad[i]) * s), ld(m[i]), ld(v[i]), hyper)
            m[i], v[i], p[i] = st(mi), st(vi), st(pi)
            copy[i] = st_c(pi)

    return kernel


@functools.cache
def adam_steps_kernel():
    """``kernel(skip_if, steps)``: ``steps[k][0] += 1`` for every tensor unless skip_if[0]."""

    @jit
    def kernel(skip_if, steps):
        if cuda.grid(1) == 0 and skip_if[0] == 0:
            for k in range(len(steps)):
                steps[k][0] += 1

    return kernel


def multi_sgd_steps(models, diffs, copies, bufs, lr, skip_if, scale, mu, wd):
    """One launch of :func:`sgd_cast_kernel` per tensor."""
    steps = []
    for k, (p, g, c) in enumerate(zip(models, diffs, copies)):
        kernel = sgd_cast_kernel(bufs is not None, *types_of(p), types_of(g)[0], types_of(c)[2])
        buf = p if bufs is None else bufs[k]
        steps += flat_steps(kernel, p.size, (flat(p), flat(g), flat(c), flat(buf), flat(lr),
                                             flat(skip_if), flat(scale), mu, wd),
                            f"multi_tensor_sgd_update_with_cast {short(g.dtype)}")
    return steps


def multi_adam_steps(models, diffs, copies, ms, vs, steps_, lr, skip_if, scale, beta1, beta2,
                     eps, wd):
    """One launch of :func:`adam_cast_kernel` per tensor, then :func:`adam_steps_kernel`."""
    steps = []
    for p, g, c, m, v, t in zip(models, diffs, copies, ms, vs, steps_):
        kernel = adam_cast_kernel(*types_of(p), types_of(g)[0], types_of(c)[2])
        steps += flat_steps(kernel, p.size, (flat(p), flat(g), flat(c), flat(m), flat(v),
                                             flat(t), flat(lr), flat(skip_if), flat(scale),
                                             beta1, beta2, eps, wd),
                            f"multi_tensor_adam_update_with_cast {short(g.dtype)}")
    return steps + flat_steps(adam_steps_kernel(), 1,
                              (flat(skip_if), tuple(flat(t) for t in steps_)), "adam_steps")


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


BUILDERS = {"sgd_update": sgd_builder(sgd_steps), "adam_update": adam_builder(adam_steps),
            "multi_tensor_sgd_update_with_cast": multi_sgd_builder(multi_sgd_steps),
            "multi_tensor_adam_update_with_cast": multi_adam_builder(multi_adam_steps)}
"""Op type -> builder for the optimizer updates."""
