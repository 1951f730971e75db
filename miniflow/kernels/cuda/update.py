"""Optimizer update CUDA kernels (in place, no outputs): ``sgd_update``, ``adam_update`` and
``adadelta_update``, one launch for many parameters (multi-tensor, OneFlow's
``multi_tensor_sgd_update`` / ``multi_tensor_adam_update``), and the multi-tensor updates with cast
(``multi_tensor_sgd_update_with_cast`` / ``multi_tensor_adam_update_with_cast`` /
``multi_tensor_adadelta_update_with_cast``).

Every kernel takes tuples of flat arrays (parameters, gradients, state), one entry per parameter,
and runs one grid-stride loop over their concatenation: thread ``t`` updates the elements
``t, t + gridsize, ...`` of the concatenated parameters, so small tensors (biases) and large ones
share the grid evenly. A single ``sgd_update`` / ``adam_update`` node is a group of one
(:data:`BUILDERS`); the plan groups the update nodes that share their hyperparameters, learning
rate and ``skip_if`` into one launch (``runtime.plan.grouped_nodes``, :data:`GROUPS`). A launch
takes at most ``launch.MAX_ARRAYS`` array arguments (CUDA's 4 KiB of kernel parameters), so a
larger group is split into several launches.

The scalar bodies are those of ``kernels.common.update`` (PyTorch's rules; the builders are
there too), compiled as device functions: the same math as the CPU kernels. Elements load
through ``ld`` (bfloat16 as its bits, ``common.types_of``). When ``skip_if[0] != 0`` every thread
returns at once and nothing changes. Hyperparameters are converted to the compute type (``ct``),
the learning rate from its f64[1] array (``lr[0]``, read by every thread when the kernel runs);
Adam's bias corrections are float64.

The updates with cast are the same kernels with ``cast``: the gradient (of its own dtype, its
``ld_g``) is multiplied by ``scale[0]`` after its load and rounded to the compute type through
``round_float32`` (never contracted into an FMA with the update that reads it: the CPU rounds
the product too), and the new weight is stored once more, into its half copy (``st_c``).

Adam's step counters are read by every thread of the update kernel, so they cannot be
incremented inside it (threads of other blocks could read a counter after the increment, and a
kernel has no grid-wide barrier without a cooperative launch). Every thread computes with
``step[0] + 1``, and a second small kernel, launched after it on the same stream, increments
all the group's counters (one thread each): two launches per group, not two per parameter.
Adadelta's step counters (read by no thread: PyTorch's state, kept) are counted by the same
second kernel.
"""
from __future__ import annotations

import functools

from numba import cuda, types

from .common import device, flat, jit, round_float32, round_float64, short, types_of
from .launch import chunks, flat_steps
from ..common.update import (adadelta_builder, adadelta_element, adam_builder, adam_corrections,
                             adam_element, multi_adadelta_builder, multi_adadelta_cast_builder,
                             multi_adam_builder, multi_adam_cast_builder, multi_sgd_builder,
                             multi_sgd_cast_builder, sgd_builder, sgd_element)

__all__ = ["first_index", "multi_sgd_kernel", "multi_adam_kernel", "multi_adam_step_kernel",
           "multi_adadelta_kernel", "sgd_steps", "adam_steps", "adadelta_steps", "BUILDERS",
           "GROUPS"]


@cuda.jit(device=True)
def first_index(start, stride, offset):
    """The first index ``i >= 0`` of a tensor starting at ``offset`` in the concatenation that
    thread ``start`` of a grid-stride loop of ``stride`` visits (``offset + i = start mod
    stride``)."""
    return (start - offset) % stride


def _rounding(ct):
    """The FMA-proof rounding to compute type ``ct`` (float32 or float64)."""
    return round_float64 if ct == types.float64 else round_float32


@functools.cache
def multi_sgd_kernel(momentum: bool, nesterov: bool, dampened: bool, cast: bool, ld, ct, st,
                     ld_g, st_c):
    """``kernel(ps, grads, bufs, copies, lr, skip_if, scale, mu, wd, one_d, steps)``: for every
    ``k`` and ``i``, ``ps[k][i], bufs[k][i] = sgd_element(...)`` with the learning rate
    ``lr[0]``, unless skip_if[0] (``bufs`` is read and written only with ``momentum``; with
    ``cast`` the gradient is ``grads[k][i] * scale[0]`` and ``copies[k][i]`` gets the new weight
    rounded, else neither ``scale`` nor ``copies`` is touched; ``nesterov``: Nesterov momentum;
    ``dampened``: ``one_d = 1 - dampening``, and the buffer's first step is ``steps[k][0] == 0``,
    counted by :func:`multi_adam_step_kernel` after it, else neither is read).
    ``ld``/``ct``/``st``: the parameters' element types, ``ld_g``: the gradients' load,
    ``st_c``: the copies' store."""
    sgd, rnd = device(sgd_element), _rounding(ct)

    @jit
    def kernel(ps, grads, bufs, copies, lr, skip_if, scale, mu, wd, one_d, steps):
        if skip_if[0] != 0:
            return
        lr_c, mu_c, wd_c, one_d_c = ct(lr[0]), ct(mu), ct(wd), ct(one_d)
        s = ct(scale[0]) if cast else ct(1.0)
        start, stride = cuda.grid(1), cuda.gridsize(1)
        offset = 0
        for k in range(len(ps)):
            p, grad, buf, copy = ps[k], grads[k], bufs[k], copies[k]
            first = steps[k][0] == 0 if dampened else False
            for i in range(first_index(start, stride, offset), p.size, stride):
                g = rnd(ld_g(grad[i]) * s) if cast else ct(ld_g(grad[i]))
                pi, b = sgd(ld(p[i]), g, ld(buf[i]) if momentum else mu_c, lr_c, mu_c, wd_c,
                            momentum, nesterov, dampened, one_d_c, first)
                if momentum:
                    buf[i] = st(b)
                p[i] = st(pi)
                if cast:
                    copy[i] = st_c(pi)
            offset += p.size

    return kernel


@functools.cache
def multi_adam_kernel(amsgrad: bool, cast: bool, ld, ct, st, ld_g, st_c):
    """``kernel(ps, grads, copies, ms, vs, steps, lr, skip_if, scale, beta1, beta2, eps, wd,
    vmaxs)``, unless skip_if[0]: ``ps[k][i], ms[k][i], vs[k][i], vmaxs[k][i] = adam_element(...)``
    (``vmaxs`` read and written only with ``amsgrad``) at step
    ``t = steps[k][0] + 1`` with the learning rate ``lr[0]`` (``cast``: the gradient times
    ``scale[0]``, the new weight also into ``copies[k][i]``, as :func:`multi_sgd_kernel`; ``wd``
    the pair ``(weight_decay, decoupled_weight_decay)``)."""
    corrections, adam, rnd = device(adam_corrections), device(adam_element), _rounding(ct)

    @jit
    def kernel(ps, grads, copies, ms, vs, steps, lr, skip_if, scale, beta1, beta2, eps, wd,
               vmaxs):
        if skip_if[0] != 0:
            return
        s = ct(scale[0]) if cast else ct(1.0)
        start, stride = cuda.grid(1), cuda.gridsize(1)
        offset = 0
        for k in range(len(ps)):
            p, grad, copy, m, v, vmax = ps[k], grads[k], copies[k], ms[k], vs[k], vmaxs[k]
            step_size, bc2_sqrt = corrections(lr[0], beta1, beta2, steps[k][0] + 1)
            hyper = (ct(step_size), ct(bc2_sqrt), ct(beta1), ct(beta2), ct(1.0 - beta1),
                     ct(1.0 - beta2), ct(eps), ct(wd[0]), ct(1.0 - lr[0] * wd[1]))
            for i in range(first_index(start, stride, offset), p.size, stride):
                g = rnd(ld_g(grad[i]) * s) if cast else ct(ld_g(grad[i]))
                pi, mi, vi, xi = adam(ld(p[i]), g, ld(m[i]), ld(v[i]),
                                      ld(vmax[i]) if amsgrad else hyper[0], hyper, amsgrad)
                if amsgrad:
                    vmax[i] = st(xi)
                m[i], v[i], p[i] = st(mi), st(vi), st(pi)
                if cast:
                    copy[i] = st_c(pi)
            offset += p.size

    return kernel


@functools.cache
def multi_adadelta_kernel(maximize: bool, cast: bool, ld, ct, st, ld_g, st_c):
    """``kernel(ps, grads, copies, square_avgs, acc_deltas, lr, skip_if, scale, rho, eps, wd)``,
    unless skip_if[0]: ``ps[k][i], square_avgs[k][i], acc_deltas[k][i] =
    adadelta_element(...)`` with the learning rate ``lr[0]`` (``maximize``: the gradient's
    negative; ``cast``: the gradient times ``scale[0]``, the new weight also into
    ``copies[k][i]``, as :func:`multi_sgd_kernel`; the step counters are
    :func:`multi_adam_step_kernel`'s)."""
    adadelta, rnd = device(adadelta_element), _rounding(ct)

    @jit
    def kernel(ps, grads, copies, square_avgs, acc_deltas, lr, skip_if, scale, rho, eps, wd):
        if skip_if[0] != 0:
            return
        lr_c, rho_c, one_rho, eps_c, wd_c = ct(lr[0]), ct(rho), ct(1.0 - rho), ct(eps), ct(wd)
        s = ct(scale[0]) if cast else ct(1.0)
        start, stride = cuda.grid(1), cuda.gridsize(1)
        offset = 0
        for k in range(len(ps)):
            p, grad, copy, sq, acc = ps[k], grads[k], copies[k], square_avgs[k], acc_deltas[k]
            for i in range(first_index(start, stride, offset), p.size, stride):
                g = rnd(ld_g(grad[i]) * s) if cast else ct(ld_g(grad[i]))
                pi, si, ai = adadelta(ld(p[i]), g, ld(sq[i]), ld(acc[i]), lr_c, rho_c, one_rho,
                                      eps_c, wd_c, maximize)
                sq[i], acc[i], p[i] = st(si), st(ai), st(pi)
                if cast:
                    copy[i] = st_c(pi)
            offset += p.size

    return kernel


@functools.cache
def multi_adam_step_kernel():
    """``kernel(skip_if, steps)``: ``steps[k][0] += 1`` for every k (thread k), unless
    skip_if[0] (Adam's and Adadelta's step counters, SGD's with dampening)."""

    @jit
    def kernel(skip_if, steps):
        k = cuda.grid(1)
        if k < len(steps) and skip_if[0] == 0:
            steps[k][0] += 1

    return kernel


def _label(op: str, ps) -> str:
    return f"{op} {short(ps[0].dtype)}" + (f" x{len(ps)}" if len(ps) > 1 else "")


def multi_sgd_steps(ps, grads, lr, skip_if, bufs, mu, wd, nesterov, dampening, step_arrays,
                    copies=None, scale=None):
    """Launches of :func:`multi_sgd_kernel` over parameters ``ps`` (lists; ``bufs`` None without
    momentum: the parameters stand in for the buffers; ``step_arrays`` None without dampening:
    the learning rate stands in for them; with them each launch is followed by one of
    :func:`multi_adam_step_kernel`; ``copies`` and the f32[1] ``scale``: the update with cast,
    else the parameters and ``lr`` stand in for them)."""
    cast, dampened = copies is not None, step_arrays is not None
    ld_g, st_c = types_of(grads[0])[0], types_of(copies[0] if cast else ps[0])[2]
    kernel = multi_sgd_kernel(bufs is not None, nesterov, dampened, cast, *types_of(ps[0]),
                              ld_g, st_c)
    bufs = ps if bufs is None else bufs
    copies = copies if cast else ps
    op = "multi_tensor_sgd_update_with_cast" if cast else "sgd_update"
    steps = []
    for part in chunks(list(range(len(ps))), (4 if cast else 3) + dampened):
        p = tuple(flat(ps[k]) for k in part)
        t = tuple(flat(step_arrays[k]) for k in part) if dampened else (flat(lr),)
        steps += flat_steps(kernel, sum(a.size for a in p),
                            (p, tuple(flat(grads[k]) for k in part),
                             tuple(flat(bufs[k]) for k in part),
                             tuple(flat(copies[k]) for k in part) if cast else p, flat(lr),
                             flat(skip_if), flat(scale if cast else lr), mu, wd,
                             1.0 - dampening, t), _label(op, p))
        if dampened:
            steps += flat_steps(multi_adam_step_kernel(), len(t), (flat(skip_if), t),
                                _label("sgd_step", p))
    return steps


def multi_adam_steps(ps, grads, lr, skip_if, ms, vs, step_arrays, beta1, beta2, eps, wd,
                     vmaxs=None, copies=None, scale=None):
    """Launches of :func:`multi_adam_kernel` over parameters ``ps`` (lists), each followed by
    one of :func:`multi_adam_step_kernel` over the same parameters' step counters (``vmaxs``
    None without amsgrad: the first moments stand in for them; ``copies`` and ``scale``: the
    update with cast, as :func:`multi_sgd_steps`)."""
    cast = copies is not None
    ld_g, st_c = types_of(grads[0])[0], types_of(copies[0] if cast else ps[0])[2]
    amsgrad = vmaxs is not None
    kernel = multi_adam_kernel(amsgrad, cast, *types_of(ps[0]), ld_g, st_c)
    vmaxs = vmaxs if amsgrad else ms
    counter = multi_adam_step_kernel()
    op = "multi_tensor_adam_update_with_cast" if cast else "adam_update"
    steps = []
    for part in chunks(list(range(len(ps))), (6 if cast else 5) + amsgrad):
        p = tuple(flat(ps[k]) for k in part)
        t = tuple(flat(step_arrays[k]) for k in part)
        steps += flat_steps(kernel, sum(a.size for a in p),
                            (p, tuple(flat(grads[k]) for k in part),
                             tuple(flat(copies[k]) for k in part) if cast else p,
                             tuple(flat(ms[k]) for k in part), tuple(flat(vs[k]) for k in part),
                             t, flat(lr), flat(skip_if), flat(scale if cast else lr), beta1,
                             beta2, eps, wd, tuple(flat(vmaxs[k]) for k in part)),
                            _label(op, p))
        steps += flat_steps(counter, len(t), (flat(skip_if), t), _label("adam_step", p))
    return steps


def multi_adadelta_steps(ps, grads, lr, skip_if, square_avgs, acc_deltas, step_arrays, rho,
                         eps, wd, maximize, copies=None, scale=None):
    """Launches of :func:`multi_adadelta_kernel` over parameters ``ps`` (lists), each followed
    by one of :func:`multi_adam_step_kernel` over the same parameters' step counters
    (``copies`` and ``scale``: the update with cast, as :func:`multi_sgd_steps`)."""
    cast = copies is not None
    ld_g, st_c = types_of(grads[0])[0], types_of(copies[0] if cast else ps[0])[2]
    kernel = multi_adadelta_kernel(maximize, cast, *types_of(ps[0]), ld_g, st_c)
    counter = multi_adam_step_kernel()
    op = "multi_tensor_adadelta_update_with_cast" if cast else "adadelta_update"
    steps = []
    for part in chunks(list(range(len(ps))), 6 if cast else 5):
        p = tuple(flat(ps[k]) for k in part)
        t = tuple(flat(step_arrays[k]) for k in part)
        steps += flat_steps(kernel, sum(a.size for a in p),
                            (p, tuple(flat(grads[k]) for k in part),
                             tuple(flat(copies[k]) for k in part) if cast else p,
                             tuple(flat(square_avgs[k]) for k in part),
                             tuple(flat(acc_deltas[k]) for k in part), flat(lr), flat(skip_if),
                             flat(scale if cast else lr), rho, eps, wd), _label(op, p))
        steps += flat_steps(counter, len(t), (flat(skip_if), t), _label("adadelta_step", p))
    return steps


def sgd_steps(p, grad, lr, skip_if, buf, mu, wd, nesterov, dampening, step):
    """One ``sgd_update`` (``buf`` None without momentum, ``step`` without dampening): a group
    of one."""
    return multi_sgd_steps([p], [grad], lr, skip_if, None if buf is None else [buf], mu, wd,
                           nesterov, dampening, None if step is None else [step])


def adam_steps(p, grad, lr, skip_if, m, v, step, beta1, beta2, eps, wd, vmax):
    """One ``adam_update`` (``vmax`` None without amsgrad): a group of one."""
    return multi_adam_steps([p], [grad], lr, skip_if, [m], [v], [step], beta1, beta2, eps, wd,
                            None if vmax is None else [vmax])


def adadelta_steps(p, grad, lr, skip_if, square_avg, acc_delta, step, rho, eps, wd, maximize):
    """One ``adadelta_update``: a group of one."""
    return multi_adadelta_steps([p], [grad], lr, skip_if, [square_avg], [acc_delta], [step], rho,
                                eps, wd, maximize)


def sgd_cast_steps(models, diffs, copies, bufs, lr, skip_if, scale, mu, wd, nesterov, dampening,
                   step_arrays):
    """One ``multi_tensor_sgd_update_with_cast`` (``bufs`` None without momentum,
    ``step_arrays`` without dampening)."""
    return multi_sgd_steps(models, diffs, lr, skip_if, bufs, mu, wd, nesterov, dampening,
                           step_arrays, copies, scale)


def adam_cast_steps(models, diffs, copies, ms, vs, step_arrays, lr, skip_if, scale, beta1,
                    beta2, eps, wd, vmaxs):
    """One ``multi_tensor_adam_update_with_cast`` (``vmaxs`` None without amsgrad)."""
    return multi_adam_steps(models, diffs, lr, skip_if, ms, vs, step_arrays, beta1, beta2, eps,
                            wd, vmaxs, copies, scale)


def adadelta_cast_steps(models, diffs, copies, square_avgs, acc_deltas, step_arrays, lr, skip_if,
                        scale, rho, eps, wd, maximize):
    """One ``multi_tensor_adadelta_update_with_cast``."""
    return multi_adadelta_steps(models, diffs, lr, skip_if, square_avgs, acc_deltas, step_arrays,
                                rho, eps, wd, maximize, copies, scale)


BUILDERS = {"sgd_update": sgd_builder(sgd_steps), "adam_update": adam_builder(adam_steps),
            "adadelta_update": adadelta_builder(adadelta_steps),
            "multi_tensor_sgd_update_with_cast": multi_sgd_cast_builder(sgd_cast_steps),
            "multi_tensor_adam_update_with_cast": multi_adam_cast_builder(adam_cast_steps),
            "multi_tensor_adadelta_update_with_cast":
                multi_adadelta_cast_builder(adadelta_cast_steps)}
"""Op type -> builder for the optimizer updates."""
GROUPS = {"sgd_update": multi_sgd_builder(multi_sgd_steps),
          "adam_update": multi_adam_builder(multi_adam_steps),
          "adadelta_update": multi_adadelta_builder(multi_adadelta_steps)}
"""Op type -> ``GroupBuilder`` of several of its nodes as one launch."""
