"""Optimizer update CUDA kernels (in place, no outputs): ``sgd_update`` and ``adam_update``, one
launch for many parameters (multi-tensor, OneFlow's ``multi_tensor_sgd_update`` /
``multi_tensor_adam_update``).

Every kernel takes tuples of flat arrays (parameters, gradients, state), one entry per parameter,
and runs one grid-stride loop over their concatenation: thread ``t`` updates the elements
``t, t + gridsize, ...`` of the concatenated parameters, so small tensors (biases) and large ones
share the grid evenly. A single ``sgd_update`` / ``adam_update`` node is a group of one
(:data:`BUILDERS`); the plan groups the update nodes that share their hyperparameters, learning
rate and ``skip_if`` into one launch (``runtime.plan.grouped_nodes``, :data:`GROUPS`). A launch
takes at most ``launch.MAX_ARRAYS`` array arguments (CUDA's 4 KiB of kernel parameters), so a
larger group is split into several launches.

The scalar bodies are those of ``kernels.common.update`` (PyTorch's rules; the builders are
there too), compiled as device functions: the same math as the CPU kernels. When
``skip_if[0] != 0`` every thread returns at once and nothing changes. Hyperparameters are
converted to the compute type (``ct``), the learning rate from its f64[1] array (``lr[0]``, read
by every thread when the kernel runs); Adam's bias corrections are float64.

Adam's step counters are read by every thread of the update kernel, so they cannot be
incremented inside it (threads of other blocks could read a counter after the increment, and a
kernel has no grid-wide barrier without a cooperative launch). Every thread computes with
``step[0] + 1``, and a second small kernel, launched after it on the same stream, increments
all the group's counters (one thread each): two launches per group, not two per parameter.
"""
from __future__ import annotations

import functools

from numba import cuda

from .common import device, flat, jit, short, types_of
from .launch import chunks, flat_steps
from ..common.update import (adam_builder, adam_corrections, adam_element, multi_adam_builder,
                             multi_sgd_builder, sgd_builder, sgd_element)

__all__ = ["first_index", "multi_sgd_kernel", "multi_adam_kernel", "multi_adam_step_kernel",
           "sgd_steps", "adam_steps", "BUILDERS", "GROUPS"]

@cuda.jit(device=True)
def first_index(start, stride, offset):
    """The first index ``i >= 0`` of a tensor starting at ``offset`` in the concatenation that
    thread ``start`` of a grid-stride loop of ``stride`` visits (``offset + i = start mod
    stride``)."""
    return (start - offset) % stride


@functools.cache
def multi_sgd_kernel(momentum: bool, ct, st):
    """``kernel(ps, grads, bufs, lr, skip_if, mu, wd)``: for every ``k`` and ``i``,
    ``ps[k][i], bufs[k][i] = sgd_element(...)`` with the learning rate ``lr[0]``, unless
    skip_if[0] (``bufs`` is read and written only with ``momentum``)."""
    sgd = device(sgd_element)

    @jit
    def kernel(ps, grads, bufs, lr, skip_if, mu, wd):
        if skip_if[0] != 0:
            return
        lr_c, mu_c, wd_c = ct(lr[0]), ct(mu), ct(wd)
        start, stride = cuda.grid(1), cuda.gridsize(1)
        offset = 0
        for k in range(len(ps)):
            p, grad, buf = ps[k], grads[k], bufs[k]
            for i in range(first_index(start, stride, offset), p.size, stride):
                pi, b = sgd(ct(p[i]), ct(grad[i]), ct(buf[i]) if momentum else mu_c, lr_c,
                            mu_c, wd_c, momentum)
                if momentum:
                    buf[i] = st(b)
                p[i] = st(pi)
            offset += p.size

    return kernel


@functools.cache
def multi_adam_kernel(ct, st):
    """``kernel(ps, grads, ms, vs, steps, lr, skip_if, beta1, beta2, eps, wd)``, unless
    skip_if[0]: ``ps[k][i], ms[k][i], vs[k][i] = adam_element(...)`` at step
    ``t = steps[k][0] + 1`` with the learning rate ``lr[0]``."""
    corrections, adam = device(adam_corrections), device(adam_element)

    @jit
    def kernel(ps, grads, ms, vs, steps, lr, skip_if, beta1, beta2, eps, wd):
        if skip_if[0] != 0:
            return
        start, stride = cuda.grid(1), cuda.gridsize(1)
        offset = 0
        for k in range(len(ps)):
            p, grad, m, v = ps[k], grads[k], ms[k], vs[k]
            step_size, bc2_sqrt = corrections(lr[0], beta1, beta2, steps[k][0] + 1)
            hyper = (ct(step_size), ct(bc2_sqrt), ct(beta1), ct(beta2), ct(1.0 - beta1),
                     ct(1.0 - beta2), ct(eps), ct(wd))
            for i in range(first_index(start, stride, offset), p.size, stride):
                pi, mi, vi = adam(ct(p[i]), ct(grad[i]), ct(m[i]), ct(v[i]), hyper)
                m[i], v[i], p[i] = st(mi), st(vi), st(pi)
            offset += p.size

    return kernel


@functools.cache
def multi_adam_step_kernel():
    """``kernel(skip_if, steps)``: ``steps[k][0] += 1`` for every k (thread k), unless
    skip_if[0]."""

    @jit
    def kernel(skip_if, steps):
        k = cuda.grid(1)
        if k < len(steps) and skip_if[0] == 0:
            steps[k][0] += 1

    return kernel


def _label(op: str, ps) -> str:
    return f"{op} {short(ps[0].dtype)}" + (f" x{len(ps)}" if len(ps) > 1 else "")


def multi_sgd_steps(ps, grads, lr, skip_if, bufs, mu, wd):
    """Launches of :func:`multi_sgd_kernel` over parameters ``ps`` (lists; ``bufs`` None without
    momentum: the parameters stand in for the buffers)."""
    kernel = multi_sgd_kernel(bufs is not None, *types_of(ps[0]))
    bufs = ps if bufs is None else bufs
    steps = []
    for part in chunks(list(range(len(ps))), 3):
        p = tuple(flat(ps[k]) for k in part)
        steps += flat_steps(kernel, sum(a.size for a in p),
                            (p, tuple(flat(grads[k]) for k in part),
                             tuple(flat(bufs[k]) for k in part), flat(lr), flat(skip_if), mu, wd),
                            _label("sgd_update", p))
    return steps


def multi_adam_steps(ps, grads, lr, skip_if, ms, vs, step_arrays, beta1, beta2, eps, wd):
    """Launches of :func:`multi_adam_kernel` over parameters ``ps`` (lists), each followed by
    one of :func:`multi_adam_step_kernel` over the same parameters' step counters."""
    kernel, counter = multi_adam_kernel(*types_of(ps[0])), multi_adam_step_kernel()
    steps = []
    for part in chunks(list(range(len(ps))), 5):
        p = tuple(flat(ps[k]) for k in part)
        t = tuple(flat(step_arrays[k]) for k in part)
        steps += flat_steps(kernel, sum(a.size for a in p),
                            (p, tuple(flat(grads[k]) for k in part),
                             tuple(flat(ms[k]) for k in part), tuple(flat(vs[k]) for k in part),
                             t, flat(lr), flat(skip_if), beta1, beta2, eps, wd),
                            _label("adam_update", p))
        steps += flat_steps(counter, len(t), (flat(skip_if), t), _label("adam_step", p))
    return steps


def sgd_steps(p, grad, lr, skip_if, buf, mu, wd):
    """One ``sgd_update`` (``buf`` None without momentum): a group of one."""
    return multi_sgd_steps([p], [grad], lr, skip_if, None if buf is None else [buf], mu, wd)


def adam_steps(p, grad, lr, skip_if, m, v, step, beta1, beta2, eps, wd):
    """One ``adam_update``: a group of one."""
    return multi_adam_steps([p], [grad], lr, skip_if, [m], [v], [step], beta1, beta2, eps, wd)


BUILDERS = {"sgd_update": sgd_builder(sgd_steps), "adam_update": adam_builder(adam_steps)}
"""Op type -> builder for the optimizer updates."""
GROUPS = {"sgd_update": multi_sgd_builder(multi_sgd_steps),
          "adam_update": multi_adam_builder(multi_adam_steps)}
"""Op type -> ``GroupBuilder`` of several of its nodes as one launch."""
